"""The harness's pytest plugin: multi-rank tests reported the way pytest reports any test.

Registered through the `pytest11` entry point when the package is installed (and by
`-p harness.pytest_plugin`, which the checkout's pytest settings pass). For a multi-rank
test it:

- leads a failure's report with the rank that failed first and its exception line
  (`FAILED t.py::T::test - rank 1: AssertionError: 9.0 != 99.0`), then that rank's traceback
  laid out by pytest itself (every `--tb` style, the user's frames only), then the other
  ranks and the collectives, a section each;
- puts each rank's output in pytest's captured sections (`-rP`, `--show-capture`);
- has the forkserver rewrite the asserts of the modules pytest rewrote, so a bare `assert`
  in a rank process explains itself (harness/process/assert_rewrite.py);
- with pytest-timeout, stops the ranks before its timer fires, so that the harness's hang
  report (stacks, pending collectives) is what the user sees;
- `--debug-rank N` gives rank N the terminal for `breakpoint()`;
- under pytest-xdist, lets a grid point's params (an enum, a dtype) cross to the controller.

The report comes from the same TestReport as unittest's (harness/outcome/merge.py builds it;
the failure its replay raises carries its `RankReport`, harness/outcome/replay.py); only the
layout is pytest's.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import os
import sys
import sysconfig
import time
from types import TracebackType
from typing import Any, Generator, List, Optional, Tuple

import pytest

from harness import devices
from harness.launch.case import RankedTestCase
from harness.outcome import stacks
from harness.outcome.rank_record import RankRecord
from harness.outcome.replay import rank_report
from harness.outcome.report import RankReport
from harness.outcome.stacks import Frame
from harness.process import assert_rewrite, forkserver
from harness.process.case import MultiProcessTestCase

_DEADLINE = pytest.StashKey[float]()
_RECORDS = pytest.StashKey[List[RankRecord]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "multi-rank tests (torch-dist-harness)")
    group.addoption(
        "--debug-rank", type=int, default=None, metavar="N",
        help="give rank N of each multi-rank test the terminal, for breakpoint()/pdb; the "
        "other ranks and the timeout wait for it (sets HARNESS_DEBUG_RANK)",
    )


def pytest_configure(config: pytest.Config) -> None:
    rank = config.getoption("debug_rank", None)
    if rank is not None:
        if rank < 0:
            raise pytest.UsageError(f"--debug-rank {rank}: a rank is a number from 0")
        os.environ[devices.DEBUG_RANK_ENV] = str(rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Name the collected modules pytest rewrote, for the forkserver to rewrite them too."""
    modules = {getattr(item, "module", None) for item in session.items}
    assert_rewrite.rewrite_in_ranks(assert_rewrite.rewritten_by_pytest(modules))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """Start the forkserver before the test's own time (and pytest-timeout's timer) starts:
    its start-up, seconds once per run, is not the test's."""
    cls = getattr(item, "cls", None)
    if isinstance(cls, type) and issubclass(cls, MultiProcessTestCase):
        try:
            if devices.start_method() == "forkserver" and devices.torchrun_env() is None:
                forkserver.warm_up(cls.__module__)
        except devices.HarnessConfigError:
            pass  # the test itself reports it
    return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout starts its timer: note when it will fire (its own hook does the rest)."""
    timeout = getattr(settings, "timeout", None)
    if timeout:
        item.stash[_DEADLINE] = time.monotonic() + float(timeout)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    case = getattr(item, "instance", None)
    ranked = isinstance(case, RankedTestCase)
    if ranked and _DEADLINE in item.stash:
        case.deadline = item.stash[_DEADLINE]
    try:
        return (yield)
    finally:
        if ranked:  # the ranks' output goes into the test's report (not its grid points')
            item.stash[_RECORDS] = list(case.rank_records)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when != "call":
        return report
    lead = rank_report(call.excinfo.value) if call.excinfo is not None else None
    if lead is not None and report.failed:
        longrepr = _longrepr(item, lead)
        if longrepr is not None:
            report.longrepr = longrepr
    for record in item.stash.get(_RECORDS, []):
        if record.output.strip():
            name = f"Captured stdout+stderr call (rank {record.rank})"
            report.sections.append((name, record.output))
    if _RECORDS in item.stash:
        del item.stash[_RECORDS]
    return report


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


def _longrepr(item: pytest.Item, lead: RankReport) -> Any:
    """pytest's own layout of the failure: the lead's frames as a traceback, then sections."""
    frames = lead.frames
    if lead.hang:  # a hang points at the user's line the rank waits in
        frames = _without_library_tail(frames)
    frames = frames or [_test_frame(item)]
    error = _labelled_error(lead.label, lead.message)
    try:
        tb = _traceback(frames, error)
    except Exception:  # a frame that cannot be stood up: keep pytest's own report of it
        return None
    error.__traceback__ = tb
    longrepr: Any = item.repr_failure(pytest.ExceptionInfo.from_exc_info((type(error), error, tb)))
    if hasattr(longrepr, "addsection"):
        for title, text in lead.sections:
            if not title:
                title, _, text = text.partition("\n")
            longrepr.addsection(title.rstrip(":"), stacks.clean_traceback(text))
    return longrepr


def _without_library_tail(frames: List[Frame]) -> List[Frame]:
    """The frames up to the last one of the user's code (not the stdlib's or an installed
    package's), when there is one."""
    libraries = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    last = max((i for i, f in enumerate(frames) if not f.filename.startswith(libraries)),
               default=None)
    return frames if last is None else frames[: last + 1]


def _labelled_error(label: str, message: str) -> Exception:
    """An exception shown as `<label>: <message>`, e.g. `rank 1: AssertionError: boom`."""
    cls = type(label, (Exception,), {"__module__": "builtins"})
    cls.__qualname__ = label
    return cls(message)


def _test_frame(item: pytest.Item) -> Frame:
    """Where the test is defined: the frame a report points at when the ranks gave none."""
    path, lineno, _ = item.reportinfo()
    name = getattr(item, "originalname", None) or item.name
    return Frame(str(path), (lineno or 0) + 1, name)


def _traceback(frames: List[Frame], error: BaseException) -> Optional[TracebackType]:
    """A traceback of real frame objects standing at the given lines of the given files, so
    that pytest (source, `--tb` styles, `__tracebackhide__`) and `traceback` show them as if
    the error had been raised here; the frames have no locals."""
    tb: Optional[TracebackType] = None
    for frame in reversed(frames):
        one = _one_frame(frame, error)
        tb = TracebackType(tb, one.tb_frame, one.tb_lasti, one.tb_lineno)
    return tb


def _one_frame(frame: Frame, error: BaseException) -> TracebackType:
    line = linecache.getline(frame.filename, frame.lineno)
    indent = len(line) - len(line.lstrip())
    # The raise spans the line's text: Python then draws no carets under part of it.
    statement = "raise (__error" + " " * max(0, len(line.strip()) - 15) + ")"
    first = _function_start(frame.filename, frame.lineno, frame.name)
    namespace = {"__error": error, "__name__": "__harness_rank__"}
    if first is not None and first < frame.lineno:
        source = (
            "\n" * (first - 1) + "def _f():\n" + "\n" * (frame.lineno - first - 1)
            + " " * max(indent, 1) + statement + "\n"
        )
        exec(compile(source, frame.filename, "exec"), namespace)
        function = namespace["_f"]
        names = {"co_name": frame.name}
        if hasattr(function.__code__, "co_qualname"):  # Python 3.11+
            names["co_qualname"] = frame.name
        function.__code__ = function.__code__.replace(**names)
        call: Any = function
    else:
        code = compile("\n" * (frame.lineno - 1) + statement, frame.filename, "exec")
        code = code.replace(co_name=frame.name)
        call = functools.partial(exec, code, namespace)
    try:
        call()
    except BaseException:
        tb = sys.exc_info()[2]
    assert tb is not None and tb.tb_next is not None
    return tb.tb_next


def _function_start(filename: str, lineno: int, name: str) -> Optional[int]:
    """The first line (decorators included) of the innermost function `name` around `lineno`."""
    spans = [(a, b) for a, b, n in _functions(filename) if n == name and a <= lineno <= b]
    return max(spans)[0] if spans else None


@functools.lru_cache(maxsize=64)
def _functions(filename: str) -> Tuple[Tuple[int, int, str], ...]:
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return ()
    return tuple(
        (min([node.lineno] + [d.lineno for d in node.decorator_list]),
         node.end_lineno or node.lineno, node.name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )
