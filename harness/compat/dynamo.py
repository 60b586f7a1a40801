"""Dynamo's caches, reset between grid points as upstream's `run_subtests` does.

Compile-counter tests count the compilations of one grid point only, so each point must start
without the previous point's compiled frames (``torch._dynamo.reset``).
"""

from __future__ import annotations

import sys


def reset() -> None:
    """``torch._dynamo.reset()``, where dynamo was imported: otherwise nothing was compiled
    and there is nothing to reset (importing it would cost a second)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
