"""pytest's capture, log and warning fixtures, as a rank builds them for its own code.

pytest's `capsys`, `capfd`, `caplog` and `recwarn` belong to the pytest process and see only
what happens there; a ranked test asking for them gets these instead, made in the rank
(harness/pytest_plugin/in_rank.py) and undone there when the test ends. They keep pytest's
API (`readouterr()` with `.out`/`.err`, `disabled()`, `records`, `text`, `messages`,
`record_tuples`, `set_level`, `at_level`, `clear`, `pop`, `list`). What a capture took and
the test did not read goes on to the rank's output when it ends, so a failure's report still
shows it, as pytest shows a test's uncollected output.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple, Type, Union


class CaptureResult(NamedTuple):
    """What `readouterr()` returns, as pytest's: `out`, `err` (also unpackable)."""

    out: str
    err: str


class SysCapture:
    """`capsys` in a rank: `sys.stdout` and `sys.stderr` captured while the test runs."""

    def __init__(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        self._out, self._err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = self._out, self._err

    def readouterr(self) -> CaptureResult:
        """What was written since the last call (or the start)."""
        result = CaptureResult(self._out.getvalue(), self._err.getvalue())
        for stream in (self._out, self._err):
            stream.seek(0)
            stream.truncate()
        return result

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Write to the rank's real streams inside the block."""
        sys.stdout, sys.stderr = self._saved
        try:
            yield
        finally:
            sys.stdout, sys.stderr = self._out, self._err

    def close(self) -> None:
        rest = self.readouterr()
        sys.stdout, sys.stderr = self._saved
        sys.stdout.write(rest.out)
        sys.stderr.write(rest.err)


class FdCapture:
    """`capfd` in a rank: file descriptors 1 and 2 (so C++ and child processes too)."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
        self._saved = [os.dup(1), os.dup(2)]
        self._read = [0, 0]
        self._redirect()

    def _redirect(self) -> None:
        for fd, target in zip((1, 2), self._files):
            os.dup2(target.fileno(), fd)

    def _restore(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)

    def readouterr(self) -> CaptureResult:
        """What was written to fds 1 and 2 since the last call (or the start)."""
        sys.stdout.flush()
        sys.stderr.flush()
        texts = []
        for i, target in enumerate(self._files):
            target.seek(self._read[i])
            data = target.read()
            self._read[i] += len(data)
            texts.append(data.decode(errors="replace"))
        return CaptureResult(*texts)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Write to the rank's real descriptors inside the block."""
        self._restore()
        try:
            yield
        finally:
            self._redirect()

    def close(self) -> None:
        rest = self.readouterr()
        self._restore()
        for fd, text in zip((1, 2), rest):
            os.write(fd, text.encode())
        for handle in (*self._saved,):
            os.close(handle)
        for target in self._files:
            target.close()


LOG_FORMAT = "%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s"  # pytest's


class _RecordsHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=0)
        self.records: List[logging.LogRecord] = []
        self.stream = io.StringIO()
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.stream.write(self.format(record) + "\n")


class LogCapture:
    """`caplog` in a rank: the log records the rank's code emits while the test runs."""

    def __init__(self) -> None:
        self.handler = _RecordsHandler()
        self._levels: Dict[Optional[str], int] = {}
        logging.getLogger().addHandler(self.handler)

    @property
    def records(self) -> List[logging.LogRecord]:
        return self.handler.records

    @property
    def text(self) -> str:
        return self.handler.stream.getvalue()

    @property
    def messages(self) -> List[str]:
        return [record.getMessage() for record in self.records]

    @property
    def record_tuples(self) -> List[Tuple[str, int, str]]:
        return [(r.name, r.levelno, r.getMessage()) for r in self.records]

    def clear(self) -> None:
        self.handler.records.clear()
        self.handler.stream = io.StringIO()

    def set_level(self, level: Union[int, str], logger: Optional[str] = None) -> None:
        """Set the level of `logger` (the root logger by default) until the test ends."""
        target = logging.getLogger(logger)
        self._levels.setdefault(logger, target.level)
        target.setLevel(level)
        self.handler.setLevel(level)

    @contextlib.contextmanager
    def at_level(self, level: Union[int, str], logger: Optional[str] = None) -> Iterator[None]:
        """The level of `logger` set inside the block only."""
        target = logging.getLogger(logger)
        saved, saved_handler = target.level, self.handler.level
        target.setLevel(level)
        self.handler.setLevel(level)
        try:
            yield
        finally:
            target.setLevel(saved)
            self.handler.setLevel(saved_handler)

    def close(self) -> None:
        logging.getLogger().removeHandler(self.handler)
        for logger, level in self._levels.items():
            logging.getLogger(logger).setLevel(level)


class WarningsRecorder:
    """`recwarn` in a rank: every warning the rank's code emits while the test runs."""

    def __init__(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self.list: List[warnings.WarningMessage] = self._catcher.__enter__()
        warnings.simplefilter("always")

    def __len__(self) -> int:
        return len(self.list)

    def __iter__(self) -> Iterator[warnings.WarningMessage]:
        return iter(self.list)

    def __getitem__(self, index: int) -> warnings.WarningMessage:
        return self.list[index]

    def pop(self, cls: Type[Warning] = Warning) -> warnings.WarningMessage:
        """The first recorded warning of class `cls`, taken out of the list."""
        for i, message in enumerate(self.list):
            if issubclass(message.category, cls):
                return self.list.pop(i)
        raise AssertionError(f"{cls!r} not found in warning list")

    def clear(self) -> None:
        self.list[:] = []

    def close(self) -> None:
        self._catcher.__exit__(None, None, None)


def make(name: str) -> Any:
    """A new rank-side `name` fixture (one of in_rank's builtins); `.close()` undoes it."""
    if name == "monkeypatch":
        import pytest

        patch = pytest.MonkeyPatch()
        patch.close = patch.undo  # type: ignore[attr-defined]
        return patch
    kinds = {"capsys": SysCapture, "capfd": FdCapture, "caplog": LogCapture,
             "recwarn": WarningsRecorder}
    return kinds[name]()
