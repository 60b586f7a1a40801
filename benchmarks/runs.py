"""What the pytest-session benchmarks (bench_functions.py, bench_session.py and
bench_fresh_floor.py) share: one place for how they run a variant and report on it, so that
the three measure and clean up alike.

- run_command / run_pytest: a command (a generated pytest file) in the benchmark's work
  folder, in its own process group and TMPDIR, under a timeout; RunFailed, with the tail of
  its output, when it fails; what it left behind (processes still in its group, which are
  killed, and files in its TMPDIR) as notes;
- read_junit / junit_times: each test's seconds from pytest's --junitxml report;
- parse_args: the options they share (--timeout, --json) and the checks of --tests and
  --rounds;
- test_files, work_folder: the generated files in a temporary folder that is pytest's
  rootdir, removed at the end; exit_on_signals, so that SIGTERM and SIGHUP remove it too;
- run_rounds: each variant once a round, their order rotated from round to round;
- median_without_first, header, verdict, problems, print_problems, target, write_json: the
  numbers and the printed and --json report that the three have in common.

The scripts put the repository's root first on sys.path (for harness and tests.fixtures)
and import this as `from benchmarks import runs`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
)

from tests.fixtures import procs  # the one /proc reader of tests and benchmarks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = "harness.pytest_plugin"
TAIL_CHARS = 4000  # how much of a failed run's output its error shows
GROUP_EXIT_WAIT_S = 10.0  # how long a run's helpers (forkserver, pool workers) may take to exit

T = TypeVar("T")

# The marked test every pytest-session benchmark times (`__N__` of them; `__MODE__`: the
# ranks' mode), after the imports and set-up each file adds: one definition, so that every
# variant measures the same body.
MARKED_ALL_REDUCE = '''
@pytest.mark.ranks(2, mode="__MODE__")
@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(rank, world_size, i):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
'''
# ... and the same body as a test class's tests (after a file's `TestAllReduce`, a
# MultiProcessTestCase of 2 ranks): each makes and destroys its own group, as a fresh
# marked test's ranks do.
CLASS_ALL_REDUCE = '''
def _all_reduce(self):
    dist.init_process_group(
        "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
    )
    t = torch.ones(1) * (self.rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
    dist.destroy_process_group()


for _i in range(__N__):
    setattr(TestAllReduce, f"test_all_reduce_{_i:03d}", _all_reduce)
'''


class RunFailed(Exception):
    """A variant's run did not pass all its tests."""


@dataclass
class Completed:
    """A command that passed: its command line, output, wall time (from its start to its
    output's end), notes on what it left behind, and (run_pytest with junit_tests) each
    test's seconds in run order."""

    command: List[str]
    output: str
    wall: float
    leftovers: List[str] = field(default_factory=list)
    times: List[float] = field(default_factory=list)


def tail(output: str) -> str:
    """The end of a run's output, as its error shows it."""
    return output[-TAIL_CHARS:]


def group_members(pgid: int) -> List[int]:
    """The processes in process group `pgid`, from /proc."""
    return [p.pid for p in procs.processes() if p.pgrp == pgid]


def stop_group(pgid: int, wait_s: float) -> List[int]:
    """Wait up to `wait_s` for group `pgid` to empty; kill what is left; return its pids."""
    deadline = time.monotonic() + wait_s
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if left:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            time.sleep(1.0)
    return left


def _leftovers(left: List[int], tmp: str) -> List[str]:
    """Notes on what a run left: processes of its group that were still running, files in
    its TMPDIR."""
    leftovers = [f"{len(left)} process(es) still running after it ({left})"] if left else []
    stray = sorted(os.listdir(tmp))
    if stray:
        leftovers.append(f"left in its TMPDIR: {', '.join(stray[:5])}")
    return leftovers


def run_command(
    command: Sequence[str],
    workdir: str,
    run_id: str,
    timeout: float,
    env: Optional[Mapping[str, str]] = None,
    expect: str = "",
) -> Completed:
    """Run `command` in `workdir`, in its own process group and TMPDIR (workdir/tmp-RUN_ID),
    with `env` added to the environment; its output, wall time and what it left behind.
    RunFailed if it times out, exits non-zero or its output lacks `expect`."""
    command = list(command)
    tmp = os.path.join(workdir, f"tmp-{run_id}")
    os.mkdir(tmp)
    child_env = dict(os.environ, **(env or {}), TMPDIR=tmp, GLOO_SOCKET_IFNAME="lo")
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    started = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=workdir, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = child.communicate(timeout=timeout)
        wall = time.perf_counter() - started
    except subprocess.TimeoutExpired:
        stop_group(child.pid, 0)
        output, _ = child.communicate()
        text = tail(output.decode(errors="replace"))
        raise RunFailed(f"timed out after {timeout:.0f} s\n$ {' '.join(command)}\n{text}") from None
    except BaseException:  # interrupted: the run and all it started go
        stop_group(child.pid, 0)
        child.wait()
        raise
    left = stop_group(child.pid, GROUP_EXIT_WAIT_S)
    text = output.decode(errors="replace")
    if child.returncode != 0 or expect not in text:
        raise RunFailed(f"exit code {child.returncode}; cwd {workdir}\n$ {' '.join(command)}\n"
                        f"{tail(text)}")
    return Completed(command, text, wall, _leftovers(left, tmp))


def read_junit(path: str, expected: int) -> List[float]:
    """Each test's seconds (setup + call + teardown) from pytest's junit report, in run order."""
    suite = ElementTree.parse(path).getroot().find("testsuite")
    if suite is None:
        raise RunFailed(f"{path}: no testsuite")
    times, names = [], []
    for case in suite.iter("testcase"):
        names.append(f"{case.get('classname')}::{case.get('name')}")
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            raise RunFailed(f"{names[-1]} did not pass")
        times.append(float(case.get("time", "nan")))
    if len(times) != expected:
        raise RunFailed(f"{len(times)} tests reported, {expected} expected: {', '.join(names)}")
    return times


def junit_times(path: str, expected: int, done: Completed) -> List[float]:
    """read_junit for the run `done`; RunFailed with its command and output's tail when the
    report is missing, unreadable, or not `expected` tests that all passed."""
    try:
        return read_junit(path, expected)
    except (RunFailed, OSError, ElementTree.ParseError) as error:
        raise RunFailed(f"{error}\n$ {' '.join(done.command)}\n{tail(done.output)}") from None


def run_pytest(
    workdir: str,
    test_file: str,
    run_id: str,
    timeout: float,
    *,
    plugin: bool = True,
    junit_tests: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    expect: str = "",
) -> Completed:
    """`python -m pytest TEST_FILE -q -p no:cacheprovider` by run_command, with the harness's
    plugin (plugin=False: disabled, `-p no:harness.pytest_plugin`, as the package's entry
    point would load it) and pytest's temporary folders in workdir/basetemp-RUN_ID. With
    `junit_tests`, a --junitxml report gives .times (RunFailed unless that many tests passed)."""
    junit = os.path.join(workdir, f"junit-{run_id}.xml")
    command = [
        sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider",
        "-p", PLUGIN if plugin else f"no:{PLUGIN}",
        f"--basetemp={os.path.join(workdir, f'basetemp-{run_id}')}",
    ]
    if junit_tests is not None:
        command.append(f"--junitxml={junit}")
    done = run_command(command, workdir, run_id, timeout, env, expect)
    if junit_tests is None:
        return done
    return replace(done, times=junit_times(junit, junit_tests, done))


def parse_args(
    parser: argparse.ArgumentParser, timeout_help: str, min_tests: int
) -> argparse.Namespace:
    """The command line, `parser` (which has --tests and --rounds) given --timeout and --json;
    a usage error unless --tests is at least `min_tests` and --rounds at least 1."""
    parser.add_argument("--timeout", type=float, default=600.0, help=timeout_help)
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    args = parser.parse_args()
    if args.tests < min_tests or args.rounds < 1:
        parser.error("--tests and --rounds must be at least 1" if min_tests == 1 else
                     f"--tests must be at least {min_tests} and --rounds at least 1")
    return args


def test_files(sources: Mapping[str, str], tests: int) -> Dict[str, str]:
    """test_NAME.py for each variant's source, its __N__ the number of tests."""
    return {f"test_{name}.py": source.replace("__N__", str(tests))
            for name, source in sources.items()}


@contextlib.contextmanager
def work_folder(prefix: str, files: Mapping[str, str]) -> Iterator[str]:
    """A new temporary folder holding `files` (name -> text) and an empty pytest.ini (so the
    folder is pytest's rootdir: no settings from above it); removed with all in it at the end."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    try:
        for name, text in {"pytest.ini": "[pytest]\n", **files}.items():
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP exit by SystemExit, so that the clean-up (work_folder's, a run's
    stop_group) runs."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)


def rotated(names: Sequence[str], round_: int) -> List[str]:
    """`names` in the order of round `round_`: rotated by one place a round."""
    shift = round_ % len(names)
    return [*names[shift:], *names[:shift]]


def run_rounds(
    run: Callable[[str, str], T], names: Sequence[str], rounds: int, says: Callable[[T], str]
) -> Optional[Dict[str, List[T]]]:
    """Each variant once a round, in rotated order (so machine load falls on all alike):
    `run(name, run_id)`, each run's line on stderr ending in `says(result)`. The results per
    variant in round order; None when a run fails (why, on stderr)."""
    results: Dict[str, List[T]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in rotated(names, round_):
            try:
                results[name].append(run(name, f"{name}-{round_}"))
            except RunFailed as error:
                print(f"variant {name} failed (round {round_ + 1}): {error}", file=sys.stderr)
                return None
            print(f"  round {round_ + 1}: {name} {says(results[name][-1])}", file=sys.stderr,
                  flush=True)
    return results


def median_without_first(values: Sequence[float]) -> float:
    """The median of `values` without the first (which carries a pool's or a set's start),
    or of the one there is."""
    return statistics.median(values[1:] or values)


def torch_version() -> Optional[str]:
    """The installed torch's version, without importing it; None when there is none."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return None


def header(what: str, rounds: int) -> str:
    """The report's first line: what was run, and on what."""
    return (f"{what}, {rounds} round(s), {os.cpu_count()} cores, torch {torch_version()}; "
            "medians over the rounds")


def verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _leftovers_of(run: Any) -> Iterable[str]:
    return run.leftovers


def problems(
    results: Mapping[str, Sequence[T]], notes: Callable[[T], Iterable[str]] = _leftovers_of
) -> List[str]:
    """'VARIANT: NOTE' for each of each run's notes (by default what it left behind)."""
    return [f"{name}: {note}" for name, done in results.items() for run in done
            for note in notes(run)]


def print_problems(found: Iterable[str]) -> None:
    for problem in found:
        print(f"  problem: {problem}")


def target(label: str, value: float, limit: str, passed: bool) -> Dict[str, Any]:
    """One of the project's targets, as --json writes it."""
    return {"target": label, "value": value, "limit": limit, "passed": passed}


def write_json(
    path: Optional[str], tests: int, rounds: int, medians: Mapping[str, Any],
    found: List[str], **targets: Any,
) -> None:
    """The numbers, when --json named a `path`: the run's size, each variant's medians, the
    problems and the targets (`targets`, by key)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({
            "tests": tests, "rounds": rounds, "cpu_count": os.cpu_count(),
            "variants": medians, "problems": found, **targets,
        }, f, indent=2)
