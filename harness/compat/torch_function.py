"""torch's stack of torch-function modes, and whether torch functions dispatch to them.

`torch.set_default_device` pushes a mode onto that stack; a test that leaves one (or any mode)
behind changes every later test's tensors. Upstream's TestCase notices it after each test by
the stack's depth and state, which only private entry points expose.
"""

from __future__ import annotations

from typing import Any


def mode_stack_depth() -> int:
    """How many torch-function modes are pushed (``torch._C._len_torch_function_stack``)."""
    import torch

    return int(torch._C._len_torch_function_stack())


def pop_modes(count: int) -> None:
    """Pop the `count` innermost torch-function modes (``torch._C._pop_torch_function_stack``)."""
    import torch

    for _ in range(count):
        torch._C._pop_torch_function_stack()


def dispatch_state() -> Any:
    """Whether torch functions dispatch to modes and subclasses now
    (``torch._C._get_torch_function_state``)."""
    import torch

    return torch._C._get_torch_function_state()


def set_dispatch_state(state: Any) -> None:
    """Set what `dispatch_state` returned (``torch._C._set_torch_function_state``)."""
    import torch

    torch._C._set_torch_function_state(state)
