"""harness.runner.loader: -k matching, selection errors, shards and repeats, suites that skip
or fail at import, and the test files a folder holds."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import textwrap
import unittest
import uuid
from pathlib import Path
from typing import Tuple

from harness.outcome.report import TestReport
from harness.runner.loader import (
    SuiteLoader,
    UsageError,
    load_module,
    name_matcher,
    repeat,
    resolve_modules,
    select,
    shard,
)
from harness.runner.results import Collector


class _Named(unittest.TestCase):
    """A stand-in test with a chosen id, for the selection functions."""

    def __init__(self, test_id: str) -> None:
        super().__init__("runTest")
        self._id = test_id

    def runTest(self) -> None:  # noqa: N802 - unittest's naming
        """Never run."""

    def id(self) -> str:
        return self._id


class TestSelectionFunctions(unittest.TestCase):
    IDS = [f"suite.mod{m}.TestC.test_{n}" for m in (1, 2) for n in ("a", "b", "c", "grid")]

    def plan(self):
        return [
            (module, [_Named(i) for i in self.IDS if i.startswith(module)])
            for module in ("suite.mod1", "suite.mod2")
        ]

    def test_pattern_without_star_matches_a_substring(self) -> None:
        match = name_matcher("test_b")
        self.assertTrue(match("suite.mod1.TestC.test_b"))
        self.assertFalse(match("suite.mod1.TestC.test_a"))
        self.assertTrue(name_matcher("*mod2.*_a")("suite.mod2.TestC.test_a"))
        self.assertFalse(name_matcher("*mod2.*_a")("suite.mod2.TestC.test_a_x"))

    def test_select_rejects_unmatched_and_empty_patterns(self) -> None:
        with self.assertRaisesRegex(UsageError, "-k 'zzz' matches no test"):
            select(self.plan(), ["test_a", "zzz"])
        with self.assertRaisesRegex(UsageError, "empty pattern"):
            select(self.plan(), [""])
        kept = select(self.plan(), ["*mod2*grid"])
        self.assertEqual([[t.id() for t in tests] for _, tests in kept],
                         [["suite.mod2.TestC.test_grid"]])

    def test_shards_partition_the_run(self) -> None:
        for count in (1, 2, 3, 5, 9):
            with self.subTest(count=count):
                ids = [t.id() for i in range(1, count + 1)
                       for _, tests in shard(self.plan(), i, count) for t in tests]
                self.assertEqual(sorted(ids), sorted(self.IDS))

    def test_repeat_makes_fresh_instances(self) -> None:
        plan = [("m", [unittest.FunctionTestCase(lambda: None)])]
        self.assertIs(repeat(plan, 1), plan)
        plan = [("m", [TestSelectionFunctions("test_repeat_makes_fresh_instances")])]
        tests = repeat(plan, 3)[0][1]
        self.assertEqual(len(tests), 3)
        self.assertEqual(len({id(t) for t in tests}), 3)


class TestFolders(unittest.TestCase):
    def test_a_folder_is_searched_recursively_but_not_hidden_or_build_folders(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            files = ["test_top.py", "unit/test_a.py", "unit/deep/test_b.py", "unit/helper.py",
                     ".venv/test_no.py", "build/test_no.py", "venv/lib/test_no.py"]
            for name in files:
                (Path(root) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(root) / name).write_text("")
            saved = sys.path[:]
            self.addCleanup(sys.path.__setitem__, slice(None), saved)
            self.assertEqual(resolve_modules([root]), ["test_top", "test_b", "test_a"])
            self.assertIn(str(Path(root, "unit", "deep").resolve()), sys.path)

    def test_an_unknown_name_is_a_usage_error(self) -> None:
        with self.assertRaisesRegex(UsageError, "unknown test module 'no/such/dir'"):
            resolve_modules(["no/such/dir"])


class TestSuitesThatStopAtImport(unittest.TestCase):
    """unittest.TestLoader's rules: a module-level SkipTest (or upstream's print-and-exit(0))
    is a skip of the suite with its reason; anything else raised or exited is an error."""

    def setUp(self) -> None:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.folder = Path(folder.name)
        sys.path.insert(0, folder.name)
        self.addCleanup(sys.path.remove, folder.name)

    def outcome(self, source: str) -> Tuple[str, TestReport]:
        """Load a module with this source, run what the loader made of it: (test id, record)."""
        name = f"suite_{uuid.uuid4().hex}"
        (self.folder / f"{name}.py").write_text(textwrap.dedent(source))
        self.addCleanup(sys.modules.pop, name, None)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            tests = load_module(name)
        self.assertEqual(len(tests), 1, [t.id() for t in tests])
        records = []
        collector = Collector(lambda test: None, lambda test, record: records.append(record))
        collector.suite = name
        tests[0].run(collector)
        self.assertEqual(len(records), 1)
        return tests[0].id().replace(name, "M"), records[0]

    def test_exit_0_after_printing_a_reason_is_a_skip_with_that_reason(self) -> None:
        test_id, record = self.outcome("""
            import sys
            print("Skip dev-asan as torch + multiprocessing spawn have known issues",
                  file=sys.stderr)
            sys.exit(0)
        """)
        self.assertEqual(test_id, "M.ImportSkipped.test_import")
        self.assertEqual(record.status, "skipped")
        self.assertEqual(record.message,
                         "Skip dev-asan as torch + multiprocessing spawn have known issues")

    def test_bare_exit_without_a_message_is_a_skip_that_says_so(self) -> None:
        _, record = self.outcome("import sys\nsys.exit()\n")
        self.assertEqual((record.status, record.message), ("skipped", "sys.exit(None) at import"))

    def test_module_level_skiptest_is_a_skip(self) -> None:
        _, record = self.outcome("import unittest\nraise unittest.SkipTest('no distributed')\n")
        self.assertEqual((record.status, record.message), ("skipped", "no distributed"))

    def test_other_exit_codes_are_errors(self) -> None:
        for code in ("3", "'fatal: no config'"):
            with self.subTest(code=code):
                test_id, record = self.outcome(f"import sys\nprint('hm')\nsys.exit({code})\n")
                self.assertEqual(test_id, "M.ImportFailure.test_import")
                self.assertEqual((record.status, record.exc_type), ("error", "SystemExit"))
                self.assertIn(f"SystemExit: {code.strip(chr(39))}", record.message)
                self.assertIn(f"sys.exit({code})", record.detail)

    def test_exceptions_are_errors_with_the_traceback(self) -> None:
        test_id, record = self.outcome("def f():\n    raise KeyError('cfg')\nf()\n")
        self.assertEqual(test_id, "M.ImportFailure.test_import")
        self.assertEqual((record.status, record.exc_type), ("error", "KeyError"))
        self.assertTrue(record.message.endswith("KeyError: 'cfg'"), record.message)
        self.assertIn("in f\n    raise KeyError('cfg')", record.detail)
        self.assertNotIn("importlib", record.detail)

    def test_select_keeps_suites_not_loaded_and_tolerates_unmatched_patterns(self) -> None:
        name = f"suite_{uuid.uuid4().hex}"
        (self.folder / f"{name}.py").write_text("import sys\nsys.exit(0)\n")
        self.addCleanup(sys.modules.pop, name, None)
        stand_in = load_module(name)
        plan = [("suite.mod1", [_Named("suite.mod1.TestC.test_a")]), (name, stand_in)]
        kept = select(plan, ["test_a", "only_in_the_skipped_suite"])
        self.assertEqual([[t.id() for t in tests] for _, tests in kept],
                         [["suite.mod1.TestC.test_a"], [stand_in[0].id()]])

    def write(self, source: str) -> str:
        name = f"suite_{uuid.uuid4().hex}"
        (self.folder / f"{name}.py").write_text(textwrap.dedent(source))
        self.addCleanup(sys.modules.pop, name, None)
        return name

    def test_a_module_that_imports_loads_by_unittests_rules(self) -> None:
        name = self.write("""
            import unittest
            class TestB(unittest.TestCase):
                def test_z(self): pass
                def test_a(self): pass
                def helper(self): pass
            class TestA(unittest.TestCase):
                def test_only(self): pass
        """)
        loader = SuiteLoader()
        self.assertIsInstance(loader, unittest.TestLoader)
        ids = [t.id().replace(name, "M") for t in load_module(name)]
        self.assertEqual(ids, ["M.TestA.test_only", "M.TestB.test_a", "M.TestB.test_z"])

    def test_the_load_tests_protocol_is_honoured(self) -> None:
        name = self.write("""
            import unittest
            class TestB(unittest.TestCase):
                def test_kept(self): pass
                def test_dropped(self): pass
            def load_tests(loader, tests, pattern):
                return unittest.TestSuite([TestB("test_kept")])
        """)
        suite = SuiteLoader().loadTestsFromModuleName(name)
        self.assertEqual([t.id().replace(name, "M") for t in suite], ["M.TestB.test_kept"])

    def test_ctrl_c_at_import_is_not_swallowed(self) -> None:
        name = f"suite_{uuid.uuid4().hex}"
        (self.folder / f"{name}.py").write_text("raise KeyboardInterrupt\n")
        self.addCleanup(sys.modules.pop, name, None)
        with self.assertRaises(KeyboardInterrupt):
            load_module(name)


if __name__ == "__main__":
    unittest.main()
