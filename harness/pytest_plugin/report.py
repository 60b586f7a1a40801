"""A multi-rank failure laid out by pytest itself: the lead rank's frames as a real traceback
(every `--tb` style, `__tracebackhide__`, source lines), then the other ranks and the
collectives as sections. Used for the harness's classes and marked functions alike.
"""

from __future__ import annotations

import ast
import functools
import importlib
import linecache
import sys
import sysconfig
from types import TracebackType
from typing import Any, List, Optional, Tuple

import pytest

from harness.outcome import stacks
from harness.outcome.report import RankReport
from harness.outcome.stacks import Frame


def longrepr(item: pytest.Item, lead: RankReport) -> Any:
    """pytest's own layout of the failure: the lead's frames as a traceback, then sections."""
    frames = lead.frames
    if lead.hang:  # a hang points at the user's line the rank waits in
        frames = _without_library_tail(frames)
    frames = frames or [_test_frame(item)]
    error = _labelled_error(lead.label, lead.message)
    try:
        tb = _traceback(frames, error)
    except Exception:  # a frame that cannot be stood up: keep pytest's own report of it
        return None
    error.__traceback__ = tb
    longrepr: Any = item.repr_failure(pytest.ExceptionInfo.from_exc_info((type(error), error, tb)))
    if hasattr(longrepr, "addsection"):
        for title, text in lead.sections:
            if not title:
                title, _, text = text.partition("\n")
            longrepr.addsection(title.rstrip(":"), stacks.clean_traceback(text))
    return longrepr


def _without_library_tail(frames: List[Frame]) -> List[Frame]:
    """The frames up to the last one of the user's code (not the stdlib's or an installed
    package's), when there is one."""
    libraries = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    last = max((i for i, f in enumerate(frames) if not f.filename.startswith(libraries)),
               default=None)
    return frames if last is None else frames[: last + 1]


def _labelled_error(label: str, message: str) -> Exception:
    """An exception shown as `<label>: <message>`, e.g. `rank 1: AssertionError: boom`."""
    cls = type(label, (Exception,), {"__module__": "builtins"})
    cls.__qualname__ = label
    return cls(message)


def _test_frame(item: pytest.Item) -> Frame:
    """Where the test is defined, at its `def` line (its decorators above it): the frame a
    report points at when the ranks gave none (a crash, an exit)."""
    path, lineno, _ = item.reportinfo()
    name = getattr(item, "originalname", None) or item.name
    line = (lineno or 0) + 1  # pytest's is 0-based, at the first decorator
    found = [d for first, d, _, n in _functions(str(path)) if n == name and first <= line <= d]
    return Frame(str(path), min(found) if found else line, name)


def _traceback(frames: List[Frame], error: BaseException) -> Optional[TracebackType]:
    """A traceback of real frame objects standing at the given lines of the given files, so
    that pytest (source, `--tb` styles, `__tracebackhide__`) and `traceback` show them as if
    the error had been raised here; the frames have no locals."""
    tb: Optional[TracebackType] = None
    for frame in reversed(frames):
        one = _one_frame(frame, error)
        tb = TracebackType(tb, one.tb_frame, one.tb_lasti, one.tb_lineno)
    return tb


def _one_frame(frame: Frame, error: BaseException) -> TracebackType:
    line = linecache.getline(frame.filename, frame.lineno)
    indent = len(line) - len(line.lstrip())
    # The raise spans the line's text: Python then draws no carets under part of it.
    statement = "raise (__error" + " " * max(0, len(line.strip()) - 15) + ")"
    first = _function_start(frame.filename, frame.lineno, frame.name)
    namespace = {"__error": error, "__name__": "__harness_rank__"}
    if first is not None:  # a function's frame shows the function's lines, not the module's
        if first < frame.lineno:
            source = (
                "\n" * (first - 1) + "def _f():\n" + "\n" * (frame.lineno - first - 1)
                + " " * max(indent, 1) + statement + "\n"
            )
        else:  # at the function's first line (a one-line function, a `def` undecorated)
            source = "\n" * (first - 1) + "def _f(): " + statement + "\n"
        exec(compile(source, frame.filename, "exec"), namespace)
        function = namespace["_f"]
        names = {"co_name": frame.name}
        if hasattr(function.__code__, "co_qualname"):  # Python 3.11+
            names["co_qualname"] = frame.name
        function.__code__ = function.__code__.replace(**names)
        call: Any = function
    else:
        code = compile("\n" * (frame.lineno - 1) + statement, frame.filename, "exec")
        code = code.replace(co_name=frame.name)
        call = functools.partial(exec, code, namespace)
    try:
        call()
    except BaseException:
        tb = sys.exc_info()[2]
    assert tb is not None and tb.tb_next is not None
    return tb.tb_next


def _function_start(filename: str, lineno: int, name: str) -> Optional[int]:
    """The first line (decorators included) of the innermost function `name` around `lineno`."""
    spans = [(a, b) for a, _, b, n in _functions(filename) if n == name and a <= lineno <= b]
    return max(spans)[0] if spans else None


@functools.lru_cache(maxsize=64)
def _functions(filename: str) -> Tuple[Tuple[int, int, int, str], ...]:
    """Each function of the file: (first line with its decorators, `def` line, last line,
    name)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return ()
    return tuple(
        (min([node.lineno] + [d.lineno for d in node.decorator_list]), node.lineno,
         node.end_lineno or node.lineno, node.name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def as_raised_in_the_rank(
    error: BaseException, lead: Optional[RankReport], item: pytest.Item
) -> BaseException:
    """`error` (a multi-rank failure, led by `lead`) as an instance of the lead rank's exception
    class, where the test's `xfail(raises=...)` names that class or a base of it (pytest checks
    the raised exception's type); `error` itself otherwise."""
    raises = [mark.kwargs["raises"] for mark in item.iter_markers("xfail")
              if mark.kwargs.get("raises") is not None]
    if not raises or lead is None or not lead.exc_class[1]:
        return error
    cls = _exception_class(*lead.exc_class)
    if cls is None or not any(issubclass(cls, expected) for expected in raises):
        return error
    try:
        twin = cls.__new__(cls, *error.args)
        twin.__dict__.update(vars(error))  # the report in parts it carries
    except Exception:  # a class that cannot be stood up so: pytest judges the failure as is
        return error
    return twin.with_traceback(error.__traceback__)


def _exception_class(module: str, qualname: str) -> Optional[type]:
    """The exception class a rank raised, found here by its module and qualified name (None
    where it cannot be: a class local to a function, a module this process lacks)."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None
