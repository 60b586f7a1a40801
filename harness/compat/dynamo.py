"""TorchDynamo state a compiled test resets around itself (``torch._dynamo.reset``, its
counters, its test config), and between grid points as upstream's `run_subtests` does."""

from __future__ import annotations

import sys
from typing import Any


def reset_dynamo() -> None:
    """Forget compiled code and guards, and clear Dynamo's counters."""
    import torch._dynamo
    import torch._dynamo.utils

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def reset_if_loaded() -> None:
    """``torch._dynamo.reset()`` (counters kept, as upstream's grid points), where Dynamo was
    imported: otherwise nothing was compiled and there is nothing to reset (importing it would
    cost a second). Compile-counter tests count one grid point's compilations only."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def test_config() -> Any:
    """Dynamo's config for tests (as its own test base): errors raised, not suppressed."""
    import torch._dynamo.config as config

    return config.patch(raise_on_ctx_manager_usage=True, suppress_errors=False,
                        log_compilation_metrics=False)
