"""torch's structured-logging state (``torch._logging._internal``): the loggers it registered
and the reset a logging test ends with."""

from __future__ import annotations

from typing import List


def registered_log_names() -> List[str]:
    """Qualified names of the loggers torch._logging registered (the ones with handlers)."""
    from torch._logging import _internal

    return list(_internal.log_registry.get_log_qnames())


def reset_log_state() -> None:
    """Forget every TORCH_LOGS / set_logs setting and set the loggers up afresh."""
    import torch._logging
    from torch._logging import _internal

    _internal.log_state.clear()
    torch._logging._init_logs()


def dynamo_log_test_patches() -> List[object]:
    """The patches a logging test runs under: errors of compiled code suppressed, Dynamo
    not verbose."""
    from unittest import mock

    return [mock.patch("torch._dynamo.config.suppress_errors", True),
            mock.patch("torch._dynamo.config.verbose", False)]
