"""Warning capture that works when ranks are threads of one process.

`warnings.catch_warnings` (and so unittest's `assertWarns`/`assertWarnsRegex`) saves and
restores the process-wide filters and `showwarning`. Two rank threads doing that at once
undo each other: one thread's exit restores filters under the other, whose warning is then
swallowed as "already shown". While a threaded test runs, `per_thread_warnings()` gives each
thread its own `catch_warnings` blocks: filters set inside a block apply to that thread only,
every warning is let through the process-wide filters, and a hook hands it to the issuing
thread's innermost recording block (or shows it as usual when there is none).
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from typing import Any, Callable, Iterator, List, Optional, Tuple

Filter = Tuple[str, Optional["re.Pattern[str]"], type]

_blocks = threading.local()  # .stack: this thread's open ThreadCatchWarnings, outermost first


def _open_blocks() -> List[ThreadCatchWarnings]:
    return _blocks.__dict__.setdefault("stack", [])


class ThreadCatchWarnings:
    """Stands in for `warnings.catch_warnings` while a threaded test runs: one thread's block."""

    def __init__(self, *, record: bool = False, action: Optional[str] = None,
                 category: type = Warning, **_ignored: Any) -> None:
        self.log: Optional[List[warnings.WarningMessage]] = [] if record else None
        self.filters: List[Filter] = []  # newest first, as in warnings.filters
        if action is not None:
            self.filters.append((action, None, category))

    def __enter__(self) -> Optional[List[warnings.WarningMessage]]:
        _open_blocks().append(self)
        return self.log

    def __exit__(self, *exc_info: Any) -> None:
        _open_blocks().remove(self)


def _thread_action(message: Any, category: type) -> Optional[str]:
    """The action of the newest filter of this thread's blocks that matches, if any."""
    text = str(message)
    for block in reversed(_open_blocks()):
        for action, pattern, filter_category in block.filters:
            if issubclass(category, filter_category) and (pattern is None or pattern.match(text)):
                return action
    return None


class _RestoredMarker(Warning):
    """Never issued; a filter for it is added and removed to mark the filters as changed."""


@contextlib.contextmanager
def per_thread_warnings(divert: Optional[Callable[[str], bool]] = None) -> Iterator[None]:
    """Give each thread its own warning blocks and filters until the context ends. A warning
    no block records is offered, formatted, to `divert` (True: it took it), else shown."""
    saved = (warnings.filters[:], warnings.showwarning, warnings.catch_warnings,
             warnings.simplefilter, warnings.filterwarnings)
    _, show_original, _, simplefilter_original, filterwarnings_original = saved

    def simplefilter(action: str, category: type = Warning, lineno: int = 0,
                     append: bool = False) -> None:
        blocks = _open_blocks()
        if not blocks:
            return simplefilter_original(action, category, lineno, append)
        entry = (action, None, category)
        blocks[-1].filters.insert(len(blocks[-1].filters) if append else 0, entry)

    def filterwarnings(action: str, message: str = "", category: type = Warning,
                       module: str = "", lineno: int = 0, append: bool = False) -> None:
        blocks = _open_blocks()
        if not blocks:
            return filterwarnings_original(action, message, category, module, lineno, append)
        entry = (action, re.compile(message, re.I) if message else None, category)
        blocks[-1].filters.insert(len(blocks[-1].filters) if append else 0, entry)

    def show(message: Any, category: type, filename: str, lineno: int,
             file: Any = None, line: Optional[str] = None) -> None:
        action = _thread_action(message, category)
        if action == "ignore":
            return
        if action == "error":
            raise message if isinstance(message, Warning) else category(message)
        log = next((b.log for b in reversed(_open_blocks()) if b.log is not None), None)
        if log is not None:
            log.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        elif divert is None or not divert(
            warnings.formatwarning(message, category, filename, lineno, line)
        ):
            show_original(message, category, filename, lineno, file, line)

    simplefilter_original("always")
    warnings.showwarning = show
    warnings.catch_warnings = ThreadCatchWarnings  # type: ignore[misc]
    warnings.simplefilter = simplefilter  # type: ignore[assignment]
    warnings.filterwarnings = filterwarnings  # type: ignore[assignment]
    try:
        yield
    finally:
        (filters, warnings.showwarning, warnings.catch_warnings,
         warnings.simplefilter, warnings.filterwarnings) = saved
        warnings.filters[:] = filters
        warnings.simplefilter("default", _RestoredMarker)  # bumps the filters' version ...
        warnings.filters.pop(0)  # ... so registries forget what they saw under "always"
