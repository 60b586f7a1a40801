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
from typing import Any, Dict, Optional, Tuple

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
            exception="".join(traceback.format_exception_only(exctype, value)).strip(),
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


def _chain_lines(value: Optional[BaseException]) -> list:
    """The exception line of `value` and of each cause or context before it."""
    lines, seen = [], set()
    while value is not None and id(value) not in seen:
        seen.add(id(value))
        lines.append("".join(traceback.format_exception_only(type(value), value)).strip())
        value = value.__cause__ or (None if value.__suppress_context__ else value.__context__)
    return lines
