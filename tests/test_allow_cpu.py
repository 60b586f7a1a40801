"""HARNESS_ALLOW_CPU: GPU-written upstream-style files skip without it and pass on CPU with it.

The upstream-style files in tests/upstream_style/allow_cpu_*.py run as scripts, both ways:
the ids that ran and their outcomes, the adaptations' lines in the ranks' output and the
run's summary line, and nothing left on disk. The adaptations themselves (FSDP1 without
device_id, DDP device_ids) are checked in a child process, where patching torch is safe.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Optional
from unittest import mock

import pytest
import torch

from harness import settings
from harness.compat import cpu_defaults as compat_cpu_defaults
from tests.fixtures import REPO, child_env

STYLE_DIR = REPO / "tests" / "upstream_style"
NO_ACCELERATOR = not torch.cuda.is_available()

FSDP1_IDS = {
    f"TestFSDP1OnAcceleratorsCPU.{name}_cpu": "pass"
    for name in (
        "test_ddp_device_ids_rank",
        "test_fsdp_matches_ddp_sharding_strategy0",
        "test_fsdp_matches_ddp_sharding_strategy1",
        "test_fsdp_state_dict_round_trip",
        "test_fsdp_without_device_id_all_gathers",
        "test_only_cuda_broadcast",
    )
}
FSDP1_IDS["TestFSDP1ThreadRanksCPU.test_fsdp_without_device_id_in_threads_cpu"] = "pass"
PLAIN_IDS = [
    "TestDTensorRequirements.test_backend_naming_nccl",
    "TestDTensorRequirements.test_skip_unless_torch_gpu",
    "TestRequirementsOnAccelerators.test_at_least_x_gpu",
    "TestRequirementsOnAccelerators.test_requires_accelerator_dist_backend",
    "TestRequirementsOnAccelerators.test_requires_nccl",
    "TestRequirementsOnAccelerators.test_skip_if_no_gpu",
]
INSTANTIATED_IDS = [
    "TestDTensorOnAcceleratorsCPU.test_shard_then_full_tensor_cpu",
    "TestFullyShardOnAcceleratorsCPU.test_fully_shard_matches_local_training_cpu",
    "TestFullyShardOnAcceleratorsCPU.test_only_accelerator_all_reduce_cpu",
]
FSDP_LINE = "[harness] HARNESS_ALLOW_CPU: FSDP built without device_id uses cpu"
DDP_LINE = (
    "[harness] HARNESS_ALLOW_CPU: DDP device_ids/output_device naming the rank's device "
    "are None for a CPU module"
)
FSDP1_SUMMARY = (
    "CPU adaptations (HARNESS_ALLOW_CPU): FSDP1 device_id=cpu in 5 tests; "
    "DDP device_ids=None in 3 tests"
)


def outcomes(xml_dir: str) -> Dict[str, str]:
    """`Class.test` -> pass / skip / fail for each test in the JUnit XML of a run."""
    found = {}
    for path in Path(xml_dir).glob("*.xml"):
        for case in ET.parse(path).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = ("fail" if kinds & {"failure", "error"}
                       else "skip" if "skipped" in kinds else "pass")
            found[f"{case.get('classname').split('.')[-1]}.{case.get('name')}"] = outcome
    return found


def run_script(
    path: Path, *args: str, env: Optional[Dict[str, str]] = None, tmp: Optional[str] = None
) -> subprocess.CompletedProcess:
    """Run a test file as a script, with TMPDIR at `tmp` (to see what it leaves behind)."""
    extra = dict(env or {})
    if tmp is not None:
        extra["TMPDIR"] = tmp
    return subprocess.run(
        [sys.executable, str(path), *args], cwd=REPO, env=child_env(extra),
        capture_output=True, text=True, timeout=900,
    )


@unittest.skipUnless(NO_ACCELERATOR, "the switch changes nothing where accelerators exist")
@pytest.mark.slow
class UpstreamStyleFilesBothWays(unittest.TestCase):
    """Each file: skipped (or not made) without the switch, passed on CPU with it."""

    def run_file(self, name: str, *args: str, env: Optional[Dict[str, str]] = None):
        with tempfile.TemporaryDirectory() as xml_dir, tempfile.TemporaryDirectory() as tmp:
            proc = run_script(
                STYLE_DIR / name, f"--save-xml={xml_dir}", *args, env=env, tmp=tmp
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
            # torch's own caches (torchinductor_<user>) may stay; nothing of the harness may
            left = [n for n in os.listdir(tmp) if not n.startswith("torchinductor_")]
            self.assertEqual(left, [], "the run left files behind")
            return outcomes(xml_dir), proc.stdout + proc.stderr

    def test_fsdp1_file_makes_no_class_without_the_switch(self):
        ran, output = self.run_file("allow_cpu_fsdp1.py")
        self.assertEqual(ran, {})
        self.assertIn("Ran 0 tests", output)
        self.assertNotIn("CPU adaptations", output)

    def test_fsdp1_file_passes_with_the_switch(self):
        ran, output = self.run_file(
            "allow_cpu_fsdp1.py", env={"HARNESS_ALLOW_CPU": "1", "HARNESS_SHOW_OUTPUT": "1"}
        )
        self.assertEqual(ran, FSDP1_IDS)
        self.assertIn(f"[rank 0] {FSDP_LINE}", output)
        self.assertIn(f"[rank 1] {DDP_LINE}", output)
        self.assertEqual(output.rstrip().splitlines()[-1], FSDP1_SUMMARY)

    def test_fsdp2_dtensor_file_skips_without_the_switch(self):
        ran, output = self.run_file("allow_cpu_fsdp2_dtensor.py")
        self.assertEqual(ran, {name: "skip" for name in PLAIN_IDS})
        self.assertNotIn("CPU adaptations", output)

    def test_fsdp2_dtensor_file_passes_with_allow_cpu_flag(self):
        """run_tests's --allow-cpu: the file is run again with the switch, so its classes exist."""
        ran, output = self.run_file("allow_cpu_fsdp2_dtensor.py", "--allow-cpu")
        self.assertEqual(ran, {name: "pass" for name in PLAIN_IDS + INSTANTIATED_IDS})
        self.assertNotIn("CPU adaptations", output)  # FSDP2 and DTensor need no adaptation


CHILD = textwrap.dedent('''
    import os, sys, tempfile, unittest
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP
    from harness.compat import cpu_defaults as compat_cpu_defaults
    from harness.launch.context import running_as_rank

    BUILDS = [
        ("fsdp", lambda: FSDP(nn.Linear(2, 2))),
        ("ddp_rank", lambda: DDP(nn.Linear(2, 2), device_ids=[0], output_device=0)),
        ("ddp_other", lambda: DDP(nn.Linear(2, 2), device_ids=[3])),
    ]

    def build_all(where):
        for label, build in BUILDS:
            try:
                model = build()
                device = getattr(model, "compute_device", getattr(model, "device", None))
                print(where, label, "ok", device)
            except Exception as error:
                print(where, label, "error", str(error).splitlines()[0])

    class Rank0(unittest.TestCase):
        def runTest(self):
            build_all("rank")

    print("installed", compat_cpu_defaults.PROCESS_ADAPTATIONS.install())
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "rdv"),
                                rank=0, world_size=1)
        rank = Rank0()
        with running_as_rank(rank):  # what the adaptations look for: a launcher runs a rank
            rank.runTest()
        build_all("outside")
        dist.destroy_process_group()
''')


@unittest.skipUnless(NO_ACCELERATOR, "the adaptations apply only where no accelerator exists")
@pytest.mark.slow
class Adaptations(unittest.TestCase):
    """In a child process (torch patched there only): what each adaptation does and doesn't."""

    outputs: Dict[str, str] = {}  # the child's output per switch value: one run serves all

    def run_child(self, env: Dict[str, str]) -> str:
        key = repr(sorted(env.items()))
        if key not in self.outputs:
            proc = subprocess.run(
                [sys.executable, "-c", CHILD], cwd=REPO, env=child_env(env),
                capture_output=True, text=True, timeout=600,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            type(self).outputs[key] = proc.stdout + proc.stderr
        return self.outputs[key]

    def test_without_switch_torch_refuses_as_before(self):
        out = self.run_child({})
        self.assertIn("installed False", out)
        self.assertIn("rank fsdp error FSDP needs a non-CPU accelerator device", out)
        self.assertIn(
            "rank ddp_rank error DistributedDataParallel device_ids and output_device", out
        )
        self.assertNotIn("[harness]", out)

    def test_with_switch_cpu_analogs_and_one_line_each(self):
        out = self.run_child({"HARNESS_ALLOW_CPU": "1"})
        self.assertIn("installed True", out)
        self.assertIn("rank fsdp ok cpu", out)
        self.assertIn("rank ddp_rank ok cpu", out)
        self.assertEqual(out.count(FSDP_LINE), 1)
        self.assertEqual(out.count(DDP_LINE), 1)

    def test_outside_a_rank_torch_refuses_as_before(self):
        """Installed in a process, the analogs apply to ranks only, not to other code there."""
        out = self.run_child({"HARNESS_ALLOW_CPU": "1"})
        self.assertIn("outside fsdp error FSDP needs a non-CPU accelerator device", out)
        self.assertIn(
            "outside ddp_rank error DistributedDataParallel device_ids and output_device", out
        )

    def test_device_ids_naming_another_device_keep_torch_error(self):
        """Only the rank's own device is adapted: any other still gets torch's own error."""
        out = self.run_child({"HARNESS_ALLOW_CPU": "1"})
        self.assertIn(
            "rank ddp_other error DistributedDataParallel device_ids and output_device", out
        )

    def test_test_needing_an_accelerator_fails_with_torch_error(self):
        source = textwrap.dedent('''
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from harness import FSDPTest, run_tests, skip_if_lt_x_gpu

            class NeedsGPU(FSDPTest):
                world_size = 2

                @skip_if_lt_x_gpu(2)
                def test_current_device(self):
                    FSDP(torch.nn.Linear(2, 2), device_id=torch.cuda.current_device())

            if __name__ == "__main__":
                run_tests()
        ''')
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "needs_gpu.py"
            script.write_text(source)
            proc = run_script(script, env={"HARNESS_ALLOW_CPU": "1"})
        self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
        self.assertIn("Torch not compiled with CUDA enabled", proc.stderr)
        self.assertIn("FAILED (failures=1)", proc.stderr)


class AdaptationLog(unittest.TestCase):
    """The run's log: made only while the CPU stands in, removed after, summed up per test."""

    def test_no_log_without_the_switch(self):
        with mock.patch.dict(os.environ, {settings.ALLOW_CPU_ENV: "0"}):
            os.environ.pop(compat_cpu_defaults.LOG_ENV, None)
            with compat_cpu_defaults.adaptation_log():
                self.assertNotIn(compat_cpu_defaults.LOG_ENV, os.environ)
                self.assertIsNone(compat_cpu_defaults.summary_line())

    @unittest.skipUnless(NO_ACCELERATOR, "the log exists only where no accelerator exists")
    def test_log_counts_tests_once_and_is_removed(self):
        with mock.patch.dict(os.environ, {settings.ALLOW_CPU_ENV: "1"}):
            os.environ.pop(compat_cpu_defaults.LOG_ENV, None)
            with compat_cpu_defaults.adaptation_log():
                path = os.environ[compat_cpu_defaults.LOG_ENV]
                self.assertIsNone(compat_cpu_defaults.summary_line())
                Path(path).write_text(
                    "ddp_device_ids\tm.A.test_a\nddp_device_ids\tm.A.test_a\n"
                    "fsdp1_device_id\tm.A.test_a\nfsdp1_device_id\tm.A.test_b\n"
                )
                self.assertEqual(
                    compat_cpu_defaults.summary_line(),
                    "CPU adaptations (HARNESS_ALLOW_CPU): FSDP1 device_id=cpu in 2 tests; "
                    "DDP device_ids=None in 1 test",
                )
            self.assertNotIn(compat_cpu_defaults.LOG_ENV, os.environ)
            self.assertFalse(os.path.exists(os.path.dirname(path)))


if __name__ == "__main__":
    unittest.main()
