"""harness/pytest_plugin/ (functions.py and the modules it drives): marked pytest functions,
rank fixtures, rank_pool and DistributedTest, as a user runs them.

One pytest subprocess runs tests/fixtures/ranked_functions.py (a user's file: every
behaviour a test there) serially and one under pytest-xdist; each test here reads its part of
those runs (a pytest start costs seconds): the outcome of each test id from the JUnit XML,
the report text from the terminal output, and what the ranks left in $FUNCTIONS_OUT. Both runs
must give every test the same outcome.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

import pytest

from tests.fixtures import REPO, user_pytest_env

USER_FILE = REPO / "tests" / "fixtures" / "ranked_functions.py"

EXPECTED = {
    **{f"test_sum[ranks{n}-{s}]": "passed" for n in (2, 3) for s in ("1.0", "2.0")},
    "test_rank1_fails": "failed",
    "test_one_rank_fails_other_waits": "failed",
    "test_hang": "failed",
    "test_hang_under_pytest_timeout": "skipped",
    "test_within_pytest_timeout": "skipped",
    "test_crash": "failed",
    "test_exits": "failed",
    "test_compare_explained": "failed",
    "test_pytest_fail_in_rank": "failed",
    "test_skip_in_ranks": "skipped",
    "test_size_zero": "error",
    "test_bad_mode": "error",
    "test_bad_option": "error",
    "test_unsendable": "error",
    "test_rank_without_marker": "error",
    "test_lambda_param[lambda]": "passed",
    "test_needs_cuda": "skipped",
    "test_cuda_or_cpu": "passed",
    "test_own_group": "passed",
    "test_teardown_in_rank": "passed",
    "test_paths": "passed",
    "test_pytest_fixtures_act_in_rank": "passed",
    "test_capfd_in_rank": "passed",
    "test_threads": "passed",
    "test_threads_rank_fails": "failed",
    "test_rank_fixture_fails": "error",
    "test_rank_fixture_fails_in_threads": "error",
    "test_rank_fixture_teardown_fails": "error",
    "test_xfail": "skipped",
    "test_imperative_xfail": "skipped",
    "test_xfail_raises": "skipped",
    "test_xfail_raises_another": "failed",
    "test_request_is_refused": "error",
    "test_shared_first": "passed",
    "test_shared_leaks": "failed",
    "test_shared_after_leak": "passed",
    "test_shared_fails": "failed",
    "test_shared_after_failure": "passed",
    "test_pool": "passed",
    "test_pool_in_threads_and_fresh": "passed",
    "test_pool_rank_fails": "failed",
    "test_pool_local_function": "failed",
    "TestDeepSpeedShape::test_each_size": "passed",
    "TestDeepSpeedShape::test_marked_size": "passed",
    "TestDeepSpeedReuse::test_a": "passed",
    "TestDeepSpeedReuse::test_b": "passed",
    "TestAlreadyRanked::test_x": "error",
    "TestPlainClass::test_method": "passed",
    "test_plain_still_plain": "passed",
}


class Run(NamedTuple):
    outcomes: Dict[str, Tuple[str, str]]  # test id -> (outcome, message)
    output: str
    left: Dict[str, List[str]]  # the notes the ranks wrote into $FUNCTIONS_OUT: a pid a line
    tmp_entries: List[str]  # new harness-* entries in the temp dir after the run


def _harness_temp(tmp: str) -> List[str]:
    return sorted(name for name in os.listdir(tmp) if name.startswith(("harness", "pymp")))


def _run(*args: str, plugin: Tuple[str, ...] = ("-p", "harness.pytest_plugin"),
         launcher: Tuple[str, ...] = (sys.executable, "-m"), **env_extra: str) -> Run:
    """pytest (`launcher` + pytest ARGS) on the user file in a fresh folder; what it gave."""
    with tempfile.TemporaryDirectory() as work:
        out, tmp = os.path.join(work, "out"), os.path.join(work, "tmp")
        os.mkdir(out)
        os.mkdir(tmp)
        shutil.copy(USER_FILE, os.path.join(work, "test_user.py"))
        xml = os.path.join(work, "report.xml")
        env = user_pytest_env(FUNCTIONS_OUT=out, TMPDIR=tmp, COLUMNS="200", **env_extra)
        done = subprocess.run(
            [*launcher, "pytest", *plugin, "-p", "no:cacheprovider", "test_user.py", "-rA",
             f"--junitxml={xml}", f"--basetemp={os.path.join(work, 'base')}", *args],
            cwd=work, env=env, capture_output=True, text=True, timeout=900,
        )
        outcomes = {}
        if os.path.exists(xml):
            for case in ET.parse(xml).getroot().iter("testcase"):
                outcomes[_test_id(case)] = _outcome(case)
        left = {name: Path(out, name).read_text().splitlines() for name in os.listdir(out)}
        return Run(outcomes, done.stdout + done.stderr, left, _harness_temp(tmp))


def _test_id(case: ET.Element) -> str:
    cls = case.get("classname", "").rpartition(".")[2]
    name = case.get("name", "")
    return f"{cls}::{name}" if cls.startswith("Test") else name


def _outcome(case: ET.Element) -> Tuple[str, str]:
    kinds = [child for child in case if child.tag in ("failure", "error", "skipped")]
    if not kinds:
        return "passed", ""
    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kinds[0].tag]
    return outcome, kinds[0].get("message", "")


@functools.cache
def serial_run() -> Run:
    return _run()


@functools.cache
def xdist_run() -> Run:
    # HARNESS_WORLD_SIZE changes no marker's sizes (test_sum checks its sums).
    return _run("-n", "2", HARNESS_WORLD_SIZE="5")


def section(output: str, test: str) -> str:
    """The report pytest printed for one failing test."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and f" {test} " in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("__", "=="))),
               len(lines))
    return "\n".join(lines[start:end])


def message(test: str) -> str:
    return serial_run().outcomes[test][1]


def assert_outcomes(run: Run) -> None:
    """Every test of the user file has its EXPECTED outcome; else each one that differs, with
    its message and its part of the output."""
    got = {test: outcome for test, (outcome, _) in run.outcomes.items()}
    wrong = {t: (got.get(t), EXPECTED.get(t)) for t in {*got, *EXPECTED}
             if got.get(t) != EXPECTED.get(t)}
    shown = []
    for test in wrong:
        lines = [line for line in run.output.splitlines() if test.split("::")[-1] in line]
        shown.append(f"{test}: {run.outcomes.get(test)}\n" + "\n".join(lines[:20]))
    assert not wrong, f"(got, expected): {wrong}\n" + "\n\n".join(shown) + run.output[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(360)  # a limit of its own: a harness that never times out fails here
class TestOutcomes:
    def test_every_test_has_its_outcome(self) -> None:
        assert_outcomes(serial_run())

    def test_pytest_xdist_gives_the_same_outcomes(self) -> None:
        assert_outcomes(xdist_run())

    def test_nothing_is_left_behind(self) -> None:
        assert serial_run().tmp_entries == []
        assert xdist_run().tmp_entries == []


@pytest.mark.slow
@pytest.mark.timeout(360)  # a limit of its own: a harness that never times out fails here
class TestReports:
    def test_a_failure_leads_with_the_rank_and_pytests_explanation(self) -> None:
        output = serial_run().output
        assert "FAILED test_user.py::test_rank1_fails - rank 1: AssertionError: assert 10 == 0" \
            in output
        text = section(output, "test_rank1_fails")
        assert ">       assert value == 0" in text
        assert "Captured stdout+stderr call (rank 1)" in output and "output of rank 1" in output
        # the whole explanation, as pytest gives it in its own process
        explained = section(output, "test_compare_explained")
        assert "rank 1: AssertionError: assert [1, 2, 3] == [1, 2, 4]" in explained, explained
        assert "At index 2 diff: 3 != 4" in explained, explained

    def test_pytest_fail_in_a_rank_reads_as_pytests_at_the_users_line(self) -> None:
        assert message("test_pytest_fail_in_rank").startswith(
            "rank 1: Failed: rank 1 gave up on purpose")
        text = section(serial_run().output, "test_pytest_fail_in_rank")
        assert '>           pytest.fail("rank 1 gave up on purpose")' in text, text
        assert "contextlib" not in text and "_pytest/" not in text, text

    def test_an_exit_points_at_the_test_alone(self) -> None:
        assert message("test_exits").startswith("rank 1: exited with code 3")
        text = section(serial_run().output, "test_exits")
        assert ">   def test_exits(rank):" in text, text
        assert "def test_crash" not in text and "import" not in text, text  # not the module

    def test_one_rank_failing_does_not_deadlock_the_other(self) -> None:
        assert message("test_one_rank_fails_other_waits").startswith(
            "rank 1: ValueError: rank 1 gave up")

    def test_a_hang_fails_its_test_with_the_hang_report_and_the_session_goes_on(self) -> None:
        text = section(serial_run().output, "test_hang")
        assert "timed out after 4 s" in message("test_hang")
        assert "time.sleep(600)" in text  # where the hanging rank waits
        assert serial_run().outcomes["test_crash"][0] == "failed"  # the next test ran

    def test_a_crash_names_the_rank_and_signal(self) -> None:
        assert message("test_crash").startswith("rank 1: died by signal SIGSEGV")

    def test_skip_in_ranks_keeps_its_reason_and_the_tests_place(self) -> None:
        assert "SKIPPED [1] test_user.py:" in serial_run().output
        assert re.search(r"test_user\.py:\d+: skipped inside the ranks", serial_run().output)

    def test_bad_input_is_one_line_naming_what_is_wrong(self) -> None:
        assert "world size 0 is below 1" in message("test_size_zero")
        assert "unknown mode 'bogus'" in message("test_bad_mode")
        assert "unknown option 'colour'" in message("test_bad_option")
        assert "fixture 'lock'" in message("test_unsendable")
        assert "@harness.rank_fixture" in message("test_unsendable")
        unsendable = section(serial_run().output, "test_unsendable")
        assert unsendable.count("cannot be sent") == 1, unsendable  # said once, no chain
        local = section(serial_run().output, "test_pool_local_function")
        assert "is not a module-level function" in local
        assert "pool.py" not in local, local  # at the user's line, not in the pool
        assert "@pytest.mark.ranks(N)" in message("test_rank_without_marker")
        assert "already a multi-rank unittest class" in message("TestAlreadyRanked::test_x")
        assert "not a module-level function" in message("test_pool_local_function")
        for test in ("test_size_zero", "test_bad_mode", "test_unsendable"):
            assert "Traceback" not in section(serial_run().output, test)

    def test_cuda_skips_at_collection_with_what_is_missing(self) -> None:
        if serial_run().outcomes["test_needs_cuda"][0] == "passed":
            pytest.skip("this machine has 2 CUDA devices")
        assert "needs 2 CUDA device(s), 0 available here" in serial_run().output

    def test_thread_ranks_report_as_process_ranks(self) -> None:
        assert message("test_threads_rank_fails").startswith("rank 0: KeyError: 'thread rank 0'")

    def test_a_rank_fixture_that_raises_is_an_error_at_setup(self) -> None:
        output = serial_run().output
        for test in ("test_rank_fixture_fails", "test_rank_fixture_fails_in_threads"):
            # JUnit's <error>, worded as pytest words a fixture's error
            assert message(test) == 'failed on setup with "rank 1: ValueError: no data for rank 1"'
            assert f"ERROR at setup of {test} " in output, output[-3000:]
            assert f"ERROR test_user.py::{test} - rank 1: ValueError" in output
        text = section(output, "test_rank_fixture_fails")
        assert '>           raise ValueError("no data for rank 1")' in text, text  # in the fixture
        assert "in_rank.py" not in text, text

    def test_a_rank_fixture_whose_teardown_raises_errors_at_teardown(self) -> None:
        test = "test_rank_fixture_teardown_fails"
        output = serial_run().output
        assert [len(serial_run().left[f"teardown_test_ran{rank}"]) for rank in (0, 1)] == [1, 1]
        assert f"PASSED test_user.py::{test}" in output, output[-3000:]  # the test itself
        assert f"ERROR at teardown of {test} " in output
        assert message(test) == (
            'failed on teardown with "rank 1: OSError: rank 1 could not close its file"')
        raised = '>           raise OSError("rank 1 could not close its file")'
        assert raised in section(output, test)

    def test_xfail_and_request(self) -> None:
        assert "XFAIL test_user.py::test_xfail - known to fail on rank 1" in serial_run().output
        assert ("XFAIL test_user.py::test_imperative_xfail - all_gather_into_tensor is not on "
                "gloo") in serial_run().output  # pytest.xfail() in the ranks
        assert "fixture 'request' belongs to the pytest process" in message(
            "test_request_is_refused")

    def test_pool_failure_names_the_rank(self) -> None:
        assert message("test_pool_rank_fails").startswith(
            "rank 1: AssertionError: pool rank disagrees")


@pytest.mark.slow
@pytest.mark.timeout(360)  # a limit of its own: a harness that never times out fails here
class TestRankFixtures:
    def test_generator_teardown_runs_in_each_rank(self) -> None:
        assert [len(serial_run().left[f"teardown{rank}"]) for rank in (0, 1)] == [1, 1]

    def test_ranks_scope_lives_as_long_as_the_shared_set(self) -> None:
        left = serial_run().left
        # Built once per set of ranks. The leak retired the first set (killed: no teardown);
        # the second ended after a failed test (its ranks finished the set); the third when
        # the module's tests were done.
        assert [len(left[f"set_built{rank}"]) for rank in (0, 1)] == [3, 3]
        assert [len(left[f"set_finished{rank}"]) for rank in (0, 1)] == [2, 2]

    def test_shared_ranks_are_replaced_after_a_failure(self) -> None:
        pids = serial_run().left["failed_in0"]
        assert len(pids) == 2 and pids[0] != pids[1]

    def test_deepspeed_sizes_run_in_turn_and_reuse_shares_ranks(self) -> None:
        left = set(serial_run().left)
        assert {"size1_rank0", "size2_rank0", "size2_rank1"} <= left
        assert {"reuse_a0", "reuse_a1", "reuse_b0", "reuse_b1"} <= left


@pytest.mark.slow
@pytest.mark.timeout(360)  # a limit of its own: a harness that never times out fails here
class TestPytestOptions:
    """What a pytest user expects of the options around a run."""

    @staticmethod
    @functools.cache
    def timeout_run() -> Run:
        return _run("--timeout", "10", "-x", "-k",
                    "pytest_timeout or sum or crash", WITH_PYTEST_TIMEOUT="1")

    def test_a_test_well_inside_pytest_timeout_runs_to_its_end(self) -> None:
        # --timeout 10 leaves the ranks about 7.4 s (was 4.9: this 5.5 s test failed)
        outcome, text = self.timeout_run().outcomes["test_within_pytest_timeout"]
        assert outcome == "passed", text

    def test_pytest_timeout_shows_the_harness_hang_report(self) -> None:
        outcome, text = self.timeout_run().outcomes["test_hang_under_pytest_timeout"]
        assert outcome == "failed" and "timed out" in text, self.timeout_run().output[-2000:]
        assert "Timeout (0:00:10)" not in self.timeout_run().output  # not pytest-timeout's

    def test_k_selects_and_x_stops_at_the_first_failure(self) -> None:
        ran = set(self.timeout_run().outcomes)
        assert "test_hang_under_pytest_timeout" in ran and "test_rank1_fails" not in ran
        assert "test_crash" not in ran  # after the first failure

    def test_s_shows_the_ranks_output_as_it_is_printed(self) -> None:
        run = _run("-s", "-k", "test_rank1_fails")
        live = run.output.split("= FAILURES =")[0]  # printed before pytest's report
        for rank in (0, 1):
            assert f"[rank {rank}] output of rank {rank}" in live, run.output[-3000:]
        assert run.outcomes["test_rank1_fails"][0] == "failed"

    def test_the_plugin_turned_off_leaves_plain_pytest(self) -> None:
        run = _run("-k", "sum or plain_still", plugin=("-p", "no:harness.pytest_plugin"))
        assert "INTERNALERROR" not in run.output
        assert run.outcomes["test_plain_still_plain"][0] == "passed"
        outcome, text = run.outcomes["test_sum[1.0]"]  # no `ranks` sizes in the id, no fixture
        assert outcome == "error" and "fixture 'rank' not found" in text

    def test_torchrun_runs_a_matching_size_in_process_and_skips_the_others(self) -> None:
        run = _run("-k", "test_sum or test_threads", launcher=(
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m"))
        got = {test: outcome for test, (outcome, _) in run.outcomes.items()}
        assert got["test_sum[ranks2-1.0]"] == "passed", run.output[-3000:]
        assert got["test_sum[ranks3-1.0]"] == "skipped"
        assert "needs world size 3, torchrun launched 2 processes" in run.output


CONFTEST = """
import torch
from harness import rank_fixture

@rank_fixture
def weights(device, rank):
    return torch.ones(2, device=device) * rank

@rank_fixture
def asked_by_mark(rank, rank_tmp_path):
    (rank_tmp_path / "used").write_text(str(rank))
"""

TEST_FILE = """
import pytest, torch.distributed as dist

@pytest.mark.ranks(2)
@pytest.mark.parametrize("scale", [2.0])
def test_weights(weights, scale):
    dist.all_reduce(weights)
    assert (weights * scale).tolist() == [2.0, 2.0]

@pytest.mark.usefixtures("asked_by_mark")
@pytest.mark.ranks(2, init=False)
def test_a_rank_fixture_not_taken_is_built_in_the_ranks(rank, rank_tmp_path):
    assert (rank_tmp_path / "used").read_text() == str(rank)
"""


@pytest.mark.slow
def test_a_conftest_rank_fixture_under_import_mode_importlib(tmp_path: Path) -> None:
    """The ranks find a module pytest imported from its file (not importable by name); a rank
    fixture a test uses without taking it (usefixtures) is built there too."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_weights.py").write_text(TEST_FILE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = user_pytest_env()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "--import-mode=importlib", str(tests)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300,
    )
    assert "2 passed" in done.stdout, done.stdout[-2000:]


def run_files(folder: Path, files: Dict[str, str]) -> str:
    """pytest's output (`-q -rE`) on these files, written into `folder`, as a user runs it."""
    for name, text in files.items():
        (folder / name).write_text(text)
    env = user_pytest_env()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "-rE"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )
    return done.stdout


MARKING_CONFTEST = '''
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name.startswith("test_dist"):
            sizes = [2, 3] if "list" in item.name else 2
            item.add_marker(pytest.mark.ranks(sizes))
'''

MARKED_ELSEWHERE = '''
import pytest
import torch.distributed as dist

pytestmark = pytest.mark.ranks(2)


def test_module_mark(rank, world_size):
    assert dist.get_world_size() == world_size == 2


class TestPlainClass:
    def test_method(self, rank):
        assert dist.get_rank() == rank
'''

MARKED_BY_CONFTEST = '''
import torch.distributed as dist


def test_dist_from_conftest(rank, world_size):
    assert dist.get_world_size() == world_size == 2


def test_dist_list_from_conftest(rank):
    pass
'''


@pytest.mark.slow
def test_the_marker_from_pytestmark_a_class_and_a_conftest(tmp_path: Path) -> None:
    """pytestmark (module, class) and a conftest's add_marker rank a test as the decorator
    does; a list of sizes added after collection is a one-line error saying why."""
    out = run_files(tmp_path, {
        "conftest.py": MARKING_CONFTEST, "test_marked_elsewhere.py": MARKED_ELSEWHERE,
        "test_marked_by_conftest.py": MARKED_BY_CONFTEST,
    })
    assert "3 passed, 1 error" in out, out[-3000:]
    assert "ERROR test_marked_by_conftest.py::test_dist_list_from_conftest" in out
    assert "added after collection" in out


CLASHING_CONFTEST = '''
import pytest


@pytest.fixture
def device():
    return "the user's device"
'''

CLASHING_TESTS = '''
import pytest


@pytest.mark.ranks(2)
@pytest.mark.parametrize("rank", range(2))
def test_parametrized_rank(rank):
    pass


@pytest.mark.ranks(2)
def test_users_device(device):
    pass


@pytest.mark.ranks([1, 2])
def test_listed_sizes(rank, world_size):
    assert 0 <= rank < world_size


def test_not_ranked(device):
    assert device == "the user's device"
'''


@pytest.mark.slow
def test_a_users_parameter_or_fixture_named_like_a_rank_fixture_is_an_error(
    tmp_path: Path,
) -> None:
    """Never a value silently replaced by the rank's own: one line naming both."""
    out = run_files(tmp_path, {"conftest.py": CLASHING_CONFTEST, "test_clash.py": CLASHING_TESTS})
    assert "3 passed, 3 errors" in out, out[-3000:]
    assert "parametrize('rank', ...) on a ranked test: 'rank' is the rank's own fixture" in out
    assert "fixture 'device' of conftest in a ranked test" in out


LEAKING_TESTS = '''
import os

import pytest


@pytest.mark.ranks(2, mode="shared", skip_leak_checks=("environ",))
def test_sets_a_variable_on_purpose(rank):
    os.environ["SET_ON_PURPOSE"] = "1"


@pytest.mark.ranks(2, mode="shared")
def test_leaks_a_variable(rank):
    os.environ["LEAKED_BY_MISTAKE"] = "1"
'''


@pytest.mark.slow
def test_a_leak_check_is_waived_per_test_and_the_message_names_the_option(
    tmp_path: Path,
) -> None:
    out = run_files(tmp_path, {"test_leaking.py": LEAKING_TESTS})
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert ('test_leaks_a_variable left LEAKED_BY_MISTAKE in os.environ '
            '(skip_leak_checks=("environ",) waives it)') in out, out[-3000:]


AUTOUSE_CONFTEST = '''
import os

from harness import rank_fixture


@rank_fixture(autouse=True)
def per_rank_setup(rank, world_size, tmp_path):
    os.environ["SET_UP_IN_RANK"] = f"{rank}/{world_size}"
    yield
    del os.environ["SET_UP_IN_RANK"]
'''

AUTOUSE_TESTS = '''
import os

import pytest


@pytest.fixture
def seen_at_setup():
    return os.environ.get("SET_UP_IN_RANK")


@pytest.mark.ranks(2)
def test_fresh(rank, world_size):
    assert os.environ["SET_UP_IN_RANK"] == f"{rank}/{world_size}"


@pytest.mark.ranks(2, mode="shared")
def test_shared(rank):
    assert os.environ["SET_UP_IN_RANK"] == f"{rank}/2"


def test_without_ranks(seen_at_setup):
    assert seen_at_setup is None and "SET_UP_IN_RANK" not in os.environ


def env_of(rank, world_size):
    return os.environ.get("SET_UP_IN_RANK")


def test_a_pool_call_is_no_test(rank_pool):
    assert rank_pool.run(env_of) == [None, None]
'''


@pytest.mark.slow
def test_an_autouse_rank_fixture_reaches_every_ranked_test_and_nothing_else(
    tmp_path: Path,
) -> None:
    out = run_files(tmp_path, {"conftest.py": AUTOUSE_CONFTEST, "test_autouse.py": AUTOUSE_TESTS})
    assert "4 passed" in out, out[-3000:]


LAUNCHER_ENV_TESTS = '''
import os

import pytest
import torch
import torch.distributed as dist

from harness import MultiProcessTestCase

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
         "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.ranks(2, init=False)
def test_a_bare_init_process_group_makes_the_world(rank):
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert (dist.get_rank(), dist.get_world_size(), t.item()) == (rank, 2, 2)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.ranks(2, mode="shared")
def test_shared_ranks_see_it(rank):
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == (str(rank), str(rank))


def test_the_pytest_process_has_none_of_it():
    assert [name for name in NAMES if name in os.environ] == []


class TestClassRanks(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_see_it(self):
        assert os.environ["WORLD_SIZE"] == "2" and os.environ["MASTER_ADDR"] == "127.0.0.1"
'''


@pytest.mark.slow
def test_every_process_rank_runs_in_torchruns_environment(tmp_path: Path) -> None:
    out = run_files(tmp_path, {"test_launcher_env.py": LAUNCHER_ENV_TESTS})
    assert "4 passed" in out, out[-3000:]


LEAVING_TESTS = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.ranks(2)
def test_leaves_and_breaks_the_connection(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)


@pytest.mark.ranks(2, mode="shared", timeout=3)
def test_returns_while_a_peer_waits(rank):
    if rank == 0:
        dist.all_reduce(torch.ones(1))
'''


@pytest.mark.slow
def test_the_rank_that_left_is_named_first(tmp_path: Path) -> None:
    """Not the peer waiting for it: in the timeout's headline, and before the gloo error its
    exit caused in the peer (a consequence)."""
    out = run_files(tmp_path, {"test_leaving.py": LEAVING_TESTS})
    assert "2 failed" in out, out[-3000:]
    assert "E   rank 1: left the test while rank 0 was in a collective with it" in out, out
    assert "rank 0 raised as a consequence" in out
    assert "E   rank 1: left the test while rank 0 waits in all_reduce #" in out, out


AUTOUSE_DEPENDENCIES_CONFTEST = '''
import os

import pytest

from harness import rank_fixture


@pytest.fixture
def config_value():
    return "CFG"


@rank_fixture
def cfg(config_value, rank):
    return f"{config_value}{rank}"


@rank_fixture(autouse=True)
def init(cfg, rank):
    os.environ["INIT_SEEN"] = cfg
    yield
    del os.environ["INIT_SEEN"]
'''

AUTOUSE_IN_A_CLASS = '''
import os

import pytest

from harness import rank_fixture


@rank_fixture
def own(rank):
    return os.environ.get("INIT_SEEN")  # the autouse one was built first


@pytest.mark.ranks(2)
def test_module(rank, own):
    assert own == f"CFG{rank}"


class TestInClass:
    @rank_fixture(autouse=True)
    def class_setup(self, rank):
        os.environ["CLASS_SETUP"] = str(rank)

    @pytest.mark.ranks(2)
    def test_method(self, rank):
        assert os.environ["CLASS_SETUP"] == str(rank)
        assert os.environ["INIT_SEEN"] == f"CFG{rank}"


def test_without_ranks():
    assert "INIT_SEEN" not in os.environ and "CLASS_SETUP" not in os.environ
'''


@pytest.mark.slow
def test_autouse_rank_fixtures_in_a_class_with_dependencies_come_first(tmp_path: Path) -> None:
    """What an autouse rank fixture asks for through other rank fixtures is resolved; one
    defined in a class reaches that class's ranked tests; both before the test's own."""
    out = run_files(tmp_path, {"conftest.py": AUTOUSE_DEPENDENCIES_CONFTEST,
                               "test_autouse_class.py": AUTOUSE_IN_A_CLASS})
    assert "3 passed" in out, out[-3000:]

