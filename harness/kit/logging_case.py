"""Upstream's `logging_utils.LoggingTestCase`: a base for tests of torch's structured
logging (TORCH_LOGS) that collects the records torch's loggers emit during a block and finds
them by message."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, List, Optional
from unittest import mock

from harness.compat.dynamo import reset_dynamo
from harness.compat.torch_logging import (
    dynamo_log_test_patches,
    registered_log_names,
    reset_log_state,
)
from harness.single_process.testcase import TestCase

__all__ = ["LoggingTestCase"]


class LoggingTestCase(TestCase):
    """Dynamo reset around each test; for the class, compiled-code errors suppressed and
    torch's logs reset afterwards. `_handler_watcher(records)` appends every record torch's
    registered loggers emit inside the block to `records`."""

    _exit_stack: contextlib.ExitStack

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._exit_stack = contextlib.ExitStack()
        cls._exit_stack.enter_context(mock.patch.dict(os.environ, {"___LOG_TESTING": ""}))
        for patch in dynamo_log_test_patches():
            cls._exit_stack.enter_context(patch)  # type: ignore[arg-type]

    @classmethod
    def tearDownClass(cls) -> None:
        cls._exit_stack.close()
        reset_log_state()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        reset_dynamo()

    def tearDown(self) -> None:
        reset_dynamo()
        super().tearDown()

    def hasRecord(self, records: List[logging.LogRecord], m: str) -> bool:  # noqa: N802
        return any(m in record.getMessage() for record in records)

    def getRecord(self, records: List[logging.LogRecord], m: str) -> logging.LogRecord:  # noqa: N802
        """The one record whose message contains `m` (fails on none or several)."""
        found: Optional[logging.LogRecord] = None
        for record in records:
            if m in record.getMessage():
                self.assertIsNone(
                    found, msg=f"multiple matching records: {found} and {record} among {records}")
                found = record
        if found is None:
            self.fail(f"did not find record with {m} among {records}")
        return found

    def _handler_watcher(self, record_list: List[logging.LogRecord]) -> contextlib.ExitStack:
        """Patch the emit of each handler of torch's registered loggers to also append the
        record to `record_list` (until the returned stack is closed)."""
        stack = contextlib.ExitStack()
        for name in registered_log_names():
            logger = logging.getLogger(name)
            count = len(logger.handlers)
            self.assertLessEqual(count, 2, "All pt2 loggers should only have at most two "
                                 "handlers (debug artifacts and messages above debug level).")
            self.assertGreater(count, 0, "All pt2 loggers should have more than zero handlers")
            for handler in logger.handlers:
                stack.enter_context(mock.patch.object(handler, "emit",
                                                      _also_collect(handler.emit, record_list)))
        return stack


def _also_collect(emit: Any, records: List[logging.LogRecord]) -> Any:
    def new_emit(record: logging.LogRecord) -> None:
        emit(record)
        records.append(record)

    return new_emit
