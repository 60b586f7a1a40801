"""Delaying a CUDA stream without blocking the host (``torch.cuda._sleep``).

Upstream's FSDP models delay a rank's GPU work (before a reduction, before a reshard) to expose
missing stream synchronisation; the models here do the same on CUDA.
"""

from __future__ import annotations

import functools


@functools.cache
def _cycles_per_ms() -> float:
    """How many ``torch.cuda._sleep`` cycles take a millisecond on this GPU (measured once)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def stream_sleep(ms: float) -> None:
    """Keep the current CUDA stream busy for about ``ms`` milliseconds, without blocking the
    host: what delays a GPU-side collective or reshard."""
    import torch

    torch.cuda._sleep(int(ms * _cycles_per_ms()))
