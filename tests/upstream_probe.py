"""Differential runs: one small test file, written against upstream's harness, run as a script
under torch's installed harness and, moved over with `harness.migrate`, under this one.

Outcomes are read per test id (`Class.test`) from each run's JUnit XML, so the two harnesses
are compared on what a CI system sees: passed, failure, error or skipped.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from harness.migrate import harness_names, migrate_source
from tests.fixtures import child_env, upstream_env

UPSTREAM, HARNESS = "upstream", "harness"


def _outcomes(xml_dir: Path) -> Dict[str, str]:
    found: Dict[str, str] = {}
    for path in sorted(xml_dir.rglob("*.xml")):  # upstream nests its reports in folders
        for case in ET.parse(path).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            found[test_id] = kinds[0] if kinds else "passed"
    return found


def run_probe(
    source: str, under: str, *, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
    files: Optional[Dict[str, str]] = None, timeout: float = 600,
) -> Tuple[Dict[str, str], subprocess.CompletedProcess]:
    """Run `source` as `probe.py` under `under` (UPSTREAM or HARNESS): (outcome per test id,
    the finished process). `files` are written beside it first (name -> text)."""
    if under == HARNESS:
        source, _, left = migrate_source(source, harness_names())
        if left:
            raise AssertionError(f"the probe keeps private imports under the harness: {left}")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name, text in (files or {}).items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text)
        (work / "probe.py").write_text(source)
        proc = subprocess.run(
            [sys.executable, "probe.py", *args, f"--save-xml={work / 'xml'}"], cwd=work,
            env=(upstream_env if under == UPSTREAM else child_env)(env), capture_output=True,
            text=True, timeout=timeout,
        )
        return _outcomes(work), proc


def compare(source: str, **options: object) -> Tuple[Dict[str, str], Dict[str, str], str]:
    """Both harnesses' outcomes for `source`, and both runs' output (for assertion messages)."""
    theirs, their_run = run_probe(source, UPSTREAM, **options)  # type: ignore[arg-type]
    ours, our_run = run_probe(source, HARNESS, **options)  # type: ignore[arg-type]
    shown = (f"--- upstream:\n{their_run.stderr[-3000:]}\n"
             f"--- harness:\n{our_run.stderr[-3000:]}")
    return theirs, ours, shown
