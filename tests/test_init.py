"""harness/__init__.py: every public name of the design contract is importable from `harness`;
`harness.__version__` is the package's one version."""

import ast
import importlib
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

import harness
from tests import zygote
from tests.fixtures import REPO, child_env

CONTRACT_NAMES = [
    "TestCase", "MultiProcessTestCase", "MultiThreadedTestCase", "FSDPTest",
    "FSDPTestMultiThread", "DTensorTestBase", "with_comms", "with_temp_dir", "parametrize",
    "instantiate_parametrized_tests", "run_subtests", "skip_if_lt_x_gpu", "TEST_SKIPS",
    "TEST_WITH_DEV_DBG_ASAN", "run_tests", "FSDPInitMode", "DEVICEInitMode", "CUDAInitMode",
    "NestedWrappedModule", "TransformerWithSharedParams", "MLP", "assert_module_states",
    "_assert_module_states", "check_sharded_parity", "patch_reduce_scatter",
    "patch_register_post_backward_hook_backward", "reduce_scatter_with_assert",
]


class PublicNamesTest(unittest.TestCase):
    def test_every_contract_name_is_exported(self):
        for name in CONTRACT_NAMES:
            with self.subTest(name=name):
                self.assertIn(name, harness.__all__)
                self.assertIsNotNone(getattr(harness, name))

    def test_aliases(self):
        self.assertIs(harness.CUDAInitMode, harness.DEVICEInitMode)
        self.assertIs(harness._assert_module_states, harness.assert_module_states)

    def test_parametrize_is_the_decorator_not_the_module(self):
        self.assertTrue(callable(harness.parametrize))
        self.assertEqual(harness.parametrize.__name__, "parametrize")

    def test_all_lists_only_what_exists(self):
        for name in harness.__all__:
            self.assertTrue(hasattr(harness, name), name)

    def test_no_private_torch_testing_import(self):
        root = Path(__file__).resolve().parent.parent
        for path in sorted([*root.glob("harness/**/*.py"), *root.glob("test_cases/*.py")]):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for name in names:
                    self.assertFalse(name.startswith("torch.testing._internal"), f"{path}: {name}")


class VersionTest(unittest.TestCase):
    def test_version_is_a_release_number(self):
        self.assertRegex(harness.__version__, r"^\d+\.\d+\.\d+([.-]?\w+)?$")

    @unittest.skipIf(sys.version_info < (3, 11), "reads pyproject.toml with tomllib (3.11+)")
    def test_the_package_takes_its_version_from_here_alone(self):
        import tomllib

        root = Path(__file__).resolve().parent.parent
        with open(root / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)
        self.assertIn("version", project["project"]["dynamic"])
        self.assertNotIn("version", project["project"])
        self.assertEqual(project["tool"]["setuptools"]["dynamic"]["version"],
                         {"attr": "harness.__version__"})
        # setup.py, kept for tools that call it, sets nothing: no second place for the version
        self.assertEqual(re.findall(r"setup\((.*)\)", (root / "setup.py").read_text()), [""])
        source = (root / "harness" / "__init__.py").read_text()
        self.assertEqual(len(re.findall(r"^__version__ = ", source, re.M)), 1)


class LazyNamesTest(unittest.TestCase):
    """Names load on first use: a submodule, or one name, imports only what it needs."""

    def test_importing_a_public_names_module_does_not_replace_the_public_name(self):
        module = importlib.import_module("harness.single_process.parametrize")
        self.assertIs(harness.parametrize, module.parametrize)
        from harness import parametrize

        self.assertIs(parametrize, module.parametrize)

    def test_unknown_name_is_an_attribute_error_naming_it(self):
        with self.assertRaisesRegex(AttributeError, "has no attribute 'no_such_name'"):
            harness.no_such_name  # noqa: B018
        with self.assertRaises(ImportError):
            from harness import no_such_name  # noqa: F401

    def test_submodules_are_attributes_as_before(self):
        self.assertIs(harness.settings, sys.modules["harness.settings"])

    def test_dir_lists_every_public_name(self):
        self.assertLessEqual(set(harness.__all__), set(dir(harness)))

    @pytest.mark.slow
    def test_the_outcome_model_and_the_package_load_without_torch(self):
        code = (
            "import sys\n"
            "import harness, harness.outcome.rank_record, harness.outcome.merge\n"
            "import harness.outcome.fold, harness.outcome.replay, harness.outcome.report\n"
            "print('torch' in sys.modules)\n"
            "from harness import TestCase\n"
            "print('torch' in sys.modules, TestCase.__module__)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                              env=child_env(zygote.FRESH_INTERPRETER),
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.split(), ["False", "True", "harness.single_process.testcase"])


if __name__ == "__main__":
    unittest.main()
