"""harness.kit.fake_pg: `init_process_group("fake", store=FakeStore(), ...)` makes one
process any rank of any world size, on CPU without HARNESS_ALLOW_CPU, as upstream's; the
"fake" backend torch's testing package registers is never replaced."""

from __future__ import annotations

import subprocess
import sys
import unittest
from unittest import mock

import pytest
import torch.distributed as dist

from harness.compat import fake_pg as compat_fake_pg
from harness.kit.fake_pg import FakeStore
from tests.differential import both
from tests.fixtures import REPO, child_env

FAKE = '''
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


class FakeWorld(TestCase):
    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    @parametrize("world_size", [8, 64])
    def test_any_rank_of_any_size(self, world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=world_size - 1,
                                world_size=world_size)
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (world_size - 1, world_size))
        self.assertEqual(dist.get_backend(), "fake")
        value = torch.ones(3)
        dist.all_reduce(value)  # returns at once; nothing is reduced
        self.assertEqual(value, torch.ones(3))

    def test_mesh_and_dtensor(self):
        dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=16)
        mesh = init_device_mesh("cpu", (4, 4), mesh_dim_names=("dp", "tp"))
        self.assertEqual(mesh["tp"].get_local_rank(), 1)
        shard = distribute_tensor(torch.arange(32.0).reshape(16, 2), mesh["tp"], [Shard(0)])
        self.assertEqual(shard.to_local().shape, torch.Size([4, 2]))

    def test_a_missing_store_is_not_needed_for_a_second_group(self):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        group = dist.new_group([0, 1])
        self.assertEqual(dist.get_world_size(group), 2)


instantiate_parametrized_tests(FakeWorld)
'''

# Torch's own registration (its testing package imported first) is kept; imported after
# ours, it replaces ours; both ways the fake group works.
REGISTRATION = r'''
import sys
import torch.distributed as dist
order = sys.argv[1]
if order == "upstream-first":
    import torch.testing._internal.distributed.fake_pg as upstream
from harness import FakeStore
store = FakeStore()
if order == "ours-first":
    import torch.testing._internal.distributed.fake_pg as upstream
creator = dist.Backend._plugins["FAKE"].creator_fn
assert creator is upstream._create_fake_pg, creator
dist.init_process_group("fake", store=store, rank=2, world_size=32)
assert dist.get_world_size() == 32
print("ok")
'''


@pytest.mark.slow
class FakeProcessGroupTest(unittest.TestCase):
    def test_outcomes_match_upstream(self) -> None:
        theirs, ours = both(FAKE)
        self.assertEqual({k: v[0] for k, v in theirs.items()},
                         dict.fromkeys(theirs, "pass"))
        self.assertEqual(ours, theirs)

    def test_torchs_own_registration_is_kept(self) -> None:
        for order in ("upstream-first", "ours-first"):
            with self.subTest(order=order):
                proc = subprocess.run([sys.executable, "-c", REGISTRATION, order],
                                      capture_output=True, text=True, env=child_env(),
                                      cwd=REPO, timeout=300)
                self.assertEqual((proc.returncode, proc.stdout.strip()), (0, "ok"),
                                 proc.stderr[-2000:])



class RegistrationTest(unittest.TestCase):
    """torch registers its fake backend when FSDP (or its testing package) is imported; a
    FakeStore registers the harness's only where no registration exists."""

    def test_a_store_registers_the_backend_only_where_none_is(self) -> None:
        with mock.patch.dict(dist.Backend._plugins, clear=True):
            FakeStore()
            creator = dist.Backend._plugins["FAKE"].creator_fn
            self.assertIs(creator, compat_fake_pg._create_fake_group)
            dist.init_process_group("fake", store=FakeStore(), rank=7, world_size=64)
            try:
                self.assertEqual((dist.get_rank(), dist.get_world_size()), (7, 64))
            finally:
                dist.destroy_process_group()
        kept = dist.Backend._plugins.get("FAKE")
        FakeStore()
        self.assertIs(dist.Backend._plugins.get("FAKE"), kept)

if __name__ == "__main__":
    unittest.main()
