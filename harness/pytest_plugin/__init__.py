"""The harness's pytest plugin: multi-rank tests reported the way pytest reports any test.

Registered through the `pytest11` entry point when the package is installed (and by
`-p harness.pytest_plugin`, which the checkout's pytest settings pass; `-p
no:harness.pytest_plugin` turns all of it off). For a multi-rank test, a harness class's or
a marked function's, it:

- leads a failure's report with the rank that failed first and its exception line
  (`FAILED t.py::test_sum - rank 1: AssertionError: assert ...`), then that rank's traceback
  laid out by pytest itself (every `--tb` style, the user's frames only), then the other
  ranks and the collectives, a section each (report.py);
- puts each rank's output in pytest's captured sections (`-rP`, `--show-capture`);
- has the forkserver rewrite the asserts of the modules pytest rewrote, so a bare `assert`
  in a rank process explains itself (harness/process/assert_rewrite.py);
- with pytest-timeout, stops the ranks before its timer fires, so that the harness's hang
  report (stacks, pending collectives) is what the user sees;
- `--debug-rank N` gives rank N the terminal for `breakpoint()`;
- under pytest-xdist, lets a grid point's params (an enum, a dtype) cross to the controller.

The report comes from the same TestReport as unittest's (harness/outcome/merge.py builds it;
the failure its replay raises carries its `RankReport`, harness/outcome/replay.py); only the
layout is pytest's. Marked functions (`@pytest.mark.ranks`, `@rank_fixture`, `rank_pool`,
`DistributedTest`) are functions.py's hooks and fixtures.py's, pool.py's and deepspeed.py's
fixtures, registered with this plugin.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Generator, Optional, Tuple

import pytest

from harness import settings
from harness.compat import pytest_internals
from harness.launch.ranked_case import RankedTestCase
from harness.outcome.replay import rank_report
from harness.outcome.report import RankReport, TestReport
from harness.process import assert_rewrite, forkserver, shared
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.pytest_plugin import deepspeed, fixtures, functions, leases, pool, stash
from harness.pytest_plugin import report as report_layout
from harness.pytest_plugin.run import RanksFailure
from harness.requirements import decorators

MARKERS = (
    "ranks(N | [N, ...], *, mode='fresh'|'shared'|'threads', device='auto'|'cpu'|'cuda', "
    "backend=None, allow_cpu=False, init=True, timeout=None, skip_leak_checks=()): run the "
    "test once in each of N ranks (torch-dist-harness)",
    "world_size(N | [N, ...]): a harness.DistributedTest method's world size",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "multi-rank tests (torch-dist-harness)")
    group.addoption(
        "--debug-rank", type=int, default=None, metavar="N",
        help="give rank N of each multi-rank test the terminal, for breakpoint()/pdb; the "
        "other ranks and the timeout wait for it (sets HARNESS_DEBUG_RANK)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if (unsupported := pytest_internals.check_supported_pytest(pytest.__version__)) is not None:
        raise pytest.UsageError(unsupported)
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    for module in (functions, fixtures, pool, deepspeed):
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, module.__name__)
    if not hasattr(config, "workerinput"):  # not an xdist worker: the run's device locks
        leases.open_locks(_accelerators())
    rank = config.getoption("debug_rank", None)
    if rank is not None:
        if rank < 0:
            raise pytest.UsageError(f"--debug-rank {rank}: a rank is a number from 0")
        os.environ[settings.DEBUG_RANK_ENV] = str(rank)
    if config.getoption("capture", None) == "no" and settings.SHOW_OUTPUT_ENV not in os.environ:
        # `-s`: the ranks' output reaches the terminal as it is printed, as a test's own does
        os.environ[settings.SHOW_OUTPUT_ENV] = "1"
        config.add_cleanup(lambda: os.environ.pop(settings.SHOW_OUTPUT_ENV, None))


def _accelerators() -> int:
    try:
        return settings.accelerator_count()
    except settings.HarnessConfigError:
        return 0  # the tests report it


def pytest_unconfigure(config: pytest.Config) -> None:
    shared.OPEN_RANKS.stop_all()
    if not hasattr(config, "workerinput"):
        leases.close_locks()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Name the collected modules pytest rewrote, for the forkserver to rewrite them too; end
    the session if a module ran its tests when pytest imported it (a missing main guard).
    The forkserver itself starts with the run loop (below)."""
    modules = {getattr(item, "module", None) for item in session.items}
    config = session.config
    assert_rewrite.rewrite_in_ranks(
        assert_rewrite.rewritten_by_pytest(modules),
        config.get_verbosity(pytest.Config.VERBOSITY_ASSERTIONS), _truncation(config),
    )
    missing_guard = forkserver.missing_guard_seen()
    if missing_guard is not None:  # a module ran its tests when imported, starting ranks
        pytest.exit(missing_guard, returncode=forkserver.MISSING_GUARD_EXIT_CODE)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> Any:
    """Start the forkserver as a fork of this process, now that pytest has imported the test
    modules (their asserts rewritten) and before any test or fixture ran: the first ranks
    start at once, where a forkserver started as an interpreter would import torch and the
    test code again first (seconds). Here, outside every other plugin's wrapper, the fork
    holds none of pytest's collection-time state (its warnings recorder, its log handlers).
    Where forking is not safe (another thread runs, an accelerator runtime is built in) or
    fails, the first test that starts ranks starts one instead."""
    if not session.config.option.collectonly and not session.testsfailed:
        _fork_forkserver(session)
    return (yield)


def _fork_forkserver(session: pytest.Session) -> None:
    items = [item for item in session.items if _starts_rank_processes(item)]
    try:
        if not items or settings.start_method() != "forkserver" or settings.torchrun_env():
            return
        forkserver.start_as_fork({item.module.__name__ for item in items})  # type: ignore[attr-defined]
    except settings.HarnessConfigError:
        return  # the tests report it
    except OSError:
        return  # (no socket, no fork here): started as an interpreter when first needed


def _truncation(config: pytest.Config) -> Tuple[int, int]:
    """pytest's cut of an assertion explanation (lines, characters; (0, 0): none), by its
    rule: the ini limits (else pytest's own), none on CI."""
    if pytest_internals.running_on_ci():  # pytest's own rule: no cut on CI
        return 0, 0
    limits = (config.getini(f"truncation_limit_{kind}") for kind in ("lines", "chars"))
    lines, chars = (int(value) if value is not None else default
                    for value, default in zip(limits, assert_rewrite.PYTEST_TRUNCATION))
    return lines, chars


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """Start the forkserver before the test's own time (and pytest-timeout's timer) starts:
    its start-up, seconds once per run, is not the test's."""
    if _starts_rank_processes(item):
        try:
            if settings.start_method() == "forkserver" and settings.torchrun_env() is None:
                forkserver.warm_up(item.module.__name__)  # type: ignore[attr-defined]
        except settings.HarnessConfigError:
            pass  # the test itself reports it
        except (EOFError, OSError):
            pass  # a forkserver that died starting: the test starts one and fails with its log
    return (yield)


def _starts_rank_processes(item: pytest.Item) -> bool:
    """Whether the test may start rank processes: a marked function in processes, or a test
    of a multi-process class, unless it is sure to skip first (a GPU test on a CPU machine:
    a session of only such tests then starts no forkserver at all)."""
    if item.get_closest_marker("skip") is not None:
        return False
    ranks = item.stash.get(fixtures.RANKS, None)
    if ranks is not None:
        return ranks.mode != "threads"
    cls = getattr(item, "cls", None)
    if not (isinstance(cls, type) and issubclass(cls, MultiProcessTestCase)):
        return False
    try:
        return not decorators.skips_before_it_starts(cls, getattr(cls, item.name, None))
    except settings.HarnessConfigError:
        return False  # the test itself reports it


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout starts its timer: note when it will fire (its own hook does the rest)."""
    timeout = getattr(settings, "timeout", None)
    if timeout:
        item.stash[stash.DEADLINE] = time.monotonic() + float(timeout)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    case = getattr(item, "instance", None)
    ranked = isinstance(case, RankedTestCase)
    if ranked and stash.DEADLINE in item.stash:
        case.deadline = item.stash[stash.DEADLINE]
    try:
        return (yield)
    finally:
        if ranked:  # the ranks' output goes into the test's report (not its grid points')
            item.stash[stash.RECORDS] = list(case.rank_records)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    lead = _lead(call)
    if lead is not None and report.failed:
        longrepr = report_layout.longrepr(item, lead)
        if longrepr is not None:
            report.longrepr = longrepr
    # the ranks' output goes into the report of the phase that joined them: the call's, or
    # the set-up's when a `@rank_fixture` failed there
    if call.when != "call" and not (call.when == "setup" and report.failed):
        return report
    if report.skipped and fixtures.RANKS in item.stash and isinstance(report.longrepr, tuple):
        # A skip inside the ranks: pytest would point at the harness's raise; point at the test.
        path, lineno, _ = item.reportinfo()
        report.longrepr = (str(path), (lineno or 0) + 1, report.longrepr[2])
    for record in item.stash.get(stash.RECORDS, []):
        if record.output.strip():
            name = f"Captured stdout+stderr {report.when} (rank {record.rank})"
            report.sections.append((name, record.output))
    if stash.RECORDS in item.stash:
        del item.stash[stash.RECORDS]
    return report


def _lead(call: pytest.CallInfo[None]) -> Optional[RankReport]:
    """A multi-rank failure's report in parts: a marked test's or a pool call's (`RanksFailure`,
    or the lead rank's own exception class raised in its place, which carries the report), a
    class's replay's."""
    if call.excinfo is None:
        return None
    error = call.excinfo.value
    if isinstance(error, RanksFailure):
        return error.lead
    report = getattr(error, "report", None)  # raised as the lead rank's own class
    if isinstance(report, TestReport):
        return report.own.lead
    return rank_report(error)


PLAIN_TYPES = (type(None), bool, int, float, str)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In a pytest-xdist worker, a grid point's params travel as their repr.

    A worker sends each report to the controller through execnet, which carries only plain
    values: a subtest's params (`sharding_strategy=ShardingStrategy.FULL_SHARD`, as
    run_subtests and the grid points a multi-rank test replays pass them) would stop the
    worker with a DumpError. The controller shows them as `name='ShardingStrategy.FULL_SHARD'`.
    """
    context = getattr(report, "context", None)
    if not os.environ.get("PYTEST_XDIST_WORKER") or not dataclasses.is_dataclass(context):
        return
    kwargs = getattr(context, "kwargs", None) or {}
    if any(type(value) not in PLAIN_TYPES for value in kwargs.values()):
        plain = {k: v if type(v) in PLAIN_TYPES else repr(v) for k, v in kwargs.items()}
        report.context = dataclasses.replace(context, kwargs=plain)  # type: ignore[attr-defined]
