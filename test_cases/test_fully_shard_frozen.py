"""``fully_shard`` (FSDP2) with frozen parameters: training parity with DDP (``replicate``).

Mirrors upstream's test/distributed/_composable/fsdp/test_fully_shard_frozen.py; runs on the
rank's device (CPU with gloo when no accelerator exists).
"""

import copy
import functools
import itertools
from typing import List, Optional, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from harness import (
    MLP,
    FSDPTest,
    check_sharded_parity,
    patch_reduce_scatter,
    patch_register_post_backward_hook_backward,
    reduce_scatter_with_assert,
    run_tests,
    skip_if_lt_x_gpu,
)
from harness.compat import distributed, fsdp2, fsdp_collectives
from harness.settings import default_world_size


class TestFullyShardFrozen(FSDPTest):
    @property
    def world_size(self) -> int:
        return min(4, default_world_size())

    def _mesh(self) -> DeviceMesh:
        return init_device_mesh(self.device.type, (self.world_size,))

    def _replicate(self, module: nn.Module, **kwargs) -> nn.Module:
        """The DDP reference on the rank's device (no device_ids for CPU modules)."""
        device_ids: Optional[List[int]] = (
            None if self.device.type == "cpu" else [self.device.index]
        )
        return distributed.composable_replicate(
            module.to(self.device), device_ids=device_ids, **kwargs
        )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_train_mixed_requires_grad_per_group(self):
        """
        Tests training parity with DDP when mixing frozen and non-frozen
        parameters in the same FSDP communication group. This checks that
        the reduce-scatters reduce the expected numel and that they are called
        via the custom autograd function backward (i.e. that they are not
        delayed until the end of backward).
        """
        self.run_subtests(
            {
                "reshard_after_forward": [False, True, 2],
                "use_activation_checkpointing": [False, True],
                "freeze_after_init": [False, True],
            },
            self._test_train_mixed_requires_grad_per_group,
        )

    def _test_train_mixed_requires_grad_per_group(
        self,
        reshard_after_forward: Union[bool, int],
        use_activation_checkpointing: bool,
        freeze_after_init: bool,
    ):
        torch.manual_seed(42)
        num_mlps, lin_dim = (3, 32)
        model = nn.Sequential(*[MLP(lin_dim, torch.device("cpu")) for _ in range(num_mlps)])

        def train_biases_only(*modules: nn.Module) -> None:
            # Freeze every weight and keep the biases trainable (BitFit-style fine-tuning)
            for name, param in itertools.chain(*(m.named_parameters() for m in modules)):
                if not name.endswith("bias"):
                    param.requires_grad_(False)

        if not freeze_after_init:
            train_biases_only(model)
        # Weights frozen after DDP's construction never get a gradient: DDP must allow that
        ref_model = self._replicate(
            copy.deepcopy(model), find_unused_parameters=freeze_after_init
        )
        ref_optim = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
        mesh = self._mesh()
        for mlp in model:
            if use_activation_checkpointing:
                distributed.composable_checkpoint(mlp)
            fully_shard(mlp, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        if freeze_after_init:
            train_biases_only(model, ref_model)

        # Each MLP is one communication group, so each reduce-scatter carries exactly the
        # padded local shards of one MLP's biases (the frozen weights contribute nothing)
        expected_numel = sum(
            -(-param.size(0) // self.world_size) * (param.numel() // param.size(0))
            for name, param in model[0].named_parameters()
            if name.endswith("bias")
        )
        in_post_backward = False
        post_backward_calls = 0
        reduce_scatters_in_post_backward: List[bool] = []
        orig_backward = fsdp2.register_post_backward_function().backward
        orig_reduce_scatter = getattr(dist, fsdp_collectives.reduce_scatter_name())

        def backward_with_count(*args, **kwargs):
            nonlocal in_post_backward, post_backward_calls
            post_backward_calls += 1
            in_post_backward = True
            try:
                return orig_backward(*args, **kwargs)
            finally:
                in_post_backward = False

        def assert_fn(output: torch.Tensor) -> None:
            reduce_scatters_in_post_backward.append(in_post_backward)
            self.assertEqual(output.numel(), expected_numel)

        reduce_scatter = functools.partial(
            reduce_scatter_with_assert, self, orig_reduce_scatter, assert_fn
        )
        torch.manual_seed(42 + self.rank + 1)
        with patch_reduce_scatter(reduce_scatter), patch_register_post_backward_hook_backward(
            backward_with_count
        ):
            for iter_idx in range(5):
                post_backward_calls = 0
                reduce_scatters_in_post_backward.clear()
                inp = torch.randn((8, lin_dim), device=self.device)
                losses: List[torch.Tensor] = []
                for _model, _optim in ((ref_model, ref_optim), (model, optim)):
                    _optim.zero_grad(set_to_none=(iter_idx % 2 == 0))
                    losses.append(_model(inp).sum())
                    losses[-1].backward()
                self.assertEqual(losses[0], losses[1])
                # Gradients before the step: Adam would hide a wrongly scaled one from the losses
                check_sharded_parity(self, ref_model, model)
                for _optim in (ref_optim, optim):
                    _optim.step()
                # One reduce-scatter per MLP; all but possibly the first MLP's (whose input does
                # not require grad) run inside the autograd post-backward, not the final callback
                self.assertEqual(len(reduce_scatters_in_post_backward), num_mlps)
                self.assertGreaterEqual(sum(reduce_scatters_in_post_backward), num_mlps - 1)
                self.assertGreaterEqual(post_backward_calls, num_mlps - 1)
        check_sharded_parity(self, ref_model, model)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_train_mixed_requires_grad_across_groups(self):
        """
        Tests training parity with DDP when mixing frozen and non-frozen
        parameters across different FSDP communication groups, including
        possibly unfreezing parameters.
        """
        self.run_subtests(
            {
                "reshard_after_forward": [False, True, 2],
                "unfreeze_params": [False, True],
            },
            self._test_train_mixed_requires_grad_across_groups,
        )

    def _test_train_mixed_requires_grad_across_groups(
        self,
        reshard_after_forward: Union[bool, int],
        unfreeze_params: bool,
    ):
        torch.manual_seed(42)
        num_linears, lin_dim = (6, 32)
        modules: List[nn.Module] = []
        for _ in range(num_linears):
            modules += [nn.Linear(lin_dim, lin_dim), nn.ReLU()]
        model = nn.Sequential(*modules)
        ref_model = self._replicate(copy.deepcopy(model), find_unused_parameters=True)
        mesh = self._mesh()
        for module in model.modules():
            if isinstance(module, nn.Linear):
                fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
        ref_optim = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
        optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        orig_backward = fsdp2.register_post_backward_function().backward
        backward_count = 0

        def _set_requires_grad(seq: nn.Module, requires_grad: bool):
            for i in range(num_linears):
                # Interleave frozen -> non-frozen -> ... linears
                if i % 2 == 0:
                    for param in seq[i * 2].parameters():
                        param.requires_grad_(requires_grad)

        def backward_with_count(*args, **kwargs):
            nonlocal backward_count
            backward_count += 1
            return orig_backward(*args, **kwargs)

        _set_requires_grad(model, False)
        _set_requires_grad(ref_model, False)
        frozen_params = [p for p in model.parameters() if not p.requires_grad]
        self.assertEqual(len(frozen_params), 2 * (num_linears // 2))  # weight + bias each
        num_iters, no_grad_iter_idx = (3, 1)
        torch.manual_seed(42 + self.rank)
        inp = torch.randn((8, lin_dim), device=self.device)
        with patch_register_post_backward_hook_backward(backward_with_count):
            for iter_idx in range(num_iters):
                unfrozen = unfreeze_params and iter_idx == num_iters - 1
                if unfrozen:
                    # Unfreeze the parameters on the last step to emulate some kinds of
                    # fine-tuning
                    _set_requires_grad(model, True)
                    _set_requires_grad(ref_model, True)
                backward_count = 0
                losses: List[torch.Tensor] = []
                for _model, _optim in ((ref_model, ref_optim), (model, optim)):
                    _optim.zero_grad(set_to_none=(iter_idx % 2 == 0))
                    if iter_idx == no_grad_iter_idx:
                        with torch.no_grad():
                            losses.append(_model(inp).sum())
                    else:
                        losses.append(_model(inp).sum())
                        losses[-1].backward()
                self.assertEqual(losses[0], losses[1])
                if iter_idx == no_grad_iter_idx:
                    self.assertEqual(backward_count, 0)
                    continue
                # Check that the post-backward hooks ran through the autograd backward, not
                # the final callback, for every linear whose input requires gradient: all but
                # the first one, and while the first one is frozen, not the second one either
                expected_count = num_linears - 1 if unfrozen else num_linears - 2
                self.assertEqual(backward_count, expected_count)
                # Without a root FSDP module nothing reshards the first linear after
                # backward when reshard_after_forward=False, so reshard explicitly first
                for module in model:
                    if isinstance(module, FSDPModule):
                        module.reshard()
                # Gradients before the step: Adam would hide a wrongly scaled one from the losses
                if unfrozen:
                    # DDP only reduces the gradients of parameters that required grad when it
                    # was built: compare with DDP the linears that trained all along, and
                    # check only that the unfrozen ones got gradients
                    for i in range(1, num_linears, 2):
                        check_sharded_parity(self, ref_model[i * 2], model[i * 2])
                    for param in frozen_params:
                        self.assertIsNotNone(param.grad)
                else:
                    check_sharded_parity(self, ref_model, model)
                for _optim in (ref_optim, optim):
                    _optim.step()

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_multi_forward_mixed_requires_grad(self):
        """
        Tests training parity with DDP when having trainable and frozen modules
        that participate multiple times in forward.
        """
        self.run_subtests(
            {"reshard_after_forward": [True, False, 2]},
            self._test_multi_forward_mixed_requires_grad,
        )

    def _test_multi_forward_mixed_requires_grad(
        self,
        reshard_after_forward: Union[bool, int],
    ):
        class MultiForwardModule(nn.Module):
            def __init__(self, device: torch.device):
                super().__init__()
                self.layer_0 = nn.Linear(5, 5, device=device)
                self.layer_no_grad = nn.Linear(5, 5, device=device)
                self.layer_with_grad = nn.Linear(5, 5, device=device)
                self.layer_no_grad.requires_grad_(False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                x = self.layer_0(x)
                for _ in range(3):
                    x = self.layer_no_grad(F.relu(self.layer_with_grad(x)))
                    # Make sure that calling the same layer multiple times
                    # works regardless of whether gradient is enabled
                    with torch.no_grad():
                        x += F.relu(self.layer_with_grad(x))
                return x

        torch.manual_seed(42)
        model = MultiForwardModule(torch.device("cpu"))
        ref_model = self._replicate(copy.deepcopy(model))
        mesh = self._mesh()
        for module in model.modules():
            if isinstance(module, nn.Linear):
                fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        ref_optim = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
        optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        # Different data on each rank, so that gradients that are not reduced show up
        torch.manual_seed(42 + self.rank + 1)
        for iter_idx in range(10):
            inp = torch.randn((8, 5), device=self.device)
            losses: List[torch.Tensor] = []
            for _model, _optim in ((ref_model, ref_optim), (model, optim)):
                _optim.zero_grad(set_to_none=(iter_idx % 2 == 0))
                losses.append(_model(inp).sum())
                losses[-1].backward()
            self.assertEqual(losses[0], losses[1])
            # Gradients before the step: Adam would hide a wrongly scaled one from the losses
            check_sharded_parity(self, ref_model, model)
            for _optim in (ref_optim, optim):
                _optim.step()
        check_sharded_parity(self, ref_model, model)


if __name__ == "__main__":
    run_tests()
