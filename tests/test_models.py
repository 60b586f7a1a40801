"""Tests for harness/kit/models.py: upstream parity, shapes, placement, determinism, wrapping and
bad input."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
import time
import unittest
import warnings
from typing import Any, Dict, List
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import enable_wrap
from torch.distributed.tensor import DTensor

from harness.compat import fsdp1, fsdp_collectives
from harness.kit.models import (
    MLP,
    AlwaysWrapNestedWrappedModule,
    CUDAInitMode,
    DEVICEInitMode,
    DoubleLinear,
    DummyDDP,
    FSDPInitMode,
    FSDPTestModel,
    MixtureOfExperts,
    MLPStack,
    ModuleWithDelay,
    NestedLinear,
    NestedWrappedModule,
    NestedWrappedModuleWithDelay,
    NonUniformReqGradNWM,
    SkipModel,
    SkipModule,
    TransformerWithSharedParams,
    current_device,
    fsdp_kwargs_for_device,
)
from harness.single_process.testcase import TestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "upstream_style", "fsdp_model_probe.py")
NWM_FAMILY = (
    NestedWrappedModule,
    AlwaysWrapNestedWrappedModule,
    NonUniformReqGradNWM,
    MixtureOfExperts,
)



def delayed_at_least(start: float, seconds: float) -> bool:
    """Whether `seconds` passed since `start`; on an accelerator the models delay with a device
    sleep whose length follows a cycles-per-ms estimate (an H200 slept 11 of 50 ms), so only
    the CPU's delays are timed."""
    return torch.cuda.is_available() or time.monotonic() - start >= seconds

class _Group:
    """Just enough of a process group for models built without FSDP."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class TestInitModes(TestCase):
    def test_cuda_names_are_aliases(self) -> None:
        self.assertIs(CUDAInitMode, DEVICEInitMode)
        self.assertIs(DEVICEInitMode.CUDA_BEFORE, DEVICEInitMode.DEVICE_BEFORE)
        self.assertIs(DEVICEInitMode.CUDA_AFTER, DEVICEInitMode.DEVICE_AFTER)
        self.assertIs(DEVICEInitMode.CUDA_NEVER, DEVICEInitMode.DEVICE_NEVER)
        self.assertEqual(
            ["DEVICE_BEFORE", "DEVICE_AFTER", "DEVICE_NEVER"], [m.name for m in DEVICEInitMode]
        )
        self.assertEqual(["NO_FSDP", "RECURSIVE"], [m.name for m in FSDPInitMode])

    def test_bad_modes_give_one_line_errors(self) -> None:
        group = _Group(0, 1)
        cases = [
            ((group, FSDPInitMode.NO_FSDP), {}, "exactly one of"),
            (
                (group, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER),
                {"cuda_init_mode": CUDAInitMode.CUDA_NEVER},
                "exactly one of",
            ),
            ((group, FSDPInitMode.NO_FSDP, "cpu"), {}, "must be a DEVICEInitMode"),
            ((group, "recursive", DEVICEInitMode.DEVICE_NEVER), {}, "must be an FSDPInitMode"),
        ]
        for model_cls in (*NWM_FAMILY, TransformerWithSharedParams):
            for args, kwargs, message in cases:
                with self.subTest(model=model_cls.__name__, message=message):
                    with self.assertRaisesRegex(ValueError, message) as caught:
                        model_cls.init(*args, **kwargs)
                    self.assertNotIn("\n", str(caught.exception))


class TestMLP(TestCase):
    def test_forward_is_relu_out_proj_relu_in_proj(self) -> None:
        mlp = MLP(3, dim_multiplier=2)
        self.assertEqual((6, 3), tuple(mlp.in_proj.weight.shape))
        self.assertEqual((3, 6), tuple(mlp.out_proj.weight.shape))
        self.assertIsNone(mlp.buffer)
        x = torch.randn(5, 3)
        self.assertEqual(torch.relu(mlp.out_proj(torch.relu(mlp.in_proj(x)))), mlp(x))

    def test_buffer_is_added_and_registered(self) -> None:
        mlp = MLP(4, with_buffer=True)
        self.assertEqual(["buffer"], [name for name, _ in mlp.named_buffers()])
        x = torch.randn(2, 4)
        expected = torch.relu(mlp.out_proj(torch.relu(mlp.in_proj(x)))) + mlp.buffer
        self.assertEqual(expected, mlp(x))
        before = mlp.buffer.clone()
        mlp.reset_parameters()
        self.assertNotEqual(before, mlp.buffer)

    def test_device_and_bias(self) -> None:
        mlp = MLP(4, torch.device("meta"), bias=False)
        self.assertEqual({torch.device("meta")}, {p.device for p in mlp.parameters()})
        self.assertIsNone(mlp.in_proj.bias)

    def test_bad_dim(self) -> None:
        with self.assertRaisesRegex(ValueError, "dim >= 1"):
            MLP(0)

    def test_options_are_keyword_only_as_upstream(self) -> None:
        with self.assertRaises(TypeError):
            MLP(4, None, False)  # type: ignore[misc]


@pytest.mark.slow
class TestParityWithUpstream(TestCase):
    """Every model, built from harness and from upstream's common_fsdp the same way, is the
    same model: module types, parameter names/shapes/values, input, output, loss, gradients,
    and the generator state its get_input leaves behind (tests/upstream_style/fsdp_model_probe.py
    builds them, each source in its own interpreter)."""

    results: Dict[str, Dict[str, Any]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            procs = {}
            for source in ("harness", "upstream"):
                out = os.path.join(tmp, f"{source}.pt")
                procs[source] = (
                    subprocess.Popen(
                        [sys.executable, PROBE, source, out],
                        cwd=ROOT,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                    out,
                )
            for source, (proc, out) in procs.items():
                output, _ = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise AssertionError(f"probe of {source} failed:\n{output}")
                cls.results[source] = torch.load(out, weights_only=False)

    def test_same_cases(self) -> None:
        self.assertEqual(sorted(self.results["upstream"]), sorted(self.results["harness"]))
        self.assertGreaterEqual(len(self.results["harness"]), 20)

    def test_every_model_matches_upstream(self) -> None:
        upstream, ours = self.results["upstream"], self.results["harness"]
        for case in sorted(upstream):
            for field in sorted(upstream[case]):
                with self.subTest(case=case, field=field):
                    self.assertIn(field, ours[case])
                    self.assertEqual(upstream[case][field], ours[case][field])

    def test_parameter_counts(self) -> None:
        """Upstream's counts, spelled out so a structural change shows which model moved."""
        expected = {
            "NestedWrappedModule": 4 * 8 + 4 + 4 * 16 + 16 + 16 * 16 + 16 + 16 * 4 + 4 + 4 * 8 + 8,
            "MixtureOfExperts": 8 * 12 + 12 + 12 * 23 + 23 + 23 * 12 + 12 + 12 * 8 + 8,
            "MLP": 2 * 8 * 32 + 32 + 8,
            "MLPStack": 2 * (2 * 8 * 24 + 24 + 8) + (2 * 8 * 32 + 32 + 8),
            "DoubleLinear": 2 * (8 * 8 + 8),
        }
        for case, count in expected.items():
            with self.subTest(case=case):
                params = self.results["harness"][case]["params"]
                self.assertEqual(count, sum(torch.Size(shape).numel() for _, shape, _ in params))


class TestNewModelsWithoutFSDP(TestCase):
    def test_every_test_model_is_an_fsdp_test_model(self) -> None:
        with self.assertRaises(TypeError):
            FSDPTestModel()  # type: ignore[abstract]
        for model_cls in (*NWM_FAMILY, TransformerWithSharedParams, ModuleWithDelay):
            with self.subTest(model=model_cls.__name__):
                self.assertTrue(issubclass(model_cls, FSDPTestModel))

    def test_always_wrap_without_fsdp_is_the_nested_module(self) -> None:
        model = AlwaysWrapNestedWrappedModule.init(
            _Group(0, 2), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER
        )
        self.assertIsInstance(model, NestedWrappedModule)
        self.assertEqual(4, len(model.module))

    def test_nonuniform_req_grad_trains_only_the_last_linear(self) -> None:
        model = NonUniformReqGradNWM.init(
            _Group(0, 2), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER
        )
        self.assertEqual(3, len(model.module))
        trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        self.assertEqual(["module.2.1.weight", "module.2.1.bias"], trainable)
        inp = model.get_input("cpu")
        model.run_backward(model.get_loss(inp, model(*inp)))
        self.assertEqual(
            trainable, [name for name, p in model.named_parameters() if p.grad is not None]
        )

    def test_mixture_of_experts_experts_differ_per_rank(self) -> None:
        ranks = [
            MixtureOfExperts.init(
                _Group(rank, 2), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER,
                deterministic=True,
            )
            for rank in (0, 1)
        ]
        for model in ranks:
            experts = [n for n, p in model.named_parameters() if getattr(p, "expert", False)]
            self.assertEqual(["module.2.weight", "module.2.bias"], experts)
            self.assertEqual(23 * 12 + 12, model.num_expert_params)
        self.assertNotEqual(ranks[0].module[2].weight, ranks[1].module[2].weight)
        self.assertEqual(ranks[0].module[1].weight, ranks[1].module[1].weight)
        self.assertEqual(ranks[0].module[0].weight, ranks[1].module[0].weight)

    def test_module_with_delay_delays_loss_and_reduce_scatter(self) -> None:
        name = fsdp_collectives.reduce_scatter_name()
        calls: List[Any] = []
        waited: List[float] = []

        def recording_reduce_scatter(*args: Any, **kwargs: Any) -> str:
            calls.append((args, kwargs))
            return "work"

        class Inner(NestedWrappedModule):
            def run_backward(self, loss: torch.Tensor) -> None:
                start = time.monotonic()
                self.result = getattr(dist, name)("out", "in", group=None)
                waited.append(time.monotonic() - start)
                loss.backward()

        inner = Inner(_Group(0, 2), False, DEVICEInitMode.DEVICE_NEVER, False)
        model = ModuleWithDelay(inner, delay_after_loss_ms=50, delay_before_reduction_ms=60)
        inp = model.get_input("cpu")
        start = time.monotonic()
        loss = model.get_loss(inp, model(*inp))
        self.assertTrue(delayed_at_least(start, 0.05))
        with mock.patch.object(dist, name, recording_reduce_scatter):
            model.run_backward(loss)
            self.assertIs(getattr(dist, name), recording_reduce_scatter, "not restored")
        self.assertGreaterEqual(waited[0], 0.06)
        self.assertEqual([(("out", "in"), {"group": None})], calls)
        self.assertEqual("work", inner.result)
        self.assertTrue(all(p.grad is not None for p in inner.parameters()))

    def test_nested_wrapped_module_with_delay_defaults(self) -> None:
        model = NestedWrappedModuleWithDelay.init(_Group(0, 2), FSDPInitMode.NO_FSDP)
        self.assertIsInstance(model, ModuleWithDelay)
        self.assertIsInstance(model.module, NestedWrappedModule)
        self.assertEqual((0, 0), (model.delay_after_loss_ms, model.delay_before_reduction_ms))

    def test_dummy_ddp_forwards(self) -> None:
        inner = nn.Linear(3, 2)
        wrapper = DummyDDP(inner)
        x = torch.randn(4, 3)
        self.assertIs(inner, wrapper.module)
        self.assertEqual(inner(x), wrapper(x))

    def test_double_linear_outputs(self) -> None:
        model = DoubleLinear(4)
        x = torch.randn(2, 4)
        first, second = model(x)
        self.assertEqual(torch.relu(model.lin1(x)), first)
        self.assertEqual(torch.relu(model.lin2(x)), second)
        model.use_second_linear = False
        self.assertEqual(first, model(x))

    def test_mlp_stack_layout(self) -> None:
        self.assertEqual([24, 32, 24], [m.in_proj.out_features for m in MLPStack(8)])
        with_sp = MLPStack(8, with_seq_parallel=True)
        self.assertIsInstance(with_sp[3], nn.LayerNorm)
        self.assertIsNone(with_sp[3].bias)
        self.assertTrue(with_sp.with_seq_parallel)


class TestModelsWithoutFSDP(TestCase):
    def test_nested_wrapped_module_layout_and_io(self) -> None:
        model = NestedWrappedModule.init(
            _Group(1, 2), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER
        )
        self.assertEqual((1, 2), (model.rank, model.world_size))
        self.assertEqual(4, len(model.module))
        self.assertFalse(any(isinstance(m, FSDP) for m in model.modules()))
        self.assertEqual({torch.device("cpu")}, {p.device for p in model.parameters()})
        (x,) = model.get_input(torch.device("cpu"))
        self.assertEqual((4, 8), tuple(x.shape))
        self.assertEqual(x, model.get_input("cpu")[0])  # same every call
        other_rank = NestedWrappedModule.init(
            _Group(0, 2), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER
        )
        self.assertNotEqual(x, other_rank.get_input("cpu")[0])  # differs across ranks
        out = model(x)
        self.assertEqual((4, 8), tuple(out.shape))
        loss = model.get_loss((x,), out)
        self.assertEqual(out.sum(), loss)
        model.run_backward(loss)
        self.assertTrue(all(p.grad is not None for p in model.parameters()))

    def test_deterministic_construction(self) -> None:
        for model_cls in (NestedWrappedModule, TransformerWithSharedParams):
            with self.subTest(model=model_cls.__name__):
                a, b = (
                    model_cls.init(
                        _Group(0, 1),
                        FSDPInitMode.NO_FSDP,
                        cuda_init_mode=CUDAInitMode.CUDA_NEVER,
                        deterministic=True,
                    )
                    for _ in range(2)
                )
                self.assertEqual(list(a.state_dict().values()), list(b.state_dict().values()))

    def test_device_before_moves_to_current_device(self) -> None:
        for model_cls in (NestedWrappedModule, TransformerWithSharedParams):
            with self.subTest(model=model_cls.__name__):
                model = model_cls.init(
                    _Group(0, 1), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE
                )
                devices = {t.device for t in [*model.parameters(), *model.buffers()]}
                self.assertEqual({current_device()}, devices)

    def test_transformer_shares_weights_and_trains(self) -> None:
        model = TransformerWithSharedParams.init(
            _Group(0, 1), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER
        )
        self.assertIs(model.output_proj.weight, model.embed_tokens.weight)
        self.assertEqual(torch.long, model.long_buffer.dtype)
        self.assertIsInstance(model.bn, nn.BatchNorm1d)
        self.assertEqual([model.transformer], model.get_ignored_modules())
        inp = model.get_input(torch.device("cpu"))
        self.assertEqual([(6, 2), (4, 2)], [tuple(t.shape) for t in inp])
        out = model(*inp)
        self.assertEqual((4, 2, TransformerWithSharedParams.VOCAB), tuple(out.shape))
        loss = model.get_loss(inp, out)
        self.assertEqual(0, loss.dim())
        model.run_backward(loss)
        self.assertIsNotNone(model.embed_tokens.weight.grad)

    def test_transformer_without_bn(self) -> None:
        model = TransformerWithSharedParams.init(
            _Group(0, 1), FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER, add_bn=False
        )
        self.assertIsInstance(model.bn, nn.Identity)


class TestModelsWithFSDP(TestCase):
    """RECURSIVE wrapping in a one-rank gloo group (in this process, no spawning)."""

    @classmethod
    def setUpClass(cls) -> None:
        if dist.is_initialized():
            raise unittest.SkipTest("a default process group already exists in this process")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls) -> None:
        dist.destroy_process_group()

    def _fsdp_kwargs(self) -> dict:
        return {"device_id": current_device()}

    def _train_step(self, model: nn.Module) -> None:
        inp = model.get_input(current_device())
        loss = model.get_loss(inp, model(*inp))
        model.run_backward(loss)
        self.assertTrue(torch.isfinite(loss))

    def test_nested_wrapped_module_recursive(self) -> None:
        group = dist.group.WORLD
        for mode in DEVICEInitMode:
            with self.subTest(mode=mode.name), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # world size 1 -> NO_SHARD warning
                model = NestedWrappedModule.init(
                    group, FSDPInitMode.RECURSIVE, mode, self._fsdp_kwargs()
                )
                self.assertNotIsInstance(model, FSDP)  # top level stays plain
                self.assertEqual(3, len(FSDP.fsdp_modules(model)))
                self.assertIsInstance(model.module[1], FSDP)
                self.assertIsInstance(model.module[2], FSDP)
                if mode != DEVICEInitMode.DEVICE_NEVER or current_device().type == "cpu":
                    # DEVICE_NEVER leaves the unwrapped layers on the CPU while FSDP moves its
                    # own to device_id: on an accelerator the model is mixed, as upstream's is
                    self._train_step(model)

    def test_transformer_recursive(self) -> None:
        group = dist.group.WORLD
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = TransformerWithSharedParams.init(
                group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE, self._fsdp_kwargs()
            )
        self.assertIsInstance(model, FSDP)
        # top level + 2 encoder + 2 decoder layers
        self.assertEqual(5, len(FSDP.fsdp_modules(model)))
        self._train_step(model)

    def test_fsdp_kwargs_for_device(self) -> None:
        kwargs = {"use_orig_params": True}
        adapted = fsdp_kwargs_for_device(kwargs)
        self.assertEqual({"use_orig_params": True}, kwargs, "the caller's kwargs changed")
        if current_device().type == "cpu":
            self.assertEqual(torch.device("cpu"), adapted.pop("device_id"))
        self.assertEqual(kwargs, adapted)
        self.assertEqual("given", fsdp_kwargs_for_device({"device_id": "given"})["device_id"])
        on_cpu = current_device().type == "cpu"
        expected = {"device_id": torch.device("cpu")} if on_cpu else {}
        self.assertEqual(expected, fsdp_kwargs_for_device(None))

    def test_wrapping_without_device_id_works_here(self) -> None:
        """On CPU the models pass FSDP1 the CPU as device_id; without it FSDP1 refuses."""
        group = dist.group.WORLD
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = NestedWrappedModule.init(
                group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE
            )
            if current_device().type == "cpu":
                with self.assertRaisesRegex(RuntimeError, "accelerator"):
                    FSDP(nn.Linear(2, 2), group)
        self._train_step(model)

    def test_always_wrap_wraps_every_module(self) -> None:
        group = dist.group.WORLD
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AlwaysWrapNestedWrappedModule.init(
                group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_AFTER
            )
        self.assertIsInstance(model, FSDP)
        # root, module (Sequential), 4 top-level entries, the inner Sequential's 2 linears
        self.assertEqual(8, len(FSDP.fsdp_modules(model)))
        self._train_step(model)

    def test_nonuniform_req_grad_recursive(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = NonUniformReqGradNWM.init(
                dist.group.WORLD,
                FSDPInitMode.RECURSIVE,
                DEVICEInitMode.DEVICE_BEFORE,
                {"use_orig_params": True},
            )
        self.assertEqual(3, len(FSDP.fsdp_modules(model)))
        trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        self.assertEqual(2, len(trainable))
        self.assertTrue(all(".2." in name and name.endswith(("weight", "bias"))
                            for name in trainable))
        self._train_step(model)

    def test_mixture_of_experts_recursive_with_delay(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = MixtureOfExperts.init(
                dist.group.WORLD,
                FSDPInitMode.RECURSIVE,
                DEVICEInitMode.DEVICE_BEFORE,
                delay_before_free_ms=20,
            )
        expert, shared = model.module[2], model.module[1]
        self.assertIsInstance(expert, FSDP)
        self.assertIsInstance(shared, FSDP)
        self.assertEqual(1, dist.get_world_size(expert.process_group))
        runtime = fsdp1.runtime_module()
        original = runtime._reshard
        start = time.monotonic()
        self._train_step(model)
        self.assertTrue(delayed_at_least(start, 0.02))
        self.assertIs(original, runtime._reshard, "the delayed reshard was not undone")

    def test_mlp_stack_parallelize_on_a_2d_mesh(self) -> None:
        mesh = init_device_mesh(current_device().type, (1, 1), mesh_dim_names=("dp", "tp"))
        for with_seq_parallel in (False, True):
            with self.subTest(with_seq_parallel=with_seq_parallel):
                torch.manual_seed(0)
                model = MLPStack(8, with_seq_parallel=with_seq_parallel)
                ref = copy.deepcopy(model).to(current_device())
                model.parallelize(mesh["tp"], mesh["dp"], use_activation_checkpointing=True)
                self.assertTrue(all(isinstance(p, DTensor) for p in model.parameters()))
                x = torch.randn(2, 3, 8, device=current_device())
                out = model(x)
                out = out.full_tensor() if isinstance(out, DTensor) else out
                self.assertEqual(ref(x), out)
                out.sum().backward()
                self.assertTrue(all(p.grad is not None for p in model.parameters()))

    def test_skip_model_wraps_inside_enable_wrap(self) -> None:
        for double_nest in (False, True):
            with self.subTest(double_nest=double_nest), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with enable_wrap(wrapper_cls=FSDP, device_id=current_device()):
                    model = SkipModel(double_nest=double_nest)
                self.assertNotIsInstance(model.linear_skip, FSDP)
                self.assertIsInstance(model.nested_linear, FSDP)
                inner = model.nested_linear.module.nested_linear
                self.assertEqual(double_nest, isinstance(inner, FSDP))
                out = model(torch.randn(2, 10, device=current_device()))
                out.sum().backward()
                self.assertEqual((2, 10), tuple(out.shape))
        plain = SkipModel(double_nest=True)  # outside enable_wrap, wrap() is a no-op
        self.assertFalse(any(isinstance(m, FSDP) for m in plain.modules()))
        self.assertIsInstance(NestedLinear(fsdp_wrap=True).nested_linear, nn.Linear)
        self.assertIsNone(SkipModule().lin.bias)

    def test_custom_policy_is_used_and_kwargs_not_mutated(self) -> None:
        group = dist.group.WORLD
        kwargs = {**self._fsdp_kwargs(), "auto_wrap_policy": None}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = TransformerWithSharedParams.init(
                group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_NEVER, kwargs
            )
        self.assertEqual(1, len(FSDP.fsdp_modules(model)))
        self.assertIn("auto_wrap_policy", kwargs)


if __name__ == "__main__":
    unittest.main()
