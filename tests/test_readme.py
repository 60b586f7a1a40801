"""README.md and docs/: the first ranked example and its report are real, and no link is broken.

The README opens with a ranked pytest test that fails on rank 1, followed by the report pytest
prints for it. A test here writes that example into a folder of its own and runs pytest there
as a user runs it (the plugin on, no cache, the checkout importable, none of this run's
HARNESS_/PYTEST_ knobs), then checks the report the README shows against the real one, line by
line in order (the session header, left out as `...`, and the closing line's time aside). The
README is read at test time, so it cannot drift from what the harness prints.

The fast tests check the documents' relative links (each names a file that exists), that
every document under docs/ is reachable from the README, and that the first ranked test and
its report stay on the README's first screen.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple

import pytest

from tests.fixtures import REPO, user_pytest_env

README = REPO / "README.md"
DOCS = REPO / "docs"
FENCE = re.compile(r"^```[^\n]*\n(?P<body>.*?)^```$", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
CLOSING_TIME = re.compile(r" in \d+(\.\d+)?s( \([0-9:]+\))? ")  # "1 failed in 1.63s"
FIRST_SCREEN = 40  # the first ranked test starts within this many lines
REPORT_SCREEN = 60  # and the report's closing line comes within this many


class Example(NamedTuple):
    code: str  # the test file
    code_line: int  # 1-based line of the README where its block opens
    file_name: str  # what the shown command runs: `$ python -m pytest <file_name>`
    report: List[str]  # the report's lines as the README shows them, the command line aside
    report_end: int  # 1-based line of the README where the report's block closes


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def first_ranked_example() -> Example:
    """The README's first ```python block that uses `pytest.mark.ranks`, and the block after
    it: the report, opening with the command that ran it."""
    text = README.read_text()
    blocks = list(FENCE.finditer(text))
    index = next(
        (i for i, block in enumerate(blocks)
         if text[block.start():text.index("\n", block.start())] == "```python"
         and "pytest.mark.ranks" in block["body"]),
        None,
    )
    assert index is not None, "README.md has no ```python block using pytest.mark.ranks"
    block = blocks[index]
    assert index + 1 < len(blocks), "README.md: the first ranked example has no report after it"
    shown = blocks[index + 1]
    command, *report = shown["body"].rstrip("\n").splitlines()
    found = re.fullmatch(r"\$ python -m pytest (\S+\.py)", command)
    assert found, f"README.md: the report after the first ranked example opens with {command!r}"
    return Example(block["body"], line_of(text, block.start()), found[1], report,
                   line_of(text, shown.end()))


def normalised(line: str) -> str:
    """A line with what differs between runs (the closing line's time) taken out."""
    return CLOSING_TIME.sub(" in <time> ", line)


@pytest.mark.slow
def test_first_ranked_example_prints_the_report_shown(tmp_path: Path) -> None:
    example = first_ranked_example()
    (tmp_path / example.file_name).write_text(example.code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         example.file_name],
        cwd=tmp_path, env=user_pytest_env(COLUMNS="80"), capture_output=True, text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output  # the example fails, as the README says

    # The key lines are shown, and shown as printed: the headline naming rank 1, the
    # assertion's line, the summary line.
    shown = [line for line in example.report if line != "..."]
    headline = next((line for line in shown if line.startswith("E       rank 1: ")), None)
    assert headline is not None, "README.md: the report shows no `E` line naming rank 1"
    assert any(line.startswith(">       assert ") for line in shown), example.report
    summary = f"FAILED {example.file_name}::"
    assert any(line.startswith(summary) and " - rank 1: " in line for line in shown), shown
    assert any(line.startswith("=") and " 1 failed in " in line for line in shown), shown

    # Every line the README shows is printed, in that order.
    printed = [normalised(line) for line in done.stdout.splitlines()]
    at = 0
    for line in shown:
        want = normalised(line)
        assert want in printed[at:], (
            f"README.md shows {line!r}, which the real run does not print (after what matched "
            f"before it); the run printed:\n{output}"
        )
        at = printed.index(want, at) + 1


def test_first_ranked_example_is_on_the_first_screen() -> None:
    example = first_ranked_example()
    assert example.code_line <= FIRST_SCREEN, example.code_line
    assert example.report_end <= REPORT_SCREEN, example.report_end


def documents() -> List[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(document: Path) -> List[str]:
    """The link targets of a Markdown document, outside code blocks and code spans."""
    text = FENCE.sub("", document.read_text())
    return [m["target"] for m in LINK.finditer(INLINE_CODE.sub("", text))]


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")


@pytest.mark.parametrize("document", documents(), ids=lambda path: path.name)
def test_relative_links_point_at_files(document: Path) -> None:
    broken = [
        target for target in links(document)
        if relative(target) and not (document.parent / target.partition("#")[0]).exists()
    ]
    assert not broken, f"{document.relative_to(REPO)} links to files that do not exist: {broken}"


def test_every_document_is_reachable_from_the_readme() -> None:
    seen, todo = {README.resolve()}, [README]
    while todo:
        document = todo.pop()
        for target in links(document):
            path = (document.parent / target.partition("#")[0]).resolve()
            if relative(target) and path.suffix == ".md" and path.exists() and path not in seen:
                seen.add(path)
                todo.append(path)
    orphans = [str(p.relative_to(REPO)) for p in DOCS.glob("*.md") if p.resolve() not in seen]
    assert not orphans, f"no link from README.md leads to {orphans}"
