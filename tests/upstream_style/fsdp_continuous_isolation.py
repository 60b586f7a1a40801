"""Shared-process bases, tests in one class: a failing test fails alone (no poison pill).

tests/test_continuous.py runs this file as a script: `test_1_fails` must fail and every later
test of the class must still run and pass, each in an initialised default group.
"""

import torch
import torch.distributed as dist

from harness import FSDPTestContinuous, MultiProcContinuousTest, run_tests, skip_if_lt_x_gpu


class TestIsolation(MultiProcContinuousTest):
    world_size = 2

    def test_1_fails(self):
        self.assertEqual(self.rank, -5, "deliberate failure")

    def test_2_runs_after_a_failure(self):
        value = torch.ones(1)
        dist.all_reduce(value, group=self.pg)
        self.assertEqual(value.item(), 2.0)


class TestIsolationFSDP(FSDPTestContinuous):
    world_size = 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDP's bases skip on CPU unless it is allowed
    def test_1_fails_in_one_rank(self):
        if self.rank == 1:
            raise RuntimeError("rank 1 breaks")

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_2_runs_after_a_failure(self):
        value = torch.full((1,), float(self.rank), device=self.device)
        dist.all_reduce(value, group=self.process_group)
        self.assertEqual(value.item(), 1.0)


if __name__ == "__main__":
    run_tests()
