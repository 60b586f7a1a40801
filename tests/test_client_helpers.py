"""A client's installed helper package that imports upstream's private harness itself
(torchao.testing.utils imports `common_utils` and `common_dtensor` and subclasses upstream's
`DTensorTestBase`), beside migrated test classes in the same file: both kinds keep upstream's
outcomes, test by test.

A migrated test file cannot reach into such a package (it is installed, not the user's), so the
process holds the harness's bases and upstream's private modules at once. This runs the same
file twice: as the client has it before migrating (everything upstream's, run by upstream's
`run_tests`) and after (its own classes on the harness, the helper still upstream's, run by
the harness's `run_tests`), and compares every test id's outcome.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from tests.fixtures import child_env, upstream_diff, upstream_env

HELPER = textwrap.dedent('''
    """The client's helper package: written against upstream's private harness."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal import common_utils
    from torch.testing._internal.distributed._tensor import common_dtensor


    class HelperDTensorBase(common_dtensor.DTensorTestBase):
        @property
        def world_size(self):
            return 2

        def summed(self, value):
            tensor = torch.full((2,), float(value), device=self.device_type)
            dist.all_reduce(tensor)
            return tensor


    def helper_seed():
        return common_utils.SEED
''')

BODY = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from client_helpers import HelperDTensorBase
    from torch.testing._internal.distributed._tensor.common_dtensor import (
        with_comms as upstream_with_comms,
    )
    {imports}


    class TestThroughTheHelper(HelperDTensorBase):
        @upstream_with_comms
        def test_helper_sums(self):
            self.assertEqual(self.summed(self.rank + 1).tolist(), [3.0, 3.0])

        @upstream_with_comms
        def test_helper_fails_on_rank_1(self):
            self.assertEqual(self.rank, 0)


    class TestMigrated(DTensorTestBase):
        @property
        def world_size(self):
            return 2

        @with_comms
        def test_sums(self):
            tensor = torch.full((2,), float(self.rank + 1))
            dist.all_reduce(tensor)
            self.assertEqual(tensor.tolist(), [3.0, 3.0])

        @with_comms
        def test_fails_on_rank_1(self):
            self.assertEqual(self.rank, 0)


    class TestPlain(TestCase):
        def test_plain(self):
            self.assertEqual(torch.ones(2), torch.ones(2))


    if __name__ == "__main__":
        run_tests()
''')

UPSTREAM = (
    "from torch.testing._internal.common_utils import TestCase, run_tests\n"
    "from torch.testing._internal.distributed._tensor.common_dtensor import (\n"
    "    DTensorTestBase, with_comms)"
)
MIGRATED = "from harness import DTensorTestBase, TestCase, run_tests, with_comms"


def outcomes(imports: str, upstream: bool) -> Dict[str, str]:
    """Every test id of the file (with `imports`) and its outcome, run as a script."""
    with tempfile.TemporaryDirectory(prefix="harness-client-") as folder:
        Path(folder, "client_helpers.py").write_text(HELPER)
        Path(folder, "test_client.py").write_text(BODY.format(imports=imports))
        xml_dir = Path(folder, "xml")
        env = (upstream_env if upstream else child_env)({"HARNESS_DEVICE": "cpu"})
        env["PYTHONPATH"] = f"{folder}:{env['PYTHONPATH']}"
        proc = subprocess.run(
            [sys.executable, "test_client.py", "--save-xml", str(xml_dir)], cwd=folder, env=env,
            capture_output=True, text=True, timeout=600,
        )
        found = upstream_diff._read_xml(xml_dir)
        assert found, f"no results ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_upstream_helper_classes_and_migrated_classes_in_one_file() -> None:
    ours = outcomes(MIGRATED, upstream=False)
    assert {test: outcome.split(":")[0] for test, outcome in ours.items()} == {
        "TestThroughTheHelper.test_helper_sums": "passed",
        "TestThroughTheHelper.test_helper_fails_on_rank_1": "error",
        "TestMigrated.test_sums": "passed",
        "TestMigrated.test_fails_on_rank_1": "failed",
        "TestPlain.test_plain": "passed",
    }
    theirs = outcomes(UPSTREAM, upstream=True)
    # Upstream reports every rank's exception as an error; the harness tells an assertion's
    # (a failure) from other exceptions, as unittest does: compare passed / not passed.
    def coarse(found: Dict[str, str]) -> Dict[str, str]:
        return {test: "passed" if o == "passed" else "not passed" for test, o in found.items()}

    assert coarse(ours) == coarse(theirs)
