"""Python stacks and tracebacks of ranks, in one format whichever mode ran the rank.

A rank's report shows where it was: the traceback of what it raised, the stack it died with
(faulthandler's dump of a crash) or the stack it hung in (the dump the supervisor asks for,
or a rank thread's frame). All of them are shown as Python shows a traceback (most recent
call last, `  File "...", line N, in name` and the source line), with the harness's own
frames hidden: they are the same in every report and bury the user's line. faulthandler's
noise (other threads, the "Extension modules" list) is left out.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import threading
import unittest
from typing import List, NamedTuple, Sequence, Tuple

FRAME_LINE = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+)(, in (?P<name>.+))?$')
_DUMP_FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>.+)$')
_DUMP_THREAD = re.compile(
    r"^(Current thread 0x[0-9a-fA-F]+ |Thread 0x[0-9a-fA-F]+ |Stack )\(most recent call first\):$"
)
_FATAL = "Fatal Python error:"

_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The harness's machinery: how a rank is started, run, synchronised and reported. The kit
# (FSDP/DTensor helpers a test calls) is the user's library and stays visible.
_HIDDEN = tuple(
    os.path.join(_HARNESS, name)
    for name in (
        "launch" + os.sep, "outcome" + os.sep, "process" + os.sep, "threads" + os.sep,
        "runner" + os.sep, "compat" + os.sep, "pytest_plugin" + os.sep,
        *(os.path.join("single_process", name)
          for name in ("testcase.py", "comparison.py", "subtests.py", "parametrize.py")),
    )
) + (os.path.dirname(unittest.__file__) + os.sep,) + tuple(
    # pytest's own frames (`pytest.fail` in a rank), which pytest hides in its reports too
    os.path.dirname(spec.origin) + os.sep
    for spec in (importlib.util.find_spec(name) for name in ("_pytest", "pluggy"))
    if spec is not None and spec.origin is not None
)
# Hidden only below the first frame of the test: what starts a process or a thread.
_STARTERS = (
    os.path.dirname(os.path.abspath(threading.__file__)) + os.sep + "multiprocessing" + os.sep,
    os.path.abspath(threading.__file__),
    os.path.join(os.path.dirname(os.path.abspath(threading.__file__)), "runpy.py"),
    "<string>",
)


class Frame(NamedTuple):
    """One frame of a stack or traceback; `line`, its source line, where it was read."""

    filename: str
    lineno: int
    name: str
    line: str = ""


def is_hidden(filename: str) -> bool:
    """Whether a frame of this file is the harness's machinery (hidden in reports)."""
    return os.path.abspath(filename).startswith(_HIDDEN)


_PROCESS_ENTRY = (os.path.join(_STARTERS[0], "process.py"), "_bootstrap")


def visible(frames: Sequence[Frame]) -> List[Frame]:
    """The frames a report shows (oldest first): without the starters below the test and the
    harness's machinery; all of them when nothing else is left (a fault of the harness).

    A process rank's stack starts at multiprocessing's `_bootstrap`: a rank forked from a
    forkserver that was itself forked from the runner or pytest (and its xdist worker) holds
    their frames below that, which say nothing about the test."""
    entries = [i for i, f in enumerate(frames) if (f.filename, f.name) == _PROCESS_ENTRY]
    if entries:
        frames = frames[entries[-1]:]
    start = 0
    while start < len(frames) and (
        frames[start].filename.startswith(_STARTERS) or is_hidden(frames[start].filename)
    ):
        start += 1
    shown = [f for f in frames[start:] if not is_hidden(f.filename)]
    return shown or list(frames)


def format_frames(frames: Sequence[Frame]) -> str:
    """Frames (oldest first) as Python prints a traceback's, each with its source line."""
    lines = []
    for frame in frames:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        source = linecache.getline(frame.filename, frame.lineno).strip()
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


def format_stack(frames: Sequence[Frame]) -> str:
    """A stack (oldest first) in the report's format, harness frames hidden."""
    return format_frames(visible(frames))


def clean_traceback(text: str) -> str:
    """A formatted traceback with the harness's frames taken out (each traceback of a chain
    keeps them all if nothing else is left)."""
    out: List[str] = []
    segment: List[Tuple[bool, List[str]]] = []  # (hidden, lines) per frame of the traceback

    def flush() -> None:
        kept = [lines for hidden, lines in segment if not hidden]
        for lines in kept if kept else [lines for _, lines in segment]:
            out.extend(lines)
        segment.clear()

    for line in text.splitlines():
        match = FRAME_LINE.match(line)
        if match:
            segment.append((is_hidden(match["file"]), [line]))
        elif segment and line.startswith("    "):
            segment[-1][1].append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _threads(dump: str) -> List[Tuple[bool, List[Frame]]]:
    """faulthandler's thread blocks: (is the current thread, frames oldest first)."""
    threads: List[Tuple[bool, List[Frame]]] = []
    for line in dump.splitlines():
        head = _DUMP_THREAD.match(line)
        if head:
            threads.append((not line.startswith("Thread"), []))
            continue
        frame = _DUMP_FRAME.match(line)
        if frame and threads:
            threads[-1][1].insert(0, Frame(frame["file"], int(frame["line"]), frame["name"]))
    return threads


def faulthandler_frames(dump: str, crashed: bool = False) -> List[Frame]:
    """The frames (oldest first) of the stack that matters in a faulthandler dump, the one
    text the harness reads frames from: the thread that crashed (`crashed`), else the main
    thread (the one not started by `threading`); none when the dump has no thread's."""
    threads = [(current, frames) for current, frames in _threads(dump) if frames]
    if not threads:
        return []
    chosen = None
    if crashed:
        chosen = next((frames for current, frames in threads if current), None)
    if chosen is None:
        started = os.path.abspath(threading.__file__)
        chosen = next(
            (frames for _, frames in threads if frames[0].filename != started), threads[0][1]
        )
    return chosen


def from_faulthandler(dump: str, crashed: bool = False) -> str:
    """The stack that matters in a faulthandler dump, in the report's format (the dump as it
    is when it has no thread's stack)."""
    frames = faulthandler_frames(dump, crashed)
    return format_stack(frames) if frames else dump.strip()


def split_fatal_error(output: str) -> Tuple[str, str]:
    """(output without faulthandler's fatal-error dump, the dump) for a rank that crashed."""
    lines = output.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(_FATAL)), None)
    if start is None:
        return output, ""
    end = start + 1
    while end < len(lines):
        line = lines[end].rstrip("\n")
        if line.startswith("Extension modules:"):
            end += 1
            break
        if not (line == "" or line.startswith("  ") or _DUMP_THREAD.match(line)):
            break
        end += 1
    return "".join(lines[:start] + lines[end:]), "".join(lines[start:end])
