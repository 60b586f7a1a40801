"""harness/kit/fsdp_helpers.py: the helpers detect what they claim and patch what FSDP calls."""

from __future__ import annotations

import copy
import functools
import unittest
from typing import Any, Dict, List
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

from harness import settings
from harness.compat import fsdp2, fsdp_collectives, inductor
from harness.kit.fsdp import FSDPTest
from harness.kit.fsdp_helpers import (
    DummyProcessGroup,
    _assert_module_states,
    _broadcast_state_dict,
    _get_state_dict,
    _zero_model,
    assert_module_states,
    check_sharded_parity,
    compiled_fsdp_test,
    get_devtype,
    get_full_params,
    patch_all_gather,
    patch_all_reduce,
    patch_foreach_all_gather,
    patch_foreach_reduce,
    patch_post_backward,
    patch_reduce_scatter,
    patch_register_post_backward_hook_backward,
    patch_reshard,
    patch_unshard,
    reduce_scatter_with_assert,
    subtest_name,
)
from harness.requirements.decorators import skip_if_lt_x_gpu
from harness.single_process.testcase import TestCase

# Each patch helper, what it patches (owner, attribute) in this torch.
PATCHES = {
    patch_all_gather: (dist, fsdp_collectives.all_gather_name()),
    patch_all_reduce: (dist, "all_reduce"),
    patch_reduce_scatter: (dist, fsdp_collectives.reduce_scatter_name()),
    patch_foreach_all_gather: (fsdp2.param_group_module(), "foreach_all_gather"),
    patch_foreach_reduce: (fsdp2.param_group_module(), "foreach_reduce"),
    patch_unshard: (fsdp2.param_group_class(), "unshard"),
    patch_reshard: (fsdp2.param_group_class(), "reshard"),
    patch_post_backward: (fsdp2.param_group_class(), "post_backward"),
}


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

    def test_get_devtype(self) -> None:
        self.assertEqual(torch.device(settings.device_type()), get_devtype())
        if not torch.cuda.is_available():
            self.assertEqual(torch.device("cpu"), get_devtype())

    def test_subtest_name(self) -> None:
        mapping = {"True": "on", "ShardingStrategy.NO_SHARD": "no_shard", "3": "three"}
        from torch.distributed.fsdp import ShardingStrategy

        self.assertEqual("on_none_no_shard_three",
                         subtest_name(mapping, True, None, ShardingStrategy.NO_SHARD, 3))
        self.assertEqual("", subtest_name(mapping))
        with self.assertRaisesRegex(KeyError, "'False' is not a key of test_name_mapping") as ctx:
            subtest_name(mapping, False)
        self.assertNotIn("\n", str(ctx.exception))

    def test_dummy_process_group(self) -> None:
        group = DummyProcessGroup(rank=2, size=4)
        self.assertEqual((2, 4), (group.rank(), group.size()))
        work = group.allreduce(torch.ones(3))
        self.assertTrue(work.wait())
        self.assertTrue(work.is_completed())
        future = work.get_future()
        self.assertTrue(future.done())
        self.assertEqual(1, future.wait())
        for rank, size in ((4, 4), (-1, 2), (0, 0)):
            with self.subTest(rank=rank, size=size):
                with self.assertRaisesRegex(ValueError, "0 <= rank < size"):
                    DummyProcessGroup(rank, size)

    def test_every_patch_sets_and_restores_its_target(self) -> None:
        for helper, (owner, name) in PATCHES.items():
            with self.subTest(helper=helper.__name__):
                original = vars(owner)[name]

                def replacement(*args: Any, **kwargs: Any) -> None:
                    return None

                with self.assertRaisesRegex(RuntimeError, "body failed"):
                    with helper(replacement):
                        self.assertIs(vars(owner)[name], replacement)
                        raise RuntimeError("body failed")
                self.assertIs(vars(owner)[name], original)
                with self.assertRaisesRegex(TypeError, f"{helper.__name__}: expected a callable"):
                    with helper("not callable"):  # type: ignore[arg-type]
                        pass
                self.assertIs(vars(owner)[name], original)

    def test_compiled_fsdp_test_runs_eager_then_compiled(self) -> None:
        seen: List[Any] = []

        @compiled_fsdp_test(compile_compute_on_module=nn.ReLU)
        def body(tag: str) -> None:
            seen.append((tag, fully_shard))

        with mock.patch.object(inductor, "has_triton", return_value=False):
            with self.assertWarnsRegex(UserWarning, "needs Triton"):
                body("eager only")
        self.assertEqual(1, len(seen))
        self.assertIs(fully_shard, seen[0][1])
        seen.clear()
        with mock.patch.object(inductor, "has_triton", return_value=True):
            body("both")
        self.assertEqual(["both", "both"], [tag for tag, _ in seen])
        self.assertIs(fully_shard, seen[0][1])
        compiled_variant = seen[1][1]
        self.assertIsNot(fully_shard, compiled_variant)
        self.assertIs(fully_shard, globals()["fully_shard"], "the global was not restored")
        # The variant shards, then compiles only instances of compile_compute_on_module.
        relu, linear = nn.ReLU(), nn.Linear(2, 2)
        with mock.patch("harness.kit.fsdp_helpers.fully_shard", side_effect=lambda m, **k: m) as fs:
            self.assertIs(relu, compiled_variant(relu, mesh="mesh"))
            compiled_variant(linear)
        calls = [(call.args, call.kwargs) for call in fs.call_args_list]
        self.assertEqual([((relu,), {"mesh": "mesh"}), ((linear,), {})], calls)
        self.assertIsNotNone(relu._compiled_call_impl)
        self.assertIsNone(linear._compiled_call_impl)

    def test_zero_model_and_get_state_dict_without_fsdp(self) -> None:
        model = nn.BatchNorm1d(3)
        with torch.no_grad():
            model.weight.fill_(2.0)
            model.running_mean.fill_(1.0)
        _zero_model(model, summon_full=False)
        self.assertEqual(torch.zeros(3), model.weight)
        self.assertEqual(torch.ones(3), model.running_mean)
        _zero_model(model, zero_buffers=True, summon_full=False)
        self.assertEqual(torch.zeros(3), model.running_mean)
        state = _get_state_dict(model, cpu_offload=True, half=True)
        self.assertEqual(torch.float16, state["weight"].dtype)
        self.assertEqual(torch.device("cpu"), state["weight"].device)

    def test_patches_are_undone(self) -> None:
        name = fsdp_collectives.reduce_scatter_name()
        original = getattr(dist, name)
        function_cls = fsdp2.register_post_backward_function()
        original_backward = function_cls.__dict__["backward"]
        with self.assertRaises(RuntimeError):
            with patch_reduce_scatter(lambda *a, **k: None):
                self.assertIsNot(getattr(dist, name), original)
                raise RuntimeError("body failed")
        self.assertIs(getattr(dist, name), original)
        with patch_register_post_backward_hook_backward(lambda ctx, *grads: grads):
            self.assertIsNot(function_cls.__dict__["backward"], original_backward)
        self.assertIs(function_cls.__dict__["backward"], original_backward)


@pytest.mark.slow
@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless it is allowed
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
        orig = getattr(dist, fsdp_collectives.reduce_scatter_name())
        reduce_scatter = functools.partial(
            reduce_scatter_with_assert, self, orig, lambda out: outputs.append(out.numel())
        )
        fsdp1_model = FSDP(nn.Linear(4, 4), device_id=self.device)
        fsdp2_model = fully_shard(nn.Linear(4, 6), mesh=self._mesh())
        inp = torch.randn(2, 4, device=self.device)
        with patch_reduce_scatter(reduce_scatter):
            fsdp1_model(inp).sum().backward()
            self.assertEqual(outputs, [10])  # (16 + 4) elements over 2 ranks
            fsdp2_model(inp).sum().backward()
            self.assertEqual(outputs, [10, 15])  # (24 + 6) elements over 2 ranks
        fsdp2_model(inp).sum().backward()
        self.assertEqual(len(outputs), 2, "the patch outlived its context")

    def test_fully_shard_patches_intercept_what_they_claim(self) -> None:
        """Each patch sees fully_shard's calls while active, forwards them, and is gone after."""
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).to(self.device)
        model = copy.deepcopy(ref)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=self._mesh())
        fully_shard(model, mesh=self._mesh())
        inp = torch.randn(2, 4, device=self.device)
        # (helper, phase it must see calls in)
        cases = [
            (patch_all_gather, "forward"),
            (patch_foreach_all_gather, "forward"),
            (patch_unshard, "forward"),
            (patch_reshard, "forward"),
            (patch_foreach_reduce, "backward"),
            (patch_post_backward, "backward"),
        ]
        for helper, phase in cases:
            owner, name = PATCHES[helper]
            original = getattr(owner, name)
            calls: Dict[str, int] = {"forward": 0, "backward": 0}
            current = ["forward"]

            def counting(
                *args: Any,
                _orig: Any = original,
                _calls: Dict[str, int] = calls,
                _current: List[str] = current,
                **kwargs: Any,
            ) -> Any:
                _calls[_current[0]] += 1
                return _orig(*args, **kwargs)

            with self.subTest(helper=helper.__name__):
                with helper(counting):
                    loss = model(inp).sum()
                    current[0] = "backward"
                    loss.backward()
                self.assertGreater(calls[phase], 0, f"{helper.__name__} saw no {phase} call")
                before = dict(calls)
                model(inp).sum().backward()
                self.assertEqual(before, calls, "the patch outlived its context")
        # Every call was forwarded: the gradients accumulated over the 2 backward passes per
        # case, with and without a patch, match the plain reference's.
        for _ in range(2 * len(cases)):
            ref(inp).sum().backward()
        check_sharded_parity(self, ref, model)

    def test_patch_all_reduce_sees_fsdp1_no_shard(self) -> None:
        torch.manual_seed(0)
        seen: List[int] = []
        orig = dist.all_reduce

        def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            seen.append(tensor.numel())
            return orig(tensor, *args, **kwargs)

        from torch.distributed.fsdp import ShardingStrategy

        model = FSDP(
            nn.Linear(4, 4), device_id=self.device, sharding_strategy=ShardingStrategy.NO_SHARD
        )
        inp = torch.randn(2, 4, device=self.device)
        with patch_all_reduce(counting):
            model(inp).sum().backward()
        self.assertIn(20, seen)  # the flat gradient of 16 + 4 elements
        count = len(seen)
        model(inp).sum().backward()
        self.assertEqual(count, len(seen), "the patch outlived its context")

    def test_get_full_params_unshards(self) -> None:
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2)).to(self.device)
        model = FSDP(copy.deepcopy(ref), device_id=self.device, use_orig_params=True)
        full = get_full_params(model)
        self.assertEqual(list(ref.parameters()), full)
        local = [p.numel() for p in model.parameters()]
        self.assertLess(sum(local), sum(p.numel() for p in ref.parameters()), "not sharded")
        with torch.no_grad():
            full[0].add_(1.0)
        self.assertEqual(list(ref.parameters()), get_full_params(model), "returned a view")
        nested = FSDP(
            nn.Sequential(FSDP(nn.Linear(3, 5), device_id=self.device), nn.Linear(5, 2)),
            device_id=self.device,
        )
        shapes = sorted(tuple(p.shape) for p in get_full_params(nested))
        self.assertEqual([(2,), (2, 5), (5,), (5, 3)], shapes)
        # recurse=False: the inner instance stays sharded (its flat parameter's local shard)
        shapes = sorted(tuple(p.shape) for p in get_full_params(nested, recurse=False))
        self.assertEqual([(2,), (2, 5), (10,)], shapes)

    def test_zero_model_and_broadcast_state_dict(self) -> None:
        torch.manual_seed(self.rank)
        model = FSDP(nn.Linear(3, 4), device_id=self.device)
        _zero_model(model)
        self.assertEqual([torch.zeros(4, 3), torch.zeros(4)],
                         [p.cpu() for p in get_full_params(model)])
        state = {"w": torch.full((2,), float(self.rank + 7))}
        received = _broadcast_state_dict(self.rank, state)
        self.assertEqual(torch.full((2,), 7.0, device=get_devtype()), received["w"])

    def test_patch_register_post_backward_hook_backward(self) -> None:
        torch.manual_seed(0)
        orig_backward = fsdp2.register_post_backward_function().backward
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
