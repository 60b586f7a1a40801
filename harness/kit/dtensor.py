"""DTensor test bases, as upstream's common_dtensor: multi-process, threaded and LocalTensor.

- `DTensorTestBase` (one process per rank): a test opts into its process group with
  `@with_comms` (or `@with_comms(eager_init=..., backend=...)`, handed to `init_pg`);
  `@with_temp_dir` below it gives all ranks one shared directory.
- `DTensorOpTestBase` (one thread per rank): for op tests that need no real processes.
- `create_local_tensor_test_class(cls)` makes `<Class>WithLocalTensor`: the same tests run
  once, in this process, with every rank simulated by torch's LocalTensor (a private torch
  feature, reached through harness/compat/local_tensor.py) on a group that communicates
  nothing. `map_local_tensor_for_rank` lets such a test compute per-rank expectations.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import tempfile
import unittest
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from harness import settings
from harness.compat import local_tensor as compat_local_tensor
from harness.compat.local_tensor import tree_flatten, tree_unflatten
from harness.launch.in_process import SimulatedRanks
from harness.launch.launcher import Launcher
from harness.process.continuous import MultiProcContinuousTest
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.requirements.decorators import TEST_SKIPS, accelerators_suffice, skip_if_lt_x_gpu
from harness.single_process.testcase import TestCase
from harness.threads.multithreaded_case import MultiThreadedTestCase

DEFAULT_WORLD_SIZE = settings.DEFAULT_WORLD_SIZE  # upstream's NUM_DEVICES without 2-3 GPUs

T = TypeVar("T")


def _ranks_for(accelerators: int) -> int:
    return min(DEFAULT_WORLD_SIZE, accelerators) if accelerators > 1 else DEFAULT_WORLD_SIZE


def num_devices() -> int:
    """Ranks a DTensor test uses: 4, or fewer when 2-3 accelerators are present (as upstream)."""
    return _ranks_for(settings.accelerator_count())


def _accelerators_at_import() -> int:
    """The accelerator count for the module constants; a bad HARNESS_DEVICE must not break
    `import harness` (the bases report it, one line, when a test runs)."""
    try:
        return settings.accelerator_count()
    except settings.HarnessConfigError:
        return 0


# Upstream's module constants, fixed at import; the bases ask again at call time.
NUM_DEVICES = _ranks_for(_accelerators_at_import())
DEVICE_TYPE = "cuda" if _accelerators_at_import() > 0 else "cpu"
PG_BACKEND = settings.backend_for(DEVICE_TYPE)


def skip_unless_torch_gpu(method: T) -> T:
    """Skip unless there are as many accelerators as a DTensor test has ranks."""
    return skip_if_lt_x_gpu(num_devices())(method)  # type: ignore[return-value]


class DTensorTestMixin:
    """Helpers every DTensor base shares: mesh, device type, per-rank seed, op checks."""

    rank: Any
    world_size: int
    assertEqual: Callable[..., None]

    @property
    def is_local_tensor_enabled(self) -> bool:
        """Whether LocalTensor simulates all ranks in one process (*WithLocalTensor classes)."""
        return False

    @property
    def device_type(self) -> str:
        """The accelerator type when there is one per rank, else "cpu" (as upstream)."""
        if settings.accelerator_count() < self.world_size:
            return "cpu"
        return settings.device_type()

    def build_device_mesh(self) -> DeviceMesh:
        """A 1-D mesh over all ranks on this test's device type."""
        return init_device_mesh(self.device_type, (self.world_size,))

    def init_manual_seed_for_rank(self) -> None:
        """Seed torch with this rank's number, so ranks draw different values."""
        torch.manual_seed(self.rank)

    def _test_op_on_dtensor(self, op_call: Callable, *args: Any, **kwargs: Any) -> None:
        """Check op(dtensors).full_tensor() equals op on the same arguments' full tensors."""
        flat_args, spec = tree_flatten(args)
        full_args = tree_unflatten(
            [a.full_tensor().detach().clone() if isinstance(a, DTensor) else a for a in flat_args],
            spec,
        )
        full_kwargs = {
            k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in kwargs.items()
        }
        expected, _ = tree_flatten(op_call(*full_args, **full_kwargs))
        actual, _ = tree_flatten(op_call(*args, **kwargs))
        self.assertEqual(expected, [out.full_tensor() for out in actual])

    def _test_op(self, mesh: DeviceMesh, op_call: Callable, *args: Any, **kwargs: Any) -> None:
        """Check op_call over every sharding DTensorConverter makes of the arguments."""
        expected = op_call(*args, **kwargs)
        converter = DTensorConverter(mesh, args, kwargs)
        for d_args, d_kwargs in converter:
            self.assertEqual(converter.successful(), True)
            self.assertEqual(op_call(*d_args, **d_kwargs).full_tensor(), expected)


class DTensorTestBase(DTensorTestMixin, MultiProcessTestCase):
    """One process per rank (4 by default); `@with_comms` gives a test its process group."""

    @property
    def world_size(self) -> int:
        return num_devices()

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()  # as upstream's: the rest of a subclass's setUp is the parent's

    @property
    def backend(self) -> str:
        """The default collective backend of this test's device type (gloo on CPU)."""
        return settings.backend_for(self.device_type)

    def _supported_backends(self) -> Tuple[str, ...]:
        own = f"cpu:gloo,{self.device_type}:{self.backend}"
        return (
            "nccl", "gloo", "mpi", own, "cpu:gloo", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:ncclx",
            "cuda:ncclx", "hccl", "xccl", "fake", "cpu:gloo,xpu:xccl",
        )

    def init_pg(self, eager_init: bool, backend: Optional[str] = None) -> None:
        """Initialise the default group through this test's rendezvous file.

        `eager_init` binds an accelerator backend to the rank's device at once (so its
        communicator exists before the first collective); `backend` defaults to `self.backend`.
        """
        if backend is None:
            backend = self.backend
        if backend not in self._supported_backends():
            raise RuntimeError(f"Backend {backend} not supported!")
        if any(name in backend for name in settings.ACCELERATOR_BACKENDS):
            found = settings.accelerator_count()
            if not accelerators_suffice(self.world_size):
                known = TEST_SKIPS.get(f"multi-gpu-{self.world_size}")
                need = known.message if known else f"Need at least {self.world_size} devices"
                raise unittest.SkipTest(
                    f"{need}: backend {backend} needs one per rank, found {found}"
                )
            if found == 0:  # HARNESS_ALLOW_CPU=1: the CPU stands in, with the CPU's backend
                backend = settings.backend_for("cpu")
        if backend == compat_local_tensor.FAKE_BACKEND:
            compat_local_tensor.register_fake_backend()
        device_id = None
        if "nccl" in backend or "xccl" in backend:
            device = settings.rank_device(self.rank)
            torch.accelerator.set_device_index(device.index)
            device_id = device if eager_init else None
        dist.init_process_group(
            backend=backend,
            init_method=self.init_method,
            rank=self.rank,
            world_size=self.world_size,
            device_id=device_id,
        )

    def destroy_pg(self, device_id: Optional[int] = None) -> None:
        """Wait for every rank (on `device_id`'s accelerator unless CPU), then destroy the group."""
        if self.device_type == "cpu":
            dist.barrier()
        else:
            if device_id is None:
                device_id = torch.accelerator.current_device_index()
            dist.barrier(device_ids=[device_id])
        dist.destroy_process_group()


class DTensorContinuousTestBase(DTensorTestMixin, MultiProcContinuousTest):
    """DTensor helpers on upstream's shared-process base (harness/process/continuous.py)."""

    @classmethod
    def backend_str(cls) -> str:
        return settings.backend_for(settings.device_type())

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        """Bind each rank to its accelerator first; skip with fewer accelerators than ranks."""
        found = settings.accelerator_count()
        if found > 0:
            if world_size > found:
                raise unittest.SkipTest(
                    f"Need at least {world_size} CUDA devices: one per rank, found {found}"
                )
            torch.accelerator.set_device_index(settings.rank_device(rank).index)
        super()._init_pg(rank, world_size, rdvz_file)


TestFunc = Callable[..., Any]


def _comms_wrapper(func: TestFunc, eager_init: bool, backend: Optional[str]) -> TestFunc:
    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(self, "init_pg"):  # a base whose ranks already have a group
            return func(self, *args, **kwargs)
        self.init_pg(eager_init, backend)
        try:
            result = func(self, *args, **kwargs)
        except BaseException:
            if dist.is_initialized():
                dist.destroy_process_group()  # no barrier: the other ranks may never reach it
            raise
        self.destroy_pg()
        return result

    return wrapper


def with_comms(
    eager_init: TestFunc | bool = False, backend: Optional[str] = None
) -> TestFunc:
    """Run the test inside a default process group created for it and destroyed after it.

    Use bare (`@with_comms`) or called (`@with_comms(eager_init=True, backend="gloo")`);
    the arguments go to `self.init_pg`. On a base without `init_pg` (DTensorOpTestBase,
    whose rank threads already have a group) the test just runs.
    """
    if callable(eager_init):
        return _comms_wrapper(eager_init, False, backend)
    if not isinstance(eager_init, bool):
        raise TypeError(f"with_comms: eager_init must be a bool, got {eager_init!r}")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"with_comms: backend must be a str or None, got {backend!r}")
    return functools.partial(_comms_wrapper, eager_init=eager_init, backend=backend)


def with_temp_dir(func: Callable) -> Callable:
    """Give every rank the same fresh `self.temp_dir`: rank 0 creates it, all ranks learn it.

    Needs the default group (put `@with_comms` above it). The directory is removed once
    every rank is done with it.
    """

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not dist.is_initialized():
            raise RuntimeError(
                f"with_temp_dir on {func.__name__} needs a process group: put @with_comms above it"
            )
        is_first = dist.get_rank() == 0
        shared = [tempfile.mkdtemp(prefix="harness-temp-dir-") if is_first else None]
        dist.broadcast_object_list(shared, src=0)
        self.temp_dir = shared[0]
        try:
            result = func(self, *args, **kwargs)
            dist.barrier()  # nobody still reads the directory when rank 0 removes it
        finally:
            if is_first:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        return result

    return wrapper


class DTensorOpTestBase(MultiThreadedTestCase):
    """One thread per rank (4 by default), each with its default group, for DTensor op tests."""

    @property
    def world_size(self) -> int:
        return num_devices()

    @property
    def device_type(self) -> str:
        return settings.device_type()

    def build_device_mesh(self) -> DeviceMesh:
        """A 1-D mesh over all ranks on this test's device type."""
        return init_device_mesh(self.device_type, (self.world_size,))

    def setUp(self) -> None:
        super().setUp()
        # Rank threads propagate shardings concurrently: give the propagator a real lock
        # before they start, and the original back when the test ends.
        guard = compat_local_tensor.thread_safe_sharding_propagation()
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)
        self._spawn_threads()  # as upstream's: the rest of a subclass's setUp is the parent's


class DTensorConverter:
    """Iterates over every placement combination (Replicate, or an even Shard) of an op's args.

    Each step yields (args, kwargs) with every tensor turned into a DTensor on `mesh`;
    `successful()` says whether every tensor could be converted.
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        args: Tuple[object, ...],
        kwargs: Dict[str, object],
        replicate_only: bool = False,
    ) -> None:
        self.hit = 0
        self.miss = 0
        self.mesh = mesh
        self.args = args
        self.kwargs = kwargs
        self.replicate_only = replicate_only
        self.flatten_args, self.flatten_args_spec = tree_flatten(args)
        self.flatten_kwargs, self.flatten_kwargs_spec = tree_flatten(kwargs)
        tensors = [
            arg for arg in [*self.flatten_args, *self.flatten_kwargs]
            if isinstance(arg, torch.Tensor)
        ]
        choices = [self.gen_sharding_choices_for_arg(t) for t in tensors]
        self.sharding_combs: Iterator[Sequence[Placement]] = iter(itertools.product(*choices))

    def successful(self) -> bool:
        return self.hit > 0 and self.miss == 0

    def is_supported_tensor(self, t: torch.Tensor) -> bool:
        """DTensor holds dense, plain tensors only (no sparse, quantized, nested, meta, ...)."""
        unsupported = (
            t.is_sparse_csr or t.is_sparse or t.is_mkldnn or t.is_quantized or t.is_nested
            or compat_local_tensor.is_functional_tensor(t) or t.is_neg() or t.is_conj()
            or t.device.type in ("lazy", "meta")
        )
        return not unsupported

    def gen_sharding_choices_for_arg(self, arg: torch.Tensor) -> Sequence[Placement]:
        """Replicate, plus Shard(d) for each dim the mesh divides evenly (bools: replicate only)."""
        if self.replicate_only or arg.dtype == torch.bool:  # c10d has no bool collectives
            return [Replicate()]
        size = self.mesh.size()
        even = [Shard(d) for d, n in enumerate(arg.shape) if n > 1 and n % size == 0]
        return [Replicate(), *even]

    def __iter__(self) -> DTensorConverter:
        return self

    def __next__(self) -> Tuple[Tuple[object, ...], Dict[str, object]]:
        placements = iter(next(self.sharding_combs))

        def convert(flat: List[object]) -> List[object]:
            return [
                self.to_dist_tensor(a, self.mesh, [next(placements)])
                if isinstance(a, torch.Tensor) else a
                for a in flat
            ]

        new_args = convert(self.flatten_args)
        new_kwargs = convert(self.flatten_kwargs)
        return (
            tree_unflatten(new_args, self.flatten_args_spec),
            tree_unflatten(new_kwargs, self.flatten_kwargs_spec),
        )

    def to_dist_tensor(
        self, t: torch.Tensor, mesh: DeviceMesh, placements: List[Placement]
    ) -> torch.Tensor:
        """`t` as a DTensor (scalars replicated), or `t` itself (counted a miss) if unsupported."""
        plain = type(t) is torch.Tensor or type(t) is nn.Parameter
        if plain or compat_local_tensor.is_local_tensor(t):
            if not self.is_supported_tensor(t):
                self.miss += 1
                return t
            self.hit += 1
            if t.ndim == 0:
                result = distribute_tensor(t, mesh, [Replicate()] * mesh.ndim)
            else:
                result = distribute_tensor(t, mesh, placements)
            if isinstance(t, nn.Parameter):
                result = nn.Parameter(result, requires_grad=result.requires_grad)
            return result
        if torch.overrides.is_tensor_like(t):
            self.miss += 1  # DTensor does not hold other tensor subclasses
            return t
        raise RuntimeError(f"Trying to convert to DTensor, but got {type(t)}")


# --- shard order (upstream's helpers for tests of placements applied in a given order) ------


def _convert_shard_order_dict_to_ShardOrder(shard_order: Dict[int, Sequence[int]]) -> tuple:  # noqa: N802
    """{tensor_dim: mesh_dims} as a DTensor shard order (a tuple of ShardOrderEntry)."""
    return tuple(
        compat_local_tensor.shard_order_entry(tensor_dim, tuple(mesh_dims))
        for tensor_dim, mesh_dims in shard_order.items()
    )


def shard_order_to_placement(shard_order: Any, mesh: DeviceMesh) -> Tuple[Placement, ...]:
    """The placements a shard order implies: Shard(tensor_dim) on its mesh dims, else Replicate."""
    placements: List[Placement] = [Replicate() for _ in range(mesh.ndim)]
    for entry in shard_order or ():
        for mesh_dim in entry.mesh_dims:
            placements[mesh_dim] = Shard(entry.tensor_dim)
    return tuple(placements)


def _contiguous_splits(items: List[int], parts: int) -> Iterator[List[List[int]]]:
    """Every way to cut `items` into `parts` non-empty runs, in order."""
    for cuts in itertools.combinations(range(1, len(items)), parts - 1):
        bounds = (0, *cuts, len(items))
        yield [items[a:b] for a, b in itertools.pairwise(bounds)]


def generate_shard_orders(mesh: DeviceMesh, tensor_rank: int) -> Iterator[tuple]:
    """Every shard order of a `tensor_rank`-D tensor over `mesh` (upstream's enumeration).

    For each order of the mesh dims, cut it into runs and give each run to a distinct
    tensor dim (in increasing tensor-dim order).
    """
    mesh_dims = list(range(mesh.ndim))
    for device_order in itertools.permutations(mesh_dims):
        for parts in range(1, mesh.ndim + 1):
            for runs in _contiguous_splits(mesh_dims, parts):
                for tensor_dims in itertools.combinations(range(tensor_rank), len(runs)):
                    yield _convert_shard_order_dict_to_ShardOrder({
                        tensor_dim: device_order[run[0]: run[-1] + 1]
                        for tensor_dim, run in zip(tensor_dims, runs)
                    })


def redistribute(
    dtensor_input: DTensor,
    device_mesh: DeviceMesh,
    placements: Optional[Sequence[Placement]],
    shard_order: Any,
    use_graph_based_transform: bool = True,
) -> DTensor:
    """`dtensor_input` redistributed to `placements` (default: those of `shard_order`), with
    the shards applied in `shard_order`. Forward only."""
    if placements is None:
        placements = shard_order_to_placement(shard_order, device_mesh)
    return compat_local_tensor.redistribute_to_shard_order(
        dtensor_input, device_mesh, tuple(placements), shard_order, use_graph_based_transform
    )


def patched_distribute_tensor(
    input_tensor: torch.Tensor,
    device_mesh: DeviceMesh,
    placements: Optional[Sequence[Placement]],
    shard_order: Any,
    use_graph_based_transform: bool = True,
    src_data_rank: Optional[int] = 0,
) -> DTensor:
    """distribute_tensor, then the shards put in `shard_order`."""
    if placements is None:
        placements = shard_order_to_placement(shard_order, device_mesh)
    placements = tuple(placements)
    distributed = distribute_tensor(
        input_tensor, device_mesh, placements, src_data_rank=src_data_rank
    )
    compat_local_tensor.use_explicit_shard_order(distributed)
    return redistribute(
        distributed, device_mesh, placements, shard_order, use_graph_based_transform
    )


def make_full_tensor(dtensor_input: DTensor) -> torch.Tensor:
    """The full tensor of `dtensor_input`, gathered through `redistribute` (any shard order)."""
    return redistribute(
        dtensor_input, dtensor_input.device_mesh, placements=None, shard_order=()
    ).to_local()


# --- checking a sharding rule on one sample ---------------------------------------------------

op_strategy_context = compat_local_tensor.op_strategy_context


def _tensors_in(args: Any, kwargs: Any) -> List[torch.Tensor]:
    leaves = [*compat_local_tensor.tree_leaves(args), *compat_local_tensor.tree_leaves(kwargs)]
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _with_tensors(args: Any, kwargs: Any, tensors: Sequence[Any]) -> Tuple[Any, Any]:
    """(args, kwargs) with their tensors replaced, in order, by `tensors`."""
    replacements = iter(tensors)
    return compat_local_tensor.tree_map(
        lambda leaf: next(replacements) if isinstance(leaf, torch.Tensor) else leaf, (args, kwargs)
    )


def validate_sharding_rule_sample(
    op: Callable, full_args: Any, full_kwargs: Any, input_placements: Sequence[Placement],
    output_placements: Sequence[Placement], device_mesh: DeviceMesh,
) -> bool:
    """Whether running `op` on each rank's shards (inputs placed as `input_placements`) gives
    outputs that, read as `output_placements`, equal `op` on the full inputs (1-D mesh)."""
    full_tensors = _tensors_in(full_args, full_kwargs)
    dtensors = [
        distribute_tensor(t, device_mesh, (p,)) for t, p in zip(full_tensors, input_placements)
    ]
    local_args, local_kwargs = _with_tensors(
        full_args, full_kwargs, [d.to_local() for d in dtensors]
    )
    expected = _tensors_in(op(*full_args, **full_kwargs), {})
    actual = _tensors_in(op(*local_args, **local_kwargs), {})
    for ref, local, placement in zip(expected, actual, output_placements):
        full = DTensor.from_local(local, device_mesh, (placement,))
        full = full.redistribute(device_mesh, (Replicate(),)).to_local()
        if ref.shape != full.shape or not torch.allclose(
            ref, full, atol=1e-5, rtol=1e-5, equal_nan=True
        ):
            return False
    return True


def _grad_leaves(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    copies = [t.detach().clone() for t in tensors]
    return [c.requires_grad_(True) if c.is_floating_point() else c for c in copies]


def _backward_through(output: Any) -> bool:
    """Backward from the sum of the float outputs that need grad; False if there are none."""
    outs = [t for t in _tensors_in(output, {}) if t.is_floating_point() and t.requires_grad]
    if not outs:
        return False
    sum(t.sum() for t in outs).backward()
    return True


def validate_sharding_rule_sample_backward(
    op: Callable, full_args: Any, full_kwargs: Any, input_placements: Sequence[Placement],
    device_mesh: DeviceMesh,
) -> Optional[bool]:
    """Whether the gradients of `op` on DTensors placed as `input_placements` equal those on
    the full tensors. None when the op has no float gradient or DTensor has no backward rule."""
    full_tensors = _tensors_in(full_args, full_kwargs)
    if not any(t.is_floating_point() for t in full_tensors):
        return None
    reference = _grad_leaves(full_tensors)
    ref_args, ref_kwargs = _with_tensors(full_args, full_kwargs, reference)
    try:
        if not _backward_through(op(*ref_args, **ref_kwargs)):
            return None
    except RuntimeError:
        return None
    if len(input_placements) != len(full_tensors):
        raise ValueError(
            f"{len(input_placements)} placements given for {len(full_tensors)} input tensors"
        )
    distributed = [
        distribute_tensor(c, device_mesh, (p,))
        for c, p in zip(_grad_leaves(full_tensors), input_placements)
    ]
    d_args, d_kwargs = _with_tensors(full_args, full_kwargs, distributed)
    try:
        if not _backward_through(op(*d_args, **d_kwargs)):
            return None
    except Exception as error:
        unsupported = ("does not have a sharding strategy registered",
                       "got mixed torch.Tensor and DTensor")
        if any(text in str(error) for text in unsupported):
            return None
        raise
    for ref, dist_t in zip(reference, distributed):
        if not ref.is_floating_point() or ref.grad is None:
            continue
        if dist_t.grad is None:
            return False
        grad = dist_t.grad.full_tensor() if isinstance(dist_t.grad, DTensor) else dist_t.grad
        if ref.grad.shape != grad.shape or not torch.allclose(
            ref.grad, grad, atol=1e-5, rtol=1.3e-6, equal_nan=True
        ):
            return False
    return True


# --- ranks simulated in one process (LocalTensor) -----------------------------------------


class _LocalRanksMixin:
    """What the *WithLocalTensor classes share: one process in which every rank is simulated."""

    world_size: int

    @property
    def is_local_tensor_enabled(self) -> bool:
        return True

    @property
    def rank(self) -> Any:
        """Every rank at once: a SymInt holding r for simulated rank r."""
        return compat_local_tensor.local_rank(self.world_size)

    @rank.setter
    def rank(self, rank: int) -> None:
        """The rank is always every rank; the bases' assignments are ignored."""

    def _handle_test_skip(self, msg: str) -> None:
        self.skipTest(msg)  # type: ignore[attr-defined]

    def _get_local_tensor_mode(self) -> Any:
        return compat_local_tensor.local_tensor_mode(self.world_size)

    def make_launcher(self) -> Launcher:
        """Every rank is simulated by one run of the test in this process."""
        return SimulatedRanks()

    def rank_set_up(self) -> None:
        """In the instance that simulates the ranks: LocalTensor's process-wide settings."""
        compat_local_tensor.set_record_function_enabled(False)
        self.addCleanup(compat_local_tensor.set_record_function_enabled, True)  # type: ignore[attr-defined]
        self.addCleanup(compat_local_tensor.reset_dtensor_rng_tracker)  # type: ignore[attr-defined]
        super().rank_set_up()  # type: ignore[misc]

    def build_device_mesh(self) -> DeviceMesh:
        with compat_local_tensor.maybe_disable_local_tensor_mode():
            return super().build_device_mesh()  # type: ignore[misc]

    def init_manual_seed_for_rank(self) -> None:
        torch.manual_seed(0)


class _LocalGroupPerTest:
    """`with_comms` on a LocalTensor class: a fake default group around each test."""

    world_size: int
    _pg: Any = None

    def init_pg(self, eager_init: bool, backend: Optional[str] = None) -> None:
        """A fake default group of world_size ranks (nothing to talk to: all ranks are here)."""
        self._pg = compat_local_tensor.init_fake_process_group(self.world_size)

    def destroy_pg(self, device_id: Optional[int] = None) -> None:
        dist.destroy_process_group(self._pg)
        self._pg = None


class LocalDTensorTestBase(_LocalRanksMixin, _LocalGroupPerTest, DTensorTestBase):
    """DTensorTestBase with every rank simulated in this process (no rank processes)."""


class LocalDTensorOpTestBase(_LocalRanksMixin, _LocalGroupPerTest, DTensorOpTestBase):
    """DTensorOpTestBase with every rank simulated in this process (no rank threads)."""


class LocalDTensorContinuousTestBase(_LocalRanksMixin, DTensorContinuousTestBase):
    """DTensorContinuousTestBase with every rank simulated in this process, on one fake
    default group for the whole class (as upstream's class-wide group)."""

    world_size = NUM_DEVICES

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.pg = compat_local_tensor.init_fake_process_group(cls.world_size)

    @classmethod
    def tearDownClass(cls) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        cls.pg = None
        super().tearDownClass()

    def setUp(self) -> None:
        TestCase.setUp(self)  # no rank processes and no per-test group: the class has one

    def tearDown(self) -> None:
        TestCase.tearDown(self)


def _in_local_tensor_mode(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapped(self: Any) -> Any:
        compat_local_tensor.reset_dynamo()
        with self._get_local_tensor_mode():
            return fn(self)

    return wrapped


def _skipped(self: unittest.TestCase) -> None:
    self.skipTest("Skipped test")


def create_local_tensor_test_class(
    orig_cls: type,
    skipped_tests: Optional[List[str]] = None,
    base_class: type = LocalDTensorTestBase,
) -> type:
    """`<orig_cls>WithLocalTensor`: orig_cls's tests run in one process, ranks simulated.

    Each test_* method runs inside a LocalTensorMode over all ranks; those named in
    `skipped_tests` skip. The class body (and so `__module__`) is orig_cls's; bind the
    result to a module-level name for the loader to find it.
    """
    if not isinstance(orig_cls, type):
        raise TypeError(f"create_local_tensor_test_class: expected a test class, got {orig_cls!r}")
    skipped = set(skipped_tests or [])
    body = dict(orig_cls.__dict__)
    for name, value in list(body.items()):
        if not callable(value):
            continue
        if name in skipped:
            body[name] = _skipped
        elif name.startswith("test_"):
            body[name] = _in_local_tensor_mode(value)
    for slot in ("__dict__", "__weakref__"):
        body.pop(slot, None)
    return type(orig_cls.__name__ + "WithLocalTensor", (base_class, *orig_cls.__bases__), body)


@compat_local_tensor.maybe_run_for_local_tensor
def map_local_tensor_for_rank(tensor: Any, rank: Any, func: Callable[[Any, int], Any]) -> Any:
    """func(tensor, rank); under LocalTensorMode once per simulated rank, with that rank's shard."""
    return func(tensor, rank)


@compat_local_tensor.maybe_run_for_local_tensor
def map_local_for_rank(rank: Any, func: Callable[[int], Any]) -> Any:
    """func(rank); under LocalTensorMode once per simulated rank."""
    return func(rank)


def reduce_local_int(val: Any, func: Callable[[Dict[int, int]], Any]) -> Any:
    """func({rank: value}) over the per-rank ints of a LocalTensor-mode SymInt."""
    return func(compat_local_tensor.local_ints(val))
