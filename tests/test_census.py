"""The census: how many of upstream's distributed test files move over to the harness.

`../shared/census/extracts` (next to the checkout) holds the private imports of each
`test_*.py` file of upstream's `test/distributed`. As a user would, this copies them, runs
`python -m harness.migrate` over the copy, and counts the files that import something private
and afterwards have nothing private left and whose import statements execute (one child
process execs each migrated file: a name migrate maps but `harness` lacks fails there).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections import Counter
from pathlib import Path
from typing import Dict, List

import pytest

from tests.fixtures import REPO, child_env


def _checkouts() -> List[Path]:
    """This checkout and, for a git worktree, the main checkout it was made from."""
    found = [REPO]
    dot_git = REPO / ".git"
    if dot_git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        text = dot_git.read_text().strip()
        if text.startswith("gitdir:"):
            found.append(Path(text.split(":", 1)[1].strip()).resolve().parents[2])
    return found


EXTRACTS = next((c.parent / "shared" / "census" / "extracts" for c in _checkouts()
                 if (c.parent / "shared" / "census" / "extracts").is_dir()),
                REPO.parent / "shared" / "census" / "extracts")
PRIVATE = re.compile(r"^[^#]*torch\.testing\._internal", re.M)
REQUIRED = 212  # of the 236 files that import something private (issue 18)
# Folders the figure is reported for (the rest of test/distributed/ by its first folder).
FOLDERS = ("_composable/fsdp", "tensor/parallel", "fsdp", "checkpoint", "tensor", "_shard")

EXEC_EACH = """
import json, sys
failed = {}
for path in sys.argv[1:]:
    try:
        exec(compile(open(path).read(), path, "exec"), {"__name__": "census_file"})
    except BaseException as error:  # noqa: BLE001 - the census counts any failure
        failed[path] = f"{type(error).__name__}: {error}"
print(json.dumps(failed))
"""


def _folder(relative: Path) -> str:
    text = relative.as_posix()
    for folder in FOLDERS:
        if text.startswith(folder + "/"):
            return folder
    return "top-level" if len(relative.parts) == 1 else relative.parts[0]


def census(extracts: Path) -> Dict[str, object]:
    """Migrate a copy of `extracts` and count the files that moved over, per folder."""
    with tempfile.TemporaryDirectory(prefix="census.") as tmp:
        copy = Path(tmp) / "extracts"
        shutil.copytree(extracts, copy)
        migrate = subprocess.run(
            [sys.executable, "-m", "harness.migrate", str(copy)], capture_output=True,
            text=True, env=child_env(), cwd=REPO, timeout=600)
        if migrate.returncode not in (0, 1):
            raise AssertionError(f"migrate failed:\n{migrate.stderr[-3000:]}")
        root = copy / "test" / "distributed"
        files = sorted(root.rglob("test_*.py"))
        importing = [f for f in files
                     if PRIVATE.search((extracts / f.relative_to(copy)).read_text())]
        clean = [f for f in importing if not PRIVATE.search(f.read_text())]
        run = subprocess.run([sys.executable, "-c", EXEC_EACH, *map(str, clean)],
                             capture_output=True, text=True, env=child_env(), cwd=REPO,
                             timeout=600)
        if run.returncode != 0:
            raise AssertionError(f"executing the imports failed:\n{run.stderr[-3000:]}")
        failed: Dict[str, str] = json.loads(run.stdout.strip().splitlines()[-1])
        moved = {f for f in clean if str(f) not in failed}
        total: Counter = Counter(_folder(f.relative_to(root)) for f in importing)
        done: Counter = Counter(_folder(f.relative_to(root)) for f in moved)
        return {
            "moved": len(moved), "importing": len(importing),
            "per_folder": {k: (done[k], total[k]) for k in sorted(total)},
            "import_failures": {str(Path(p).relative_to(root)): e for p, e in failed.items()},
        }


@pytest.mark.slow
@unittest.skipUnless(EXTRACTS.is_dir(), f"no census extracts at {EXTRACTS} (../shared next "
                                        "to the checkout)")
class CensusTest(unittest.TestCase):
    def test_nine_in_ten_upstream_files_move_over(self) -> None:
        result = census(EXTRACTS)
        lines: List[str] = [f"census: {result['moved']} of {result['importing']} files move over"]
        lines += [f"  {folder}: {done}/{total}"
                  for folder, (done, total) in result["per_folder"].items()]
        print("\n".join(lines))
        self.assertEqual(result["import_failures"], {})
        self.assertEqual(result["importing"], 236)
        self.assertGreaterEqual(result["moved"], REQUIRED, "\n".join(lines))


if __name__ == "__main__":
    unittest.main()
