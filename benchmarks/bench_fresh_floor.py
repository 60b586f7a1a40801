"""Where a fresh ranked test's time goes, against the floor: two forked processes doing the
same work by hand.

The work of one test: 2 ranks each init a gloo group, all_reduce one tensor, check the sum,
destroy the group. Measured side by side in one run (the variants' order rotates from round
to round, so machine load falls on all alike), N tests each:

- floor:   a hand-written script (a process that already imported torch) that, per test,
           forks 2 children with os.fork; each does `dist.init_process_group("gloo",
           store=dist.FileStore(path, 2), rank=r, world_size=2)`, the all_reduce,
           destroy_process_group and os._exit(0); the parent waits for both. A test's time:
           from before the first fork to both children reaped (and the store file removed);
- fresh:   the harness's @pytest.mark.ranks(2) functions (mode="fresh") in one pytest
           session, a test's time pytest's own (setup + call + teardown, from --junitxml);
- class:   the harness's MultiProcessTestCase, N test methods that make the group themselves,
           under `python -m unittest`; a test's time from the start of its setUp to its last
           cleanup (the launcher's, which removes the ranks' folder);
- probed:  the fresh session again, with the harness's functions wrapped from outside (the
           generated test file imports a probe module that monkeypatches them; the forkserver
           is a fork of the pytest process, or imports the test file, so the ranks inherit the
           wrappers; harness/ itself is untouched): each wrapper appends `time.monotonic()`
           (one clock for all processes) to a log, which gives the breakdown by phase. In the
           supervisor: run_on_ranks, RankGroup.start and .supervise, each rank's _launch; in
           a rank: multiprocessing's _bootstrap, _set_up_process, RankRun.run,
           FreshFunction.set_up, init_group, call_in_rank, tear_down, _leave. A
           function the probe cannot find (renamed) is reported, and its phases show "-".

Per variant: the median per test without the first test, then the median over the rounds.
The breakdown: a phase ends when the last rank reaches its end (so the phases add up to the
test's time, along the path that decides it), medians per phase over the tests (without the
first) and over the rounds, next to the floor's phases where they compare. Then the
project's target, PASS or FAIL: fresh at most 1.2x the floor. Exits 1 when a variant fails,
else 0. Everything is removed at the end: the generated files, the logs, pytest's temporary
folders and any process a run left behind (reported as a problem).

    python benchmarks/bench_fresh_floor.py [--tests 20] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import runs  # noqa: E402 - what the pytest-session benchmarks share

TARGET_RATIO = 1.2  # fresh at most this times the floor
PROBE_LOG_ENV = "BENCH_PHASE_LOG"
AROUND = "pytest around the call (hooks, fixtures)"  # pytest's time outside run_on_ranks
PROBED_TEST = "probed test (pytest's time)"
CLASS_LOG_ENV = "BENCH_CLASS_LOG"

_FLOOR = '''
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

WORLD_SIZE = 2


def _rank(rank, path, report_fd):
    first = time.monotonic()
    dist.init_process_group(
        "gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE
    )
    init = time.monotonic()
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
    body = time.monotonic()
    dist.destroy_process_group()
    destroy = time.monotonic()
    os.write(report_fd, (json.dumps([rank, first, init, body, destroy]) + "\\n").encode())


def one_test(i, store_dir):
    path = os.path.join(store_dir, f"store{i}")
    read_fd, write_fd = os.pipe()
    began = time.monotonic()
    pids = []
    for rank in range(WORLD_SIZE):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(read_fd)
                _rank(rank, path, write_fd)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    os.close(write_fd)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    if os.path.exists(path):
        os.remove(path)
    ended = time.monotonic()
    with os.fdopen(read_fd, "rb") as f:
        lines = f.read().splitlines()
    if any(codes) or len(lines) != WORLD_SIZE:
        raise SystemExit(f"floor test {i}: exit codes {codes}, {len(lines)} reports")
    return {"began": began, "ended": ended, "ranks": sorted(json.loads(line) for line in lines)}


if __name__ == "__main__":
    tests, out, store_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    results = [one_test(i, store_dir) for i in range(tests)]
    with open(out, "w") as f:
        json.dump(results, f)
'''

_MARKED = '''
import pytest
import torch
import torch.distributed as dist
__PROBE__
''' + runs.MARKED_ALL_REDUCE.replace("__MODE__", "fresh")

_CLASS = '''
import os
import time

import torch
import torch.distributed as dist

from harness import MultiProcessTestCase

LOG = os.environ["__LOG_ENV__"]


def _stamp(name):
    with open(LOG, "a") as f:
        f.write(f"{name} {time.monotonic():.9f}\\n")


class TestAllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        _stamp("begin")
        self.addCleanup(_stamp, "end")  # the last cleanup: after the launcher's
        super().setUp()

''' + runs.CLASS_ALL_REDUCE

# Imported by the probed test file, so in the pytest process (the supervisor), in the
# forkserver (a fork of it, or an interpreter that imports the test file) and so in every rank.
_PROBE = '''
"""Wraps the harness's functions along a fresh test's path; each wrapper appends a stamp
(test, who: "s" the supervisor or the rank's number, what, time.monotonic()) to the log."""

import functools
import importlib
import os
import time

LOG = os.environ.get("__LOG_ENV__")
_who = {"test": "", "who": "s"}
_log = {"pid": None, "fd": None}
MISSING = []


def stamp(what):
    if not LOG:
        return
    pid = os.getpid()
    if _log["pid"] != pid:  # each process its own descriptor (O_APPEND: whole lines)
        _log["fd"] = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        _log["pid"] = pid
    line = f"{_who['test']}\\t{_who['who']}\\t{what}\\t{time.monotonic():.9f}\\n"
    os.write(_log["fd"], line.encode())


def _supervising(call, *args, **kwargs):
    _who.update(test=call.test_id, who="s")


def _in_rank(spec, *args, **kwargs):
    _who.update(test=getattr(spec.job.inputs, "test_id", ""), who=str(spec.rank))


def _bootstrapping(process, *args, **kwargs):
    spec = (getattr(process, "_args", None) or (None,))[0]
    if hasattr(spec, "rank"):  # a rank, unpickled, about to run its target
        _in_rank(spec)


def _wrap_launch():
    """The supervisor's start of one rank: pickle it, the server forks, the pid comes back."""
    try:
        popen = importlib.import_module("harness.process.mp_forkserver")._Popen
        original = popen._launch
    except (ImportError, AttributeError):
        MISSING.append("harness.process.mp_forkserver:_Popen._launch")
        return

    @functools.wraps(original)
    def _launch(self, process_obj):
        rank = getattr((getattr(process_obj, "_args", None) or (None,))[0], "rank", "")
        stamp(f"launch{rank}_begin")
        try:
            return original(self, process_obj)
        finally:
            stamp(f"launch{rank}_end")

    popen._launch = _launch


def wrap(module, owner, name, before=None, after=None, on_enter=None):
    try:
        target = importlib.import_module(module)
        if owner:
            target = getattr(target, owner)
        original = getattr(target, name)
    except (ImportError, AttributeError):
        MISSING.append(f"{module}:{owner + '.' if owner else ''}{name}")
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if on_enter is not None:
            on_enter(*args, **kwargs)
        if before:
            stamp(before)
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                stamp(after)

    setattr(target, name, wrapper)


if LOG:
    wrap("harness.pytest_plugin.functions", "", "run_on_ranks", "call_begin", "call_end",
         on_enter=_supervising)
    wrap("harness.process.supervisor", "RankGroup", "start", "start_begin", "start_end")
    wrap("harness.process.supervisor", "RankGroup", "supervise", "supervise_begin",
         "supervise_end")
    wrap("harness.process.rank", "", "_set_up_process", "first_line", "process_ready",
         on_enter=_in_rank)
    wrap("harness.process.rank", "RankRun", "run", "run_begin")
    wrap("harness.pytest_plugin.rank_program", "FreshFunction", "set_up", "set_up_begin",
         "set_up_end")
    wrap("harness.pytest_plugin.rank_program", "FunctionProgram", "init_group", "init_begin",
         "init_end")
    wrap("harness.pytest_plugin.rank_program", "", "call_in_rank", "body_begin", "body_end")
    wrap("harness.pytest_plugin.rank_program", "FreshFunction", "tear_down", "cleanup_begin",
         "cleanup_end")
    wrap("harness.process.rank", "", "_leave", "leave")
    wrap("multiprocessing.process", "BaseProcess", "_bootstrap", "bootstrap",
         on_enter=_bootstrapping)
    _wrap_launch()
    if MISSING:
        stamp("missing " + ",".join(MISSING))
'''

# The breakdown: (phase, where it starts, where it ends, the floor's phase that compares).
# A rank's stamp stands for the last rank to reach it ("max"); "s" is the supervisor's.
PHASES: List[Tuple[str, str, str, Optional[str]]] = [
    ("supervisor set-up (case, setUp, rank dir)", "s:call_begin", "s:start_begin", None),
    ("fork: start -> both ranks' first line", "s:start_begin", "max:first_line", "fork"),
    ("rank process set-up (_set_up_process)", "max:first_line", "max:process_ready", None),
    ("test re-created in rank (class, instance)", "max:process_ready", "max:run_begin", None),
    ("attach_rank, unittest's run until setUp", "max:run_begin", "max:set_up_begin", None),
    ("rank_set_up before the group (seed)", "max:set_up_begin", "max:init_begin", None),
    ("rendezvous + group init + barrier", "max:init_begin", "max:init_end", "init"),
    ("test body (with unittest's call)", "max:init_end", "max:body_end", "body"),
    ("rank teardown (destroy_process_group)", "max:body_end", "max:cleanup_end", "destroy"),
    ("report (events, done) until _leave", "max:cleanup_end", "max:leave", None),
    ("exit + reap (supervise returns)", "max:leave", "s:supervise_end", "exit"),
    ("after the join (decide, replay, close)", "s:supervise_end", "s:call_end", None),
]
# Inside the fork phase (not added to the sum): where its time goes.
FORK_DETAIL: List[Tuple[str, str, str]] = [
    ("  fork: RankGroup.start (both ranks)", "s:start_begin", "s:start_end"),
    ("  fork: rank 0 _launch (pickle, server forks)", "s:launch0_begin", "s:launch0_end"),
    ("  fork: rank 1 _launch", "s:launch1_begin", "s:launch1_end"),
    ("  fork: start -> rank 0 in _bootstrap", "s:start_begin", "0:bootstrap"),
    ("  fork: start -> rank 1 in _bootstrap", "s:start_begin", "1:bootstrap"),
    ("  fork: _bootstrap -> first line (last rank)", "max:bootstrap", "max:first_line"),
]
FLOOR_PHASES = ("fork", "init", "body", "destroy", "exit")


@dataclass
class Run:
    """One run of a variant: each test's seconds (in run order), its phases, what it left."""

    tests: List[float]
    phases: Dict[str, List[float]] = field(default_factory=dict)  # phase -> seconds per test
    leftovers: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def per_test(self) -> float:
        return runs.median_without_first(self.tests)


def run_floor(workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    out = os.path.join(workdir, f"floor-{run_id}.json")
    stores = os.path.join(workdir, f"stores-{run_id}")
    os.mkdir(stores)
    command = [sys.executable, "floor.py", str(tests), out, stores]
    leftovers = runs.run_command(command, workdir, run_id, timeout).leftovers
    with open(out) as f:
        results = json.load(f)
    if len(results) != tests:
        raise runs.RunFailed(f"floor: {len(results)} tests reported, {tests} expected")
    if os.listdir(stores):
        leftovers.append(f"store files left: {', '.join(sorted(os.listdir(stores))[:5])}")
    phases: Dict[str, List[float]] = {name: [] for name in FLOOR_PHASES}
    for test in results:
        ranks = test["ranks"]  # [rank, first, init, body, destroy]
        marks = [test["began"], *(max(r[i] for r in ranks) for i in range(1, 5)), test["ended"]]
        for name, start, end in zip(FLOOR_PHASES, marks, marks[1:]):
            phases[name].append(end - start)
    return Run([t["ended"] - t["began"] for t in results], phases, leftovers)


def run_pytest(workdir: str, tests: int, run_id: str, timeout: float, probed: bool) -> Run:
    log = os.path.join(workdir, f"phases-{run_id}.log")
    done = runs.run_pytest(
        workdir, "test_probed.py" if probed else "test_fresh.py", run_id, timeout,
        junit_tests=tests, env={PROBE_LOG_ENV: log} if probed else None,
    )
    run = Run(done.times, leftovers=done.leftovers)
    if probed:
        run.phases, run.notes = read_phases(log, done.times)
    return run


def read_phases(log: str, times: List[float]) -> Tuple[Dict[str, List[float]], List[str]]:
    """Each phase's seconds per test (in run order) from the probe's log; notes on what the
    probe could not wrap or find."""
    stamps: Dict[str, Dict[str, Dict[str, float]]] = {}  # test -> who -> what -> time
    notes: List[str] = []
    with open(log) as f:
        for line in f:
            test, who, what, at = line.rstrip("\n").split("\t")
            if what.startswith("missing "):
                notes.append(f"probe could not wrap {what[len('missing '):]}")
                continue
            stamps.setdefault(test, {}).setdefault(who, {}).setdefault(what, float(at))
    order = [test for test in stamps if test]  # in the order the supervisor began them
    spans = [(name, start, end) for name, start, end, _ in PHASES] + FORK_DETAIL
    phases: Dict[str, List[float]] = {name: [] for name, _, _ in spans}
    phases[AROUND] = []
    phases[PROBED_TEST] = []
    for test, junit_s in zip(order, times):
        by = stamps[test]
        for name, start, end in spans:
            begin, finish = _stamp_at(by, start), _stamp_at(by, end)
            if begin is not None and finish is not None:
                phases[name].append(finish - begin)
        call_begin, call_end = _stamp_at(by, "s:call_begin"), _stamp_at(by, "s:call_end")
        if call_begin is not None and call_end is not None:
            phases[AROUND].append(junit_s - (call_end - call_begin))
        phases[PROBED_TEST].append(junit_s)
    if len(order) != len(times):
        notes.append(f"probe log has {len(order)} tests, pytest ran {len(times)}")
    return phases, notes


def _stamp_at(by: Dict[str, Dict[str, float]], point: str) -> Optional[float]:
    """When `point` ("s:what", "<rank>:what", or "max:what", the last rank) was reached."""
    where, what = point.split(":")
    if where != "max":
        return by.get(where, {}).get(what)
    found = [stamps.get(what) for who, stamps in by.items() if who != "s"]
    reached = [at for at in found if at is not None]
    return max(reached) if found and len(reached) == len(found) else None


def run_class(workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    log = os.path.join(workdir, f"class-{run_id}.log")
    command = [sys.executable, "-m", "unittest", "-q", "test_class"]
    done = runs.run_command(command, workdir, run_id, timeout, {CLASS_LOG_ENV: log})
    begins, ends = [], []
    with open(log) as f:
        for line in f:
            what, at = line.split()
            (begins if what == "begin" else ends).append(float(at))
    if len(begins) != tests or len(ends) != tests or f"Ran {tests} tests" not in done.output:
        raise runs.RunFailed(f"class: {len(begins)} tests began, {len(ends)} ended, {tests} "
                             f"expected\n{runs.tail(done.output)}")
    return Run([end - begin for begin, end in zip(begins, ends)], leftovers=done.leftovers)


def summarize(rounds: List[Run]) -> Dict[str, Any]:
    """Medians over the rounds of each round's median (without the first test), in ms."""
    phases: Dict[str, Optional[float]] = {}
    for name in rounds[0].phases:
        per_round = [runs.median_without_first(values) for values in
                     (r.phases.get(name, []) for r in rounds) if values]
        phases[name] = statistics.median(per_round) * 1e3 if per_round else None
    return {
        "per_test_ms": statistics.median(r.per_test for r in rounds) * 1e3,
        "rounds_ms": [r.per_test * 1e3 for r in rounds],
        "phases_ms": phases,
    }


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_breakdown(probed: Dict[str, Any], floor: Dict[str, Any]) -> None:
    """The phases of the probed fresh test next to the floor's, with the difference; the
    fork phase's detail below it (not added to the sum)."""
    rows: List[Tuple[str, Optional[float], Optional[float]]] = [
        (AROUND, probed["phases_ms"].get(AROUND), None)
    ]
    for name, _, _, floor_phase in PHASES:
        rows.append((name, probed["phases_ms"].get(name),
                     floor["phases_ms"].get(floor_phase) if floor_phase else None))
    print(f"\n{'phase of a fresh test (probed)':<46}{'harness ms':>11}{'floor ms':>10}"
          f"{'extra ms':>10}")
    for name, harness_ms, floor_ms in rows:
        extra = None if harness_ms is None else harness_ms - (floor_ms or 0.0)
        print(f"{name:<46}{_ms(harness_ms):>11}{_ms(floor_ms):>10}{_ms(extra):>10}")
        if name == PHASES[1][0]:
            for detail, _, _ in FORK_DETAIL:
                print(f"{detail:<46}{_ms(probed['phases_ms'].get(detail)):>11}")
    phase_sum = sum(h for _, h, _ in rows if h is not None)
    floor_sum = sum(f for _, _, f in rows if f is not None)
    print(f"{'sum of the phases':<46}{phase_sum:>11.1f}{floor_sum:>10.1f}"
          f"{phase_sum - floor_sum:>10.1f}")
    print(f"{'per test (median)':<46}{_ms(probed['phases_ms'].get(PROBED_TEST)):>11}"
          f"{floor['per_test_ms']:>10.1f}")
    print("(a phase ends when the last rank reaches its end; medians per phase, so the sum "
          "differs a little from the median test; the indented fork rows are inside the fork "
          "phase; floor: fork = before the first os.fork to both children's first line, init "
          "= init_process_group with a FileStore, exit = last child done to both reaped)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20, help="tests per variant (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants (>= 1)")
    args = runs.parse_args(parser, "seconds per run", min_tests=2)
    runs.exit_on_signals()

    variants = {
        "floor": lambda run_id: run_floor(workdir, args.tests, run_id, args.timeout),
        "fresh": lambda run_id: run_pytest(workdir, args.tests, run_id, args.timeout, False),
        "class": lambda run_id: run_class(workdir, args.tests, run_id, args.timeout),
        "probed": lambda run_id: run_pytest(workdir, args.tests, run_id, args.timeout, True),
    }
    n = str(args.tests)
    files = {
        "floor.py": _FLOOR,
        "test_fresh.py": _MARKED.replace("__PROBE__", "").replace("__N__", n),
        "test_probed.py": _MARKED.replace("__PROBE__", "\nimport phase_probe  # noqa: F401\n")
                            .replace("__N__", n),
        "phase_probe.py": _PROBE.replace("__LOG_ENV__", PROBE_LOG_ENV),
        "test_class.py": _CLASS.replace("__LOG_ENV__", CLASS_LOG_ENV).replace("__N__", n),
    }
    with runs.work_folder("bench-fresh-floor-", files) as workdir:
        results = runs.run_rounds(
            lambda name, run_id: variants[name](run_id), list(variants), args.rounds,
            lambda run: f"{run.per_test * 1e3:.1f} ms a test",
        )
    if results is None:
        return 1

    medians = {name: summarize(variant_runs) for name, variant_runs in results.items()}
    floor_ms = medians["floor"]["per_test_ms"]
    print(runs.header(f"{args.tests} trivial 2-rank gloo tests per variant", args.rounds))
    print(f"{'variant':<8}{'per test ms':>12}{'vs floor':>10}   rounds ms")
    for name, m in medians.items():
        rounds = ", ".join(f"{v:.1f}" for v in m["rounds_ms"])
        print(f"{name:<8}{m['per_test_ms']:>12.1f}{m['per_test_ms'] / floor_ms:>9.2f}x   {rounds}")
    print_breakdown(medians["probed"], medians["floor"])
    ratio = medians["fresh"]["per_test_ms"] / floor_ms
    passed = ratio <= TARGET_RATIO
    print(f"\nfresh <= {TARGET_RATIO}x floor: {runs.verdict(passed)} ({ratio:.2f}x: "
          f"{medians['fresh']['per_test_ms']:.1f} ms against {floor_ms:.1f} ms)")
    problems = runs.problems(results, lambda run: [*run.leftovers, *run.notes])
    runs.print_problems(dict.fromkeys(problems))
    runs.write_json(args.json, args.tests, args.rounds, medians, problems,
                    target=runs.target("fresh / floor", ratio, f"<= {TARGET_RATIO}x", passed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
