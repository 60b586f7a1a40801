"""harness/pytest_plugin/captures.py: pytest's capture, log and warning fixtures as a rank
builds them (here in this process: they act on the process that makes them)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

from harness.pytest_plugin import captures


def test_capsys_captures_and_passes_on_what_was_not_read(capsys: pytest.CaptureFixture) -> None:
    fixture = captures.make("capsys")
    print("one")
    sys.stderr.write("err\n")
    assert fixture.readouterr() == ("one\n", "err\n")
    assert fixture.readouterr().out == ""
    with fixture.disabled():
        print("straight through")
    print("unread")
    fixture.close()
    assert capsys.readouterr().out == "straight through\nunread\n"


def test_capfd_captures_file_descriptors(capfd: pytest.CaptureFixture) -> None:
    fixture = captures.make("capfd")
    os.write(1, b"fd one\n")
    os.write(2, b"fd two\n")
    result = fixture.readouterr()
    assert (result.out, result.err) == ("fd one\n", "fd two\n")
    os.write(1, b"left\n")
    fixture.close()
    assert capfd.readouterr().out == "left\n"


def test_caplog_records_and_restores_levels() -> None:
    fixture = captures.make("caplog")
    logger = logging.getLogger("harness.test.caplog")
    before = logger.level
    fixture.set_level(logging.DEBUG, logger="harness.test.caplog")
    logger.debug("debug %s", 1)
    with fixture.at_level(logging.ERROR, logger="harness.test.caplog"):
        logger.warning("not recorded")
    assert fixture.messages == ["debug 1"]
    assert fixture.record_tuples == [("harness.test.caplog", logging.DEBUG, "debug 1")]
    assert "debug 1" in fixture.text
    fixture.clear()
    assert fixture.records == [] and fixture.text == ""
    fixture.close()
    assert logger.level == before and fixture.handler not in logging.getLogger().handlers


def test_recwarn_records_every_warning_and_pops_by_class() -> None:
    fixture = captures.make("recwarn")
    warnings.warn("a", DeprecationWarning, stacklevel=1)
    warnings.warn("b", UserWarning, stacklevel=1)
    assert len(fixture) == 2
    assert str(fixture.pop(UserWarning).message) == "b"
    with pytest.raises(AssertionError, match="not found"):
        fixture.pop(UserWarning)
    fixture.clear()
    assert list(fixture) == []
    fixture.close()


def test_monkeypatch_is_undone_by_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_CAPTURE_PROBE", raising=False)
    fixture = captures.make("monkeypatch")
    fixture.setenv("HARNESS_CAPTURE_PROBE", "1")
    fixture.close()
    assert "HARNESS_CAPTURE_PROBE" not in os.environ
