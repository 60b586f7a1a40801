"""The DTensor models against upstream's (torch.testing._internal...common_dtensor).

Same seed, same structure, parameter names, shapes and values, same outputs; and
`Transformer.parallelize` shards every parameter as upstream's plan does.
"""

from __future__ import annotations

import dataclasses
import unittest
from typing import Any, List, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed._tensor import common_dtensor as upstream

from harness.kit import dtensor_models as ours

ARGS = [
    {},
    {"n_layers": 3, "weight_tying": False},
    {"num_experts": 2},
    {"dim": 32, "n_heads": 8, "vocab_size": 16, "checkpoint_activations": True},
]


def _layout(module: nn.Module) -> Tuple[List[Tuple[str, str]], List[Tuple[str, Tuple[int, ...]]]]:
    modules = [(name, type(m).__name__) for name, m in module.named_modules()]
    params = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    return modules, params


def _placements(module: nn.Module) -> List[Tuple[str, Any]]:
    return [
        (name, tuple(p.placements) if isinstance(p, DTensor) else None)
        for name, p in module.named_parameters()
    ]


def _built(factory: Any, *args: Any, **kwargs: Any) -> nn.Module:
    torch.manual_seed(0)
    return factory(*args, **kwargs)


class TestModelsMatchUpstream(unittest.TestCase):
    def assert_same_model(self, mine: nn.Module, theirs: nn.Module) -> None:
        self.assertEqual(_layout(mine), _layout(theirs))
        self.assertEqual(
            sum(p.numel() for p in mine.parameters()), sum(p.numel() for p in theirs.parameters())
        )
        for (name, a), (_, b) in zip(mine.state_dict().items(), theirs.state_dict().items()):
            torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")

    def test_model_args_defaults(self) -> None:
        mine, theirs = ours.ModelArgs(), upstream.ModelArgs()
        self.assertEqual(dataclasses.asdict(mine), dataclasses.asdict(theirs))

    def test_transformer(self) -> None:
        for overrides in ARGS:
            with self.subTest(**overrides):
                mine = _built(ours.Transformer, ours.ModelArgs(**overrides)).eval()
                theirs = _built(upstream.Transformer, upstream.ModelArgs(**overrides)).eval()
                self.assert_same_model(mine, theirs)
                tokens = torch.randint(mine.model_args.vocab_size, (2, 8))
                torch.testing.assert_close(mine(tokens), theirs(tokens))
                self.assertEqual(
                    mine.output.weight is mine.tok_embeddings.weight,
                    theirs.output.weight is theirs.tok_embeddings.weight,
                )

    def test_transformer_rejects_a_too_long_sequence(self) -> None:
        model = ours.Transformer(ours.ModelArgs(max_seq_len=4))
        with self.assertRaisesRegex(AssertionError, "seq_len <= max_seq_len, got 5 > 4"):
            model(torch.zeros(1, 5, dtype=torch.long))

    def test_mlp_module_and_stacked(self) -> None:
        for bias in (True, False):
            with self.subTest(bias=bias):
                mine = ours.MLPModule("cpu", bias=bias)
                theirs = upstream.MLPModule("cpu", bias=bias)
                self.assert_same_model(mine, theirs)
                x = torch.rand(3, 10)
                torch.testing.assert_close(mine(x), theirs(x))
        for n_layers in (2, 3):
            with self.subTest(n_layers=n_layers):
                mine = ours.MLPStacked("cpu", n_layers=n_layers)
                theirs = upstream.MLPStacked("cpu", n_layers=n_layers)
                self.assert_same_model(mine, theirs)
                x = torch.rand(3, 10)
                torch.testing.assert_close(mine(x), theirs(x))

    def test_mlp_module_reset_parameters_changes_weights(self) -> None:
        model = ours.MLPModule("cpu")
        before = model.net1.weight.detach().clone()
        model.reset_parameters()
        self.assertFalse(torch.equal(before, model.net1.weight))

    def test_rms_norm(self) -> None:
        mine, theirs = ours.RMSNormPython(8), upstream.RMSNormPython(8)
        self.assert_same_model(mine, theirs)
        x = torch.randn(2, 8)
        torch.testing.assert_close(mine(x), theirs(x))


class TestParallelizeMatchesUpstream(unittest.TestCase):
    """One rank in this process: enough to compare every parameter's placements."""

    def setUp(self) -> None:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        self.addCleanup(dist.destroy_process_group)

    def _compare(self, overrides: dict, **plan: Any) -> bool:
        """Compare placements, then outputs; False if upstream's forward raises (and ours too)."""
        mine = _built(ours.Transformer, ours.ModelArgs(dropout_p=0.0, **overrides))
        theirs = _built(upstream.Transformer, upstream.ModelArgs(dropout_p=0.0, **overrides))
        ours.Transformer.parallelize(mine, **plan)
        upstream.Transformer.parallelize(theirs, **plan)
        self.assertEqual(_placements(mine), _placements(theirs))
        self.assertTrue(any(p is not None for _, p in _placements(mine)))
        tokens = torch.randint(mine.model_args.vocab_size, (2, 8))
        try:
            expected = theirs(tokens)
        except Exception as error:  # e.g. no CPU sharding rule for attention on DTensors
            with self.assertRaises(type(error)):
                mine(tokens)
            return False
        torch.testing.assert_close(mine(tokens), expected)
        return True

    def test_tensor_parallel(self) -> None:
        mesh = init_device_mesh("cpu", (1,))
        compared = []
        for seq in (False, True):
            for local_attn in (False, True):
                with self.subTest(use_seq_parallel=seq, local_output_for_attn=local_attn):
                    compared.append(self._compare(
                        {}, tp_mesh=mesh, use_seq_parallel=seq, local_output_for_attn=local_attn
                    ))
        self.assertTrue(any(compared), "no tensor-parallel forward ran to compare")

    def test_tensor_parallel_experts(self) -> None:
        mesh = init_device_mesh("cpu", (1,))
        for seq in (False, True):
            with self.subTest(use_seq_parallel=seq):
                self._compare(
                    {"num_experts": 2}, tp_mesh=mesh, use_seq_parallel=seq,
                    local_output_for_attn=True,
                )

    def test_expert_parallel(self) -> None:
        mesh = init_device_mesh("cpu", (1,))
        self.assertTrue(
            self._compare({"num_experts": 2}, tp_mesh=None, use_seq_parallel=False, ep_mesh=mesh)
        )

    def test_expert_parallel_with_tensor_parallel(self) -> None:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ep", "tp"))
        self._compare(
            {"num_experts": 2}, tp_mesh=mesh["tp"], use_seq_parallel=False, ep_mesh=mesh["ep"],
            local_output_for_attn=True,
        )

    def test_bad_arguments(self) -> None:
        with self.assertRaisesRegex(ValueError, "At least one of tp_mesh or ep_mesh"):
            ours.Transformer.parallelize(ours.Transformer(ours.ModelArgs()), None, False)
        with self.assertRaisesRegex(AssertionError, "Requires Transformer but got"):
            ours.Transformer.parallelize(nn.Linear(2, 2), init_device_mesh("cpu", (1,)), False)


if __name__ == "__main__":
    unittest.main()
