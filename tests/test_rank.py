"""harness/process/rank.py: what a rank process does around its test, in-process where it can
be (the end-to-end runs are tests/test_multiprocess.py)."""

from __future__ import annotations

import os
import tempfile
import unittest
from unittest import mock

import torch.distributed as dist

from harness.process import rank


class DestroyDefaultGroup(unittest.TestCase):
    """A fresh rank ends with os._exit right after its test: the group it destroys is kept, so
    that gloo's destructor (~20 ms a rank) never runs. Anywhere else (a shared rank, torchrun,
    this process) the group is released as usual."""

    def init_group(self) -> None:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        store = dist.FileStore(os.path.join(folder.name, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())

    def destroy(self, exits_after_test: bool) -> list:
        kept: list = []
        with mock.patch.multiple(rank, _exits_after_test=exits_after_test,
                                 _groups_kept_to_exit=kept):
            self.init_group()
            group = dist.group.WORLD
            rank.destroy_default_group()
        self.assertFalse(dist.is_initialized())
        self.assertTrue(all(g is group for g in kept))
        return kept

    def test_a_fresh_rank_keeps_the_destroyed_group_until_it_exits(self) -> None:
        self.assertEqual(len(self.destroy(exits_after_test=True)), 1)

    def test_a_rank_that_lives_on_releases_it(self) -> None:
        self.assertEqual(self.destroy(exits_after_test=False), [])


class LauncherEnvironment(unittest.TestCase):
    def test_torchruns_worker_variables_for_one_machine(self) -> None:
        self.assertEqual(rank.launcher_environment(1, 4, 29511), {
            "RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0", "ROLE_RANK": "1",
            "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "ROLE_WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
        })

    def test_a_rank_is_not_taken_for_a_process_torchrun_launched(self) -> None:
        from harness import settings

        with mock.patch.dict(os.environ, rank.launcher_environment(0, 2, 29511)):
            self.assertIsNone(settings.torchrun_env())


if __name__ == "__main__":
    unittest.main()
