"""Inductor settings the compiled FSDP tests depend on (``compiled_fsdp_test``).

Whether Inductor can generate GPU kernels (Triton) decides if the compiled half of a test runs;
one compile thread keeps each rank from starting a pool of compile workers.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


def has_triton() -> bool:
    """Whether Inductor can generate GPU kernels here (``torch.utils._triton.has_triton``)."""
    from torch.utils._triton import has_triton as triton_available

    return bool(triton_available())


@contextlib.contextmanager
def compile_threads(threads: int) -> Iterator[None]:
    """Set ``torch._inductor.config.compile_threads`` for the block, restoring it after."""
    import torch._inductor.config as inductor_config

    saved = inductor_config.compile_threads
    inductor_config.compile_threads = threads
    try:
        yield
    finally:
        inductor_config.compile_threads = saved
