# Owner(s): ["oncall: distributed"]
"""FSDP (FullyShardedDataParallel) fine-tuning: some parameters are frozen.

Mirrors upstream's test/distributed/fsdp/test_fsdp_fine_tune.py; runs on the rank's device
(CPU with gloo when no accelerator exists).
"""

import copy
import sys
from typing import Any, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullyShardedDataParallel as FSDP,
)
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import TEST_WITH_DEV_DBG_ASAN, FSDPTest, run_tests, skip_if_lt_x_gpu
from harness.compat import fsdp1
from harness.kit.fsdp1_grads import assert_fsdp1_grads_equal, named_grads
from harness.settings import default_world_size

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

if TEST_WITH_DEV_DBG_ASAN:
    print(
        "Skip dev-asan as torch + multiprocessing spawn have known issues",
        file=sys.stderr,
    )
    sys.exit(0)


class LinearUnusedInput(nn.Linear):
    def forward(self, frozen_input, learnable_input):
        return super().forward(frozen_input)


class ModelUnusedInput(nn.Module):
    def __init__(self, freeze: bool, device: torch.device):
        super().__init__()
        self.layer0 = LinearUnusedInput(4, 4, device=device)
        self.layer1_frozen = LinearUnusedInput(4, 4, device=device)
        if freeze:
            for param in self.layer1_frozen.parameters():
                param.requires_grad = False
        self.layer2 = LinearUnusedInput(4, 4, device=device)

    def forward(self, frozen_input, learnable_input):
        x = self.layer0(frozen_input, learnable_input)
        y = self.layer1_frozen(frozen_input, learnable_input)
        z = self.layer2(frozen_input, learnable_input)
        return torch.concat([x, y, z, learnable_input])


class TestFSDPFineTune(FSDPTest):
    """Tests fine-tuning cases where some parameters are frozen."""

    NUM_LINEARS = 6

    @property
    def world_size(self) -> int:
        return min(default_world_size(), 2)

    def _ddp_device_ids(self) -> Optional[List[int]]:
        """DDP takes the rank's accelerator index, and no device_ids for CPU modules."""
        return None if self.device.type == "cpu" else [self.device.index]

    def _train_in_parity_with_ddp(
        self, seq: nn.Module, inp_requires_grad: bool, check_resharded: bool, **fsdp_kwargs: Any
    ) -> None:
        """Train FSDP (each Linear wrapped) and DDP copies of `seq` side by side for 6 steps.

        After each backward, before the optimizer steps, FSDP's unsharded gradients must equal
        DDP's (Adam barely sees a wrongly scaled gradient, so losses alone would not); losses
        must match every step and the parameters at the end (losses alone can hide a wrong
        update of a late layer). With `check_resharded`, every flat parameter must be resharded
        after each step (not so for SHARD_GRAD_OP params that no gradient reaches).
        """
        fsdp_seq = FSDP(
            copy.deepcopy(seq),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            device_id=self.device,
            **fsdp_kwargs,
        )
        ddp_seq = DDP(copy.deepcopy(seq), device_ids=self._ddp_device_ids())
        fsdp_optim = torch.optim.Adam(fsdp_seq.parameters(), lr=1e-2)
        ddp_optim = torch.optim.Adam(ddp_seq.parameters(), lr=1e-2)
        torch.manual_seed(self.rank + 1)
        for _ in range(6):
            inp = torch.randn((8, 5), device=self.device, requires_grad=inp_requires_grad)
            losses = []
            for model in (fsdp_seq, ddp_seq):
                loss = model(inp).sum()
                losses.append(loss)
                loss.backward()
            assert_fsdp1_grads_equal(self, fsdp_seq, named_grads(ddp_seq.module))
            for optim in (fsdp_optim, ddp_optim):
                optim.step()
                optim.zero_grad()
            torch.testing.assert_close(losses[0], losses[1])
            if check_resharded:
                self.assertEqual(fsdp1.unsharded_handles(fsdp_seq), [])
        with FSDP.summon_full_params(fsdp_seq):
            for fsdp_param, ddp_param in zip(fsdp_seq.parameters(), ddp_seq.module.parameters()):
                self.assertEqual(fsdp_param, ddp_param)

    @torch.no_grad()
    def _copy_full_params(self, fsdp_model: FSDP, module: nn.Module) -> None:
        """Set `module`'s parameters to `fsdp_model`'s unsharded ones (same unwrapped names)."""
        with FSDP.summon_full_params(fsdp_model):
            full = dict(fsdp_model.named_parameters())
            for name, param in module.named_parameters():
                param.copy_(full[name])

    def _init_seq_module(self) -> nn.Module:
        torch.manual_seed(42)
        modules = []
        for _ in range(self.NUM_LINEARS):
            modules += [nn.Linear(5, 5, device=self.device), nn.ReLU()]
        seq = nn.Sequential(*modules)
        self._set_seq_module_requires_grad(seq, False)
        return seq

    def _set_seq_module_requires_grad(self, seq: nn.Module, requires_grad: bool):
        # Assume that the linears are leaf modules, meaning that we can pass
        # `recurse=True` to have this work both pre/post FSDP wrapping
        for i in range(self.NUM_LINEARS):
            # Only set for every other linear to test mixing frozen/non-frozen
            if i % 2 == 0:
                for param in seq[i * 2].parameters(recurse=True):
                    param.requires_grad = requires_grad

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_backward_reshard_hooks(self):
        """
        Tests that the post-backward reshard happens even for flat parameters
        that do not require gradients.
        """
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                    ShardingStrategy.NO_SHARD,
                ],
                "use_orig_params": [False, True],
                "inp_requires_grad": [False, True],
                "unfreeze_params": [False, True],
            },
            self._test_backward_reshard_hooks,
        )

    def _test_backward_reshard_hooks(
        self,
        sharding_strategy: ShardingStrategy,
        use_orig_params: bool,
        inp_requires_grad: bool,
        unfreeze_params: bool,
    ):
        """Every linear (frozen or not) must be resharded by FSDP's post-backward reshard.

        Linears 0, 2 and 4 are frozen. After each backward no flat parameter may still be
        unsharded, and the post-backward reshard must have run once per linear; the only
        exception is linear 0 while it is frozen and the input does not require grad: nothing
        in its forward requires grad, so autograd has no node to hook and FSDP reshards it in
        the end-of-backward catch-all instead. A no-grad forward must not trigger the
        post-backward reshard at all (with FULL_SHARD it still reshards after forward).
        """
        seq = FSDP(
            self._init_seq_module(),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            sharding_strategy=sharding_strategy,
            use_orig_params=use_orig_params,
            device_id=self.device,
        )
        num_steps, no_grad_step = 3, 1
        with fsdp1.record_post_backward_reshards() as reshards:
            for step in range(num_steps):
                unfrozen = unfreeze_params and step == num_steps - 1
                if unfrozen:
                    self._set_seq_module_requires_grad(seq, True)
                inp = torch.randn((8, 5), device=self.device, requires_grad=inp_requires_grad)
                reshards.clear()
                if step == no_grad_step:
                    with torch.no_grad():
                        seq(inp)
                    self.assertEqual(len(reshards), 0)
                    if sharding_strategy == ShardingStrategy.FULL_SHARD:
                        self.assertEqual(fsdp1.unsharded_handles(seq), [])
                    continue
                out = seq(inp)
                if sharding_strategy == ShardingStrategy.SHARD_GRAD_OP:
                    # Kept unsharded after forward, so only the post-backward can reshard
                    self.assertEqual(len(fsdp1.unsharded_handles(seq)), self.NUM_LINEARS)
                out.sum().backward()
                hookable = self.NUM_LINEARS - (0 if inp_requires_grad or unfrozen else 1)
                self.assertEqual(len(reshards), hookable)
                # Only an unhooked linear may keep its unsharded copy (the catch-all reshard
                # does not always free it); every hooked one must have been resharded
                unsharded = fsdp1.unsharded_handles(seq)
                self.assertLessEqual(len(unsharded), self.NUM_LINEARS - hookable, msg=unsharded)
                self.assertEqual(len({id(handle) for handle in reshards}), hookable)
                for i in range(self.NUM_LINEARS):
                    trainable = i % 2 == 1 or unfrozen
                    for param in seq[i * 2].parameters():
                        self.assertEqual(param.requires_grad, trainable)
                        # use_orig_params: a rank whose shard holds none of it has an empty view
                        has_grad = trainable and param.numel() > 0
                        self.assertEqual(param.grad is not None, has_grad, msg=f"linear {i}")
                seq.zero_grad(set_to_none=True)

    def _init_multi_traversal_module(self) -> nn.Module:
        torch.manual_seed(42)
        device = self.device

        class TestModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer_0 = nn.Linear(5, 5, device=device)
                self.layer_no_grad = nn.Linear(5, 5, device=device)
                self.layer_with_grad = nn.Linear(5, 5, device=device)
                self.layer_no_grad.requires_grad_(False)

            def forward(self, x):
                # Layer `layer_no_grad` and `layer_with_grad` are called
                # multiple times, IOW, their parameters are used multiple times
                # during forward pass.
                x = self.layer_0(x)
                for _ in range(10):
                    x = self.layer_no_grad(self.layer_with_grad(x))
                    # Make sure calling the same layer multiple times works
                    # regardless whether gradient is enabled.
                    with torch.no_grad():
                        x += self.layer_with_grad(x)
                return x

        return TestModule()

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_hooks_multi_traversal(self):
        """
        Tests that the hooks do reshard / unshard correctly in the case of same
        parameters being used multiple times during forward pass.
        """
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                    ShardingStrategy.NO_SHARD,
                ],
                "use_orig_params": [False, True],
                "inp_requires_grad": [False, True],
                "forward_prefetch": [False, True],
            },
            self._test_hooks_multi_traversal,
        )

    def _test_hooks_multi_traversal(
        self,
        sharding_strategy: ShardingStrategy,
        use_orig_params: bool,
        inp_requires_grad: bool,
        forward_prefetch: bool,
    ):
        self._train_in_parity_with_ddp(
            self._init_multi_traversal_module(),
            inp_requires_grad=inp_requires_grad,
            check_resharded=True,
            sharding_strategy=sharding_strategy,
            use_orig_params=use_orig_params,
            forward_prefetch=forward_prefetch,
        )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_parity_with_ddp(self):
        """
        Tests parity with DDP when mixing flat parameters that require and do
        not require gradients.
        """
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                    ShardingStrategy.NO_SHARD,
                ],
                "use_orig_params": [False, True],
            },
            self._test_parity_with_ddp,
        )

    def _test_parity_with_ddp(
        self,
        sharding_strategy: ShardingStrategy,
        use_orig_params: bool,
    ):
        self._train_in_parity_with_ddp(
            self._init_seq_module(),
            inp_requires_grad=False,
            check_resharded=False,
            sharding_strategy=sharding_strategy,
            use_orig_params=use_orig_params,
        )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_parity_with_non_frozen_fsdp(self):
        """
        For frozen modules with unused input, reshard could happen without unshard
        Verify numerical parity between `_post_backward_reshard_only_hook` and
        `_post_backward_hook` path
        """
        self.run_subtests(
            {
                "sharding_strategy": [
                    ShardingStrategy.FULL_SHARD,
                    ShardingStrategy.SHARD_GRAD_OP,
                ],
                "use_orig_params": [True, False],
                "offload_params": [True, False],
                "mixed_precision": [
                    MixedPrecision(),
                    MixedPrecision(
                        param_dtype=torch.float16,
                        buffer_dtype=torch.float16,
                        reduce_dtype=torch.float16,
                    ),
                ],
                "backward_prefetch": [
                    BackwardPrefetch.BACKWARD_PRE,
                    BackwardPrefetch.BACKWARD_POST,
                ],
            },
            self._test_parity_with_non_frozen_fsdp,
        )

    def _test_parity_with_non_frozen_fsdp(
        self,
        sharding_strategy: ShardingStrategy,
        use_orig_params: bool,
        offload_params: bool,
        mixed_precision: MixedPrecision,
        backward_prefetch: BackwardPrefetch,
    ):
        if offload_params and self.device.type == "cpu":
            self.skipTest(
                "offload_params=True needs an accelerator: CPU offload moves parameters "
                "off the accelerator, and parameters already on the CPU have nowhere to go"
            )
        torch.manual_seed(42)
        model = ModelUnusedInput(freeze=True, device=self.device)
        # The unsharded full-precision reference for gradients: both FSDP models reduce theirs
        # the same way, so only a reference outside FSDP sees a wrong reduction
        grad_ref = DDP(copy.deepcopy(model), device_ids=self._ddp_device_ids())
        torch.manual_seed(42)
        ref_model = ModelUnusedInput(freeze=False, device=self.device)
        fsdp_kwargs = {
            "auto_wrap_policy": ModuleWrapPolicy({LinearUnusedInput}),
            "sharding_strategy": sharding_strategy,
            "use_orig_params": use_orig_params,
            "cpu_offload": CPUOffload(offload_params=offload_params),
            "mixed_precision": mixed_precision,
            "backward_prefetch": backward_prefetch,
            "device_id": self.device,
        }
        model = FSDP(model, **fsdp_kwargs)
        ref_model = FSDP(ref_model, **fsdp_kwargs)
        model_optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        ref_model_optim = torch.optim.Adam(
            [
                param
                for name, param in ref_model.named_parameters()
                if not name.startswith("_fsdp_wrapped_module.layer1_frozen")
            ],
            lr=1e-2,
        )
        # fp16 compute and reduction against the fp32 reference: a few fp16 ulps of the sums
        tolerance = {"atol": 1e-2, "rtol": 1e-2} if mixed_precision.param_dtype else {}
        # The non-frozen model's frozen layer is left out of its optimizer, so its gradient
        # only accumulates; the frozen model must have none there, as the reference
        untrained = [n for n, _ in grad_ref.module.named_parameters() if n.startswith("layer1")]
        torch.manual_seed(self.rank + 1)
        losses = []
        for _ in range(6):
            frozen_input = torch.randn((4, 4), device=self.device, requires_grad=False)
            self._copy_full_params(model, grad_ref.module)
            for _model in (model, ref_model, grad_ref):
                loss = _model(frozen_input, frozen_input).sum()
                losses.append(loss)
                loss.backward()
            expected = named_grads(grad_ref.module)
            assert_fsdp1_grads_equal(self, model, expected, **tolerance)
            assert_fsdp1_grads_equal(self, ref_model, expected, skip=untrained, **tolerance)
            for _optim in (model_optim, ref_model_optim):
                _optim.step()
                _optim.zero_grad()
            grad_ref.zero_grad()
            self.assertEqual(losses[0], losses[1])
            losses.clear()
        with FSDP.summon_full_params(model):
            with FSDP.summon_full_params(ref_model):
                for param, ref_param in zip(model.parameters(), ref_model.parameters()):
                    self.assertEqual(param, ref_param)


if __name__ == "__main__":
    run_tests()
