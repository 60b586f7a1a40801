"""Helpers the FSDP suites use to compare, inspect and intercept FSDP.

They exist so that a suite can check *what FSDP did*, not only that it ran: that every rank holds
the same module state, that a sharded module matches a replicated reference shard by shard, that
gradient reduce-scatters carry the expected number of elements, and that ``fully_shard``'s
post-backward runs inside autograd. Patches are applied to what FSDP really calls in this torch
(``harness.compat.fsdp_collectives`` and ``harness.compat.fsdp2`` know where that is), and every
patch is undone on exit.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import unittest
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard

from harness import settings
from harness.compat import fsdp2, fsdp_collectives, inductor

__all__ = [
    "DummyProcessGroup",
    "_assert_module_states",
    "_broadcast_state_dict",
    "_get_state_dict",
    "_zero_model",
    "assert_module_states",
    "check_sharded_parity",
    "compiled_fsdp_test",
    "get_devtype",
    "get_full_params",
    "patch_all_gather",
    "patch_all_reduce",
    "patch_foreach_all_gather",
    "patch_foreach_reduce",
    "patch_post_backward",
    "patch_reduce_scatter",
    "patch_register_post_backward_hook_backward",
    "patch_reshard",
    "patch_unshard",
    "reduce_scatter_with_assert",
    "subtest_name",
]


def get_devtype() -> torch.device:
    """The device type FSDP tests run on, as a device: ``cuda`` with accelerators, else ``cpu``."""
    return torch.device(settings.device_type())


def subtest_name(test_name_mapping: Dict[str, str], *args: Any) -> str:
    """A subtest's name: each arg's entry in ``test_name_mapping`` (looked up by ``str(arg)``;
    ``"none"`` for None), joined by ``_``. Upstream files build parametrize names with it."""
    names = []
    for arg in args:
        if arg is None:
            names.append("none")
        elif str(arg) in test_name_mapping:
            names.append(test_name_mapping[str(arg)])
        else:
            raise KeyError(
                f"subtest_name: {str(arg)!r} is not a key of test_name_mapping "
                f"(keys: {', '.join(map(repr, test_name_mapping))})"
            )
    return "_".join(names)


def get_full_params(model: nn.Module, recurse: bool = True) -> List[nn.Parameter]:
    """Copies of ``model``'s unsharded (FSDP1 ``summon_full_params``) parameters.

    ``recurse=False`` unshards only the parameters of ``model``'s own FSDP instance.
    """
    with FSDP.summon_full_params(model, recurse=recurse):
        return copy.deepcopy(list(model.parameters()))


def _zero_model(model: nn.Module, zero_buffers: bool = False, summon_full: bool = True) -> None:
    """Zero ``model``'s parameters (and buffers) in place, unsharded first when ``summon_full``:
    a state-dict round trip that silently loads nothing then breaks parity."""
    context = FSDP.summon_full_params(model) if summon_full else contextlib.nullcontext()
    with context, torch.no_grad():
        for param in model.parameters():
            param.zero_()
        if zero_buffers:
            for buffer in model.buffers():
                buffer.zero_()


def _get_state_dict(
    model: nn.Module, cpu_offload: bool = False, half: bool = False
) -> Dict[str, Any]:
    """``model``'s state dict, after moving it to the test device (unless ``cpu_offload``) and
    casting it to half precision (when ``half``); both change ``model`` in place."""
    if not cpu_offload:
        model = model.to(get_devtype())
    if half:
        model.half()
    return model.state_dict()


def _broadcast_state_dict(rank: int, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """Rank 0's ``state_dict`` on every rank (sent through the CPU), on the test device."""
    for name, value in state_dict.items():
        if value.device != torch.device("cpu"):
            state_dict[name] = value.cpu()
    holder = [state_dict if rank == 0 else None]
    dist.broadcast_object_list(holder)
    received = holder[0]
    assert received is not None  # rank 0 sent it
    device = get_devtype()
    return {name: value.to(device) for name, value in received.items()}


class _CompletedWork:
    """A finished collective: what DummyProcessGroup's collectives return."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(1)
        return future


def _move_to_device(model: nn.Module, move_to_device: bool) -> nn.Module:
    """The model on the FSDP tests' device type when `move_to_device`, else unchanged."""
    return model.to(get_devtype()) if move_to_device else model


def _maybe_wrap_fsdp(model: nn.Module, wrap_fsdp: bool, *args: Any, **kwargs: Any) -> nn.Module:
    """The model wrapped in FSDP1 (with the arguments given) when `wrap_fsdp`, else as is."""
    return FSDP(model, *args, **kwargs) if wrap_fsdp else model


class DummyProcessGroup:
    """A stand-in process group of a given rank and size whose ``allreduce`` completes at once
    without communicating: for unit tests of code (communication hooks, state) that only asks a
    group its rank and size or waits on its work."""

    def __init__(self, rank: int, size: int) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(
                f"DummyProcessGroup needs 0 <= rank < size, got rank={rank}, size={size}"
            )
        self._rank = rank
        self._size = size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, *args: Any, **kwargs: Any) -> _CompletedWork:
        return _CompletedWork()


def assert_module_states(
    model: nn.Module,
    process_group: dist.ProcessGroup,
    assert_fn: Callable[[torch.Tensor, torch.Tensor], Any],
) -> None:
    """Check that every rank holds the same parameters and buffers as rank 0.

    Each rank's named parameters and buffers are gathered (as CPU tensors) to every rank, then
    ``assert_fn(rank0_tensor, rank_r_tensor)`` is called for every other rank ``r``. Names must
    match too, so ranks with differently structured modules fail instead of being zipped short.
    """
    if not callable(assert_fn):
        raise TypeError(f"assert_module_states: assert_fn must be callable, got {assert_fn!r}")
    local = [
        (name, tensor.detach().cpu())
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    ]
    world_size = dist.get_world_size(process_group)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local, group=process_group)
    reference = gathered[0]
    for rank in range(1, world_size):
        other = gathered[rank]
        ref_names = [name for name, _ in reference]
        other_names = [name for name, _ in other]
        if ref_names != other_names:
            raise AssertionError(
                f"module state names differ between rank 0 and rank {rank}: "
                f"{ref_names} vs {other_names}"
            )
        for (_, ref_tensor), (_, tensor) in zip(reference, other):
            assert_fn(ref_tensor, tensor)


_assert_module_states = assert_module_states


def _expected_local_shard(full: torch.Tensor, sharded: DTensor) -> torch.Tensor:
    """The part of ``full`` that ``sharded``'s placements put on this rank (torch.chunk layout)."""
    mesh = sharded.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("check_sharded_parity: this rank is not part of the parameter's mesh")
    local = full
    for mesh_dim, placement in enumerate(sharded.placements):
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, Shard):
            raise ValueError(f"check_sharded_parity: unsupported placement {placement!r}")
        chunks = torch.chunk(local, mesh.size(mesh_dim), dim=placement.dim)
        index = coordinate[mesh_dim]
        local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
    return local


def check_sharded_parity(
    cls: unittest.TestCase,
    replicated_module: nn.Module,
    sharded_module: nn.Module,
    prefixes_to_ignore: Iterable[str] = (),
) -> None:
    """Check that ``sharded_module`` (``fully_shard``) matches ``replicated_module`` shard by shard.

    Parameter names must correspond (after removing ``prefixes_to_ignore`` from the replicated
    names), every sharded parameter must be a DTensor, and its local shard and local gradient
    shard must equal the matching slice of the replicated parameter and gradient. A gradient
    present on one side only is a mismatch. No collectives are issued.
    """
    replicated = list(replicated_module.named_parameters())
    sharded = list(sharded_module.named_parameters())
    if len(replicated) != len(sharded):
        raise AssertionError(
            f"check_sharded_parity: {len(replicated)} replicated parameters but "
            f"{len(sharded)} sharded parameters"
        )
    for (name, param), (sharded_name, sharded_param) in zip(replicated, sharded):
        clean_name = name
        for prefix in prefixes_to_ignore:
            clean_name = clean_name.replace(prefix, "")
        cls.assertEqual(clean_name, sharded_name)
        if not isinstance(sharded_param, DTensor):
            raise AssertionError(
                f"check_sharded_parity: {sharded_name} is a {type(sharded_param).__name__}, "
                "not a DTensor (is the module sharded, and resharded?)"
            )
        expected = _expected_local_shard(param.detach(), sharded_param)
        cls.assertEqual(sharded_param.to_local().detach(), expected, msg=sharded_name)
        if param.grad is None:
            cls.assertIsNone(sharded_param.grad, msg=f"{sharded_name} has an unexpected gradient")
            continue
        cls.assertIsNotNone(sharded_param.grad, msg=f"{sharded_name} is missing its gradient")
        expected_grad = _expected_local_shard(param.grad, sharded_param)
        cls.assertEqual(sharded_param.grad.to_local(), expected_grad, msg=f"{sharded_name}.grad")


def _barrier_if_initialized() -> None:
    """Keep ranks in step around a patch (threaded ranks share the patched module)."""
    if dist.is_initialized():
        dist.barrier()


def _check_callable(helper: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{helper}: expected a callable, got {value!r}")


@contextlib.contextmanager
def _patched(owner: Any, name: str, new: Any) -> Iterator[None]:
    """Set ``owner.name = new`` for the block, restoring exactly what was there on exit.

    Ranks barrier after reading the original and before restoring it, so rank threads (which
    share the patched object) all see the same original and all run patched inside the block.
    """
    namespace = vars(owner)
    had_own, original = name in namespace, namespace.get(name)
    _barrier_if_initialized()
    setattr(owner, name, new)
    try:
        yield
    finally:
        _barrier_if_initialized()
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def patch_reduce_scatter(new_reduce_scatter: Callable[..., Any]) -> Iterator[None]:
    """Replace the reduce-scatter that FSDP calls for gradients by ``new_reduce_scatter``.

    ``new_reduce_scatter`` receives FSDP's arguments unchanged (``output``, ``input``, ``op``,
    ``group``, ``async_op``; positionally or by keyword). The original is restored on exit.
    """
    _check_callable("patch_reduce_scatter", new_reduce_scatter)
    with _patched(dist, fsdp_collectives.reduce_scatter_name(), new_reduce_scatter):
        yield


@contextlib.contextmanager
def patch_all_gather(new_all_gather_into_tensor: Callable[..., Any]) -> Iterator[None]:
    """Replace the single-tensor all-gather (``output``, ``input``, ``group``, ``async_op``) that
    ``fully_shard`` unshards with, as FSDP1 does on accelerators (FSDP1 on CPU all-gathers into a
    list instead); the original is restored on exit."""
    _check_callable("patch_all_gather", new_all_gather_into_tensor)
    with _patched(dist, fsdp_collectives.all_gather_name(), new_all_gather_into_tensor):
        yield


@contextlib.contextmanager
def patch_all_reduce(new_all_reduce: Callable[..., Any]) -> Iterator[None]:
    """Replace ``torch.distributed.all_reduce`` (what FSDP calls for HSDP's replica reduction and
    for ``NO_SHARD`` gradients); the original is restored on exit."""
    _check_callable("patch_all_reduce", new_all_reduce)
    with _patched(dist, "all_reduce", new_all_reduce):
        yield


@contextlib.contextmanager
def patch_foreach_all_gather(new_foreach_all_gather: Callable[..., Any]) -> Iterator[None]:
    """Replace ``fully_shard``'s ``foreach_all_gather`` as its param groups call it (same
    arguments); the original is restored on exit."""
    _check_callable("patch_foreach_all_gather", new_foreach_all_gather)
    with _patched(fsdp2.param_group_module(), "foreach_all_gather", new_foreach_all_gather):
        yield


@contextlib.contextmanager
def patch_foreach_reduce(new_foreach_reduce: Callable[..., Any]) -> Iterator[None]:
    """Replace ``fully_shard``'s ``foreach_reduce`` (gradient reduce-scatter and all-reduce of a
    param group) as its param groups call it; the original is restored on exit."""
    _check_callable("patch_foreach_reduce", new_foreach_reduce)
    with _patched(fsdp2.param_group_module(), "foreach_reduce", new_foreach_reduce):
        yield


@contextlib.contextmanager
def patch_unshard(new_unshard: Callable[..., Any]) -> Iterator[None]:
    """Replace ``FSDPParamGroup.unshard`` (a method: it receives the param group first, then
    ``async_op``); the original is restored on exit."""
    _check_callable("patch_unshard", new_unshard)
    with _patched(fsdp2.param_group_class(), "unshard", new_unshard):
        yield


@contextlib.contextmanager
def patch_reshard(new_reshard: Callable[..., Any]) -> Iterator[None]:
    """Replace ``FSDPParamGroup.reshard`` (a method taking the param group); the original is
    restored on exit."""
    _check_callable("patch_reshard", new_reshard)
    with _patched(fsdp2.param_group_class(), "reshard", new_reshard):
        yield


@contextlib.contextmanager
def patch_post_backward(new_post_backward: Callable[..., Any]) -> Iterator[None]:
    """Replace ``FSDPParamGroup.post_backward`` (a method taking the param group and any
    unused arguments); the original is restored on exit."""
    _check_callable("patch_post_backward", new_post_backward)
    with _patched(fsdp2.param_group_class(), "post_backward", new_post_backward):
        yield


@contextlib.contextmanager
def patch_register_post_backward_hook_backward(new_backward: Callable[..., Any]) -> Iterator[None]:
    """Replace the backward of ``fully_shard``'s post-backward autograd Function.

    ``new_backward(ctx, *grads)`` runs whenever autograd reaches a parameter group's
    post-backward (as opposed to the end-of-backward callback); it usually counts and then
    calls the original. The original is restored on exit.
    """
    _check_callable("patch_register_post_backward_hook_backward", new_backward)
    function_cls = fsdp2.register_post_backward_function()
    with _patched(function_cls, "backward", staticmethod(new_backward)):
        yield


def compiled_fsdp_test(
    compile_compute_on_module: Optional[type] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run a ``fully_shard`` test eagerly, then again with each sharded module's compute compiled.

    The second run rebinds ``fully_shard`` in the test function's module globals (where
    ``from torch.distributed.fsdp import fully_shard`` put it) to one that also calls
    ``module.compile()`` on every module it shards (only instances of
    ``compile_compute_on_module`` when given). Without Triton (as on CPU) the compiled run is
    left out with a warning, as upstream does.
    """

    def fully_shard_compiled(*args: Any, **kwargs: Any) -> Any:
        sharded = fully_shard(*args, **kwargs)
        module = args[0] if args else kwargs["module"]
        if compile_compute_on_module is None or isinstance(module, compile_compute_on_module):
            module.compile()
        return sharded

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            func(*args, **kwargs)  # eager
            if not inductor.has_triton():
                warnings.warn("Inductor on GPU needs Triton and recent GPU arch", stacklevel=2)
                return
            scope = func.__globals__
            had, original = "fully_shard" in scope, scope.get("fully_shard")
            _barrier_if_initialized()  # rank threads share the globals: patch them together
            scope["fully_shard"] = fully_shard_compiled
            try:
                with inductor.compile_threads(1):
                    func(*args, **kwargs)
            finally:
                _barrier_if_initialized()
                if had:
                    scope["fully_shard"] = original
                else:
                    del scope["fully_shard"]

        return wrapper

    return decorator


def reduce_scatter_with_assert(
    cls: unittest.TestCase,
    orig_reduce_scatter: Callable[..., Any],
    assert_fn: Callable[[torch.Tensor], Any],
    output: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``assert_fn(output)`` on a reduce-scatter's output, then the real reduce-scatter.

    Meant for ``functools.partial(reduce_scatter_with_assert, self, orig, assert_fn)`` passed to
    :func:`patch_reduce_scatter`; ``cls`` is the running test case (upstream signature).
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"reduce_scatter_with_assert ({type(cls).__name__}): output must be a tensor, "
            f"got {type(output).__name__}"
        )
    assert_fn(output)
    return orig_reduce_scatter(output, *args, **kwargs)
