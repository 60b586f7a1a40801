"""`python run_all.py` before and after a change: the whole suites, side by side in one run.

The revision to compare against (default: the last commit before issue 10's reshaping of
harness/ into launchers and subpackages) is checked out into a temporary git worktree; each
round runs `python run_all.py -q` once in that worktree and once in this checkout, in
alternating order, so both see the same machine load. It prints each side's median wall time
and closing line, and the ratio. The worktree is removed however the run ends.

    python benchmarks/bench_run_all.py [--before 407443b] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEFORE = "407443b"  # the last commit before issue 10's launchers and subpackages
RUN_TIMEOUT_S = 1800


def run_suites(checkout: str) -> Tuple[float, str]:
    """One `python run_all.py -q` in `checkout`: its wall time and closing line."""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "run_all.py", "-q"], cwd=checkout, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )
    seconds = time.monotonic() - began
    lines = done.stdout.strip().splitlines()
    closing = lines[-1] if lines else f"(no output; exit {done.returncode})"
    if done.returncode != 0:
        raise SystemExit(f"run_all.py failed in {checkout} (exit {done.returncode}): {closing}")
    return seconds, closing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    with tempfile.TemporaryDirectory(prefix="bench-run-all-") as parent:
        worktree = os.path.join(parent, "before")
        subprocess.run(
            ["git", "worktree", "add", "--detach", worktree, args.before], cwd=ROOT, check=True,
            capture_output=True,
        )
        try:
            sides = {f"before ({args.before})": worktree, "after (this checkout)": ROOT}
            times: Dict[str, List[float]] = {name: [] for name in sides}
            closing: Dict[str, str] = {}
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for name in order:
                    seconds, closing[name] = run_suites(sides[name])
                    times[name].append(seconds)
                    print(f"round {round_ + 1}: {name}: {seconds:.1f} s ({closing[name]})")
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", worktree], cwd=ROOT, capture_output=True
            )
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name}: median {median:.1f} s over {args.rounds} run(s); {closing[name]}")
    before, after = medians.values()
    print(f"after / before: {after / before:.2f}")


if __name__ == "__main__":
    main()
