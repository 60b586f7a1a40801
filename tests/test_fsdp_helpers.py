"""harness/fsdp_helpers.py: the helpers detect what they claim and patch what FSDP calls."""

from __future__ import annotations

import copy
import functools
import unittest
from typing import Any, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

from harness import compat
from harness.fsdp import FSDPTest
from harness.fsdp_helpers import (
    _assert_module_states,
    assert_module_states,
    check_sharded_parity,
    patch_reduce_scatter,
    patch_register_post_backward_hook_backward,
    reduce_scatter_with_assert,
)
from harness.testcase import TestCase


class TestHelpersSingleProcess(TestCase):
    def test_alias(self) -> None:
        self.assertIs(_assert_module_states, assert_module_states)

    def test_reduce_scatter_with_assert_checks_then_forwards(self) -> None:
        seen: List[Any] = []
        calls: List[Any] = []
        output, inp = torch.zeros(2), torch.ones(4)

        def orig(*args: Any, **kwargs: Any) -> str:
            calls.append((args, kwargs))
            return "work"

        result = reduce_scatter_with_assert(self, orig, seen.append, output, inp, group=None)
        self.assertEqual(result, "work")
        self.assertIs(seen[0], output)
        self.assertIs(calls[0][0][0], output)
        self.assertIs(calls[0][0][1], inp)
        self.assertEqual(calls[0][1], {"group": None})

        def failing(out: torch.Tensor) -> None:
            raise AssertionError("numel")

        with self.assertRaisesRegex(AssertionError, "numel"):
            reduce_scatter_with_assert(self, orig, failing, output, inp)
        self.assertEqual(len(calls), 1, "the reduce-scatter ran although the assert failed")

    def test_bad_input_is_one_line_error(self) -> None:
        with self.assertRaisesRegex(TypeError, "output must be a tensor"):
            reduce_scatter_with_assert(self, print, print, "not a tensor")
        with self.assertRaisesRegex(TypeError, "patch_reduce_scatter: expected a callable"):
            with patch_reduce_scatter(None):  # type: ignore[arg-type]
                pass
        with self.assertRaisesRegex(TypeError, "expected a callable"):
            with patch_register_post_backward_hook_backward(3):  # type: ignore[arg-type]
                pass

    def test_patches_are_undone(self) -> None:
        name = compat.fsdp_reduce_scatter_name()
        original = getattr(dist, name)
        function_cls = compat.register_post_backward_function()
        original_backward = function_cls.__dict__["backward"]
        with self.assertRaises(RuntimeError):
            with patch_reduce_scatter(lambda *a, **k: None):
                self.assertIsNot(getattr(dist, name), original)
                raise RuntimeError("body failed")
        self.assertIs(getattr(dist, name), original)
        with patch_register_post_backward_hook_backward(lambda ctx, *grads: grads):
            self.assertIsNot(function_cls.__dict__["backward"], original_backward)
        self.assertIs(function_cls.__dict__["backward"], original_backward)


class TestHelpersMultiProcess(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    def _mesh(self) -> Any:
        return init_device_mesh(self.device.type, (self.world_size,))

    def test_assert_module_states(self) -> None:
        torch.manual_seed(0)
        model = nn.Linear(3, 5, device=self.device)
        assert_module_states(model, self.process_group, self.assertEqual)
        with torch.no_grad():
            model.bias.add_(self.rank)
        with self.assertRaisesRegex(AssertionError, "not close|differ"):
            assert_module_states(model, self.process_group, self.assertEqual)
        other = nn.Linear(3, 5) if self.rank == 0 else nn.Sequential(nn.Linear(3, 5))
        with self.assertRaisesRegex(AssertionError, "names differ between rank 0 and rank 1"):
            assert_module_states(other, self.process_group, self.assertEqual)

    def test_check_sharded_parity(self) -> None:
        torch.manual_seed(0)
        # 5 rows over 2 ranks: uneven shards (3 and 2 rows)
        model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 3))
        ref = copy.deepcopy(model).to(self.device)
        fully_shard(model, mesh=self._mesh())
        check_sharded_parity(self, ref, model)
        inp = torch.randn(4, 3, device=self.device)
        model(inp).sum().backward()
        with self.assertRaisesRegex(AssertionError, "unexpected gradient"):
            check_sharded_parity(self, ref, model)
        ref(inp).sum().backward()
        check_sharded_parity(self, ref, model)
        with torch.no_grad():
            ref[0].weight.grad[0, 0] += 1.0  # row 0 lives on rank 0 only
        if self.rank == 0:
            with self.assertRaisesRegex(AssertionError, "0.weight.grad"):
                check_sharded_parity(self, ref, model)
        else:
            check_sharded_parity(self, ref, model)
        with torch.no_grad():
            ref[2].bias[-1] += 1.0  # the last of 3 elements lives on rank 1 only
        if self.rank == 1:
            with self.assertRaisesRegex(AssertionError, "2.bias"):
                check_sharded_parity(self, ref, model)
        plain = copy.deepcopy(ref)
        with self.assertRaisesRegex(AssertionError, "not a DTensor"):
            check_sharded_parity(self, ref, plain)
        with self.assertRaisesRegex(AssertionError, "2 replicated parameters"):
            check_sharded_parity(self, ref[0], model)

    def test_patch_reduce_scatter_sees_fsdp1_and_fully_shard(self) -> None:
        torch.manual_seed(0)
        outputs: List[int] = []
        orig = getattr(dist, compat.fsdp_reduce_scatter_name())
        reduce_scatter = functools.partial(
            reduce_scatter_with_assert, self, orig, lambda out: outputs.append(out.numel())
        )
        fsdp1 = FSDP(nn.Linear(4, 4), device_id=self.device)
        fsdp2 = fully_shard(nn.Linear(4, 6), mesh=self._mesh())
        inp = torch.randn(2, 4, device=self.device)
        with patch_reduce_scatter(reduce_scatter):
            fsdp1(inp).sum().backward()
            self.assertEqual(outputs, [10])  # (16 + 4) elements over 2 ranks
            fsdp2(inp).sum().backward()
            self.assertEqual(outputs, [10, 15])  # (24 + 6) elements over 2 ranks
        fsdp2(inp).sum().backward()
        self.assertEqual(len(outputs), 2, "the patch outlived its context")

    def test_patch_register_post_backward_hook_backward(self) -> None:
        torch.manual_seed(0)
        orig_backward = compat.register_post_backward_function().backward
        calls = 0

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return orig_backward(*args, **kwargs)

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        for layer in model:
            fully_shard(layer, mesh=self._mesh())
        fully_shard(model, mesh=self._mesh())
        inp = torch.randn(2, 4, device=self.device)
        with patch_register_post_backward_hook_backward(counting):
            model(inp).sum().backward()
        # The second linear's input requires grad: its post-backward runs in autograd
        self.assertGreaterEqual(calls, 1)
        for param in model.parameters():
            self.assertIsNotNone(param.grad)
        before = calls
        model(inp).sum().backward()
        self.assertEqual(calls, before, "the patch outlived its context")


if __name__ == "__main__":
    unittest.main()
