"""harness.settings: env knobs for device, world size, timeout, start method, torchrun."""

import os
import subprocess
import sys
import textwrap
import unittest
from datetime import timedelta
from unittest import mock

import pytest
import torch

from harness import settings
from harness.requirements import decorators
from harness.settings import HarnessConfigError
from tests.fixtures import upstream_diff


def env(**values):
    """Patch os.environ with `values` (None removes a variable)."""
    patch = mock.patch.dict(os.environ)
    patch.start()
    for key, value in values.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value
    return patch


class Case:
    """What the rank settings read of a case."""

    _testMethodName = "test_x"

    def __init__(self):
        self.world_size, self.timeout = 2, 5.0


class DevicesTest(unittest.TestCase):
    def setUp(self):
        self.patch = env(
            HARNESS_DEVICE=None,
            HARNESS_WORLD_SIZE=None,
            HARNESS_TIMEOUT=None,
            HARNESS_START_METHOD=None,
            HARNESS_ALLOW_CPU=None,
            HARNESS_LAUNCHED=None,
            DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=None,
            RANK=None,
            WORLD_SIZE=None,
            MASTER_ADDR=None,
            TORCHELASTIC_RUN_ID=None,
            GROUP_RANK=None,
            LOCAL_WORLD_SIZE=None,
        )
        self.addCleanup(self.patch.stop)

    def test_cpu_without_accelerators(self):
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertEqual(settings.accelerator_count(), 0)
            self.assertEqual(settings.device_type(), "cpu")
            self.assertEqual(settings.backend_for(settings.device_type()), "gloo")
            self.assertEqual(settings.rank_device(1), torch.device("cpu"))
            self.assertEqual(settings.default_world_size(), 2)

    def test_allow_cpu_switch(self):
        """HARNESS_ALLOW_CPU: off unless 1; the CPU stands in only where no accelerator exists;
        the devices still describe the machine."""
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertFalse(settings.allow_cpu())
            self.assertFalse(decorators.cpu_stands_in())
            for off in ("", "0"):
                os.environ["HARNESS_ALLOW_CPU"] = off
                self.assertFalse(decorators.cpu_stands_in())
            os.environ["HARNESS_ALLOW_CPU"] = "1"
            self.assertTrue(decorators.cpu_stands_in())
            self.assertEqual(settings.device_type(), "cpu")
            self.assertEqual(settings.rank_device(1), torch.device("cpu"))
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "device_count", return_value=2),
        ):
            self.assertTrue(settings.allow_cpu())
            self.assertFalse(decorators.cpu_stands_in())
        os.environ["HARNESS_ALLOW_CPU"] = "maybe"
        with self.assertRaisesRegex(HarnessConfigError, "^HARNESS_ALLOW_CPU='maybe' is not a sw"):
            settings.allow_cpu()

    def test_one_process_per_gpu_with_nccl(self):
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "device_count", return_value=4),
        ):
            self.assertEqual(settings.device_type(), "cuda")
            self.assertEqual(settings.backend_for("cuda"), "nccl")
            self.assertEqual(settings.default_world_size(), 4)
            self.assertEqual(settings.rank_device(5), torch.device("cuda", 1))
            os.environ["HARNESS_DEVICE"] = "cpu"
            self.assertEqual(settings.device_type(), "cpu")
            self.assertEqual(settings.default_world_size(), 2)

    def test_forcing_cuda_without_cuda_is_an_error(self):
        os.environ["HARNESS_DEVICE"] = "cuda"
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            with self.assertRaisesRegex(HarnessConfigError, "no CUDA device"):
                settings.device_type()

    def test_unknown_device_names_the_value(self):
        os.environ["HARNESS_DEVICE"] = "tpu"
        with self.assertRaisesRegex(
            HarnessConfigError, r"HARNESS_DEVICE='tpu' is not one of: cpu, cuda"
        ):
            settings.device_type()
        with self.assertRaisesRegex(HarnessConfigError, "'tpu'"):
            settings.backend_for("tpu")

    def test_world_size_from_env(self):
        os.environ["HARNESS_WORLD_SIZE"] = "3"
        self.assertEqual(settings.default_world_size(), 3)
        for bad in ("two", "1.5", "0"):
            os.environ["HARNESS_WORLD_SIZE"] = bad
            with self.assertRaisesRegex(HarnessConfigError, f"HARNESS_WORLD_SIZE='{bad}'"):
                settings.default_world_size()

    def test_timeout(self):
        self.assertEqual(settings.default_timeout(), 300.0)
        os.environ["HARNESS_TIMEOUT"] = "2.5"
        self.assertEqual(settings.default_timeout(), 2.5)
        os.environ["HARNESS_TIMEOUT"] = "soon"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_TIMEOUT='soon'"):
            settings.default_timeout()

    def test_a_timeout_default_the_file_sets_is_the_default(self):
        import harness

        self.addCleanup(delattr, harness, "TIMEOUT_DEFAULT")  # gives devices its value back
        harness.TIMEOUT_DEFAULT = 42  # as `common_distributed.TIMEOUT_DEFAULT = 42`, migrated
        self.assertEqual(settings.default_timeout(), 42.0)
        self.assertEqual(harness.get_timeout("mod.Case.test_x"), 42)
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = "30"  # read before the file set it
        self.assertEqual(settings.default_timeout(), 42.0)
        os.environ["HARNESS_TIMEOUT"] = "7"  # the run's own choice wins, as HARNESS_SEED does
        self.assertEqual(settings.default_timeout(), 7.0)

    def test_default_timeout_is_read_when_used(self):
        class Case:
            timeout = settings.DefaultTimeout()

        os.environ["HARNESS_TIMEOUT"] = "7"
        self.assertEqual(Case.timeout, 7.0)
        os.environ["HARNESS_TIMEOUT"] = "9"
        self.assertEqual(Case().timeout, 9.0)

    def test_checked_rank_settings_name_the_bad_attribute(self):
        case = Case()
        self.assertEqual(settings.checked_rank_settings(case, 2), (2, 5.0))
        for world_size in (-1, True, False, "2", 2.0, None):
            with self.assertRaisesRegex(
                HarnessConfigError, r"Case.world_size must be a positive int"
            ):
                settings.checked_rank_settings(case, world_size)
        for timeout in (0, -1, True, "5", None):
            case.timeout = timeout
            with self.assertRaisesRegex(
                HarnessConfigError, r"Case.timeout must be a positive number"
            ):
                settings.checked_rank_settings(case, 2)
        case.timeout = timedelta(seconds=3)  # a group's timeout (shared-process classes): fine
        self.assertEqual(settings.checked_rank_settings(case, 2), (2, 300.0))
        self.addCleanup(settings.TIMEOUT_OVERRIDE.pop, "test_x", None)
        settings.TIMEOUT_OVERRIDE["test_x"] = "soon"
        with self.assertRaisesRegex(HarnessConfigError, r"TIMEOUT_OVERRIDE\['test_x'\]"):
            settings.checked_rank_settings(case, 2)

    def test_world_size_zero_is_a_skip_saying_why(self):
        with mock.patch.object(torch.cuda, "device_count", return_value=0):
            with self.assertRaises(unittest.SkipTest) as caught:
                settings.checked_rank_settings(Case(), 0)
        self.assertEqual(
            str(caught.exception),
            "Case.world_size is 0: no ranks to start (0 accelerators found)",
        )

    @pytest.mark.slow
    def test_upstream_cuda_flags_follow_the_machine_and_forced_cpu(self):
        code = "import harness; print(harness.TEST_CUDA, harness.TEST_MULTIGPU)"
        cuda = torch.cuda.is_available()
        for forced, expected in (("", f"{cuda} {cuda and torch.cuda.device_count() >= 2}"),
                                 ("cpu", "False False")):
            out = subprocess.run(
                [sys.executable, "-c", code], env=dict(os.environ, HARNESS_DEVICE=forced),
                capture_output=True, text=True, check=True,
            ).stdout.strip()
            self.assertEqual(out, expected)

    def test_start_method(self):
        self.assertEqual(settings.start_method(), "forkserver")
        os.environ["HARNESS_START_METHOD"] = "spawn"
        self.assertEqual(settings.start_method(), "spawn")
        os.environ["HARNESS_START_METHOD"] = "thread"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_START_METHOD='thread'"):
            settings.start_method()

    def test_launch_detection_needs_torchruns_own_variables(self):
        """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT alone (left by a pod or an env:// test) are
        not a launch; torchrun's own variables are, and so is HARNESS_LAUNCHED=1."""
        os.environ.update(RANK="1", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        self.assertIsNone(settings.torchrun_env())
        os.environ.update(TORCHELASTIC_RUN_ID="job", GROUP_RANK="0", LOCAL_WORLD_SIZE="4")
        self.assertEqual(settings.torchrun_env(), (1, 4))
        os.environ["HARNESS_LAUNCHED"] = "0"
        self.assertEqual(settings.torchrun_env(), (1, 4))  # 0 opts nothing out: torchrun's own
        del os.environ["TORCHELASTIC_RUN_ID"]
        self.assertIsNone(settings.torchrun_env())
        os.environ["HARNESS_LAUNCHED"] = "1"
        self.assertEqual(settings.torchrun_env(), (1, 4))
        os.environ["RANK"] = "one"
        with self.assertRaisesRegex(HarnessConfigError, "RANK='one'"):
            settings.torchrun_env()
        del os.environ["MASTER_ADDR"]
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_LAUNCHED=1 but MASTER_ADDR"):
            settings.torchrun_env()
        os.environ["HARNESS_LAUNCHED"] = "sure"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_LAUNCHED='sure'"):
            settings.torchrun_env()

    def test_base_world_size(self):
        self.assertEqual(settings.base_world_size(), 4)
        self.assertEqual(settings.base_world_size(per_device=True), 1)
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "device_count", return_value=2),
        ):
            self.assertEqual(settings.base_world_size(per_device=True), 2)
            self.assertEqual(settings.base_world_size(), 4)
        os.environ["HARNESS_WORLD_SIZE"] = "3"
        self.assertEqual(settings.base_world_size(per_device=True), 3)
        os.environ.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", HARNESS_LAUNCHED="1")
        self.assertEqual(settings.base_world_size(launched=True), 2)
        self.assertEqual(settings.base_world_size(), 3)

    def test_backend_of_a_device(self):
        for device, backend in (("cpu", "gloo"), ("cuda", "nccl"), ("cuda:1", "nccl"),
                                (torch.device("cuda", 0), "nccl"), ("xpu", "xccl"),
                                ("hpu", "hccl"), ("meta", "gloo")):
            self.assertEqual(settings.backend_for(device), backend, device)
        with self.assertRaisesRegex(HarnessConfigError, "unknown device 'tpu'"):
            settings.backend_for("tpu")

    def test_test_timeout_order(self):
        """TIMEOUT_OVERRIDE[test], the class's seconds, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT,
        HARNESS_TIMEOUT, 300; a timedelta is not the test's limit."""
        case = Case()
        del case.timeout
        self.assertEqual(settings.test_timeout(case), 300.0)
        os.environ["HARNESS_TIMEOUT"] = "40"
        self.assertEqual(settings.test_timeout(case), 40.0)
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = "30"
        self.assertEqual(settings.test_timeout(case), 30.0)
        case.timeout = timedelta(seconds=3)
        self.assertEqual(settings.test_timeout(case), 30.0)
        case.timeout = 20
        self.assertEqual(settings.test_timeout(case), 20.0)
        import harness

        self.assertIs(harness.TIMEOUT_OVERRIDE, settings.TIMEOUT_OVERRIDE)  # the one users fill
        self.addCleanup(settings.TIMEOUT_OVERRIDE.pop, "test_x", None)
        harness.TIMEOUT_OVERRIDE["test_x"] = 10
        self.assertEqual(settings.test_timeout(case), 10.0)
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = "later"
        with self.assertRaisesRegex(HarnessConfigError, "_DEFAULT_TIMEOUT='later'"):
            settings.default_timeout()

    def test_intra_op_threads_share_the_cores(self):
        with mock.patch.object(os, "sched_getaffinity", return_value={0, 1, 2, 3}, create=True):
            self.assertEqual(settings.intra_op_threads(2), 2)
            self.assertEqual(settings.intra_op_threads(8), 1)


class ParsersTest(unittest.TestCase):
    """One parser per kind of value; each bad value is one line naming the variable and value."""

    NAME = "HARNESS_TEST_KNOB"

    def setUp(self):
        self.addCleanup(env(**{self.NAME: None}).stop)

    def set(self, value):
        os.environ[self.NAME] = value

    def test_a_switch_takes_the_usual_words_in_any_case(self):
        self.assertFalse(settings.env_flag(self.NAME))
        self.assertTrue(settings.env_flag(self.NAME, default=True))
        for word, on in (("1", True), ("true", True), ("Yes", True), ("TRUE", True),
                         ("0", False), ("false", False), ("No", False), ("", False)):
            self.set(word)
            self.assertIs(settings.env_flag(self.NAME), on, word)

    def test_a_bad_switch_is_one_line_naming_it(self):
        self.set("2")
        with self.assertRaises(HarnessConfigError) as caught:
            settings.env_flag(self.NAME)
        message = str(caught.exception)
        self.assertTrue(message.startswith(f"{self.NAME}='2' "), message)
        self.assertNotIn("\n", message)

    def test_every_harness_switch_reads_the_same(self):
        """HARNESS_ALLOW_CPU, HARNESS_SHOW_OUTPUT and HARNESS_LAUNCHED: one rule."""
        readers = {
            "HARNESS_ALLOW_CPU": settings.allow_cpu,
            "HARNESS_SHOW_OUTPUT": settings.show_output,
        }
        for name, read in readers.items():
            with self.subTest(name), mock.patch.dict(os.environ):
                for word, on in (("yes", True), ("True", True), ("no", False), ("0", False)):
                    os.environ[name] = word
                    self.assertIs(read(), on, word)
                os.environ[name] = "on"
                with self.assertRaisesRegex(HarnessConfigError, f"^{name}='on' is not a switch"):
                    read()

    def test_upstream_knobs_keep_upstreams_meaning(self):
        """common_utils' def_flag: off by default and on only for "1"; on by default and off
        only for "0"; nothing else is an error."""
        self.assertFalse(settings.upstream_flag(self.NAME))
        self.assertTrue(settings.upstream_flag(self.NAME, default=True))
        for value, off_default, on_default in (("1", True, True), ("0", False, False),
                                               ("true", False, True), ("yes", False, True)):
            self.set(value)
            self.assertIs(settings.upstream_flag(self.NAME), off_default, value)
            self.assertIs(settings.upstream_flag(self.NAME, default=True), on_default, value)

    def test_seconds(self):
        self.assertIsNone(settings.env_seconds(self.NAME))
        self.set("2.5")
        self.assertEqual(settings.env_seconds(self.NAME), 2.5)
        for bad in ("0", "-1", "soon", "nan"):
            self.set(bad)
            with self.assertRaisesRegex(
                HarnessConfigError, f"^{self.NAME}='{bad}' is not a positive number of seconds$"
            ):
                settings.env_seconds(self.NAME)
        self.set("0")
        self.assertEqual(settings.env_seconds(self.NAME, zero_ok=True), 0.0)
        for good in (1, 0.5):
            self.assertTrue(settings.is_positive_seconds(good))
            self.assertEqual(settings.positive_seconds(good, "x"), float(good))
        for bad in (0, -1, True, "5", None, float("nan")):
            self.assertFalse(settings.is_positive_seconds(bad))
            with self.assertRaisesRegex(
                HarnessConfigError, "^Case.timeout must be a positive number of seconds, got "
            ):
                settings.positive_seconds(bad, "Case.timeout")

    def test_counts(self):
        self.assertIsNone(settings.env_int(self.NAME))
        self.set("3")
        self.assertEqual(settings.env_int(self.NAME, 1), 3)
        self.set("-3")
        self.assertEqual(settings.env_int(self.NAME), -3)  # a seed may be negative
        with self.assertRaisesRegex(HarnessConfigError, f"^{self.NAME}='-3' must be at least 0$"):
            settings.env_int(self.NAME, 0)
        self.set("1.5")
        with self.assertRaisesRegex(HarnessConfigError, f"^{self.NAME}='1.5' is not a whole"):
            settings.env_int(self.NAME)

    def test_choices_and_lists(self):
        self.assertIsNone(settings.env_choice(self.NAME, ("a", "b")))
        self.assertEqual(settings.env_list(self.NAME), ())
        self.set("a,b")
        self.assertEqual(settings.env_list(self.NAME), ("a", "b"))
        with self.assertRaisesRegex(HarnessConfigError, f"^{self.NAME}='a,b' is not one of: a, b"):
            settings.env_choice(self.NAME, ("a", "b"))


if __name__ == "__main__":
    unittest.main()


TIMEOUT_PROBE = textwrap.dedent('''
    import time
    from datetime import timedelta

    TIMEOUT_OVERRIDE["test_cut_short"] = 2


    class Processes(MultiProcessTestCase):
        world_size = 1

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_cut_short(self):
            time.sleep(60)


    class Continuous(MultiProcContinuousTest):
        world_size = 1
        timeout = timedelta(seconds=3)  # the group's timeout, not the test's

        def test_outlives_the_group_timeout(self):
            time.sleep(5)


    if __name__ == "__main__":
        run_tests()
''')

ENV_TIMEOUT_PROBE = (
    "import time\n\n\n" + upstream_diff.THREADS_TIMEOUT_TESTS
    + '\n\nif __name__ == "__main__":\n    run_tests()\n'
)


@pytest.mark.slow
@pytest.mark.timeout(240)  # a limit of its own: a harness that never times out fails here
class UpstreamTimeoutsTest(unittest.TestCase):
    """Upstream's timeout knobs, the same probes under torch's installed harness and this one:
    the same outcome for every test (a timed-out test is an error in both)."""

    def compare(self, probe: str, names: dict, env: dict) -> dict:
        theirs = upstream_diff.outcomes(probe, names, upstream=True, env=env)
        ours = upstream_diff.outcomes(probe, names, upstream=False, env=env)
        self.assertEqual(theirs, ours)
        return ours

    def test_timeout_override_and_a_continuous_classs_group_timeout(self) -> None:
        names = {
            "common_distributed": ["MultiProcContinuousTest", "MultiProcessTestCase",
                                   "TIMEOUT_OVERRIDE"],
            "common_utils": ["run_tests"],
        }
        ours = self.compare(TIMEOUT_PROBE, names, {})
        self.assertEqual(ours["Processes.test_cut_short"], "error")
        self.assertEqual(ours["Continuous.test_outlives_the_group_timeout"], "passed")

    def test_distributed_tests_default_timeout(self) -> None:
        names = {"common_distributed": ["MultiThreadedTestCase"], "common_utils": ["run_tests"]}
        ours = self.compare(ENV_TIMEOUT_PROBE, names, {"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "3"})
        self.assertEqual(ours, {"Threads.test_quick": "passed", "Threads.test_too_long": "error"})
