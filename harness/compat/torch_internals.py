"""The one place that touches private torch symbols.

Private names move between torch releases; each lookup below says what it is for and
tries the locations known for this torch (2.13) and earlier ones, so a move breaks
one function here instead of every suite.
"""

from __future__ import annotations

import contextlib
import functools
from importlib import import_module
from typing import Any, Callable, Iterator, Sequence, Tuple


def first_attr(candidates: Sequence[Tuple[str, str]]) -> Any:
    """The first `module.attr` of `candidates` that exists; ImportError naming all tried."""
    for module_name, attr in candidates:
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
    tried = ", ".join(f"{m}.{a}" for m, a in candidates)
    raise ImportError(f"none of these exist in this torch: {tried}")


# --- fsdp helpers ---
# Where FSDP's private pieces live in this torch. The FSDP helpers, the FSDP suites and the
# strictness test reach them only through these functions.


def fsdp_reduce_scatter_name() -> str:
    """Name of the ``torch.distributed`` function FSDP calls to reduce-scatter gradients.

    Both FSDP1 and ``fully_shard`` call ``dist.reduce_scatter_single`` in this torch; older
    releases called ``dist.reduce_scatter_tensor``. Patching anything else has no effect.
    """
    import torch.distributed as dist

    if hasattr(dist, "reduce_scatter_single"):
        return "reduce_scatter_single"
    return "reduce_scatter_tensor"


def fsdp_all_gather_name() -> str:
    """Name of the ``torch.distributed`` function FSDP1 calls to all-gather flat parameters.

    ``dist.all_gather_single`` in this torch; older releases called
    ``dist.all_gather_into_tensor``.
    """
    import torch.distributed as dist

    if hasattr(dist, "all_gather_single"):
        return "all_gather_single"
    return "all_gather_into_tensor"


def fsdp_param_group_module() -> Any:
    """``fully_shard``'s param-group module, whose ``foreach_all_gather``/``foreach_reduce``
    globals the param group calls (patching them there is what reaches FSDP2)."""
    return first_attr(
        [
            (f"torch.distributed.{package}", "_fsdp_param_group")
            for package in ("fsdp._fully_shard", "_composable.fsdp")  # torch >= 2.6, older
        ]
    )


def fsdp_param_group_class() -> type:
    """``fully_shard``'s ``FSDPParamGroup`` (its ``unshard``/``reshard``/``post_backward``)."""
    return fsdp_param_group_module().FSDPParamGroup


def fsdp1_no_reshard_after_forward_strategies() -> Tuple[Any, ...]:
    """FSDP1 sharding strategies that keep parameters unsharded after forward (``_init_utils``)."""
    from torch.distributed.fsdp import _init_utils

    return tuple(_init_utils.NO_RESHARD_AFTER_FORWARD_STRATEGIES)


def fsdp1_assert_idle(fsdp_model: Any) -> None:
    """Raise unless an FSDP1 root is back in its IDLE training state (after a full step)."""
    from torch.distributed.fsdp._common_utils import TrainingState

    fsdp_model._assert_state(TrainingState.IDLE)


@functools.cache
def _cuda_cycles_per_ms() -> float:
    """How many ``torch.cuda._sleep`` cycles take a millisecond on this GPU (measured once)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def cuda_stream_sleep(ms: float) -> None:
    """Keep the current CUDA stream busy for about ``ms`` milliseconds (``torch.cuda._sleep``),
    without blocking the host: what delays a GPU-side collective or reshard."""
    import torch

    torch.cuda._sleep(int(ms * _cuda_cycles_per_ms()))


def has_triton() -> bool:
    """Whether Inductor can generate GPU kernels here (``torch.utils._triton.has_triton``)."""
    from torch.utils._triton import has_triton as triton_available

    return bool(triton_available())


@contextlib.contextmanager
def inductor_compile_threads(threads: int) -> Iterator[None]:
    """Set ``torch._inductor.config.compile_threads`` for the block, restoring it after."""
    import torch._inductor.config as inductor_config

    saved = inductor_config.compile_threads
    inductor_config.compile_threads = threads
    try:
        yield
    finally:
        inductor_config.compile_threads = saved


def register_post_backward_function() -> type:
    """``fully_shard``'s autograd Function whose backward runs a param group's post-backward."""
    return first_attr(
        [
            (f"torch.distributed.{package}._fsdp_param_group", "RegisterPostBackwardFunction")
            for package in ("fsdp._fully_shard", "_composable.fsdp")  # torch >= 2.6, older
        ]
    )


def composable_replicate(module: Any, **kwargs: Any) -> Any:
    """``torch.distributed._composable.replicate``: DDP in place, keeping the module's type."""
    from torch.distributed._composable import replicate

    return replicate(module, **kwargs)


def composable_checkpoint(module: Any) -> Any:
    """``torch.distributed._composable.checkpoint``: activation checkpointing applied in place."""
    from torch.distributed._composable import checkpoint

    return checkpoint(module)


def fsdp1_unsharded_handles(module: Any) -> list[str]:
    """Names of FSDP1 instances under ``module`` whose sharded flat parameter is unsharded now.

    A handle counts as unsharded when its padded unsharded storage is allocated or its flat
    parameter does not point at the local shard. ``NO_SHARD`` handles never count.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    names = []
    for name, sub in module.named_modules():
        handle = sub._handle if isinstance(sub, FullyShardedDataParallel) else None
        if handle is None or not handle.uses_sharded_strategy:
            continue
        if not handle.needs_unshard() or not handle.is_sharded(handle.flat_param):
            names.append(name or "<root>")
    return names


@contextlib.contextmanager
def record_fsdp1_post_backward_reshards() -> Iterator[list[Any]]:
    """Record every FSDP1 post-backward reshard (one list entry, the FlatParamHandle, per call).

    FSDP1 reshards each handle in the post-backward through
    ``_runtime_utils._post_backward_reshard``, both for flat parameters that require gradients
    and for frozen ones (through the reshard-only hook); the end-of-backward catch-all reshard
    does not go through it.
    """
    from torch.distributed.fsdp import _runtime_utils

    calls: list[Any] = []
    orig = _runtime_utils._post_backward_reshard

    def recording(state: Any, handle: Any, *args: Any) -> Any:
        calls.append(handle)
        return orig(state, handle, *args)

    _runtime_utils._post_backward_reshard = recording
    try:
        yield calls
    finally:
        _runtime_utils._post_backward_reshard = orig


def fsdp1_exec_order_class() -> type:
    """FSDP1's execution-order bookkeeping (its ``_check_order`` validates the forward order)."""
    from torch.distributed.fsdp._exec_order_utils import _ExecOrderData

    return _ExecOrderData


def fsdp1_runtime_module() -> Any:
    """FSDP1's runtime hooks module (``_runtime_utils``); fault-injection tests patch it."""
    return import_module("torch.distributed.fsdp._runtime_utils")


# --- models / test_misc ---
# FSDP1 internals that test_misc inspects (flat parameters, env knobs, the homogeneous-attribute
# list) and two private distributed entry points it calls.


def default_process_group() -> Any:
    """The default (WORLD) process group, as ``distributed_c10d._get_default_group`` returns it."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def fsdp_handles(module: Any) -> list[Any]:
    """Every FSDP1 ``FlatParamHandle`` in ``module``'s tree (``_traversal_utils``)."""
    from torch.distributed.fsdp import _traversal_utils

    return list(_traversal_utils._get_fsdp_handles(module))


def fsdp_flat_param(fsdp_module: Any) -> Any:
    """The ``FlatParameter`` an FSDP1 instance manages itself, or None when it manages none."""
    handle = fsdp_module._handle
    return handle.flat_param if handle is not None else None


def fsdp_flat_param_resharded(fsdp_module: Any) -> Tuple[bool, int, bool] | None:
    """Facts that say whether an FSDP1 instance is resharded, or None when it has no handle.

    Returns ``(uses_sharded_strategy, unsharded_storage_size, points_at_local_shard)``: the
    padded unsharded buffer's storage size (0 once freed; 0 also for ``NO_SHARD``, which
    has none) and whether the flat parameter's data is its local shard.
    """
    handle = fsdp_module._handle
    if handle is None:
        return None
    flat_param = handle.flat_param
    sharded = bool(handle.uses_sharded_strategy)
    storage = flat_param._full_param_padded.untyped_storage().size() if sharded else 0
    return sharded, storage, flat_param.data_ptr() == flat_param._local_shard.data_ptr()


def fsdp_unsafe_setattr_env() -> str:
    """Env var that makes FSDP1 bypass ``nn.Module.__setattr__`` (``_flat_param``)."""
    from torch.distributed.fsdp._flat_param import _FSDP_USE_UNSAFE_SETATTR

    return _FSDP_USE_UNSAFE_SETATTR


def fsdp_full_prec_in_eval_env() -> str:
    """Env var that makes FSDP1 run eval in full precision (``_flat_param``)."""
    from torch.distributed.fsdp._flat_param import _FSDP_USE_FULL_PREC_IN_EVAL

    return _FSDP_USE_FULL_PREC_IN_EVAL


def fsdp_homogeneous_attr_names() -> Tuple[str, ...]:
    """FSDP1 state attributes that must agree across nested instances (``_runtime_utils``)."""
    from torch.distributed.fsdp import _runtime_utils

    return tuple(_runtime_utils.HOMOGENEOUS_ATTR_NAMES)


def hybrid_shard_zero2() -> Any:
    """``ShardingStrategy._HYBRID_SHARD_ZERO2``: hybrid sharding that keeps params unsharded."""
    from torch.distributed.fsdp import ShardingStrategy

    return ShardingStrategy._HYBRID_SHARD_ZERO2


def apply_optimizer_in_backward(**kwargs: Any) -> None:
    """``torch.distributed.optim._apply_optimizer_in_backward`` (optimizer step in backward)."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    _apply_optimizer_in_backward(**kwargs)


def tensor_backward_hooks(tensor: Any) -> list[Any]:
    """Hooks registered on ``tensor`` with ``register_hook`` (its ``_backward_hooks``)."""
    hooks = tensor._backward_hooks
    return list(hooks.values()) if hooks else []


# --- fault injection (used by tests/test_strictness.py) ---
# Each fault breaks one thing an FSDP suite promises to check, in the interpreter that calls it.
# tests/test_strictness.py installs one per run, in every interpreter of the run, and asserts
# that the suite tests guarding against it fail.


class _FaultyReductionDist:
    """``torch.distributed`` as FSDP1's runtime module sees it, except for the two calls that
    reduce gradients (``reduce_scatter_single``, ``all_reduce``), which ``mode`` breaks:
    ``"sum"`` sums instead of averaging, ``"local"`` communicates nothing."""

    def __init__(self, mode: str) -> None:
        import torch.distributed

        self._dist = torch.distributed
        self._mode = mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def reduce_scatter_single(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> None:
        group = kwargs.get("group")
        if self._mode == "local":
            rank, size = self._dist.get_rank(group), self._dist.get_world_size(group)
            output.copy_(input.view(size, -1)[rank])
            return
        self._wait(self._dist.reduce_scatter_single(output, input, *args, **kwargs))
        output.mul_(self._dist.get_world_size(group))

    def all_reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> None:
        if self._mode == "local":
            return
        self._wait(self._dist.all_reduce(tensor, *args, **kwargs))
        tensor.mul_(self._dist.get_world_size(kwargs.get("group")))

    @staticmethod
    def _wait(work: Any) -> None:
        if work is not None:
            work.wait()


def fault_fsdp1_gradient_sum_not_mean() -> None:
    """FSDP1 sums gradients across ranks instead of averaging them (scaled by the group size)."""
    fsdp1_runtime_module().dist = _FaultyReductionDist("sum")


def fault_fsdp1_gradient_not_reduced() -> None:
    """FSDP1 does not communicate gradients: each rank keeps its own."""
    fsdp1_runtime_module().dist = _FaultyReductionDist("local")


def fault_no_sync_module_states() -> None:
    """FSDP1's ``sync_module_states=True`` neither checks nor broadcasts anything."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._sync_module_params_and_buffers = lambda *args, **kwargs: None


def fault_no_homogeneous_check() -> None:
    """FSDP1 accepts nested instances whose homogeneous attributes differ."""
    runtime = fsdp1_runtime_module()
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
    fsdp1_runtime_module()._register_pre_backward_hooks = lambda state, module, outputs, h: outputs


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
    import torch.distributed as dist

    name = fsdp_reduce_scatter_name()
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
    fsdp1_exec_order_class()._check_order = lambda self, handle, is_training: None


def fault_frozen_not_resharded_in_backward() -> None:
    """FSDP1 registers no post-backward reshard hook for flat parameters without gradients."""
    fsdp1_runtime_module()._register_post_backward_reshard_only_hook = lambda *a, **k: None


def fault_post_backward_outside_autograd() -> None:
    """fully_shard's autograd post-backward does nothing; the final callback does it all."""
    register_post_backward_function().backward = staticmethod(lambda ctx, *grads: (None, *grads))


def fault_checkpoint_load_noop() -> None:
    """``torch.distributed.checkpoint.load`` returns without loading anything."""
    import torch.distributed.checkpoint as dcp

    dcp.load = lambda state_dict, **kwargs: None


class _ScaledReductionDist:
    """``torch.distributed`` as an FSDP runtime module sees it, except that each reduce-scatter
    and all-reduce result (FSDP reduces only gradients with them) is multiplied by ``factor``."""

    def __init__(self, factor: float) -> None:
        import torch.distributed

        self._dist = torch.distributed
        self._factor = factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def _scaled(self, collective: str, result: Any, *args: Any, **kwargs: Any) -> Any:
        work = getattr(self._dist, collective)(*args, **kwargs)
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
    fsdp1_runtime_module().dist = scaled
    for package in ("fsdp._fully_shard", "_composable.fsdp"):  # torch >= 2.6, older
        try:
            import_module(f"torch.distributed.{package}._fsdp_collectives").dist = scaled
            return
        except ImportError:
            continue
    raise ImportError("gradient_reduction_scaled: fully_shard's _fsdp_collectives not found")


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
