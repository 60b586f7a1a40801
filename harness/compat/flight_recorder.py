"""torch's flight recorder, the log of collectives every c10d process group keeps.

It covers gloo as well as nccl: with `TORCH_FR_BUFFER_SIZE` set before a group is created,
each collective is recorded (operation, group, sequence number, input shapes and dtypes,
whether it completed). Reading it goes through a private binding, so it lives here.
"""

from __future__ import annotations

import os
from typing import Optional

BUFFER_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"
DEFAULT_BUFFER_SIZE = 2000  # entries: the last 2000 collectives, a few hundred KiB at most


def enable() -> None:
    """Record collectives in this process's groups created from now on (unless the user chose)."""
    os.environ.setdefault(BUFFER_SIZE_ENV, str(DEFAULT_BUFFER_SIZE))


def dump_json() -> Optional[str]:
    """The recorder's entries as JSON text, or None when this torch cannot dump them."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
    except ImportError:
        return None
    return _dump_fr_trace_json(includeCollectives=True, onlyActive=False).decode()
