"""tests/zygote.py: a run forked from the zygote looks, from inside, like the same run in a new
interpreter (compared side by side), and the runs it cannot make exactly start one."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests import zygote
from tests.fixtures import child_env

pytestmark = pytest.mark.slow  # every test starts processes

# Prints what a run can see of how it was started; `torch_at_start` tells the two apart.
PROBE = textwrap.dedent("""
    import sys
    torch_at_start = "torch" in sys.modules
    import json, os, random, tempfile
    main = sys.modules["__main__"]
    print(json.dumps({
        "torch_at_start": torch_at_start,
        "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "path0": sys.path[0],
        "path_from_env": [p for p in sys.path if p.startswith(os.environ["PROBE_DIR"])],
        "cwd": os.getcwd(), "probe_env": os.environ.get("PROBE_VALUE"),
        "main_file": getattr(main, "__file__", None), "main_name": main.__name__,
        "main_spec": getattr(getattr(main, "__spec__", None), "name", None),
        "tempdir": tempfile.gettempdir(), "harness_loaded": "harness" in sys.modules,
        "tests_loaded": "tests" in sys.modules, "new_session": os.getsid(0) == os.getpid(),
        "stdout_line_buffered": sys.stdout.line_buffering, "stdin": sys.stdin.fileno(),
    }), flush=True)
    code = int(os.environ.get("PROBE_EXIT", "0"))
    if code == 99:
        raise ValueError("probe failed on purpose")
    sys.exit(code)
""")


class ZygoteRunsLikeAnInterpreter(unittest.TestCase):
    def setUp(self) -> None:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.dir = Path(folder.name)
        (self.dir / "probe.py").write_text(PROBE)
        (self.dir / "lib").mkdir()
        (self.dir / "lib" / "probe_module.py").write_text(PROBE)
        (self.dir / "tmp").mkdir()

    def run_both(self, args: List[str], **extra: Any) -> List[subprocess.CompletedProcess]:
        """The same run from the zygote, then in a new interpreter."""
        runs, more = [], extra.pop("env", {})
        for fresh in ({}, zygote.FRESH_INTERPRETER):
            env = child_env({
                "PROBE_DIR": str(self.dir), "PROBE_VALUE": "seen", "TMPDIR": str(self.dir / "tmp"),
                "PYTHONPATH": str(self.dir / "lib"), **fresh, **more,
            })
            runs.append(subprocess.run([sys.executable, *args], env=env, cwd=self.dir,
                                       capture_output=True, text=True, timeout=300, **extra))
        return runs

    def assert_same(self, args: List[str], **extra: Any) -> Dict[str, Any]:
        forked, fresh = self.run_both(args, **dict(extra))
        self.assertEqual(forked.returncode, fresh.returncode, forked.stderr + fresh.stderr)
        seen = [json.loads(run.stdout) for run in (forked, fresh)]
        self.assertEqual([s.pop("torch_at_start") for s in seen], [True, False])
        self.assertEqual(seen[0], seen[1])
        return seen[0]

    def test_a_script(self) -> None:
        seen = self.assert_same(["probe.py", "an-argument"])
        self.assertEqual(seen["argv"], ["probe.py", "an-argument"])
        self.assertFalse(seen["harness_loaded"] or seen["tests_loaded"])

    def test_a_module_and_code(self) -> None:
        self.assert_same(["-m", "probe_module", "x"])
        self.assert_same(["-c", PROBE, "y"])

    def test_exit_codes_and_an_uncaught_exception(self) -> None:
        self.assert_same(["probe.py"], env={"PROBE_EXIT": "3"})
        forked, fresh = self.run_both(["probe.py"], env={"PROBE_EXIT": "99"})
        self.assertEqual((forked.returncode, fresh.returncode), (1, 1))
        self.assertEqual(forked.stderr, fresh.stderr)  # the traceback, from the script's line

    def test_a_missing_script(self) -> None:
        forked, fresh = self.run_both(["no_such_script.py"])
        self.assertEqual((forked.returncode, forked.stderr), (2, fresh.stderr))

    def test_new_session_and_stdin(self) -> None:
        seen = self.assert_same(["probe.py"], start_new_session=True, stdin=subprocess.DEVNULL)
        self.assertTrue(seen["new_session"])

    def test_what_it_cannot_run_exactly_starts_an_interpreter(self) -> None:
        site = self.dir / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text("")
        for name, env in [("a sitecustomize", {"PYTHONPATH": str(site)}),
                          ("another hash seed", {"PYTHONHASHSEED": "123"}),
                          ("a torch setting", {"TORCH_SHOW_CPP_STACKTRACES": "1"})]:
            with self.subTest(name):
                forked, _ = self.run_both(["probe.py"], env=env)
                self.assertFalse(json.loads(forked.stdout)["torch_at_start"])
        forked, _ = self.run_both(["-X", "utf8", "probe.py"])
        self.assertFalse(json.loads(forked.stdout)["torch_at_start"])


if __name__ == "__main__":
    unittest.main()
