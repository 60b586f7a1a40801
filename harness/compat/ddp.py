"""What DDP logs about itself (``DistributedDataParallel._get_ddp_logging_data``)."""

from __future__ import annotations

from typing import Any, Dict


def ddp_logging_data(model: Any) -> Dict[str, Any]:
    """The DDP instance's logging data (iteration, has_error, error, ...)."""
    return model._get_ddp_logging_data()
