"""Tests for harness/models.py: shapes, placement, determinism, wrapping and bad input."""

from __future__ import annotations

import unittest
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from harness.models import (
    MLP,
    CUDAInitMode,
    DEVICEInitMode,
    FSDPInitMode,
    NestedWrappedModule,
    TransformerWithSharedParams,
    current_device,
)
from harness.testcase import TestCase


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
        for model_cls in (NestedWrappedModule, TransformerWithSharedParams):
            for args, kwargs, message in cases:
                with self.subTest(model=model_cls.__name__, message=message):
                    with self.assertRaisesRegex(ValueError, message) as caught:
                        model_cls.init(*args, **kwargs)
                    self.assertNotIn("\n", str(caught.exception))


class TestMLP(TestCase):
    def test_forward_is_out_proj_relu_in_proj(self) -> None:
        mlp = MLP(3, dim_multiplier=2)
        self.assertEqual((6, 3), tuple(mlp.in_proj.weight.shape))
        self.assertEqual((3, 6), tuple(mlp.out_proj.weight.shape))
        self.assertIsNone(mlp.buffer)
        x = torch.randn(5, 3)
        self.assertEqual(mlp.out_proj(torch.relu(mlp.in_proj(x))), mlp(x))

    def test_buffer_is_added_and_registered(self) -> None:
        mlp = MLP(4, with_buffer=True)
        self.assertEqual(["buffer"], [name for name, _ in mlp.named_buffers()])
        x = torch.randn(2, 4)
        self.assertEqual(mlp.out_proj(torch.relu(mlp.in_proj(x))) + mlp.buffer, mlp(x))
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
