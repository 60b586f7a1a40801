"""The engine behind run_all.py: runs a plan, reads each test's TestReport, prints the summary.

Also runs the tests of `run_tests()` under torchrun, where every rank runs the same plan (its
multi-rank tests meet through torchrun's launcher, harness/process/torchrun.py); only rank 0
reports.
"""

from __future__ import annotations

import io
import os
import sys
import time
import unittest
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, TextIO, Tuple

from harness import settings
from harness.compat import cpu_defaults as compat_cpu_defaults
from harness.outcome.report import TestReport
from harness.process import forkserver, torchrun
from harness.runner import lifecycle, parallel
from harness.runner.junit import junit_result_class, stand_in_for, xml_runner
from harness.runner.loader import Plan
from harness.runner.progress import Progress, progress_interval
from harness.runner.results import Collector

SEPARATOR = "=" * 70


@dataclass
class SuiteStats:
    """One suite's row of the summary table."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    grid_points: int = 0
    seconds: float = 0.0
    note: str = ""  # a suite skipped or broken at import: why


@dataclass
class Options:
    """What run_all.py (or run_tests under torchrun) asked for, besides the test selection."""

    xml_dir: Optional[str] = None
    failfast: bool = False
    verbosity: int = 1
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    progress_stream: TextIO = field(default_factory=lambda: sys.stderr)
    order_note: Optional[str] = None  # the order tests ran in, when not the written one
    jobs: int = 1  # -j: the cores (devices) tests may keep busy side by side


class Engine:
    """Runs a plan, reports progress, and returns the exit code (0 nothing failed, 1 failed).

    Launched by torchrun, every rank runs the same plan and only rank 0 reports; when the
    ranks fall out of step (harness/process/torchrun.py), the run stops.
    """

    def __init__(self, plan: Plan, options: Options) -> None:
        self.plan, self.options = plan, options
        self.stats: Dict[str, SuiteStats] = {module: SuiteStats() for module, _ in plan}
        self.failures: List[Tuple[Tuple[int, int], TestReport]] = []  # (place, report)
        self.xml_reports: List[Tuple[Tuple[int, int], Any, TestReport]] = []
        self.arrivals = 0
        self.aborted = ""
        self.interrupted_by: Optional[int] = None  # the signal that stopped the run
        self.torchrun = torchrun.this_run()  # this process's part when torchrun launched it
        self.reporting = self.torchrun is None or self.torchrun.reports_here
        total = sum(len(tests) for _, tests in plan)
        verbosity = options.verbosity if self.reporting else 0
        self.progress = Progress(total, options.progress_stream, verbosity, progress_interval())
        self.collector = Collector(self._started, self._recorded)
        self.junit: Any = None  # the closing XML, in the plan's order
        self.junit_now: Any = None  # each finished test's class file, rewritten as it arrives
        if options.xml_dir is not None and self.reporting:
            self.junit = junit_result_class()(io.StringIO(), verbosity=0)
            self.junit_now = junit_result_class()(io.StringIO(), verbosity=0)
            self.junit_now.write_each_test_to(options.xml_dir)

    def _started(self, test: unittest.TestCase) -> None:
        self.progress.start(test.id())

    def _recorded(
        self, test: Any, report: TestReport, place: Optional[Tuple[int, int]] = None
    ) -> None:
        """A finished test's (or fixture's) report; `place` orders failures and the XML as
        the plan does (-j: reports arrive as tests finish), else the order of arrival."""
        with lifecycle.deferred_signals():  # a finished test is counted and in the XML, or neither
            self.arrivals += 1
            self._record(test, report, place or (0, self.arrivals))

    def _record(self, test: Any, record: TestReport, place: Tuple[int, int]) -> None:
        if self.torchrun is not None and self.torchrun.out_of_step and not self.aborted:
            self.aborted = self.torchrun.out_of_step
            self.collector.stop()
        stats = self.stats[record.suite]
        stats.grid_points += record.grid_points
        stats.note = getattr(test, "import_note", "") or stats.note
        if record.failed:
            stats.failed += 1
            self.failures.append((place, record))
            if self.options.failfast:
                self.collector.stop()
        elif record.status == "skipped":
            stats.skipped += 1
        else:
            stats.passed += 1
        self.progress.finish(record)
        if self.junit is not None:
            stand_in = test if isinstance(test, unittest.TestCase) else stand_in_for(record)
            self.xml_reports.append((place, stand_in, record))
            self.junit_now.report_done(stand_in, record)  # on disk, should the run be killed

    def _preload_suites(self, serial: bool) -> None:
        """Have the forkserver import every suite of the plan when it starts, so each rank
        forks with its suite imported instead of importing it per test; a serial run starts
        it now, as a fork of this process where that is safe. Not under torchrun (no rank is
        forked) nor with spawn. Suites that failed to import are left out: multiprocessing's
        forkserver survives only an ImportError from a preloaded module."""
        if self.torchrun is None and settings.start_method() == "forkserver":
            suites = [module for module, _ in self.plan if module in sys.modules]
            forkserver.preload(*suites)
            if serial:
                forkserver.start_as_fork(suites)

    def _side_by_side(self) -> Optional[parallel.Controller]:
        """-j's controller, when its pool has two workers or more (not under torchrun, whose
        ranks run the plan in step)."""
        if self.options.jobs <= 1 or self.torchrun is not None:
            return None
        units = parallel.units_of(self.plan, self.options.jobs)
        workers = parallel.pool_size(units, self.options.jobs)
        if workers <= 1:
            return None
        hooks = parallel.Hooks(
            started=self.progress.start, recorded=self._recorded,
            unit_done=self._unit_done, should_stop=lambda: self.collector.shouldStop,
        )
        return parallel.Controller(units, workers, self.options.jobs, hooks)

    def _unit_done(self, module: str, seconds: float) -> None:
        self.stats[module].seconds += seconds

    def run(self) -> int:
        """0 when nothing failed, 1 when something failed, 130/143/129 when interrupted (Ctrl-C,
        SIGTERM, SIGHUP); what ran before an interruption is still reported."""
        side_by_side = self._side_by_side()
        self._preload_suites(serial=side_by_side is None)
        self.progress.begin(len(self.plan))
        began = time.monotonic()
        try:
            if side_by_side is not None:
                side_by_side.run()
            for module, tests in [] if side_by_side is not None else self.plan:
                if self.collector.shouldStop:
                    break
                self.collector.suite, began = module, time.monotonic()
                unittest.TestSuite(tests).run(self.collector)
                self.stats[module].seconds += time.monotonic() - began
        except KeyboardInterrupt as stop:
            if self.collector.suite in self.stats:
                self.stats[self.collector.suite].seconds += time.monotonic() - began
            self.interrupted_by = lifecycle.signal_of(stop)
            self.aborted = f"interrupted by {lifecycle.describe(self.interrupted_by)}"
        finally:
            self.progress.close()
        with lifecycle.deferred_signals():
            if not self.aborted and self.torchrun is not None:
                self.torchrun.finish(settings.default_timeout())
            if self.reporting:
                self.report()
        if self.interrupted_by is not None:
            return lifecycle.exit_code(self.interrupted_by)
        if self.aborted:
            return 1
        if not self.reporting:
            # Rank 0 owns the verdict: a non-zero exit here would make torchrun terminate
            # rank 0 before its report is written.
            return 0
        return 1 if self.failures else 0

    def report(self) -> None:
        out = self.options.stream
        for _, record in sorted(self.failures, key=lambda entry: entry[0]):
            label = "ERROR" if record.status == "error" else "FAIL"
            print(f"{SEPARATOR}\n{label}: {record.test_id}\n{'-' * 70}", file=out)
            print(record.detail.rstrip() or record.message, file=out)
        if self.aborted:
            print(f"run stopped: {self.aborted}", file=out)
        if self.options.verbosity > 0:
            print(summary_table(self.stats), file=out)
            adapted = compat_cpu_defaults.summary_line()
            if adapted is not None:
                print(adapted, file=out)
        if self.junit is not None:
            for _, stand_in, record in sorted(self.xml_reports, key=lambda entry: entry[0]):
                self.junit.report_done(stand_in, record)
            os.makedirs(self.options.xml_dir, exist_ok=True)
            self.junit.generate_reports(xml_runner(self.options.xml_dir))
            print(f"JUnit XML written to {self.options.xml_dir}/", file=out)
        if self.options.order_note is not None:
            print(self.options.order_note, file=out)
        total = SuiteStats()
        for stats in self.stats.values():
            total.passed += stats.passed
            total.failed += stats.failed
            total.skipped += stats.skipped
        print(closing_line(total.passed, total.failed, total.skipped,
                           self.interrupted_by is not None), file=out)
        out.flush()


def closing_line(passed: int, failed: int, skipped: int, interrupted: bool = False) -> str:
    """The last line of a run; an interrupted run says so, so that a CI reading it does not
    take it for a finished one."""
    line = f"{passed} passed, {failed} failed, {skipped} skipped"
    return f"interrupted: {line}" if interrupted else line


def summary_table(stats: Dict[str, SuiteStats]) -> str:
    """Per suite: passed, failed, skipped, grid points run, time, and why a suite skipped or
    failed at import; then the totals."""
    header = ("suite", "passed", "failed", "skipped", "grid points", "time")
    rows = [
        (name, s.passed, s.failed, s.skipped, s.grid_points, f"{s.seconds:.1f}s")
        for name, s in stats.items()
    ]
    rows.append((
        "total",
        sum(s.passed for s in stats.values()),
        sum(s.failed for s in stats.values()),
        sum(s.skipped for s in stats.values()),
        sum(s.grid_points for s in stats.values()),
        f"{sum(s.seconds for s in stats.values()):.1f}s",
    ))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            f"{value:<{widths[0]}}" if i == 0 else f"{value:>{widths[i]}}"
            for i, value in enumerate(row)
        )
        for row in [header, *rows]
    ]
    for i, note in enumerate(s.note for s in stats.values()):
        if note:
            lines[i + 1] += f"  {note}"
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)
