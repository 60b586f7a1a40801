"""Helpers that upstream's common_distributed gives distributed tests besides the bases.

`with_dist_debug_levels` runs a test once per TORCH_DISTRIBUTED_DEBUG level (OFF, INFO,
DETAIL), which is how upstream tests check debug-only checks and messages;
`captured_output` swaps sys.stdout and sys.stderr for buffers a test can read.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from typing import Any, Callable, Iterator, Sequence, Tuple

import torch.distributed as dist

DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"
DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")


def with_dist_debug_levels(levels: Sequence[str]) -> Callable[[Callable], Callable]:
    """Run the test once for each debug level in `levels`, ranks meeting after each run.

    Like upstream, the result of the last run is returned and the first failing run
    fails the test. Unlike upstream, the previous TORCH_DISTRIBUTED_DEBUG (set or not) is
    restored afterwards, and the barrier is skipped when no group is initialised.
    """
    levels = list(levels)
    unknown = [level for level in levels if level not in DEBUG_LEVELS]
    if not levels or unknown:
        raise ValueError(
            f"with_dist_debug_levels: levels must be a non-empty list of {', '.join(DEBUG_LEVELS)}"
            f", got {levels!r}"
        )

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            previous = os.environ.get(DEBUG_ENV)
            try:
                for level in levels:
                    os.environ[DEBUG_ENV] = level
                    dist.set_debug_level_from_env()
                    result = func(*args, **kwargs)
                    if dist.is_initialized():
                        dist.barrier()
            finally:
                if previous is None:
                    os.environ.pop(DEBUG_ENV, None)
                else:
                    os.environ[DEBUG_ENV] = previous
                dist.set_debug_level_from_env()
            return result

        return wrapper

    return decorator


@contextlib.contextmanager
def captured_output() -> Iterator[Tuple[io.StringIO, io.StringIO]]:
    """Send sys.stdout and sys.stderr to fresh StringIO buffers; yield (out, err)."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
