"""Failure: an exception a rank raised, as data, built once in the rank from the live exception.

Everything a report says about it is read from these fields, in the parent and on the other
side of a torchrun exchange alike: the exception's class (module and qualified name, so
pytest's `xfail(raises=...)` can be matched), its line(s) as Python prints them, the frames
of its traceback (oldest first, each with its source line), every message of its chain (a
peer's absence shows in a cause, "Connection closed by peer"), and the phase of the test it
was raised in. `text`, the whole formatted traceback, is for display only: nothing is
recovered from it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from harness.compat import unittest_internals
from harness.outcome.stacks import Frame

ExcInfo = Tuple[Any, Any, Any]


@dataclass(frozen=True)
class Failure:
    """One exception of one rank (see the module's docstring)."""

    exc_module: str
    exc_qualname: str
    exception: str  # "ValueError: boom", as Python's last traceback lines say it
    frames: Tuple[Frame, ...]  # the traceback's frames, oldest first (harness frames too)
    messages: Tuple[str, ...]  # the exception line of each exception in its chain
    text: str  # the formatted traceback, for display
    is_assertion: bool  # an AssertionError's (a failure), else an error, as unittest tells
    phase: str = ""  # "setup"/"teardown": raised by the test's own fixtures in the rank

    @classmethod
    def from_exc_info(cls, exc_info: ExcInfo, phase: str = "") -> Failure:
        """The failure `exc_info` describes, its leading harness frames (unittest's hidden
        ones, `__unittest`) left out as unittest leaves them out."""
        exctype, value, tb = exc_info
        while tb is not None and unittest_internals.hidden_by_unittest(tb.tb_frame):
            tb = tb.tb_next
        return cls(
            exc_module=getattr(exctype, "__module__", "builtins") or "builtins",
            exc_qualname=getattr(exctype, "__qualname__", str(exctype)),
            exception=_exception_line(exctype, value),
            frames=tuple(
                Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
                for f in traceback.extract_tb(tb)
            ),
            messages=tuple(_chain_lines(value)),
            text="".join(traceback.format_exception(exctype, value, tb)),
            is_assertion=exctype is not None and issubclass(exctype, AssertionError),
            phase=phase,
        )

    @classmethod
    def of_message(cls, message: str) -> Failure:
        """A failure found after the test, with no exception to read (a leak): its message."""
        line = message.strip()
        return cls("", "", line, (), (line,), message, is_assertion=False)

    def to_data(self) -> Dict[str, Any]:
        """As JSON data (a torchrun rank's record crosses to its peers as JSON)."""
        return {
            "exc_module": self.exc_module, "exc_qualname": self.exc_qualname,
            "exception": self.exception, "frames": [list(f) for f in self.frames],
            "messages": list(self.messages), "text": self.text,
            "is_assertion": self.is_assertion, "phase": self.phase,
        }

    @classmethod
    def from_data(cls, data: Dict[str, Any]) -> Failure:
        return cls(
            data["exc_module"], data["exc_qualname"], data["exception"],
            tuple(Frame(*f) for f in data["frames"]), tuple(data["messages"]), data["text"],
            data["is_assertion"], data["phase"],
        )


def _exception_line(exctype: Any, value: Any) -> str:
    """The exception's own line(s), as a traceback ends: `Type: message` (a SyntaxError's
    location lines, which Python prints first, left out: they are where, not what)."""
    lines = "".join(traceback.format_exception_only(exctype, value)).rstrip().splitlines()
    start = 0
    while start < len(lines) - 1 and lines[start].startswith(('  File "', "    ")):
        start += 1
    return "\n".join(lines[start:]).strip()


def _chain_lines(value: Optional[BaseException]) -> List[str]:
    """The exception line of `value`, of each cause or context before it, and of each
    exception an exception group holds."""
    lines: List[str] = []
    todo, seen = [value], set()
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        lines.append(_exception_line(type(current), current))
        todo.append(current.__cause__ or (
            None if current.__suppress_context__ else current.__context__))
        held = getattr(current, "exceptions", None)  # an exception group's (Python 3.11+)
        if isinstance(held, tuple):
            todo.extend(e for e in held if isinstance(e, BaseException))
    return lines
