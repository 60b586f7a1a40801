"""harness/kit/fsdp1_grads.py: FSDP1's unsharded gradients equal DDP's; a wrong one is caught."""

from __future__ import annotations

import copy
from typing import List, Optional

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.kit.fsdp import FSDPTest
from harness.kit.fsdp1_grads import assert_fsdp1_grads_equal, fsdp1_full_grads, named_grads
from harness.requirements.decorators import skip_if_lt_x_gpu
from harness.single_process.testcase import TestCase


class TestFullGradsSingleProcess(TestCase):
    def test_rejects_a_module_that_is_not_fsdp1(self) -> None:
        with self.assertRaisesRegex(TypeError, "needs an FSDP1 module, got Linear"):
            fsdp1_full_grads(nn.Linear(2, 2))


@pytest.mark.slow
@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless it is allowed
class TestFullGrads(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    def _models(self, **fsdp_kwargs) -> tuple[FSDP, DDP]:
        """FSDP (each Linear its own unit) and DDP copies of a net whose first Linear is frozen.

        Sizes do not divide by the world size (padded shards), and with SHARD_GRAD_OP the frozen
        first Linear, which no gradient reaches, keeps FSDP's stale unsharded copy.
        """
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.ReLU(), nn.Linear(3, 3)
        ).to(self.device)
        net[0].requires_grad_(False)
        ddp_ids: Optional[List[int]] = None if self.device.type == "cpu" else [self.device.index]
        ddp = DDP(copy.deepcopy(net), device_ids=ddp_ids)
        fsdp = FSDP(
            net,
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            device_id=self.device,
            **fsdp_kwargs,
        )
        return fsdp, ddp

    def _backward(self, *models: nn.Module) -> None:
        torch.manual_seed(self.rank + 1)  # different data per rank: reduction matters
        inp = torch.randn(4, 5, device=self.device)
        for model in models:
            model(inp).sum().backward()

    def test_equal_ddp_and_leave_params_and_grads_alone(self) -> None:
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                    ShardingStrategy.NO_SHARD,
                ],
                "use_orig_params": [False, True],
            },
            self._test_equal_ddp,
        )

    def _test_equal_ddp(self, sharding_strategy: ShardingStrategy, use_orig_params: bool) -> None:
        fsdp, ddp = self._models(
            sharding_strategy=sharding_strategy, use_orig_params=use_orig_params
        )
        for _ in range(2):  # the second backward starts from FSDP's post-step state
            self._backward(fsdp, ddp)
            before = [(p.detach().clone(), p.grad) for p in fsdp.parameters()]
            grads = fsdp1_full_grads(fsdp)
            expected = named_grads(ddp.module)
            self.assertEqual(sorted(grads), sorted(expected))
            for name, grad in expected.items():
                if grad is None:
                    self.assertIsNone(grads[name], msg=name)
                else:
                    self.assertEqual(grads[name], grad, msg=name)
            self.assertIsNone(grads["0.weight"])
            self.assertIsNotNone(grads["2.weight"])
            for param, (data, grad) in zip(fsdp.parameters(), before):
                self.assertEqual(param.detach(), data)
                self.assertIs(param.grad, grad)
            assert_fsdp1_grads_equal(self, fsdp, expected)
            for model in (fsdp, ddp):
                with torch.no_grad():
                    for param in model.parameters():
                        if param.grad is not None:
                            param -= 0.1 * param.grad
                model.zero_grad(set_to_none=True)

    def test_scaled_or_missing_gradient_fails(self) -> None:
        self.run_subtests({"use_orig_params": [False, True]}, self._test_wrong_gradient_fails)

    def _test_wrong_gradient_fails(self, use_orig_params: bool) -> None:
        fsdp, ddp = self._models(use_orig_params=use_orig_params)
        self._backward(fsdp, ddp)
        expected = named_grads(ddp.module)
        with torch.no_grad():
            for param in fsdp.parameters():
                if param.grad is not None:
                    param.grad.mul_(3.0)
        with self.assertRaisesRegex(AssertionError, r"scaled: \d\.(weight|bias)\.grad"):
            assert_fsdp1_grads_equal(self, fsdp, expected, msg="scaled")
        # Leaving the scaled ones out, what remains must still compare
        trained = [name for name in expected if not name.startswith("0.")]
        assert_fsdp1_grads_equal(self, fsdp, {"0.weight": None, "0.bias": None}, skip=trained)
        for param in fsdp.parameters():
            param.grad = None
        with self.assertRaisesRegex(AssertionError, "has no gradient, its reference has one"):
            assert_fsdp1_grads_equal(self, fsdp, expected)

    def test_no_sync_gradients_are_refused(self) -> None:
        fsdp, _ = self._models(use_orig_params=False)
        with fsdp.no_sync():
            self._backward(fsdp)
        with self.assertRaisesRegex(ValueError, "not inside no_sync"):
            fsdp1_full_grads(fsdp)
