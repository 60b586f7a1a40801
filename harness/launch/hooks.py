"""The rank hooks: what a launcher calls on the instance that runs as a rank (or its class),
by public name.

A launcher (harness/launch/launcher.py) knows nothing of a base's process groups, devices or
barriers; it makes an instance of the job's class in the rank and calls these hooks at fixed
points. Two kinds of class implement them: the unittest bases (a test class's own instance,
harness/launch/ranked_case.py, whose unittest run calls its `rank_set_up`/`rank_tear_down` in place
of setUp and tearDown) and a front end's rank programs, which run without unittest
(harness/pytest_plugin/rank_program.py). Every hook has a default in the base that declares
it, so a base overrides only what its ranks need, and a suite may override one too.

`RankHooks`, every mode, on the rank's instance:
  `attach_rank(context)`  before it runs: it becomes the rank `context` describes
  `run(result)`           the test, as this rank, reported to `result` (a ReportingResult)

`ThreadRankHooks`, rank threads (harness/threads/launcher.py), around the whole case run:
  `start_rank_thread()`             before the case runs: the thread's default group
  `finish_rank_thread(passed)`      after it and its cleanups: destroy the group, then
                                    upstream's `perThreadTearDown`

`SharedRankHooks`, class methods of a shared-process class (harness/process/rank.py `serve`):
  `shared_rank_start(rank, world_size, rdvz_file)`  once per set of ranks: the class's group
                                                    (upstream's `_init_pg`)
  `shared_rank_before_test()`                       the ranks meet before each test
  `shared_rank_after_test() -> bool`                after each test: whether the rank can take
                                                    another (False: new ranks for the next)
  `shared_rank_finish()`                            when the set ends without a fault (its
                                                    pipe closed): what the set kept alive

Upstream's own names stay what suites override: `perThreadSetUp`/`perThreadTearDown` (called
from `rank_set_up`/`finish_rank_thread`), `_init_pg`, `backend_str`, `opts` (called from
`shared_rank_start`), `_run`/`run_test` (a rank process's entry point).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harness.launch.context import RankContext


@runtime_checkable
class RankHooks(Protocol):
    """What every launcher calls on the instance that runs as a rank."""

    def attach_rank(self, context: RankContext) -> None:
        """Become the rank `context` describes (before it runs)."""

    def run(self, result: Any) -> Any:
        """Run the test as this rank, reporting to `result` (a ReportingResult)."""


@runtime_checkable
class ThreadRankHooks(RankHooks, Protocol):
    """What the thread launcher also calls, around the case's run in each rank thread."""

    def start_rank_thread(self) -> None:
        """Before the case runs: the thread's default group (a failure here skips the run)."""

    def finish_rank_thread(self, passed: bool) -> None:
        """After the case and its cleanups ran; `passed` unless it failed in this rank."""


@runtime_checkable
class SharedRankHooks(Protocol):
    """What a shared rank process calls on its test class (class methods)."""

    def shared_rank_start(self, rank: int, world_size: int, rdvz_file: str) -> None:
        """Once per set of ranks: the class's attributes and its default group."""

    def shared_rank_before_test(self) -> None:
        """Before each test: the ranks meet (raises when they cannot)."""

    def shared_rank_after_test(self) -> bool:
        """After each test: whether this rank can run the class's next test."""

    def shared_rank_finish(self) -> None:
        """The parent ended the set (closed the task pipe): undo what the set kept."""
