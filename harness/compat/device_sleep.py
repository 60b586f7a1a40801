"""Keeping an accelerator stream busy for a number of cycles (``torch.<device>._sleep``)."""

from __future__ import annotations

import torch


def device_sleep(device_type: str, cycles: int) -> None:
    """Queue a kernel on the current stream of `device_type` that spins for `cycles`."""
    torch.get_device_module(device_type)._sleep(cycles)
