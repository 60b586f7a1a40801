"""TorchDynamo state a compiled test resets around itself (``torch._dynamo.reset``, its
counters, its test config)."""

from __future__ import annotations

from typing import Any


def reset_dynamo() -> None:
    """Forget compiled code and guards, and clear Dynamo's counters."""
    import torch._dynamo
    import torch._dynamo.utils

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def test_config() -> Any:
    """Dynamo's config for tests (as its own test base): errors raised, not suppressed."""
    import torch._dynamo.config as config

    return config.patch(raise_on_ctx_manager_usage=True, suppress_errors=False,
                        log_compilation_metrics=False)
