"""`python -m harness.migrate`: upstream-style test files before and after, run as a user does.

The command reads the names the harness provides from `harness.__all__` at run time, and
other names are being added to it all the time. So the exact before/after tests run the
command in a child whose `harness.__all__` is set to a fixed list (NAMES) before the
command's `main` runs; the tests of the plain `python -m harness.migrate` check what does
not depend on that list (exit codes, --check, bad input, every provided name moving).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Dict, List, Optional
from unittest import mock

import pytest

from harness.migrate import Provided, main, migrate_source
from tests.differential import both, run_file
from tests.fixtures import REPO, child_env, upstream_diff

# What the child's harness provides in the exact before/after tests.
NAMES = [
    "DEVICEInitMode", "DTensorTestBase", "FSDPInitMode", "FSDPTest", "FSDPTestMultiThread",
    "MLPStack", "ModelArgs", "NestedWrappedModule", "TEST_WITH_DEV_DBG_ASAN", "TestCase",
    "Transformer", "TransformerWithSharedParams", "check_sharded_parity",
    "create_local_tensor_test_class", "get_devtype", "instantiate_device_type_tests",
    "instantiate_parametrized_tests", "parametrize", "patch_all_gather", "run_tests",
    "skip_if_lt_x_gpu", "with_comms",
]
DRIVER = (
    "import sys, harness\n"
    "harness.__all__ = sys.argv[1].split(',')\n"
    "from harness.migrate import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)

FSDP1_BEFORE = '''\
# Owner(s): ["oncall: distributed"]

import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffload
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullyShardedDataParallel as FSDP,
    ShardingStrategy,
)
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import (
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTest,
    get_devtype,
    NestedWrappedModule,
    subtest_name,  # names the parametrized tests as upstream does
    TransformerWithSharedParams,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TEST_HPU,
    TEST_WITH_DEV_DBG_ASAN,
)


device_type = torch.device(get_devtype())

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

if TEST_WITH_DEV_DBG_ASAN:
    print(
        "Skip dev-asan as torch + multiprocessing spawn have known issues",
        file=sys.stderr,
    )
    sys.exit(0)

params = "cpu_offload,sharding_strategy"
configs = [(CPUOffload(offload_params = o), s)  # (spacing kept as written)
           for o in (True, False) for s in (None, ShardingStrategy.SHARD_GRAD_OP)]


class TestParityWithDDP(FSDPTest):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2)
    @parametrize(params, configs, subtest_name("cpu_offload", "sharding_strategy"))
    def test_nested_wrapped_model(self, cpu_offload, sharding_strategy):
        self._test_fsdp_parity(
            NestedWrappedModule,
            FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE,
            cpu_offload=cpu_offload,
            sharding_strategy=sharding_strategy,
        )

    @skip_if_lt_x_gpu(2)
    def test_transformer(self):
        model = TransformerWithSharedParams.init(
            self.process_group, FSDPInitMode.RECURSIVE, DEVICEInitMode.DEVICE_BEFORE
        )
        self.assertIsInstance(model, FSDP)


instantiate_parametrized_tests(TestParityWithDDP)
devices = ("cuda", "hpu")
instantiate_device_type_tests(TestParityWithDDP, globals(), only_for=devices)

if __name__ == "__main__":
    run_tests()
'''
FSDP1_OLD_IMPORTS = '''\
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import (
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTest,
    get_devtype,
    NestedWrappedModule,
    subtest_name,  # names the parametrized tests as upstream does
    TransformerWithSharedParams,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TEST_HPU,
    TEST_WITH_DEV_DBG_ASAN,
)
'''
FSDP1_NEW_IMPORTS = '''\
from harness import (
    DEVICEInitMode,
    FSDPInitMode,
    FSDPTest,
    get_devtype,
    instantiate_device_type_tests,
    instantiate_parametrized_tests,
    NestedWrappedModule,
    parametrize,
    run_tests,
    skip_if_lt_x_gpu,
    TEST_WITH_DEV_DBG_ASAN,
    TransformerWithSharedParams,
)
from torch.testing._internal.common_fsdp import (
    subtest_name,  # names the parametrized tests as upstream does
)
from torch.testing._internal.common_utils import (
    TEST_HPU,
)
'''

FSDP2_BEFORE = '''\
# Owner(s): ["oncall: distributed"]

import copy

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import (
    check_sharded_parity,
    FSDPTest,
    FSDPTestMultiThread,
    MLPStack,
    patch_all_gather,
)
from torch.testing._internal.common_utils import run_tests, TEST_HPU  # HPU runs differ
from torch.testing._internal.distributed._tensor.common_dtensor import (
    ModelArgs,
    Transformer,
    TransformerBlock,
)


class TestFullyShardCollectiveOps(FSDPTestMultiThread):
    @property
    def world_size(self) -> int:
        return 2

    def test_all_gather_patched(self):
        with patch_all_gather(lambda *args, **kwargs: None):
            pass


class TestFullyShardTraining(FSDPTest):
    @property
    def world_size(self) -> int:
        return min(4, torch.cuda.device_count())

    @skip_if_lt_x_gpu(2)
    def test_train_parity(self):
        torch.manual_seed(42)
        model = Transformer(ModelArgs(n_layers=2, dropout_p=0.0))
        ref_model = copy.deepcopy(model)
        for module in model.modules():
            if isinstance(module, TransformerBlock):
                fully_shard(module, mp_policy=MixedPrecisionPolicy())
        fully_shard(model)
        check_sharded_parity(self, ref_model, model)
        self.assertIsInstance(MLPStack(8), nn.Module)


if __name__ == "__main__":
    run_tests()
'''
FSDP2_OLD_IMPORTS = '''\
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import (
    check_sharded_parity,
    FSDPTest,
    FSDPTestMultiThread,
    MLPStack,
    patch_all_gather,
)
from torch.testing._internal.common_utils import run_tests, TEST_HPU  # HPU runs differ
from torch.testing._internal.distributed._tensor.common_dtensor import (
    ModelArgs,
    Transformer,
    TransformerBlock,
)
'''
FSDP2_NEW_IMPORTS = '''\
from harness import (
    check_sharded_parity,
    FSDPTest,
    FSDPTestMultiThread,
    MLPStack,
    ModelArgs,
    patch_all_gather,
    run_tests,
    skip_if_lt_x_gpu,
    Transformer,
)
from torch.testing._internal.common_utils import TEST_HPU  # HPU runs differ
from torch.testing._internal.distributed._tensor.common_dtensor import (
    TransformerBlock,
)
'''

DTENSOR_BEFORE = '''\
# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]

import torch
import torch.testing._internal.common_utils as common_utils
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)


class DTensorTest(DTensorTestBase):
    @with_comms
    def test_shard_then_replicate(self):
        mesh = self.build_device_mesh()
        tensor = torch.randn(8, 4)
        sharded = distribute_tensor(tensor, mesh, [Shard(0)])
        self.assertEqual(sharded.redistribute(mesh, [Replicate()]).to_local(), tensor)
        self.assertFalse(common_utils.TEST_WITH_ROCM)


DTensorTestWithLocalTensor = create_local_tensor_test_class(DTensorTest)

if __name__ == "__main__":
    run_tests()
'''
DTENSOR_OLD_IMPORTS = '''\
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)
'''
DTENSOR_NEW_IMPORTS = '''\
from harness import create_local_tensor_test_class, DTensorTestBase, run_tests, with_comms
'''

# A helper module deep in a folder: private imports inside try/if/def blocks.
HELPER_BEFORE = '''\
"""Shared helpers for the distributed tests."""

import os

try:
    from torch.testing._internal.common_utils import run_tests as rt, \\
        TestCase  # noqa: F401
except ImportError:  # an old torch
    rt = None


def make_case():
    if os.environ.get("USE_FSDP"):
        from torch.testing._internal.common_fsdp import FSDPTest as Base
    else:
        from torch.testing._internal.common_utils import TestCase as Base
    return Base
'''
HELPER_AFTER = '''\
"""Shared helpers for the distributed tests."""

import os

try:
    from harness import run_tests as rt, TestCase  # noqa: F401
except ImportError:  # an old torch
    rt = None


def make_case():
    if os.environ.get("USE_FSDP"):
        from harness import FSDPTest as Base
    else:
        from harness import TestCase as Base
    return Base
'''

FILES = {
    "test_fsdp_core.py": (FSDP1_BEFORE, FSDP1_OLD_IMPORTS, FSDP1_NEW_IMPORTS),
    "fsdp2/test_fully_shard_training.py": (FSDP2_BEFORE, FSDP2_OLD_IMPORTS, FSDP2_NEW_IMPORTS),
    "tensor/parallel/test_dtensor_basic.py": (
        DTENSOR_BEFORE, DTENSOR_OLD_IMPORTS, DTENSOR_NEW_IMPORTS),
}
SUBTEST = "torch.testing._internal.common_fsdp.subtest_name"
TEST_HPU = "torch.testing._internal.common_utils.TEST_HPU"
BLOCK = "torch.testing._internal.distributed._tensor.common_dtensor.TransformerBlock"
REPORTS = {
    "test_fsdp_core.py": (
        "moved 12 names to harness (instantiate_device_type_tests, skip_if_lt_x_gpu, "
        "DEVICEInitMode, FSDPInitMode, FSDPTest, get_devtype, NestedWrappedModule, "
        "TransformerWithSharedParams, instantiate_parametrized_tests, parametrize, run_tests, "
        f"TEST_WITH_DEV_DBG_ASAN); left 2: {SUBTEST}, {TEST_HPU}"),
    "fsdp2/test_fully_shard_training.py": (
        "moved 9 names to harness (skip_if_lt_x_gpu, check_sharded_parity, FSDPTest, "
        "FSDPTestMultiThread, MLPStack, patch_all_gather, run_tests, ModelArgs, Transformer); "
        f"left 2: {TEST_HPU}, {BLOCK}"),
    "tensor/parallel/test_dtensor_basic.py": (
        "moved 4 names to harness (run_tests, create_local_tensor_test_class, DTensorTestBase, "
        "with_comms); left 1: torch.testing._internal.common_utils.TEST_WITH_ROCM "
        "(module attribute)"),
    "tensor/helpers/common.py": "moved 4 names to harness (run_tests as rt, TestCase, "
                                "FSDPTest as Base, TestCase as Base)",
}


def after(before: str, old: str, new: str) -> str:
    assert old in before, "the fixture's import block is not in its file"
    return before.replace(old, new)


def write_tree(root: Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def read_tree(root: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def migrate(*args: str, names: Optional[List[str]] = None,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """The command as a subprocess: `python -m harness.migrate`, or with a fixed name list."""
    if names is None:
        command = [sys.executable, "-m", "harness.migrate", *args]
    else:
        command = [sys.executable, "-c", DRIVER, ",".join(names), *args]
    return subprocess.run(command, cwd=cwd or REPO, env=child_env(), capture_output=True,
                          text=True, timeout=300)


def migrate_here(*args: str) -> subprocess.CompletedProcess:
    """The command's main called in this process, with the harness's real names: the same
    code and output as `python -m harness.migrate`, without starting an interpreter."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:
            code = stop.code
    return subprocess.CompletedProcess(["python", "-m", "harness.migrate", *args], code,
                                       out.getvalue(), err.getvalue())


class TempDirTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="migrate-test-")
        self.addCleanup(tmp.cleanup)
        self.root = Path(tmp.name)


@pytest.mark.slow
class TestUpstreamStyleFolder(unittest.TestCase):
    """A folder of upstream-style FSDP1, FSDP2 and DTensor files, migrated once for the class
    (the tests below only read it, or check that a second run leaves it as it is)."""

    root: Path
    result: subprocess.CompletedProcess

    @classmethod
    def setUpClass(cls) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="migrate-test-")
        cls.addClassCleanup(tmp.cleanup)
        cls.root = Path(tmp.name)
        files = {name: before for name, (before, _, _) in FILES.items()}
        files["tensor/helpers/common.py"] = HELPER_BEFORE
        files["tensor/notes.txt"] = "from torch.testing._internal.common_utils import run_tests\n"
        files[".venv-like/lib.py"] = FSDP1_BEFORE  # hidden folder: not walked
        files["venv/pyvenv.cfg"] = "home = /usr/bin\n"
        files["venv/lib/site.py"] = FSDP1_BEFORE  # a virtual environment: not walked
        write_tree(cls.root, files)
        cls.result = migrate(str(cls.root), names=NAMES)

    def test_before_and_after_text(self) -> None:
        for name, (before, old, new) in FILES.items():
            with self.subTest(file=name):
                self.assertEqual((self.root / name).read_text(), after(before, old, new))
        self.assertEqual((self.root / "tensor/helpers/common.py").read_text(), HELPER_AFTER)

    def test_report_names_what_moved_and_what_is_left(self) -> None:
        expected = [f"{self.root / name}: {line}" for name, line in sorted(REPORTS.items())]
        self.assertEqual(sorted(self.result.stdout.splitlines()[:-1]), sorted(expected))
        self.assertEqual(self.result.stdout.splitlines()[-1],
                         "migrate: 4 files changed, 0 unchanged, 5 private imports left")
        self.assertEqual(self.result.returncode, 1, self.result.stderr)

    def test_folder_recursion_skips_hidden_folders_venvs_and_other_files(self) -> None:
        self.assertEqual((self.root / ".venv-like/lib.py").read_text(), FSDP1_BEFORE)
        self.assertEqual((self.root / "venv/lib/site.py").read_text(), FSDP1_BEFORE)
        self.assertIn("import run_tests", (self.root / "tensor/notes.txt").read_text())

    def test_second_run_changes_nothing(self) -> None:
        first = read_tree(self.root)
        again = migrate(str(self.root), names=NAMES)
        self.assertEqual(read_tree(self.root), first)
        self.assertEqual(again.stdout.splitlines()[-1],
                         "migrate: 0 files changed, 4 unchanged, 5 private imports left")
        self.assertNotIn("moved", again.stdout)
        check = migrate("--check", str(self.root), names=NAMES)
        self.assertEqual(check.returncode, 1)  # private imports are still left
        self.assertIn("0 files would change", check.stdout)

    def test_every_migrated_file_parses_and_leaves_no_temp_file(self) -> None:
        for path in self.root.rglob("*.py"):
            ast.parse(path.read_text(), filename=str(path))
        self.assertEqual(sorted(read_tree(self.root)), sorted([
            *FILES, "tensor/helpers/common.py", "tensor/notes.txt", ".venv-like/lib.py",
            "venv/pyvenv.cfg", "venv/lib/site.py"]))



@pytest.mark.slow
class TestNamesAddedLater(TempDirTest):
    def test_a_name_the_harness_provides_later_joins_the_harness_import(self) -> None:
        path = self.root / "test_fsdp_core.py"
        path.write_text(after(*FILES["test_fsdp_core.py"]))
        result = migrate(str(path), names=NAMES + ["TEST_HPU"])
        self.assertEqual(result.stdout.splitlines()[0],
                         f"{path}: moved 1 name to harness (TEST_HPU); left 1: {SUBTEST}")
        text = path.read_text()
        self.assertIn("    skip_if_lt_x_gpu,\n    TEST_HPU,\n    TEST_WITH_DEV_DBG_ASAN,\n", text)
        self.assertNotIn("common_utils import", text)
        ast.parse(text)


class TestCheckAndExitCodes(TempDirTest):
    """The command's main with the harness's real names (in this process: it starts none)."""

    def test_clean_file_exits_0(self) -> None:
        path = self.root / "test_clean.py"
        path.write_text("from harness import FSDPTest, run_tests\n")
        for args in ([], ["--check"]):
            result = migrate_here(*args, str(path))
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertEqual(result.stdout, "migrate: 0 files "
                             f"{'would change' if args else 'changed'}, 1 unchanged, "
                             "0 private imports left\n")

    def test_check_exits_1_when_a_file_would_change_and_writes_nothing(self) -> None:
        path = self.root / "test_x.py"
        text = "from torch.testing._internal.common_utils import run_tests  # entry point\n"
        path.write_text(text)
        before = os.stat(path)
        result = migrate_here("--check", str(path))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, f"{path}: would move 1 name to harness (run_tests)\n"
                         "migrate: 1 files would change, 0 unchanged, 0 private imports left\n")
        self.assertEqual(path.read_text(), text)
        self.assertEqual(os.stat(path).st_mtime_ns, before.st_mtime_ns)
        self.assertEqual(sorted(os.listdir(self.root)), ["test_x.py"])
        result = migrate_here(str(path))
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertEqual(path.read_text(), "from harness import run_tests  # entry point\n")

    def test_check_exits_1_when_a_private_import_is_left(self) -> None:
        path = self.root / "test_x.py"
        text = "from torch.testing._internal.common_utils import *\n"
        path.write_text(text)
        for args in (["--check"], []):
            result = migrate_here(*args, str(path))
            self.assertEqual(result.returncode, 1)
            self.assertEqual(result.stdout.splitlines()[0], f"{path}: left 1: "
                             "torch.testing._internal.common_utils.* (star import)")
            self.assertEqual(path.read_text(), text)

    def test_every_name_in_harness_all_moves(self) -> None:
        import harness

        names = sorted(harness.__all__)
        body = "".join(f"    {name},\n" for name in names)
        path = self.root / "test_all.py"
        path.write_text(f"from torch.testing._internal.common_utils import (\n{body})\n")
        result = migrate_here(str(path))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        tree = ast.parse(path.read_text())
        self.assertEqual([(node.module, sorted(a.name for a in node.names)) for node in tree.body],
                         [("harness", names)])

    def test_mode_encoding_and_newlines_are_kept(self) -> None:
        path = self.root / "test_x.py"
        text = ("# -*- coding: latin-1 -*-\r\n"
                "from torch.testing._internal.common_utils import run_tests\r\n"
                "print('\u00e9')\r\n")
        path.write_bytes(text.encode("latin-1"))
        path.chmod(0o750)
        result = migrate_here(str(path))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(path.read_bytes(), text.replace(
            "torch.testing._internal.common_utils", "harness").encode("latin-1"))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o750)


    def test_a_symlinked_file_is_migrated_once_through_its_link(self) -> None:
        target = self.root / "real" / "test_x.py"
        target.parent.mkdir()
        target.write_text("from torch.testing._internal.common_utils import run_tests\n")
        link = self.root / "tests" / "test_link.py"
        link.parent.mkdir()
        link.symlink_to(target)
        result = migrate_here(str(link), str(target))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.splitlines(), [
            f"{link}: moved 1 name to harness (run_tests)",
            "migrate: 1 files changed, 0 unchanged, 0 private imports left"])
        self.assertTrue(link.is_symlink())
        self.assertEqual(target.read_text(), "from harness import run_tests\n")


class TestBadInput(TempDirTest):
    def test_bad_path_is_one_line_exit_2_and_nothing_written(self) -> None:
        good = self.root / "test_good.py"
        text = "from torch.testing._internal.common_utils import run_tests\n"
        good.write_text(text)
        missing = self.root / "no_such_dir"
        result = migrate_here(str(good), str(missing))
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr, f"python -m harness.migrate: error: {missing}: "
                         "no such file or folder\n")
        self.assertEqual(result.stdout, "")
        self.assertEqual(good.read_text(), text)

    def test_no_path_is_a_one_line_usage_error(self) -> None:
        result = migrate_here()
        self.assertEqual(result.returncode, 2)
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
        self.assertIn("PATH", result.stderr)

    def test_unparsable_file_is_one_line_and_left_untouched(self) -> None:
        broken = self.root / "test_broken.py"
        broken_text = "from torch.testing._internal.common_utils import run_tests\ndef f(:\n"
        broken.write_text(broken_text)
        good = self.root / "test_good.py"
        good.write_text("from torch.testing._internal.common_utils import run_tests\n")
        result = migrate_here(str(self.root))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout.splitlines(), [
            f"{broken}: cannot parse: invalid syntax (line 2); left untouched",
            f"{good}: moved 1 name to harness (run_tests)",
            "migrate: 1 files changed, 1 unchanged, 0 private imports left, 1 not migrated",
        ])
        self.assertEqual(broken.read_text(), broken_text)
        self.assertEqual(good.read_text(), "from harness import run_tests\n")


# In-process rules with a fixed set of provided names.
PROVIDED = frozenset({"FSDPTest", "MLP", "TestCase", "parametrize", "run_tests",
                      "skip_if_lt_x_gpu", "TEST_SKIPS", "with_comms", "with_temp_dir",
                      "DTensorTestBase"})


def rewrite(text: str) -> str:
    return migrate_source(textwrap.dedent(text), PROVIDED)[0]


class TestRewriteRules(unittest.TestCase):
    def assertRewrites(self, before: str, expected: str) -> None:
        result = rewrite(before)
        self.assertEqual(result, textwrap.dedent(expected))
        ast.parse(result)
        self.assertEqual(migrate_source(result, PROVIDED)[0], result, "not idempotent")

    def test_alias_keeps_its_name(self) -> None:
        self.assertRewrites(
            "from torch.testing._internal.common_utils import run_tests as rt, TEST_HPU as h\n",
            "from harness import run_tests as rt\n"
            "from torch.testing._internal.common_utils import TEST_HPU as h\n")

    def test_backslash_continuation(self) -> None:
        self.assertRewrites(
            "from torch.testing._internal.common_utils import \\\n"
            "    run_tests, \\\n    TestCase\n",
            "from harness import run_tests, TestCase\n")

    def test_comments_inside_parentheses_travel_with_their_names(self) -> None:
        self.assertRewrites('''\
            from torch.testing._internal.common_utils import (  # upstream helpers
                # the entry point
                run_tests,
                TEST_HPU,  # gates hpu
                # more to come
            )  # end
            x = 1  # untouched
            ''', '''\
            from harness import (
                # upstream helpers
                # the entry point
                run_tests,
            )
            from torch.testing._internal.common_utils import (
                TEST_HPU,  # gates hpu
                # more to come
                # end
            )
            x = 1  # untouched
            ''')

    def test_merges_into_an_existing_top_level_harness_import(self) -> None:
        self.assertRewrites('''\
            from harness import (
                MLP,
                TestCase,
            )
            from torch.testing._internal.common_fsdp import FSDPTest
            from torch.testing._internal.common_utils import run_tests
            ''', '''\
            from harness import (
                FSDPTest,
                MLP,
                run_tests,
                TestCase,
            )
            ''')

    def test_keeps_ruff_order_and_keeps_order_when_lists_disagree(self) -> None:
        self.assertRewrites(
            "from harness import MLP, TestCase, parametrize\n"
            "from torch.testing._internal.common_utils import TEST_SKIPS, run_tests\n",
            "from harness import MLP, TEST_SKIPS, TestCase, parametrize, run_tests\n")
        self.assertRewrites(
            "from harness import TestCase, MLP\n"
            "from torch.testing._internal.common_utils import run_tests, TEST_SKIPS\n",
            "from harness import TestCase, MLP, run_tests, TEST_SKIPS\n")

    def test_harness_import_after_code_is_not_extended(self) -> None:
        self.assertRewrites('''\
            from torch.testing._internal.common_utils import run_tests
            MAIN = run_tests
            from harness import MLP
            ''', '''\
            from harness import run_tests
            MAIN = run_tests
            from harness import MLP
            ''')

    def test_indented_imports_keep_their_block_and_indentation(self) -> None:
        self.assertRewrites('''\
            class T:
                def test(self):
                    from torch.testing._internal.common_fsdp import FSDPTest
                    from torch.testing._internal.common_utils import (
                        run_tests,
                        TEST_HPU,
                    )
                    return FSDPTest
            if True:
            \tfrom torch.testing._internal.common_utils import TestCase
            ''', '''\
            class T:
                def test(self):
                    from harness import FSDPTest, run_tests
                    from torch.testing._internal.common_utils import (
                        TEST_HPU,
                    )
                    return FSDPTest
            if True:
            \tfrom harness import TestCase
            ''')

    def test_long_import_wraps_in_parentheses(self) -> None:
        self.assertRewrites(
            "from torch.testing._internal.common_utils import DTensorTestBase, FSDPTest, MLP, "
            "parametrize, run_tests, skip_if_lt_x_gpu, TestCase, with_comms\n",
            "from harness import (\n    DTensorTestBase,\n    FSDPTest,\n    MLP,\n"
            "    parametrize,\n    run_tests,\n    skip_if_lt_x_gpu,\n    TestCase,\n"
            "    with_comms,\n)\n")

    def test_statement_sharing_a_line_is_rewritten_in_place(self) -> None:
        self.assertRewrites(
            "if True: from torch.testing._internal.common_utils import run_tests, TEST_HPU\n",
            "if True: from harness import run_tests; "
            "from torch.testing._internal.common_utils import TEST_HPU\n")

    def test_module_and_star_imports_are_left_and_reported(self) -> None:
        text = textwrap.dedent('''\
            import torch.testing._internal.common_utils as common_utils
            from torch.testing._internal import common_distributed
            from torch.testing import _internal
            from torch.testing._internal.distributed import multi_threaded_pg
            from torch.testing._internal.common_fsdp import *
            from torch.testing._internal.common_utils import run_tests
            common_utils.TEST_HPU
            helper(common_distributed)
            ''')
        new, moved, left = migrate_source(text, PROVIDED)
        self.assertEqual(new, text.replace("torch.testing._internal.common_utils import run_tests",
                                           "harness import run_tests"))
        self.assertEqual(moved, ["run_tests"])
        self.assertEqual(left, [
            "torch.testing._internal.common_utils.TEST_HPU (module attribute)",
            "torch.testing._internal.common_distributed (module import)",
            "torch.testing._internal (module import)",
            "torch.testing._internal.distributed.multi_threaded_pg (module import)",
            "torch.testing._internal.common_fsdp.* (star import)",
        ])

    def test_deeper_modules_map_too(self) -> None:
        self.assertRewrites(
            "from torch.testing._internal.distributed._tensor.common_dtensor import with_comms\n"
            "from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir\n",
            "from harness import with_comms, with_temp_dir\n")

    def test_a_same_named_thing_from_another_private_module_stays(self) -> None:
        text = ("from torch.testing._internal.distributed._shard.sharded_tensor import (\n"
                "    with_comms,\n)\n")
        self.assertEqual(migrate_source(text, PROVIDED), (text, [], [
            "torch.testing._internal.distributed._shard.sharded_tensor.with_comms"]))

    def test_module_alias_moves_when_every_attribute_read_is_provided(self) -> None:
        self.assertRewrites(
            "import torch.testing._internal.common_utils as common\n"
            "def test():\n    common.run_tests()\n    return common.TestCase\n",
            "import harness as common\n"
            "def test():\n    common.run_tests()\n    return common.TestCase\n")

    def test_module_alias_stays_when_an_attribute_is_missing_or_it_is_passed_around(self) -> None:
        for use, label in (
                ("common.run_tests()\ncommon.TEST_HPU\n", ".TEST_HPU (module attribute)"),
                ("helper(common)\n", " (module import)")):
            with self.subTest(use=use):
                text = "import torch.testing._internal.common_utils as common\n" + use
                self.assertEqual(migrate_source(text, PROVIDED), (text, [], [
                    "torch.testing._internal.common_utils" + label]))

    def test_a_module_of_its_own_takes_the_names_harness_exports_for_another(self) -> None:
        sharded = "torch.testing._internal.distributed._shard.sharded_tensor"
        known = Provided(PROVIDED | {"ShardedTensorTestBase"}, {
            sharded: ("harness.kit.sharded_tensor",
                      frozenset({"ShardedTensorTestBase", "with_comms"}),
                      frozenset({"with_comms"}))})
        text = textwrap.dedent(f'''\
            from torch.testing._internal.common_utils import run_tests
            from {sharded} import (
                ShardedTensorTestBase,
                with_comms,
                TEST_GPU_NUM,
            )
            ''')
        new, moved, left = migrate_source(text, known)
        self.assertEqual(new, textwrap.dedent(f'''\
            from harness import run_tests, ShardedTensorTestBase
            from harness.kit.sharded_tensor import with_comms
            from {sharded} import (
                TEST_GPU_NUM,
            )
            '''))
        self.assertEqual(moved, ["run_tests", "ShardedTensorTestBase", "with_comms"])
        self.assertEqual(left, [f"{sharded}.TEST_GPU_NUM"])
        self.assertEqual(migrate_source(new, known)[0], new, "not idempotent")

    def test_upstream_test_suites_stay_with_their_reason(self) -> None:
        text = ("from torch.testing._internal.common_methods_invocations import op_db\n"
                "from torch.testing._internal.common_device_type import ops\n"
                "from torch.testing._internal.distributed.rpc_utils import generate_tests\n")
        reason = "(upstream's own test suite, not harness API)"
        self.assertEqual(migrate_source(text, PROVIDED)[2], [
            f"torch.testing._internal.common_methods_invocations.op_db {reason}",
            f"torch.testing._internal.common_device_type.ops {reason}",
            f"torch.testing._internal.distributed.rpc_utils.generate_tests {reason}",
        ])

    def test_check_passes_a_file_whose_private_imports_are_all_upstream_test_suites(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "test_ops.py"
            path.write_text("from torch.testing._internal.common_methods_invocations import "
                            "op_db\nfrom harness import run_tests\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["--check", str(path)])
            self.assertEqual(code, 0, out.getvalue())
            self.assertEqual(out.getvalue().splitlines(), [
                f"{path}: left 1: torch.testing._internal.common_methods_invocations.op_db "
                "(upstream's own test suite, not harness API)",
                "migrate: 0 files would change, 1 unchanged, 0 private imports left, "
                "1 imports of upstream's own test suites kept"])
            out = io.StringIO()
            path.write_text(path.read_text() + "from torch.testing._internal.common_utils "
                            "import TEST_NOT_A_NAME\n")
            with contextlib.redirect_stdout(out):
                self.assertEqual(main(["--check", str(path)]), 1)

    def test_unparsable_text_raises_syntax_error(self) -> None:
        with self.assertRaises(SyntaxError):
            migrate_source("from torch.testing._internal.common_utils import (\n", PROVIDED)


# Module imports: each form, with the names the in-process rules provide (and SEED).
MODULE_PROVIDED = PROVIDED | {"SEED", "instantiate_parametrized_tests"}
SHARDED = "torch.testing._internal.distributed._shard.sharded_tensor"
TORCHAO_BEFORE = '''\
import torch
from torch.testing._internal import common_utils

if common_utils.SEED is None:
    common_utils.SEED = 1234


class TestX(common_utils.TestCase):
    def test_seed(self):
        self.assertEqual(torch.initial_seed(), 1234)


common_utils.instantiate_parametrized_tests(TestX)
if __name__ == "__main__":
    common_utils.run_tests()
'''


class TestModuleImports(unittest.TestCase):
    """Every module-import form of a mirrored upstream module moves to a harness module that
    carries its names, only where the harness provides every attribute the file reads."""

    def assertMigrates(self, before: str, expected: str, moved: List[str],
                       left: Optional[List[str]] = None,
                       known: Optional[Provided] = None) -> None:
        known = known or Provided(MODULE_PROVIDED)
        new, got_moved, got_left = migrate_source(before, known)
        self.assertEqual(new, expected)
        self.assertEqual((got_moved, got_left), (moved, left or []))
        ast.parse(new)
        self.assertEqual(migrate_source(new, known), (new, [], left or []), "not idempotent")

    def assertStays(self, text: str, left: List[str]) -> None:
        self.assertEqual(migrate_source(text, Provided(MODULE_PROVIDED)), (text, [], left))

    # --- from PKG import module ------------------------------------------------------------
    def test_torchao_style_module_import_moves_and_only_its_line_changes(self) -> None:
        self.assertMigrates(
            TORCHAO_BEFORE,
            TORCHAO_BEFORE.replace("from torch.testing._internal import common_utils\n",
                                   "import harness as common_utils\n"),
            ["torch.testing._internal.common_utils as common_utils"])

    def test_from_a_subpackage_and_aliases_keep_their_names(self) -> None:
        self.assertMigrates(
            "from torch.testing._internal.distributed._tensor import common_dtensor\n"
            "from torch.testing._internal import common_utils as cu, common_distributed\n"
            "class T(common_dtensor.DTensorTestBase, cu.TestCase):\n"
            "    skips = common_distributed.TEST_SKIPS\n",
            "import harness as common_dtensor\n"
            "import harness as cu\n"
            "import harness as common_distributed\n"
            "class T(common_dtensor.DTensorTestBase, cu.TestCase):\n"
            "    skips = common_distributed.TEST_SKIPS\n",
            ["torch.testing._internal.distributed._tensor.common_dtensor as common_dtensor",
             "torch.testing._internal.common_utils as cu",
             "torch.testing._internal.common_distributed as common_distributed"])

    def test_a_mixed_import_splits_and_comments_travel(self) -> None:
        suite = ("torch.testing._internal.common_methods_invocations (module import) "
                 "(upstream's own test suite, not harness API)")
        self.assertMigrates(
            "if True:\n"
            "    from torch.testing._internal import (  # helpers\n"
            "        common_methods_invocations,\n"
            "        common_utils,  # the base\n"
            "    )\n"
            "    common_utils.run_tests(common_methods_invocations.op_db)\n",
            "if True:\n"
            "    import harness as common_utils  # the base\n"
            "    from torch.testing._internal import (\n"
            "        # helpers\n"
            "        common_methods_invocations,\n"
            "    )\n"
            "    common_utils.run_tests(common_methods_invocations.op_db)\n",
            ["torch.testing._internal.common_utils as common_utils"], [suite])

    def test_a_statement_sharing_its_line_is_rewritten_in_place(self) -> None:
        self.assertMigrates(
            "if True: from torch.testing._internal import common_utils, hop_db; x = 1\n"
            "common_utils.TestCase\n",
            "if True: import harness as common_utils; "
            "from torch.testing._internal import hop_db; x = 1\n"
            "common_utils.TestCase\n",
            ["torch.testing._internal.common_utils as common_utils"],
            ["torch.testing._internal.hop_db (module import)"])

    def test_a_module_of_its_own_moves_to_its_harness_module(self) -> None:
        known = Provided(MODULE_PROVIDED | {"ShardedTensorTestBase"}, {
            SHARDED: ("harness.kit.sharded_tensor",
                      frozenset({"ShardedTensorTestBase", "with_comms"}),
                      frozenset({"with_comms"}))})
        self.assertMigrates(
            "from torch.testing._internal.distributed._shard import sharded_tensor\n"
            "class T(sharded_tensor.ShardedTensorTestBase):\n"
            "    @sharded_tensor.with_comms\n"
            "    def test(self): pass\n",
            "import harness.kit.sharded_tensor as sharded_tensor\n"
            "class T(sharded_tensor.ShardedTensorTestBase):\n"
            "    @sharded_tensor.with_comms\n"
            "    def test(self): pass\n",
            [f"{SHARDED} as sharded_tensor"], known=known)

    def test_a_module_import_stays_and_each_missing_attribute_is_reported(self) -> None:
        self.assertStays(
            "from torch.testing._internal import common_utils\n"
            "class T(common_utils.TestCase):\n"
            "    flags = common_utils.TEST_WITH_ROCM, common_utils.IS_JETSON\n",
            ["torch.testing._internal.common_utils.IS_JETSON (module attribute)",
             "torch.testing._internal.common_utils.TEST_WITH_ROCM (module attribute)"])
        self.assertStays(
            "from torch.testing._internal import common_utils\nhelper(common_utils)\n",
            ["torch.testing._internal.common_utils (module import)"])

    # --- import torch.testing._internal.X, read by its dotted name -----------------------
    def test_dotted_module_moves_with_each_use_and_nothing_else_changes(self) -> None:
        before = (
            "import os  # first\n"
            "import torch.testing._internal.common_utils\n"
            "\n"
            "torch.testing._internal.common_utils.SEED = 99  # module state\n"
            "class T(torch.testing._internal.common_utils.TestCase):\n"
            "    def test(self):\n"
            "        self.assertEqual((torch.testing._internal\n"
            "                          .common_utils.SEED), 99)   # spaced   as it was\n"
            "        doc = 'torch.testing._internal.common_utils.TestCase'\n"
            "if __name__ == '__main__':\n"
            "    torch.testing._internal.common_utils.run_tests()\n")
        expected = (
            "import os  # first\n"
            "import harness\n"
            "\n"
            "harness.SEED = 99  # module state\n"
            "class T(harness.TestCase):\n"
            "    def test(self):\n"
            "        self.assertEqual((harness.SEED), 99)   # spaced   as it was\n"
            "        doc = 'torch.testing._internal.common_utils.TestCase'\n"
            "if __name__ == '__main__':\n"
            "    harness.run_tests()\n")
        self.assertMigrates(before, expected, ["torch.testing._internal.common_utils"])

    def test_dotted_module_keeps_torch_bound_where_the_file_reads_it(self) -> None:
        uses = "x = torch.ones(1), torch.testing._internal.common_utils.TestCase\n"
        self.assertMigrates(
            "import torch.testing._internal.common_utils\n" + uses,
            "import torch\nimport harness\nx = torch.ones(1), harness.TestCase\n",
            ["torch.testing._internal.common_utils"])
        self.assertMigrates(
            "import torch.nn\nimport torch.testing._internal.common_utils\n" + uses,
            "import torch.nn\nimport harness\nx = torch.ones(1), harness.TestCase\n",
            ["torch.testing._internal.common_utils"])
        self.assertMigrates(
            "def f():\n    if True: import torch.testing._internal.common_utils\n"
            "    return torch.ones(1), torch.testing._internal.common_utils.TestCase\n",
            "def f():\n    if True: import torch; import harness\n"
            "    return torch.ones(1), harness.TestCase\n",
            ["torch.testing._internal.common_utils"])

    def test_two_dotted_modules_share_one_harness_import(self) -> None:
        self.assertMigrates(
            "import torch.testing._internal.common_distributed\n"
            "import torch.testing._internal.common_utils\n"
            "import sys, torch.testing._internal.common_fsdp\n"
            "torch.testing._internal.common_fsdp.FSDPTest\n"
            "torch.testing._internal.common_distributed.TEST_SKIPS\n",
            "import harness\n"
            "import sys\n"
            "harness.FSDPTest\n"
            "harness.TEST_SKIPS\n",
            ["torch.testing._internal.common_distributed",
             "torch.testing._internal.common_utils", "torch.testing._internal.common_fsdp"])

    def test_dotted_module_stays_when_a_use_is_missing_passed_or_commented(self) -> None:
        head = "import torch.testing._internal.common_utils\n"
        chain = "torch.testing._internal.common_utils"
        for uses, label in (
                (f"{chain}.TestCase\n{chain}.TEST_WITH_ROCM\n",
                 f"{chain}.TEST_WITH_ROCM (module attribute)"),
                (f"helper({chain})\n{chain}.TestCase\n", f"{chain} (module import)"),
                ("(torch.testing._internal  # the base\n .common_utils.TestCase)\n",
                 f"{chain} (module import)")):
            with self.subTest(uses=uses):
                self.assertStays(head + uses, [label])

    def test_a_dotted_name_no_import_binds_in_its_scope_gets_a_harness_import_at_the_top(
            self) -> None:
        # upstream's modules import each other: a patch module reads one its imports loaded
        self.assertMigrates(
            '"""Patches."""\n'
            "from __future__ import annotations\n"
            "import torch\n"
            "\n"
            "def patch_skips():\n"
            "    import torch.testing._internal.common_distributed\n"
            "    torch.testing._internal.common_distributed.TEST_SKIPS = {}\n"
            "    torch.testing._internal.common_utils.TestCase.longMessage = True\n"
            "\n"
            "def patch_timeout():\n"
            "    torch.testing._internal.common_distributed.TEST_SKIPS = None\n",
            '"""Patches."""\n'
            "from __future__ import annotations\n"
            "import torch\n"
            "import harness\n"
            "\n"
            "def patch_skips():\n"
            "    import harness\n"
            "    harness.TEST_SKIPS = {}\n"
            "    harness.TestCase.longMessage = True\n"
            "\n"
            "def patch_timeout():\n"
            "    harness.TEST_SKIPS = None\n",
            ["torch.testing._internal.common_distributed",
             "torch.testing._internal.common_utils"])

    def test_the_harness_import_goes_before_a_decorated_first_statement(self) -> None:
        self.assertMigrates(
            "@decorate\nclass T(torch.testing._internal.common_utils.TestCase):\n    pass\n",
            "import harness\n@decorate\nclass T(harness.TestCase):\n    pass\n",
            ["torch.testing._internal.common_utils"])

    def test_a_dotted_name_the_harness_lacks_is_reported_at_its_line(self) -> None:
        self.assertStays(
            "import torch\n\ndef patch():\n"
            "    torch.testing._internal.common_utils.NOT_A_HARNESS_NAME = 1\n"
            "    return torch.testing._internal.opinfo.core.OpInfo\n",
            ["torch.testing._internal.common_utils.NOT_A_HARNESS_NAME (module attribute)",
             "torch.testing._internal.opinfo.core.OpInfo (dotted name)"])

    # --- the command ---------------------------------------------------------------------
    def test_check_names_the_missing_attribute_and_a_second_run_changes_nothing(self) -> None:
        with tempfile.TemporaryDirectory(prefix="migrate-test-") as folder:
            path = Path(folder) / "test_ao.py"
            missing = TORCHAO_BEFORE + "FLAG = common_utils.NOT_A_HARNESS_NAME\n"
            path.write_text(missing)
            result = migrate_here("--check", str(path))
            self.assertEqual(result.returncode, 1)
            self.assertEqual(result.stdout.splitlines(), [
                f"{path}: left 1: torch.testing._internal.common_utils.NOT_A_HARNESS_NAME "
                "(module attribute)",
                "migrate: 0 files would change, 1 unchanged, 1 private imports left"])
            self.assertEqual(path.read_text(), missing)
            path.write_text(TORCHAO_BEFORE)
            result = migrate_here("--check", str(path))
            self.assertEqual(result.returncode, 1)
            self.assertEqual(result.stdout.splitlines()[0], f"{path}: would move 1 name to "
                             "harness (torch.testing._internal.common_utils as common_utils)")
            self.assertEqual(path.read_text(), TORCHAO_BEFORE)
            self.assertEqual(migrate_here(str(path)).returncode, 0)
            migrated = path.read_text()
            self.assertIn("\nimport harness as common_utils\n", migrated)
            again = migrate_here("--check", str(path))
            self.assertEqual((again.returncode, again.stdout), (
                0, "migrate: 0 files would change, 1 unchanged, 0 private imports left\n"))
            self.assertEqual(path.read_text(), migrated)


class TestModuleState(unittest.TestCase):
    """`common_utils.SEED = N` through a migrated module import seeds the tests with N, as
    upstream's; an explicit HARNESS_SEED (`--seed`) wins."""

    def setUp(self) -> None:
        import harness
        import harness.single_process.testcase

        self.harness, self.testcase = harness, harness.single_process.testcase
        saved = harness.single_process.testcase.SEED

        def restore() -> None:
            harness.SEED = saved
            self.assertEqual(harness.single_process.testcase.SEED, saved)

        self.addCleanup(restore)
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop("HARNESS_SEED", None)

    def test_the_seed_reads_as_upstreams_until_set(self) -> None:
        self.assertEqual(self.harness.SEED, 1234)
        self.assertEqual(self.testcase.current_seed(), 1234)

    def test_seed_set_through_the_package_seeds_the_tests(self) -> None:
        common_utils = self.harness  # what `import harness as common_utils` binds
        common_utils.SEED = 99
        self.assertEqual((self.testcase.SEED, common_utils.SEED), (99, 99))
        self.assertEqual(self.testcase.current_seed(), 99)
        from harness import SEED

        self.assertEqual(SEED, 99)
        common_utils.SEED = None  # as unset: the default
        self.assertEqual(self.testcase.current_seed(), 1234)

    def test_harness_seed_wins_over_the_module_state(self) -> None:
        self.harness.SEED = 99
        os.environ["HARNESS_SEED"] = "7"
        self.assertEqual(self.testcase.current_seed(), 7)

    def test_a_patched_name_is_restored_in_its_home_module(self) -> None:
        import harness.runner.main

        original = harness.runner.main.run_tests
        with mock.patch("harness.run_tests", "patched"):
            self.assertEqual(harness.runner.main.run_tests, "patched")
        self.assertIs(harness.runner.main.run_tests, original)
        self.assertIs(self.harness.run_tests, original)

    def test_a_submodule_still_does_not_replace_the_public_name(self) -> None:
        import importlib

        module = importlib.import_module("harness.single_process.parametrize")
        self.harness.parametrize = module
        self.assertIs(self.harness.parametrize, module.parametrize)


# Differential probes: torchao-style files, one per import form, run under upstream's harness
# (as written) and under this one (after `python -m harness.migrate`). EXPECT is the seed each
# test must start from (PROBE_EXPECT, else the seed the file sets: DEFAULT); the test expecting
# another seed fails in both.
PROBE_TESTS = '''

EXPECT = int(os.environ.get("PROBE_EXPECT", DEFAULT))


class TestSeed({base}):
    def test_initial_seed(self):
        self.assertEqual(torch.initial_seed(), EXPECT)

    def test_draws(self):
        self.assertEqual(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(
            EXPECT)))
        self.assertEqual(random.random(), random.Random(EXPECT).random())

    def test_other_seed_fails(self):
        self.assertEqual(torch.initial_seed(), EXPECT + 1)

    def test_module_state_reads_back(self):
        self.assertEqual({module}.SEED, DEFAULT)

    @{module}.parametrize("n", [1, 2])
    def test_param(self, n):
        self.assertEqual(torch.initial_seed() + n, EXPECT + n)


{module}.instantiate_parametrized_tests(TestSeed)
'''
RANKS = '''

class TestRanks(common_distributed.MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank_seed(self):
        self.assertEqual(torch.initial_seed(), EXPECT)
        self.assertIn("multi-gpu-2", common_distributed.TEST_SKIPS)
'''
DTENSOR = '''

class TestDTensorNames(cu.TestCase):
    def test_names(self):
        self.assertTrue(issubclass(common_dtensor.DTensorTestBase, unittest.TestCase))
        self.assertGreater(common_dtensor.NUM_DEVICES, 0)
'''
HEAD = "import os\nimport random\nimport unittest\n\nimport torch\n"
PROBES = {
    # torchao's: from torch.testing._internal import common_utils, the seed left as it is
    "from_default": HEAD + TORCHAO_BEFORE.split("\n\n\nclass")[0].replace("import torch\n", "")
                    + "\nDEFAULT = 1234\n"
                    + PROBE_TESTS.format(base="common_utils.TestCase", module="common_utils"),
    # from torch.testing._internal import ..., the seed set at import; ranks too
    "from_set": HEAD + "from torch.testing._internal import common_distributed, common_utils\n"
                       "\ncommon_utils.SEED = 99\nDEFAULT = 99\n"
                + PROBE_TESTS.format(base="common_utils.TestCase", module="common_utils")
                + RANKS,
    # from a subpackage, and import ... as alias
    "subpackage_alias": HEAD + "import torch.testing._internal.common_utils as cu\n"
                               "from torch.testing._internal.distributed._tensor import "
                               "common_dtensor\n\ncu.SEED = 5\nDEFAULT = 5\n"
                        + PROBE_TESTS.format(base="cu.TestCase", module="cu") + DTENSOR,
    # read by its dotted name in a function, loaded by another import (a patch helper)
    "dotted_elsewhere": HEAD + "import torch.testing._internal.common_utils as cu\n\n\n"
                               "def patch_seed():\n"
                               "    torch.testing._internal.common_utils.SEED = 11\n\n\n"
                               "patch_seed()\nDEFAULT = 11\n"
                        + PROBE_TESTS.format(base="cu.TestCase", module="cu"),
    # import torch.testing._internal.common_utils, read by its dotted name
    "dotted": HEAD + "import torch.testing._internal.common_utils\n\n"
                     "torch.testing._internal.common_utils.SEED = 7\nDEFAULT = 7\n"
              + PROBE_TESTS.format(base="torch.testing._internal.common_utils.TestCase",
                                   module="torch.testing._internal.common_utils"),
}


# A patch helper's idiom: module state set through a function that imports nothing itself.
TIMEOUT_DEFAULT_PROBE = HEAD + textwrap.dedent("""\
    import time

    import torch.testing._internal.common_distributed
    from torch.testing._internal.common_distributed import MultiThreadedTestCase


    def shorten_the_timeout():
        torch.testing._internal.common_distributed.TIMEOUT_DEFAULT = 3


    shorten_the_timeout()


    """) + upstream_diff.THREADS_TIMEOUT_TESTS


@pytest.mark.slow
@pytest.mark.timeout(900)
class TestModuleImportsDifferential(unittest.TestCase):
    """Each import form's probe: the migrated file under this harness has the outcomes the
    file as written has under upstream's (seeded as upstream seeds, in every rank too)."""

    def check(self, name: str) -> None:
        theirs, ours = both(PROBES[name])
        kinds = {test: outcome[0] for test, outcome in theirs.items()}
        self.assertEqual(kinds, {test: "fail" if "other_seed" in test else "pass"
                                 for test in kinds}, theirs)
        self.assertEqual({test: outcome[0] for test, outcome in ours.items()}, kinds, ours)

    def test_from_package_import_module_with_the_default_seed(self) -> None:
        self.check("from_default")

    def test_from_package_import_module_with_the_seed_set_at_import(self) -> None:
        self.check("from_set")

    def test_from_subpackage_and_module_alias(self) -> None:
        self.check("subpackage_alias")

    def test_dotted_module_name(self) -> None:
        self.check("dotted")

    def test_dotted_module_name_in_a_function_without_an_import(self) -> None:
        self.check("dotted_elsewhere")

    def test_a_timeout_default_the_file_sets_is_its_tests_limit(self) -> None:
        theirs, ours = both(TIMEOUT_DEFAULT_PROBE)
        kinds = {test: outcome[0] for test, outcome in theirs.items()}
        self.assertEqual(kinds, {"Threads.test_quick": "pass", "Threads.test_too_long": "error"})
        self.assertEqual({test: outcome[0] for test, outcome in ours.items()}, kinds, ours)

    def test_harness_seed_wins_over_the_seed_the_file_sets(self) -> None:
        with tempfile.TemporaryDirectory(prefix="migrate-test-") as folder:
            path = Path(folder) / "probe_seed.py"
            path.write_text(PROBES["from_set"])
            self.assertEqual(migrate_here(str(path)).returncode, 0)
            outcomes = run_file(Path(folder), "probe_seed",
                                env={"HARNESS_SEED": "3", "PROBE_EXPECT": "3"})
        self.assertEqual({test for test, (kind, _) in outcomes.items() if kind != "pass"},
                         {"TestSeed.test_other_seed_fails"}, outcomes)
        self.assertIn("TestRanks.test_rank_seed", outcomes)


if __name__ == "__main__":
    unittest.main()
