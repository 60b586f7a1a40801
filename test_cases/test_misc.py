# Owner(s): ["oncall: distributed"]
"""Miscellaneous FSDP1 behaviour: ``device_id`` handling, CPU training, ignored modules,
sync_module_states, homogeneous attributes, warnings and errors.

Mirrors upstream ``test/distributed/fsdp/test_fsdp_misc.py``. Tests whose behaviour does
not depend on an accelerator run on CPU (gloo across processes, the ``threaded`` backend
across threads) with ``device_id`` set to the rank's device; tests about GPU placement,
CPU offload or several GPUs skip on CPU, saying they need an accelerator.
"""

import contextlib
import functools
import os
import unittest
import warnings
from collections import namedtuple
from copy import deepcopy
from itertools import chain
from typing import Any, Iterator, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import (
    CPUOffload,
    FlatParameter,
    ShardingStrategy,
)
from torch.distributed.fsdp import (
    FullyShardedDataParallel as FSDP,
)
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    transformer_auto_wrap_policy,
)
from torch.nn import TransformerDecoderLayer, TransformerEncoderLayer
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import (
    MLP,
    TEST_WITH_DEV_DBG_ASAN,
    CUDAInitMode,
    FSDPInitMode,
    FSDPTest,
    FSDPTestMultiThread,
    NestedWrappedModule,
    TransformerWithSharedParams,
    _assert_module_states,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skip_if_lt_x_gpu,
)
from harness.compat import autograd, distributed, fsdp1
from harness.kit.fsdp1_grads import assert_fsdp1_grads_equal, named_grads

if not dist.is_available():
    raise unittest.SkipTest("torch.distributed is not available")
if TEST_WITH_DEV_DBG_ASAN:
    raise unittest.SkipTest("dev-asan: torch + multiprocessing spawn have known issues")


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x, y):
        return self.b(self.a(x + y))


@contextlib.contextmanager
def _scoped_env(name: str, value: str) -> Iterator[None]:
    """Set env var ``name`` for the block on every rank, then restore its previous value.

    Rank threads share ``os.environ``, so ranks first agree (barrier) before anyone sets
    the variable and again before anyone restores it: no rank reads another's leftover.
    """
    previous = os.environ.get(name)
    dist.barrier()
    os.environ[name] = value
    try:
        yield
    finally:
        dist.barrier()
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _use_device(device: torch.device) -> None:
    """Make ``device`` the current accelerator (a no-op on CPU), as upstream's set_device."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


class TestFSDPMiscMultiProcess(FSDPTest):
    @property
    def world_size(self):
        return 2

    @property
    def process_group(self):
        return distributed.default_process_group()

    @skip_if_lt_x_gpu(2)
    @parametrize("use_index", [True, False])
    def test_fsdp_device_id(self, use_index):
        """
        Tests the FSDP ``device_id`` argument:
          - Wrapping a CPU module should move the module to the GPU matching
          ``device_id``
          - Wrapping a GPU module already on the GPU matching ``device_id``
          should not raise an error
          - Wrapping a GPU module already on GPU and passing a GPU device
          without specifying a device ID (i.e. ``torch.device("cuda")``) warns
        """
        _use_device(self.device)
        dev_id = self.device.index if use_index else self.device

        def _check_device_matches(module, device_id):
            """Checks that the ``FlatParameter``s in ``module`` have device
            matching ``device_id``."""
            devices = {p.device for p in module.parameters() if isinstance(p, FlatParameter)}
            self.assertGreater(len(devices), 0)
            self.assertEqual(1, len(devices))
            found_device = devices.pop()
            if isinstance(device_id, int):
                device = torch.device(self.device.type, device_id)
            else:
                device = device_id
            self.assertEqual(found_device, device)

        # CPU module: FSDP moves it to `device_id`.
        nested_wrapped_module = NestedWrappedModule.init(
            self.process_group,
            FSDPInitMode.RECURSIVE,
            CUDAInitMode.CUDA_NEVER,
            fsdp_kwargs={"device_id": dev_id},
        )
        _check_device_matches(nested_wrapped_module, dev_id)

        # Module already on the `device_id` device: no error.
        nested_wrapped_module = NestedWrappedModule.init(
            self.process_group,
            FSDPInitMode.RECURSIVE,
            CUDAInitMode.CUDA_BEFORE,
            fsdp_kwargs={"device_id": dev_id},
        )
        _check_device_matches(nested_wrapped_module, dev_id)

        # A device without an index warns and resolves to the current device.
        regex = "does not have an explicit index"
        with self.assertWarnsRegex(expected_warning=UserWarning, expected_regex=regex):
            nested_wrapped_module = NestedWrappedModule.init(
                self.process_group,
                FSDPInitMode.RECURSIVE,
                CUDAInitMode.CUDA_BEFORE,
                fsdp_kwargs={"device_id": torch.device(self.device.type)},
            )
        _check_device_matches(nested_wrapped_module, self.device)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize("use_second_layer", [True, False])
    @parametrize("sharding_strategy", [ShardingStrategy.NO_SHARD, None])
    def test_fsdp_module_no_compute_grad(self, use_second_layer, sharding_strategy):
        # When use_second_layer=True, b is involved in forward computation but
        # does not receive grad in backward. Otherwise, b is not involved in
        # forward computation.

        class MyModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(10, 10)
                self.b = nn.Linear(10, 10)

            def forward(self, x, y):
                out1 = self.a(x)
                if use_second_layer:
                    out2 = self.b(y)
                    return out1, out2
                else:
                    return out1

        fsdp = FSDP(
            MyModel().to(self.device),
            sharding_strategy=sharding_strategy,
            auto_wrap_policy=always_wrap_policy,
            device_id=self.device,
        )
        x = torch.randn(10, 10, device=self.device)
        y = torch.randn(10, 10, device=self.device)
        for _ in range(4):
            if use_second_layer:
                a, _ = fsdp(x, y)
            else:
                a = fsdp(x, y)
            loss = a.sum()
            loss.backward()

            # self.a receives grad, self.b does not
            a_grad = fsdp1.flat_param(fsdp.module.a).grad
            b_grad = fsdp1.flat_param(fsdp.module.b).grad
            self.assertIsNotNone(a_grad)
            self.assertIsNone(b_grad)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_not_all_outputs_used_in_loss(self):
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                    ShardingStrategy.NO_SHARD,
                ]
            },
            self._test_fsdp_not_all_outputs_used_in_loss,
        )

    def _test_fsdp_not_all_outputs_used_in_loss(self, sharding_strategy: ShardingStrategy):
        class MyModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin1 = nn.Linear(4, 4)
                self.lin2 = nn.Linear(4, 4)

            def forward(self, x):
                a = self.lin1(x)
                b = self.lin2(x)
                return (a, b)

        def _check_resharded(fsdp_module):
            state = fsdp1.flat_param_resharded(fsdp_module)
            if state is None:
                return
            uses_sharded_strategy, unsharded_storage_size, on_local_shard = state
            if uses_sharded_strategy:
                self.assertEqual(0, unsharded_storage_size)
            self.assertTrue(on_local_shard)

        def _check_equal(local, fsdp):
            with FSDP.summon_full_params(fsdp):
                for p1, p2 in zip(fsdp.parameters(), local.parameters()):
                    self.assertEqual(p1, p2)

        fsdp_ctor = functools.partial(
            FSDP, sharding_strategy=sharding_strategy, device_id=self.device
        )
        m = MyModule().to(self.device)
        local_m = deepcopy(m)
        prev_params = [p.clone() for p in local_m.parameters()]

        m.lin1 = fsdp_ctor(m.lin1)
        m = fsdp_ctor(m)
        _check_equal(local_m, m)

        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        opt_local = torch.optim.SGD(local_m.parameters(), lr=1e-3)

        for i in range(6):
            t = torch.ones(4, device=self.device)
            a, b = m(t)
            local_a, local_b = local_m(t)
            if i < 2:
                # Both outputs are used in the loss at first; later b is unused
                # and the gradients must still match local training.
                loss = (a @ b).sum()
                loss_local = (local_a @ local_b).sum()
            else:
                loss = a.sum()
                loss_local = local_a.sum()

            loss.backward()
            loss_local.backward()
            _check_resharded(m)
            assert_fsdp1_grads_equal(self, m, named_grads(local_m))
            opt.step()
            opt_local.step()
            _check_equal(local_m, m)
            # Something changed since the last step, or the check above is vacuous.
            self.assertTrue(
                any(not torch.equal(p1, p2) for p1, p2 in zip(prev_params, local_m.parameters()))
            )
            prev_params = [p.clone() for p in local_m.parameters()]
            opt.zero_grad()
            opt_local.zero_grad()

        dist.barrier()

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_optim_overlap_no_use_orig_params_error(self):
        fsdp_overlap = FSDP(
            MyModel().to(self.device),
            auto_wrap_policy=always_wrap_policy,
            use_orig_params=False,
            device_id=self.device,
        )
        distributed.apply_optimizer_in_backward(
            optimizer_class=torch.optim.SGD,
            params=fsdp_overlap.parameters(),
            optimizer_kwargs={"lr": 0.03},
            register_hook=False,
        )

        inp = torch.randn(10, 10, device=self.device)
        with self.assertRaisesRegex(RuntimeError, "only supported with use_orig_params=True"):
            fsdp_overlap(inp, inp)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_cpu_training(self):
        """Tests FSDP training on CPU."""
        gloo_pg = dist.new_group(backend="gloo")
        # Hybrid sharding shards within `gloo_pg` and replicates across singleton groups.
        singleton_pgs = [dist.new_group([r], backend="gloo") for r in range(self.world_size)]
        hybrid = (ShardingStrategy.HYBRID_SHARD, fsdp1.hybrid_shard_zero2())
        for ss in [
            ShardingStrategy.NO_SHARD,
            ShardingStrategy.FULL_SHARD,
            ShardingStrategy.SHARD_GRAD_OP,
            *hybrid,
        ]:
            torch.manual_seed(42)
            model = MyModel()
            ref_model = DDP(deepcopy(model), process_group=gloo_pg)
            model = FSDP(
                model,
                auto_wrap_policy=always_wrap_policy,
                process_group=(gloo_pg, singleton_pgs[self.rank]) if ss in hybrid else gloo_pg,
                sharding_strategy=ss,
                device_id=torch.device("cpu"),
            )
            self.assertEqual(ss, model.sharding_strategy)
            ref_optim = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
            optim = torch.optim.Adam(model.parameters(), lr=1e-2)
            torch.manual_seed(42 + self.rank)
            inp = torch.randn(2, 2)
            for _ in range(10):
                losses = []
                for _model in (ref_model, model):
                    loss = _model(inp, inp).sum()
                    losses.append(loss)
                    loss.backward()
                # Before the step: Adam would hide a wrongly scaled gradient from the losses
                assert_fsdp1_grads_equal(self, model, named_grads(ref_model.module), msg=f"{ss}")
                for _optim in (ref_optim, optim):
                    _optim.step()
                    _optim.zero_grad()
                self.assertEqual(losses[0], losses[1], f"{ss}: FSDP loss differs from DDP")

    @skip_if_lt_x_gpu(2)
    def test_fsdp_cpu_init_stays_on_cpu(self):
        # Move this test to the MT test once warning logging and backward
        # collective issue is resolved.
        """Tests that passing a CPU module to FSDP preserves that the wrapped
        module is on CPU after FSDP initialization, albeit after logging a
        warning, and that FSDP moves CPU input to GPU before the forward."""
        _use_device(self.device)
        regex = "passed-in `module` is on CPU"
        with self.assertWarnsRegex(expected_warning=UserWarning, expected_regex=regex):
            nested_wrapped_module = NestedWrappedModule.init(
                self.process_group,
                FSDPInitMode.RECURSIVE,
                CUDAInitMode.CUDA_NEVER,
            )
            fsdp_model = FSDP(nested_wrapped_module, self.process_group)
        devices = {p.device for p in fsdp_model.parameters()}
        self.assertEqual(1, len(devices))
        self.assertEqual(torch.device("cpu"), devices.pop())
        fsdp_model = fsdp_model.to(self.device)
        # Forward and backward work after moving to the device; the CPU input
        # checks that FSDP moves inputs to the compute device.
        inp = fsdp_model.module.get_input(device=torch.device("cpu"))
        fsdp_model(*inp).sum().backward()

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_cpu_init_with_sync_module_states(self):
        """
        Tests that passing ``sync_module_states=True`` raises an error for
        a CPU module since the synchronization requires GPU communication,
        while additionally passing ``device_id`` does not raise an error, even
        when the model has CPU buffers.
        """

        def init_nested_wrapped_module():
            return NestedWrappedModule.init(
                self.process_group,
                FSDPInitMode.NO_FSDP,
                CUDAInitMode.CUDA_NEVER,
            )

        # Without an accelerator FSDP needs `device_id` to pick the CPU at all; the
        # module states then stay on CPU and the same error must come.
        on_cpu = self.device.type == "cpu"
        with self.assertRaisesRegex(
            ValueError,
            "The module has CPU parameters or buffers when `sync_module_states=True`",
        ):
            FSDP(
                init_nested_wrapped_module(),
                self.process_group,
                sync_module_states=True,
                **({"device_id": self.device} if on_cpu else {}),
            )

        if on_cpu:
            # The rest needs `device_id` to move the module to an accelerator.
            return

        # Passing `device_id` does not raise, even with CPU buffers.
        nested_wrapped_module = init_nested_wrapped_module()
        nested_wrapped_module.register_buffer(
            "buf", torch.ones((2, 2), device="cpu") * self.rank
        )
        nested_wrapped_module.module[0].register_buffer(
            "buf", torch.ones((3, 2), device="cpu") * self.rank
        )
        nested_wrapped_module = FSDP(
            nested_wrapped_module,
            self.process_group,
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            device_id=self.device,
            sync_module_states=True,
        )
        # Each rank's buffers are zeros since rank 0 is the source, and they
        # are on the accelerator since `device_id` was given.
        self.assertEqual(nested_wrapped_module.buf.device, self.device)
        self.assertEqual(nested_wrapped_module.buf, torch.zeros((2, 2)))
        self.assertEqual(nested_wrapped_module.module.module[0].buf.device, self.device)
        self.assertEqual(nested_wrapped_module.module.module[0].buf, torch.zeros((3, 2)))


class TestFSDPMiscMultiThread(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    @property
    def process_group(self):
        return distributed.default_process_group()

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_namedtuple(self):
        class MyModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(100, 100)

            def forward(self, x):
                return x

        m = MyModule().to(self.device)
        m = FSDP(m, device_id=self.device)
        t = torch.ones(1, device=self.device, requires_grad=True)

        MyOutputType = namedtuple("MyOutputType", ["a", "b", "c", "d"], defaults=(t, t, t, t))

        inp = MyOutputType()
        out = m(inp)
        # Ensure hooks are registered
        for x in out:
            self.assertNotEqual([], autograd.backward_hooks(x))

        # TODO: we should check backward() and param is resharded as well, but
        # this is blocked by https://github.com/pytorch/pytorch/issues/83107
        # and https://github.com/pytorch/pytorch/issues/83129

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_device_id_auto_wrap(self):
        """Tests that ``auto_wrap_policy`` propagates ``device_id`` to all
        nested FSDP instances."""
        self.run_subtests(
            {"use_callable": [False, True]},
            self._test_device_id_auto_wrap,
        )

    def _test_device_id_auto_wrap(self, use_callable: bool):
        module_classes = {TransformerEncoderLayer, TransformerDecoderLayer}
        if use_callable:
            auto_wrap_policy = functools.partial(
                transformer_auto_wrap_policy,
                transformer_layer_cls=module_classes,
            )
        else:
            auto_wrap_policy = ModuleWrapPolicy(module_classes)
        fsdp_kwargs = {
            "auto_wrap_policy": auto_wrap_policy,
            "device_id": self.device,
        }
        fsdp_model = TransformerWithSharedParams.init(
            self.process_group,
            FSDPInitMode.RECURSIVE,
            CUDAInitMode.CUDA_BEFORE,
            fsdp_kwargs,
        )
        fsdp_modules = FSDP.fsdp_modules(fsdp_model)
        self.assertEqual(5, len(fsdp_modules))  # root + 2 encoder + 2 decoder layers
        for fsdp_module in fsdp_modules:
            self.assertEqual(fsdp_module.compute_device, self.device)

    @skip_if_lt_x_gpu(2)
    def test_fsdp_device_id_cpu_offload(self):
        """
        Tests FSDP when specifying both ``device_id`` and parameter CPU
        offloading.
        """
        self.run_subtests(
            {"use_orig_params": [False, True]},
            self._test_fsdp_device_id_cpu_offload,
        )

    def _test_fsdp_device_id_cpu_offload(self, use_orig_params: bool):
        class MyModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.seq = nn.Sequential(
                    nn.Linear(10, 10),
                    nn.Linear(10, 10),
                )
                self.lin = nn.Linear(10, 10)

            def forward(self, x):
                return self.lin(self.seq(x))

        model = MyModel()
        # Choose a wrapping policy such that there are (1) nested FSDP
        # instances and (2) the parent FSDP instance has managed parameters
        auto_wrap_policy = ModuleWrapPolicy({nn.Sequential})
        fsdp_model = FSDP(
            model,
            auto_wrap_policy=auto_wrap_policy,
            cpu_offload=CPUOffload(offload_params=True),
            device_id=self.device,
            use_orig_params=use_orig_params,
        )
        cpu_device = torch.device("cpu")
        handles = fsdp1.handles(fsdp_model)
        self.assertEqual(2, len(handles))
        for handle in handles:
            self.assertEqual(handle.flat_param.device, cpu_device)

    @skip_if_lt_x_gpu(2)
    def test_module_device_mismatches_device_id(self):
        """Tests that specifying a ``device_id`` argument to FSDP for a GPU
        module that does not match the GPU device ID raises an error."""
        _use_device(self.device)
        context = (
            self.assertRaisesRegex(ValueError, f"{self.device} vs cuda:0")
            if self.rank != 0
            else contextlib.nullcontext()
        )
        with context:
            NestedWrappedModule.init(
                self.process_group,
                FSDPInitMode.RECURSIVE,
                # Move wrapped modules to the device before wrapping with FSDP
                cuda_init_mode=CUDAInitMode.CUDA_BEFORE,
                # Should raise error since rank 1 is given `device_id=0` when
                # the model is on cuda:1
                fsdp_kwargs={"device_id": 0},
            )

    @skip_if_lt_x_gpu(2)
    def test_cpu_gpu_module(self):
        """Tests a CPU + GPU module supported if device_id is passed
        in, errors if device_id is not.
        """
        _use_device(self.device)

        class CPUGPUModule(nn.Module):
            def __init__(self, device):
                super().__init__()
                self.a = nn.Linear(1, 1).to(device)
                self.b = nn.Linear(1, 1)

        cpu_gpu = CPUGPUModule(self.device)
        fsdp = FSDP(cpu_gpu, device_id=self.device)
        for param in fsdp.parameters():
            self.assertEqual(param.device, self.device)

        # without device_id, we hit an error
        with self.assertRaisesRegex(RuntimeError, "please pass in device_id"):
            FSDP(CPUGPUModule(self.device))

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_ignored_module_meta(self):
        _use_device(self.device)

        class CPUGPUModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(1, 1)
                self.b = nn.Linear(1, 1)

        meta_device = torch.device("meta")
        with torch.device("meta"):
            m = CPUGPUModule()
        m = FSDP(m, device_id=self.device, ignored_modules=[m.a], use_orig_params=True)
        self.assertEqual(meta_device, next(m.a.parameters()).device)
        # The managed module is materialized on the rank's device.
        self.assertEqual({self.device}, {p.device for p in m.b.parameters()})

        # Test with param_init_fn
        with torch.device("meta"):
            m = CPUGPUModule()
        m = FSDP(
            m,
            device_id=self.device,
            ignored_modules=[m.a],
            use_orig_params=True,
            param_init_fn=lambda m: m.to_empty(device=self.device, recurse=False),
        )
        self.assertEqual(meta_device, next(m.a.parameters()).device)
        self.assertEqual({self.device}, {p.device for p in m.b.parameters()})

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_device_id_no_move_ignored_params_and_bufs(self):
        class CPUGPUModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(1, 1)
                self.b = nn.Linear(1, 1)
                self.a.register_buffer("buf", torch.ones(1))

        m = CPUGPUModule()
        ignored_before = {id(t): t.data_ptr() for t in chain(m.a.parameters(), m.a.buffers())}
        m = FSDP(m, device_id=self.device, ignored_modules=[m.a], use_orig_params=True)
        ignored_params = m.a.parameters()
        ignored_bufs = m.a.buffers()
        for t in chain(ignored_params, ignored_bufs):
            self.assertEqual(torch.device("cpu"), t.device)
            # Not moved, copied or flattened: the very same storage as before wrapping.
            self.assertEqual(ignored_before.get(id(t)), t.data_ptr())
        self.assertEqual({self.device}, {p.device for p in m.b.parameters()})

    @skip_if_lt_x_gpu(2)
    def test_multigpu_module(self):
        """
        Module on multiple GPUs wrapped in FSDP should raise an error.
        """

        class MultiGPUModule(nn.Module):
            def __init__(self, rank):
                super().__init__()
                self.rank = rank
                self.a = nn.Linear(1, 1).cuda(self.rank)
                self.b = nn.Linear(1, 1).cuda((self.rank + 1) % dist.get_world_size())

        with self.assertRaisesRegex(RuntimeError, "FSDP only supports single device modules"):
            FSDP(MultiGPUModule(self.rank))

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_no_params(self):
        """
        Test that device_id and cpu init work if module has no params
        (they are effective noops, but ensure FSDP does not assume module
        has parameters during init)
        """
        _use_device(self.device)
        inp = torch.randn(3, device=self.device)

        # Test CPU module with device_id
        module = FSDP(nn.ReLU(), device_id=self.device)
        self.assertEqual(torch.relu(inp), module(inp))

        if self.device.type == "cpu":
            # The rest concerns a CPU module without device_id (FSDP needs an
            # accelerator to pick a device then) and accelerator modules.
            return

        # Test CPU
        no_params = nn.ReLU()
        FSDP(no_params)

        # Test on the device
        no_params = nn.ReLU().to(self.device)
        FSDP(no_params)

        # For modules with no params, wrong device_id will raise error about
        # inconsistency between compute_device and device_id, since compute_device
        # is computed as torch.cuda.current_device when there are no params.
        no_params = nn.ReLU().to(self.device)
        context = (
            self.assertRaisesRegex(ValueError, f"Inconsistent.*{self.device} vs cuda:0")
            if self.rank != 0
            else contextlib.nullcontext()
        )
        with context:
            FSDP(no_params, device_id=0)

    @skip_if_lt_x_gpu(2)
    def test_fsdp_same_model_across_ranks(self):
        """
        FSDP broadcasts model from rank 0 to ensure it starts off with the same
        values.
        """
        # Needs an accelerator: FSDP's sync_module_states rejects CPU module states.

        class MyModel(nn.Module):
            def __init__(self, rank):
                super().__init__()
                # Seed via rank to make model different across ranks
                torch.manual_seed(rank)
                torch.cuda.manual_seed(rank)
                self.lin = nn.Linear(10, 10, bias=False)
                self.register_buffer("buffer", torch.ones(1) * rank)

        m = MyModel(self.rank).to(self.device)
        _assert_module_states(m, process_group=self.process_group, assert_fn=self.assertNotEqual)
        # Passing sync_module_states into FSDP makes model the same during init.
        fsdp = FSDP(m, sync_module_states=True)
        with fsdp.summon_full_params(fsdp):
            _assert_module_states(
                fsdp, process_group=self.process_group, assert_fn=self.assertEqual
            )

        # sync_module_states also works with CPU module with device_id passed in
        m = MyModel(self.rank)
        _assert_module_states(m, process_group=self.process_group, assert_fn=self.assertNotEqual)
        fsdp = FSDP(m, device_id=self.device, sync_module_states=True)
        with fsdp.summon_full_params(fsdp):
            _assert_module_states(
                fsdp, process_group=self.process_group, assert_fn=self.assertEqual
            )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_homogeneous_attributes(self):
        """
        Tests that passing heterogeneous values for attributes designated as
        homogeneous raises an error.
        """
        # Manually construct this list but verify against the global list of
        # homogeneous attribute names
        all_attr_name_and_values = [
            ("_use_orig_params", False, True),
            ("limit_all_gathers", False, True),
            ("_use_full_prec_in_eval", False, True),
        ]
        self.assertEqual(
            [attr_name_and_values[0] for attr_name_and_values in all_attr_name_and_values],
            list(fsdp1.homogeneous_attr_names()),
        )

        self.run_subtests(
            {"attr_name_and_values": all_attr_name_and_values},
            self._test_homogeneous_attributes,
        )

    def _test_homogeneous_attributes(self, attr_name_and_values: Tuple[str, Any, Any]):
        model = NestedWrappedModule.init(
            self.process_group,
            FSDPInitMode.NO_FSDP,
            CUDAInitMode.CUDA_BEFORE,
            {},
        )
        attr_name = attr_name_and_values[0]

        if "_use_full_prec_in_eval" == attr_name:
            model.module[1] = FSDP(model.module[1], device_id=self.device)
            with _scoped_env(fsdp1.full_prec_in_eval_env(), "1"):
                fsdp_model = FSDP(model, device_id=self.device)
        else:
            fsdp_kwargs_inner = {attr_name.lstrip("_"): attr_name_and_values[1]}
            fsdp_kwargs_outer = {attr_name.lstrip("_"): attr_name_and_values[2]}
            model.module[1] = FSDP(model.module[1], device_id=self.device, **fsdp_kwargs_inner)
            fsdp_model = FSDP(model, device_id=self.device, **fsdp_kwargs_outer)

        # Run a forward to trigger lazy initialization and the error
        with self.assertRaisesRegex(ValueError, f"Expects one homogeneous value for {attr_name}"):
            inp = fsdp_model.module.get_input(self.device)
            fsdp_model(*inp)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_fsdp_unsupported_module_cls(self):
        regex = r"FSDP will not all-gather parameters for containers that do not implement forward"
        model = nn.ModuleList([MLP(8, torch.device("cpu")) for _ in range(3)])
        with self.assertWarnsRegex(UserWarning, regex):
            FSDP(model, device_id=self.device)
        model = nn.ModuleDict({"1": MLP(8, torch.device("cpu")), "2": MLP(8, torch.device("cpu"))})
        with self.assertWarnsRegex(UserWarning, regex):
            FSDP(model, device_id=self.device)


class TestFSDPMiscWorldSize1(FSDPTestMultiThread):
    @property
    def world_size(self) -> int:
        return 1

    @skip_if_lt_x_gpu(1, allow_cpu=True)
    def test_world_size_1_sharding_strategy_warning(self):
        """
        Tests that FSDP issues a warning when it switches to using ``NO_SHARD``
        when the world size is 1.
        """
        warning_prefix = "FSDP is switching to use `NO_SHARD` instead of"
        # If the user already passes `NO_SHARD`, then there should not be a
        # warning
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")  # trigger all warnings
            FSDP(
                nn.Linear(3, 3).to(self.device),
                sharding_strategy=ShardingStrategy.NO_SHARD,
                device_id=self.device,
            )
            for warning in w:
                self.assertTrue(
                    warning.category is not UserWarning
                    or not str(warning.message).startswith(warning_prefix)
                )

        # Check that a warning is issued
        warning_suffix = " since the world size is 1."
        # - Pass `FULL_SHARD` or `None`
        expected_regex_full_shard = (
            warning_prefix + " " + str(ShardingStrategy.FULL_SHARD) + warning_suffix
        )
        with self.assertWarnsRegex(UserWarning, expected_regex_full_shard):
            FSDP(
                nn.Linear(3, 3).to(self.device),
                sharding_strategy=ShardingStrategy.FULL_SHARD,
                device_id=self.device,
            )
        with self.assertWarnsRegex(UserWarning, expected_regex_full_shard):
            FSDP(nn.Linear(3, 3).to(self.device), device_id=self.device)
        # - Pass `SHARD_GRAD_OP`
        expected_regex_shard_grad_op = (
            warning_prefix + " " + str(ShardingStrategy.SHARD_GRAD_OP) + warning_suffix
        )
        with self.assertWarnsRegex(UserWarning, expected_regex_shard_grad_op):
            FSDP(
                nn.Linear(3, 3).to(self.device),
                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                device_id=self.device,
            )

    @skip_if_lt_x_gpu(1)
    def test_training_device_mismatch_errors(self):
        """
        Tests that, when training starts, if FSDP parameters are not on the
        expected device, then an informative error is raised. This applies for
        both no parameter CPU offloading and parameter CPU offloading.
        """
        _use_device(self.device)
        # Incorrectly not moving from CPU -> GPU
        model = torch.nn.Linear(10, 10)
        fsdp_model = FSDP(model)
        inp = torch.randn((2, 10))
        with self.assertRaisesRegex(
            RuntimeError,
            "An FSDP-managed module unexpectedly has parameters on cpu. Make "
            f"sure to move the module to {self.device} before training.",
        ):
            fsdp_model(inp)

        # Incorrectly moving from CPU -> GPU
        model = torch.nn.Linear(10, 10)
        fsdp_model = FSDP(model, cpu_offload=CPUOffload(offload_params=True))
        fsdp_model.to(self.device)
        inp = torch.randn((2, 10))
        with self.assertRaisesRegex(
            RuntimeError,
            "An FSDP-managed module with parameter CPU offloading enabled has "
            f"parameters on {self.device}. Make sure to not move the module from "
            "CPU when offloading parameters.",
        ):
            fsdp_model(inp)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_unsafe_setattr(self):
        """
        Tests that the environment variable for using unsafe setattr gates as
        expected.
        """
        self.run_subtests(
            {"use_orig_params": [False, True]},
            self._test_unsafe_setattr,
        )

    def _test_unsafe_setattr(self, use_orig_params: bool):
        called_setattr_override = False

        class SetattrLinear(nn.Module):
            def __init__(self, in_dim: int, out_dim: int, device: torch.device) -> None:
                super().__init__()
                self.weight = nn.Parameter(torch.randn((in_dim, out_dim), device=device))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x @ self.weight

            def __setattr__(self, name: str, value: Any) -> None:
                nonlocal called_setattr_override
                called_setattr_override = True
                return super().__setattr__(name, value)

        def called_setattr_in_forward(inp: torch.Tensor) -> bool:
            nonlocal called_setattr_override
            module = SetattrLinear(5, 5, self.device)
            fsdp_module = FSDP(module, use_orig_params=use_orig_params, device_id=self.device)
            called_setattr_override = False
            fsdp_module(inp)
            return called_setattr_override

        inp = torch.randn((8, 5), device=self.device)
        unsafe_setattr_env = fsdp1.unsafe_setattr_env()

        # Safe setattr by default: FSDP goes through the module's `__setattr__`
        self.assertTrue(called_setattr_in_forward(inp))

        # With unsafe setattr, FSDP bypasses `__setattr__`
        with _scoped_env(unsafe_setattr_env, "1"):
            self.assertFalse(called_setattr_in_forward(inp))

        # Any value other than "1" keeps safe setattr
        with _scoped_env(unsafe_setattr_env, "0"):
            self.assertTrue(called_setattr_in_forward(inp))


instantiate_parametrized_tests(TestFSDPMiscMultiThread)
instantiate_parametrized_tests(TestFSDPMiscMultiProcess)

if __name__ == "__main__":
    run_tests()
