"""`_test_fsdp_parity` against broken FSDP or a wrong reference: every test here must FAIL.

tests/test_fsdp.py runs this file as a script and requires each test to fail with the
parity check's own message; a parity helper that passes here cannot catch anything.
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import ShardingStrategy
from torch.nn.parallel import DistributedDataParallel

from harness import (
    DEVICEInitMode,
    DummyDDP,
    FSDPInitMode,
    FSDPTest,
    NestedWrappedModule,
    TransformerWithSharedParams,
    patch_all_reduce,
    patch_reduce_scatter,
    run_tests,
    skip_if_lt_x_gpu,
)


class TestParityDetectsBreakage(FSDPTest):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_reduce_scatter_sums_instead_of_averaging(self):
        orig_reduce_scatter = dist.reduce_scatter_single

        def summing_reduce_scatter(output, input, *args, **kwargs):
            work = orig_reduce_scatter(output, input, *args, **kwargs)
            if work is not None:
                work.wait()
            output.mul_(self.world_size)

        # One step: both losses come from the same initial weights, so only the parameter
        # comparison can catch the wrong gradients.
        with patch_reduce_scatter(summing_reduce_scatter):
            self._test_fsdp_parity(
                NestedWrappedModule,
                FSDPInitMode.RECURSIVE,
                DEVICEInitMode.DEVICE_BEFORE,
                num_iters=1,
            )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_no_shard_gradients_not_all_reduced(self):
        def local_all_reduce(tensor, *args, **kwargs):
            return None  # each rank keeps its own gradient

        with patch_all_reduce(local_all_reduce):
            self._test_fsdp_parity(
                TransformerWithSharedParams,
                FSDPInitMode.RECURSIVE,
                DEVICEInitMode.DEVICE_BEFORE,
                sharding_strategy=ShardingStrategy.NO_SHARD,
            )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_reference_without_gradient_averaging(self):
        # DummyDDP does not average gradients across ranks, and each rank's input differs.
        self._test_fsdp_parity(
            NestedWrappedModule,
            FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE,
            ref_init_fn=DummyDDP,
        )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_reference_with_other_initial_weights(self):
        def perturbed(model):
            with torch.no_grad():
                next(model.parameters()).add_(0.5)
            return DistributedDataParallel(model)

        self._test_fsdp_parity(
            NestedWrappedModule,
            FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE,
            ref_init_fn=perturbed,
        )


if __name__ == "__main__":
    run_tests()
