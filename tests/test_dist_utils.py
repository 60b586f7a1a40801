"""harness.upstream.dist_utils, and the upstream-style file that uses the common_distributed
surface.

`UpstreamStyleFileTest` runs tests/upstream_style/dist_common_distributed.py as a script,
as a user runs a migrated upstream file, and checks every test id and its outcome.
"""

import io
import os
import re
import subprocess
import sys
import unittest
from typing import Dict
from unittest import mock

import pytest
import torch.distributed as dist

from harness import captured_output, settings, with_dist_debug_levels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPSTREAM_STYLE_FILE = os.path.join(ROOT, "tests", "upstream_style", "dist_common_distributed.py")
DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"


class WithDistDebugLevelsTest(unittest.TestCase):
    def setUp(self):
        patch = mock.patch.dict(os.environ)
        patch.start()
        self.addCleanup(patch.stop)
        self.addCleanup(dist.set_debug_level_from_env)  # after the environment is restored

    def test_runs_once_per_level_in_order_and_returns_the_last_result(self):
        os.environ.pop(DEBUG_ENV, None)
        seen = []

        @with_dist_debug_levels(levels=["OFF", "INFO", "DETAIL"])
        def body(tag):
            seen.append((tag, os.environ[DEBUG_ENV], dist.get_debug_level()))
            return len(seen)

        self.assertEqual(body("x"), 3)
        self.assertEqual(seen, [
            ("x", "OFF", dist.DebugLevel.OFF),
            ("x", "INFO", dist.DebugLevel.INFO),
            ("x", "DETAIL", dist.DebugLevel.DETAIL),
        ])
        self.assertNotIn(DEBUG_ENV, os.environ)
        self.assertEqual(dist.get_debug_level(), dist.DebugLevel.OFF)

    def test_a_failing_level_fails_and_the_previous_level_comes_back(self):
        os.environ[DEBUG_ENV] = "INFO"
        dist.set_debug_level_from_env()
        seen = []

        @with_dist_debug_levels(levels=["OFF", "DETAIL", "INFO"])
        def body():
            seen.append(os.environ[DEBUG_ENV])
            if os.environ[DEBUG_ENV] == "DETAIL":
                raise AssertionError("fails at DETAIL")

        with self.assertRaisesRegex(AssertionError, "fails at DETAIL"):
            body()
        self.assertEqual(seen, ["OFF", "DETAIL"])
        self.assertEqual(os.environ[DEBUG_ENV], "INFO")
        self.assertEqual(dist.get_debug_level(), dist.DebugLevel.INFO)

    def test_bad_levels_are_a_one_line_error(self):
        for bad in ([], ["VERBOSE"], "OFF"):
            with self.assertRaisesRegex(
                ValueError, r"^with_dist_debug_levels: levels must be a non-empty list of "
                r"OFF, INFO, DETAIL, got .*$"
            ):
                with_dist_debug_levels(bad)


class CapturedOutputTest(unittest.TestCase):
    def test_captures_both_streams_and_restores_them(self):
        saved = sys.stdout, sys.stderr
        with captured_output() as (out, err):
            print("out line")
            print("err line", file=sys.stderr)
            self.assertIsInstance(sys.stdout, io.StringIO)
        self.assertEqual((out.getvalue(), err.getvalue()), ("out line\n", "err line\n"))
        self.assertEqual((sys.stdout, sys.stderr), saved)

    def test_restores_the_streams_when_the_body_raises(self):
        saved = sys.stdout, sys.stderr
        with self.assertRaises(KeyError):
            with captured_output():
                raise KeyError("boom")
        self.assertEqual((sys.stdout, sys.stderr), saved)


def _outcomes_expected_here() -> Dict[str, str]:
    """Each test id of the upstream-style file and its outcome on this machine."""
    gpus = settings.accelerator_count()
    nccl = dist.is_nccl_available()
    xccl = dist.is_xccl_available()

    def gpus_for_two_ranks(none_found: str) -> str:
        if gpus >= 2:
            return "ok"
        return f"skipped {none_found}" if gpus == 0 else (
            "skipped Need at least 2 CUDA devices, found 1"
        )

    def per_gpu(cls: str) -> str:
        if gpus:
            return "ok"
        return f"skipped {cls}.world_size is 0: no ranks to start (0 accelerators found)"

    group = "ProcessGroupGlooLikeTest"
    return {
        "DeviceGenericTestCPU.test_create_pg_cpu": "ok",
        "GpuCountThreadsTest.test_per_gpu": per_gpu("GpuCountThreadsTest"),
        "GpuCountWorldSizeTest.test_per_gpu": per_gpu("GpuCountWorldSizeTest"),
        "PlainTest.test_assert_equal_forms": "ok",
        f"{group}.test_at_least_two_gpus": (
            "ok" if gpus >= 2 else "skipped at_least_x_gpu(2) is False"
        ),
        f"{group}.test_captured_output": "ok",
        f"{group}.test_debug_levels_in_order_and_restored": "ok",
        f"{group}.test_fbcode_only": "skipped only in fbcode",
        f"{group}.test_is_master_and_all_reduce": "ok",
        f"{group}.test_needs_a_gpu_per_rank": gpus_for_two_ranks(
            "CUDA is not available. This test needs one accelerator for each of its 2 ranks "
            "and none is available"
        ),
        f"{group}.test_needs_an_accelerator_backend": (
            "ok" if nccl or xccl
            else "skipped No accelerator communication backend available among ['nccl', 'xccl']"
        ),
        f"{group}.test_needs_nccl": (
            "ok" if nccl else "skipped c10d was not compiled with the NCCL backend"
        ),
        f"{group}.test_needs_two_gpus": gpus_for_two_ranks(
            "Need at least 2 CUDA devices: this test needs an accelerator and none is available"
        ),
        f"{group}.test_not_on_rocm_or_hpu": "ok",
        f"{group}.test_runs_once_per_debug_level": "ok",
        "SelfDestroyingTest.test_group_left_for_tear_down": "ok",
        "ThreadedHelpersTest.test_rank_helpers": "ok",
    }


RESULT_LINE = re.compile(
    r"^(?P<method>\w+) \(__main__\.(?P<cls>\w+)\.(?P=method)\) \.\.\. "
    r"(?P<outcome>ok|FAIL|ERROR|skipped (?P<quote>['\"])(?P<reason>.*)(?P=quote))$"
)


@pytest.mark.slow
class UpstreamStyleFileTest(unittest.TestCase):
    def test_every_id_and_outcome(self):
        env = {
            k: v for k, v in os.environ.items()
            if k not in ("PYTORCH_TEST_FBCODE", "PYTORCH_TEST_WITH_ROCM", DEBUG_ENV)
        }
        env["PYTHONPATH"] = ROOT
        done = subprocess.run(
            [sys.executable, UPSTREAM_STYLE_FILE, "-v"], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=600,
        )
        output = done.stdout + done.stderr
        outcomes = {}
        for line in output.splitlines():
            match = RESULT_LINE.match(line)
            if match:
                outcome = match["outcome"]
                if match["reason"] is not None:
                    outcome = f"skipped {match['reason']}"
                outcomes[f"{match['cls']}.{match['method']}"] = outcome
        self.assertEqual(outcomes, _outcomes_expected_here(), output)
        self.assertEqual(done.returncode, 0, output)
        self.assertIn(f"Ran {len(outcomes)} tests", output)


if __name__ == "__main__":
    unittest.main()
