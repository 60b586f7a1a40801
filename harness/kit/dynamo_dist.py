"""Upstream's bases for compiled distributed tests (`common_distributed`'s
`DynamoDistributedSingleProcTestCase`, `DynamoDistributedMultiProcTestCase` and
`_dynamo_dist_per_rank_init`): a group around each rank's test, with TorchDynamo reset
before and after so that one test's compiled code never serves the next.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional
from unittest import mock

import torch
import torch.distributed as dist

from harness import settings
from harness.compat.dynamo import reset_dynamo, test_config
from harness.kit.fake_pg import FakeStore
from harness.process.multiprocess_case import DistributedTestBase
from harness.single_process.testcase import TestCase

__all__ = [
    "DynamoDistributedMultiProcTestCase", "DynamoDistributedSingleProcTestCase",
    "_dynamo_dist_per_rank_init",
]

# upstream's fixed rendezvous for these tests; kept where the environment names none
MASTER_ADDR = "localhost"
PER_RANK_PORT = "6789"
SINGLE_PROC_PORT = "12355"


@contextlib.contextmanager
def _dynamo_dist_per_rank_init(rank: int, world_size: int, backend: Optional[str] = None,
                               init_pg: bool = True, fake_pg: bool = False) -> Iterator[None]:
    """Inside a rank: the default group (the device's default backend, or the fake one with
    `fake_pg`), Dynamo reset around the block, the group destroyed after it."""
    device = settings.rank_device(rank)
    if not fake_pg and device.index is not None:
        torch.accelerator.set_device_index(device.index)
    if backend is None:
        backend = settings.backend_for(device)
    os.environ["MASTER_ADDR"] = MASTER_ADDR
    os.environ["MASTER_PORT"] = PER_RANK_PORT
    if init_pg:
        if fake_pg:
            dist.init_process_group(backend="fake", world_size=world_size, rank=rank,
                                    store=FakeStore())
        else:
            dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    reset_dynamo()
    try:
        yield
    finally:
        reset_dynamo()
        if init_pg:
            dist.destroy_process_group()


class DynamoDistributedSingleProcTestCase(TestCase):
    """One process, a one-rank default group for the whole class; `self.device` is device 0
    of the accelerator (the CPU where there is none), Dynamo reset around each test."""

    _exit_stack: contextlib.ExitStack

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._exit_stack = contextlib.ExitStack()
        cls._exit_stack.enter_context(test_config())
        cls._exit_stack.enter_context(mock.patch.dict(
            os.environ, {"MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": SINGLE_PROC_PORT}))
        cls.rank = 0
        device = settings.device_type()
        cls.device = f"{device}:{cls.rank}"
        cls.device_ids = None if device in cls.device else [cls.rank]
        dist.init_process_group(settings.backend_for(device), rank=cls.rank, world_size=1)

    @classmethod
    def tearDownClass(cls) -> None:
        dist.destroy_process_group()
        cls._exit_stack.close()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        reset_dynamo()

    def tearDown(self) -> None:
        reset_dynamo()
        super().tearDown()


class DynamoDistributedMultiProcTestCase(DistributedTestBase):
    """One process per accelerator; decorate tests with `@skip_if_lt_x_gpu(n)`."""

    @property
    def world_size(self) -> int:
        return torch.accelerator.device_count()
