"""MultiThreadedTestCase: each test method runs in `world_size` threads of this process.

The case the test runner holds supervises (harness/launch/ranked_case.py): its launcher,
ThreadRanks (harness/threads/launcher.py), starts one thread per rank, each running its own
instance of the test with its own default process group on the `threaded` backend
(harness/threads/backend.py), so subTest grids and skips work as in a single process; as
upstream, setUp and tearDown run in the main thread only, `perThreadSetUp` and
`perThreadTearDown` in each rank thread.
Every rank's record is then turned into one outcome by the same rules as for processes
(harness/outcome/merge.py). What this module adds is what a rank thread needs: its rank,
its group (the ThreadRankHooks of harness/launch/hooks.py: `start_rank_thread`,
`finish_rank_thread`) and upstream's per-thread hooks.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist

from harness.launch.launcher import Launcher
from harness.launch.ranked_case import SUPERVISOR_RANK, RankedTestCase
from harness.threads import backend as threaded_pg
from harness.threads.launcher import ThreadRanks

MAIN_THREAD_RANK = SUPERVISOR_RANK


class MultiThreadedTestCase(RankedTestCase):
    """Each test method runs once per rank, in `world_size` threads of this process.

    The instance the test runner holds supervises (`self.rank == MAIN_THREAD_RANK`); every
    rank thread runs its own instance, whose `self.rank` is that thread's rank and whose
    default process group (backend `threaded`) is initialised before `perThreadSetUp` and
    the body; setUp, tearDown and cleanups run once, in the supervisor, as upstream.
    Note that torch's default random generator is shared by the threads, unlike
    processes: ranks that need identical random values should build them from an explicit
    `torch.Generator` or broadcast them.
    """

    MAIN_THREAD_RANK = MAIN_THREAD_RANK
    _thread_rank = MAIN_THREAD_RANK

    def make_launcher(self) -> Launcher:
        return ThreadRanks()

    @property
    def rank(self) -> int:
        """This thread's rank (each rank thread runs its own instance); -1 in the supervisor."""
        return self._thread_rank

    @rank.setter
    def rank(self, rank: int) -> None:
        # Upstream's rank is a plain attribute; subclasses read it as `_thread_rank`.
        self._thread_rank = rank

    def rank_set_up(self) -> None:
        # Rank threads share the process's generators, which the supervisor's setUp seeded
        # once: reseeding them from every rank thread would race with ranks already drawing
        # numbers (upstream's threads do not seed either).
        self.perThreadSetUp()

    def perThreadSetUp(self) -> None:  # noqa: N802 - upstream's name
        """Upstream's hook: runs in every rank thread before the test body (setUp and
        tearDown run in the main thread only)."""

    def perThreadTearDown(self) -> None:  # noqa: N802 - upstream's name
        """Upstream's hook: runs in every rank thread after the test body, once the thread's
        group is destroyed."""

    def assertEqualOnRank(  # noqa: N802 - upstream's name
        self, x: Any, y: Any, msg: Optional[str] = None, *, rank: int = 0
    ) -> None:
        """assertEqual only on `rank`: rank threads share one CPU generator (upstream's helper)."""
        if self.rank == rank:
            self.assertEqual(x, y, msg)

    def assertNotEqualOnRank(  # noqa: N802 - upstream's name
        self, x: Any, y: Any, msg: Optional[str] = None, *, rank: int = 0
    ) -> None:
        """assertNotEqual only on `rank`."""
        if self.rank == rank:
            self.assertNotEqual(x, y, msg)

    def _spawn_threads(self) -> None:
        """Upstream's call in setUp: start the rank threads now (else the test method does)."""
        self.start_ranks()

    # --- in a rank thread (ThreadRanks calls these: ThreadRankHooks) ------------------------
    def start_rank_thread(self) -> None:
        """Before setUp: the default process group on the threaded backend."""
        threaded_pg.init_default_group(self.rank)

    def finish_rank_thread(self, passed: bool) -> None:
        """After the case ran; `passed` if it did not fail. Upstream's order: the group is
        destroyed, then `perThreadTearDown` runs."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.perThreadTearDown()
