"""Faults that break FSDP on purpose, for tests/test_strictness.py.

Each fault breaks one thing an FSDP suite promises to check, in the interpreter that installs
it; test_strictness installs one per run, in every interpreter of the run (runner, forkserver,
ranks), and asserts that the suite tests guarding against it fail. Breaking torch is no part of
what the harness ships, so this lives with the harness's own tests, not in ``harness/``; by
nature it patches FSDP's private internals, finding them through ``harness.compat`` where the
library already looks them up. (Not to be confused with tests/fault_cases.py: test cases that
fail on purpose to check how the harness reports them.)
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from harness.compat import fsdp1, fsdp2, fsdp_collectives
from harness.compat.lookup import first_attr


class _FaultyReductionDist:
    """``torch.distributed`` as FSDP1's runtime module sees it, except for the two calls that
    reduce gradients (``reduce_scatter_single``, ``all_reduce``), which ``mode`` breaks:
    ``"sum"`` sums instead of averaging, ``"local"`` communicates nothing."""

    def __init__(self, mode: str) -> None:
        self._mode = mode

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def reduce_scatter_single(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> None:
        group = kwargs.get("group")
        if self._mode == "local":
            rank, size = dist.get_rank(group), dist.get_world_size(group)
            output.copy_(input.view(size, -1)[rank])
            return
        self._wait(dist.reduce_scatter_single(output, input, *args, **kwargs))
        output.mul_(dist.get_world_size(group))

    def all_reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> None:
        if self._mode == "local":
            return
        self._wait(dist.all_reduce(tensor, *args, **kwargs))
        tensor.mul_(dist.get_world_size(kwargs.get("group")))

    @staticmethod
    def _wait(work: Any) -> None:
        if work is not None:
            work.wait()


def fault_fsdp1_gradient_sum_not_mean() -> None:
    """FSDP1 sums gradients across ranks instead of averaging them (scaled by the group size)."""
    fsdp1.runtime_module().dist = _FaultyReductionDist("sum")


def fault_fsdp1_gradient_not_reduced() -> None:
    """FSDP1 does not communicate gradients: each rank keeps its own."""
    fsdp1.runtime_module().dist = _FaultyReductionDist("local")


def fault_no_sync_module_states() -> None:
    """FSDP1's ``sync_module_states=True`` neither checks nor broadcasts anything."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._sync_module_params_and_buffers = lambda *args, **kwargs: None


def fault_no_homogeneous_check() -> None:
    """FSDP1 accepts nested instances whose homogeneous attributes differ."""
    runtime = fsdp1.runtime_module()
    original = runtime._share_state_and_init_handle_attrs

    def share_without_check(root_state: Any, root_module: Any) -> None:
        try:
            original(root_state, root_module)
        except ValueError as error:
            if "homogeneous" not in str(error):
                raise

    runtime._share_state_and_init_handle_attrs = share_without_check


def fault_no_pre_backward_hooks() -> None:
    """FSDP1 registers no pre-backward hooks on forward outputs."""
    fsdp1.runtime_module()._register_pre_backward_hooks = lambda state, module, outputs, h: outputs


def fault_ignored_modules_not_ignored() -> None:
    """FSDP1 drops ``ignored_modules``: it manages (flattens, moves) those modules too."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._get_ignored_modules = lambda root_module, ignored_modules: set()


def fault_unsafe_setattr_env_ignored() -> None:
    """FSDP1 always takes the safe setattr path, whatever FSDP_USE_UNSAFE_SETATTR says."""
    from torch.distributed.fsdp import _flat_param

    def safe_only(handle: Any) -> None:
        handle._setattr_tensor = _flat_param._safe_setattr_tensor_or_param
        handle._setattr_param = _flat_param._safe_setattr_tensor_or_param

    _flat_param.FlatParamHandle._init_setattr_fns = safe_only


def _break_reduce_scatter(mode: str) -> None:
    """Break the public reduce-scatter both FSDP1 and ``fully_shard`` call for gradients.

    ``"sum"``: the reduced shard is multiplied by the world size (a sum, not a mean).
    ``"local"``: nothing is communicated; each rank keeps its slice of its own gradient.
    DDP reduces with all_reduce and stays correct, so it remains a valid reference.
    """
    name = fsdp_collectives.reduce_scatter_name()
    original = getattr(dist, name)

    def broken(output: Any, input: Any, op: Any = None, group: Any = None, async_op: bool = False):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if mode == "local":
            output.copy_(input.view(size, -1)[rank].view_as(output))
        else:
            kwargs = {} if op is None else {"op": op}
            work = original(output, input, group=group, async_op=async_op, **kwargs)
            if work is not None:
                work.wait()
            output.mul_(size)
        return None

    setattr(dist, name, broken)


def fault_reduce_scatter_sum_not_mean() -> None:
    """Gradient reduce-scatter (FSDP1 and fully_shard) sums instead of averaging."""
    _break_reduce_scatter("sum")


def fault_reduce_scatter_not_reduced() -> None:
    """Gradient reduce-scatter (FSDP1 and fully_shard) communicates nothing."""
    _break_reduce_scatter("local")


def fault_no_exec_order_check() -> None:
    """FSDP1 never validates the forward order (not across ranks, not across iterations)."""
    from torch.distributed.fsdp._exec_order_utils import _ExecOrderData

    _ExecOrderData._check_order = lambda self, handle, is_training: None


def fault_frozen_not_resharded_in_backward() -> None:
    """FSDP1 registers no post-backward reshard hook for flat parameters without gradients."""
    fsdp1.runtime_module()._register_post_backward_reshard_only_hook = lambda *a, **k: None


def fault_post_backward_outside_autograd() -> None:
    """fully_shard's autograd post-backward does nothing; the final callback does it all."""
    fsdp2.register_post_backward_function().backward = staticmethod(
        lambda ctx, *grads: (None, *grads)
    )


def fault_checkpoint_load_noop() -> None:
    """``torch.distributed.checkpoint.load`` returns without loading anything."""
    import torch.distributed.checkpoint as dcp

    dcp.load = lambda state_dict, **kwargs: None


class _ScaledReductionDist:
    """``torch.distributed`` as an FSDP runtime module sees it, except that each reduce-scatter
    and all-reduce result (FSDP reduces only gradients with them) is multiplied by ``factor``."""

    def __init__(self, factor: float) -> None:
        self._factor = factor

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def _scaled(self, collective: str, result: Any, *args: Any, **kwargs: Any) -> Any:
        work = getattr(dist, collective)(*args, **kwargs)
        if work is not None:
            work.wait()
        result.mul_(self._factor)
        return work

    def reduce_scatter_single(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        return self._scaled("reduce_scatter_single", output, output, input, *args, **kwargs)

    def reduce_scatter_tensor(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        return self._scaled("reduce_scatter_tensor", output, output, input, *args, **kwargs)

    def all_reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return self._scaled("all_reduce", tensor, tensor, *args, **kwargs)


def fault_gradient_reduction_scaled() -> None:
    """Every gradient FSDP1 or ``fully_shard`` reduce-scatters or all-reduces comes out 3x.

    A constant scale that Adam barely sees: only a test that compares gradients catches it.
    DDP reduces in C++ and stays correct, so it remains a valid reference.
    """
    scaled = _ScaledReductionDist(3.0)
    fsdp1.runtime_module().dist = scaled
    fully_shard_collectives = first_attr(
        [
            (f"torch.distributed.{package}", "_fsdp_collectives")
            for package in ("fsdp._fully_shard", "_composable.fsdp")  # torch >= 2.6, older
        ]
    )
    fully_shard_collectives.dist = scaled


FAULTS: dict[str, Callable[[], None]] = {
    "fsdp1_gradient_sum_not_mean": fault_fsdp1_gradient_sum_not_mean,
    "fsdp1_gradient_not_reduced": fault_fsdp1_gradient_not_reduced,
    "no_sync_module_states": fault_no_sync_module_states,
    "no_homogeneous_check": fault_no_homogeneous_check,
    "no_pre_backward_hooks": fault_no_pre_backward_hooks,
    "ignored_modules_not_ignored": fault_ignored_modules_not_ignored,
    "unsafe_setattr_env_ignored": fault_unsafe_setattr_env_ignored,
    "reduce_scatter_sum_not_mean": fault_reduce_scatter_sum_not_mean,
    "reduce_scatter_not_reduced": fault_reduce_scatter_not_reduced,
    "no_exec_order_check": fault_no_exec_order_check,
    "frozen_not_resharded_in_backward": fault_frozen_not_resharded_in_backward,
    "post_backward_outside_autograd": fault_post_backward_outside_autograd,
    "checkpoint_load_noop": fault_checkpoint_load_noop,
    "gradient_reduction_scaled": fault_gradient_reduction_scaled,
}


def install_fault(name: str) -> None:
    """Break torch in this interpreter as ``FAULTS[name]`` says; ValueError for unknown names."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
    FAULTS[name]()
