"""How far a run is, shown while it runs: a live line on a terminal, periodic lines otherwise.

A multi-rank test can run for minutes without output; the line says which test is running
and for how long, so a hang is visible before the timeout ends it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional, TextIO

from harness import settings
from harness.outcome.report import TestReport
from harness.runner.lifecycle import STOP_SIGNALS

PROGRESS_INTERVAL_ENV = "HARNESS_PROGRESS_INTERVAL"
DEFAULT_PROGRESS_INTERVAL_S = 30.0


def progress_interval() -> float:
    """Seconds between plain progress lines: HARNESS_PROGRESS_INTERVAL, else 30."""
    interval = settings.env_seconds(PROGRESS_INTERVAL_ENV, zero_ok=True)
    return DEFAULT_PROGRESS_INTERVAL_S if interval is None else interval


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Progress:
    """How far the run is: a live line on a terminal, plain periodic lines otherwise.

    -q shows nothing; -v adds one line per finished test (a skip with its reason).
    """

    def __init__(self, total: int, stream: TextIO, verbosity: int, interval: float) -> None:
        self.total, self.stream, self.verbosity, self.interval = total, stream, verbosity, interval
        self.live = verbosity > 0 and stream.isatty()
        self.done = 0
        self.current = ""
        self._begun = self._current_since = self._last_line = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def begin(self, suites: int) -> None:
        if self.verbosity == 0:
            return
        self._print(f"running {self.total} test(s) from {suites} suite(s)")
        self._thread = threading.Thread(target=self._tick, name="harness-progress", daemon=True)
        self._thread.start()

    def _status(self) -> str:
        now = time.monotonic()
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] {_clock(now - self._begun)}"
        if self.current:
            line += f" running {self.current} ({_clock(now - self._current_since)})"
        return line

    def _live_status(self) -> str:
        """The status cut to the terminal's width, so that \r can redraw it in place."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return self._status()[: columns - 1 if columns > 20 else 200]

    def _print(self, line: str) -> None:
        with self._lock:
            if self.live:
                self.stream.write("\r\x1b[K")
            self.stream.write(line + "\n")
            if self.live:
                self.stream.write(self._live_status())
            self.stream.flush()
            self._last_line = time.monotonic()

    def _tick(self) -> None:
        # The signals that stop a run go to the main thread: one the kernel delivered to this
        # thread would be noticed only once the main thread wakes (after a test's long sleep).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        while not self._stop.wait(0.5 if self.live else min(self.interval, 1.0) or 0.05):
            if self.live:
                with self._lock:
                    self.stream.write("\r\x1b[K" + self._live_status())
                    self.stream.flush()
            elif time.monotonic() - self._last_line >= self.interval:
                self._print(self._status())

    def start(self, test_id: str) -> None:
        self.current, self._current_since = test_id, time.monotonic()

    def finish(self, record: TestReport) -> None:
        self.done += 1
        self.current = ""
        if self.verbosity == 0:
            return
        label = {"passed": "ok", "skipped": "skip", "failed": "FAIL", "error": "ERROR"}
        if self.verbosity > 1 or record.failed:
            width = len(str(self.total))
            reason = f": {record.message}" if record.status == "skipped" and record.message else ""
            self._print(
                f"[{self.done:>{width}}/{self.total}] {label[record.status]:<5} "
                f"{record.test_id} ({record.duration:.2f}s){reason}"
            )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
