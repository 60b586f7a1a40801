"""docs/recipes.md ("Moving a hand-rolled spawner over"): each recipe's code, run as a user runs it.

Every fenced block of the document whose first line is `# recipe: <folder>/<file>` is a file
of that recipe; a test here writes a recipe's files into its own folder and runs pytest there
(the plugin on, no cache, the checkout importable, none of the HARNESS_/PYTEST_ knobs), then
asserts the session's counts. The document is read at test time, so the code it shows is the
code that ran.

DeepSpeed is not a dependency: its recipe runs against `fake_deepspeed.py` (written here),
which does what the recipe relies on in DeepSpeed's `init_distributed` (the launcher variables
or an error, a torch group made only when none exists, `deepspeed.comm` refusing calls before
it); the recipe's `import deepspeed` lines are pointed at it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

import harness
from tests.fixtures import REPO, user_pytest_env

RECIPES = REPO / "docs" / "recipes.md"
BLOCK = re.compile(r"^```python\n# recipe: (?P<path>\S+)\n(?P<body>.*?)^```$", re.M | re.S)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
KINDS = {"errors": "error", "warnings": "warning"}

FAKE_DEEPSPEED = '''
"""A stand-in for the part of DeepSpeed the recipe uses (deepspeed/comm/comm.py)."""
import os
import sys

import torch.distributed as dist

_backend = None


def init_distributed(dist_backend=None):
    global _backend
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        if name not in os.environ:
            raise ValueError(f"environment variable {name} expected, but not set")
    if not dist.is_initialized():
        dist.init_process_group(dist_backend or "gloo")  # env://
    _backend = dist_backend or "gloo"


def _ready():
    assert _backend is not None, "DeepSpeed backend not set, please initialize it"


def get_rank():
    _ready()
    return dist.get_rank()


def get_world_size():
    _ready()
    return dist.get_world_size()


comm = sys.modules[__name__]
'''


def recipe_files(recipe: str) -> Dict[str, str]:
    """The files of one recipe, by name, as docs/recipes.md shows them."""
    files: Dict[str, str] = {}
    for block in BLOCK.finditer(RECIPES.read_text()):
        folder, _, name = block["path"].partition("/")
        if folder == recipe:
            assert name not in files, f"docs/recipes.md shows {block['path']} twice"
            files[name] = block["body"]
    assert files, f"docs/recipes.md has no block marked '# recipe: {recipe}/...'"
    return files


class Run(NamedTuple):
    counts: Dict[str, int]  # pytest's closing line: {"passed": 3, "failed": 1, ...}
    returncode: int
    output: str


def run_recipe(folder: Path, files: Dict[str, str], *extra: str) -> Run:
    """pytest's run of these files, written into `folder` and run there as a user runs them."""
    for name, text in files.items():
        (folder / name).write_text(text)
    tmp = folder / "tmp"  # what the recipe's own launchers write (torchrun's log folder)
    tmp.mkdir(exist_ok=True)
    env = user_pytest_env(TMPDIR=str(tmp))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "-rfEs", *extra],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )
    closing = (done.stdout.strip().splitlines() or [""])[-1]
    counts = {KINDS.get(kind, kind): int(n) for n, kind in COUNT.findall(closing)}
    counts.pop("warning", None)
    return Run(counts, done.returncode, done.stdout + done.stderr)


def assert_counts(run: Run, expected: Dict[str, int]) -> None:
    """The session ended as expected: these counts, exit 0, no INTERNALERROR (a conftest's
    session hook that raises still prints the counts)."""
    assert run.counts == expected, run.output
    assert run.returncode == 0 and "INTERNALERROR" not in run.output, run.output


def test_blocks_name_known_recipes() -> None:
    """Every marked block belongs to a recipe a test here runs (a new one needs its test)."""
    folders = {block["path"].partition("/")[0] for block in BLOCK.finditer(RECIPES.read_text())}
    assert folders == {"deepspeed", "pool", "xdist", "spawn", "launcher", "queue"}


def test_deepspeed_import_is_the_real_one() -> None:
    files: List[str] = list(recipe_files("deepspeed").values())
    assert all("fake_deepspeed" not in text for text in files)
    assert all(re.search(r"^import deepspeed$", text, re.M) for text in files)


@pytest.mark.slow
def test_deepspeed(tmp_path: Path) -> None:
    """init_distributed in an autouse rank fixture (the harness's group, and env:// with
    init_distributed = False), DistributedFixture as a fixture calling rank_pool.run."""
    files = {name: re.sub(r"^import deepspeed$", "import fake_deepspeed as deepspeed", text,
                          flags=re.M)
             for name, text in recipe_files("deepspeed").items()}
    files["fake_deepspeed.py"] = FAKE_DEEPSPEED
    assert_counts(run_recipe(tmp_path, files), {"passed": 4})


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(harness, "RankPool"), reason="RankPool not built yet")
def test_session_pool(tmp_path: Path) -> None:
    """pytest.pool = RankPool(2) in the conftest; the helper's pytest.pool.starmap unchanged."""
    assert_counts(run_recipe(tmp_path, recipe_files("pool")), {"passed": 3})


@pytest.mark.slow
def test_xdist_workers(tmp_path: Path) -> None:
    """ignite's shape: the conftest marks `distributed` tests ranks(2), the test file as it was."""
    assert_counts(run_recipe(tmp_path, recipe_files("xdist")), {"passed": 3})
    if importlib.util.find_spec("xdist") is not None:  # and spread over workers, as ranked tests
        assert_counts(run_recipe(tmp_path, {}, "-n", "2"), {"passed": 3})


@pytest.mark.slow
def test_spawn(tmp_path: Path) -> None:
    """The spawned worker called from a ranked test; one keeping its own init (init=False)."""
    assert_counts(run_recipe(tmp_path, recipe_files("spawn")), {"passed": 3})


@pytest.mark.slow
def test_subprocess_launcher(tmp_path: Path) -> None:
    """The script's checks as a ranked test (sizes 2 and 3), torchrun's own run kept."""
    assert_counts(run_recipe(tmp_path, recipe_files("launcher")), {"passed": 3})


@pytest.mark.slow
def test_queue(tmp_path: Path) -> None:
    """Per-rank processes reporting through a queue, as rank_pool.run's values."""
    assert_counts(run_recipe(tmp_path, recipe_files("queue")), {"passed": 1})
