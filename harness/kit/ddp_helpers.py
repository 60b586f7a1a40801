"""Helpers of upstream's c10d and DDP tests (`common_distributed`): a model that records
its inputs, devices per rank, sparse all-reduce cases, DDP's logged errors, the per-test
timeout and the module's logger.
"""

from __future__ import annotations

import functools
import logging
import operator
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn as nn

from harness import settings
from harness.requirements.decorators import TEST_HPU, TEST_XPU
from harness.settings import TIMEOUT_OVERRIDE  # the one dict the bases' timeouts read

__all__ = [
    "SaveForwardInputsModel", "SaveForwardInputsModule", "TIMEOUT_OVERRIDE", "get_timeout",
    "init_multigpu_helper", "logger", "requires_ddp_rank", "simple_sparse_reduce_tests",
    "verify_ddp_error_logged",
]

logger = logging.getLogger("harness.common_distributed")
logger.setLevel(logging.INFO)

DDP_RANK_DEVICES = ("cuda", "xpu")


def requires_ddp_rank(device: str) -> bool:
    """Whether DDP on this device type takes the rank's device (`device_ids=[rank]`)."""
    return device in DDP_RANK_DEVICES


def get_timeout(test_id: str) -> float:
    """Seconds a test may take: its override by method name, else the default (300, or
    DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, or what the file set TIMEOUT_DEFAULT to)."""
    return TIMEOUT_OVERRIDE.get(test_id.split(".")[-1], settings.TIMEOUT_DEFAULT)


class SaveForwardInputsModule(nn.Module):
    def __init__(self, forward_inputs: Dict[nn.Module, torch.Tensor],
                 cast_forward_inputs: bool) -> None:
        super().__init__()
        self.l = nn.Linear(100, 100)
        self.forward_inputs = forward_inputs
        self.cast_forward_inputs = cast_forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x)


class SaveForwardInputsModel(nn.Module):
    """Two Linear(100, 100) children; every module records its forward input in
    `forward_inputs` (mixed-precision tests check the dtype each one saw)."""

    def __init__(self, forward_inputs: Dict[nn.Module, torch.Tensor],
                 cast_forward_inputs: bool) -> None:
        super().__init__()
        self.c1 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.c2 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.forward_inputs = forward_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_inputs[self] = x
        return self.c2(self.c1(x))


def _accelerator_count() -> int:
    if TEST_HPU:
        return torch.hpu.device_count()
    if TEST_XPU:
        return torch.xpu.device_count()
    return torch.cuda.device_count()


def init_multigpu_helper(world_size: int, backend: str) -> Dict[int, List[int]]:
    """The devices of each rank: the visible ones split evenly (one each when there are at
    least as many as ranks)."""
    count = _accelerator_count()
    per_rank = count // world_size if world_size > count else 1
    visible = range(count)
    return {rank: list(visible[rank * per_rank:(rank + 1) * per_rank])
            for rank in range(world_size)}


def verify_ddp_error_logged(model_ddp: Any, err_substr: str) -> None:
    """DDP's logging data records an error containing `err_substr` (its C++ trace cut)."""
    from harness.compat.ddp import ddp_logging_data

    data = ddp_logging_data(model_ddp)
    for key in ("iteration", "has_error", "error"):
        if key not in data:
            raise AssertionError(f"Expected '{key}' in ddp_logging_data")
    expected = err_substr.split("\nException raised from ")[0]
    if expected not in data["error"]:
        raise AssertionError(
            f"Did not find expected {expected} in ddp logging data error: {data['error']}")


def _sparse_case(rank: int, world_size: int, sparse_dims: int = 1,
                 dense_dims: int = 0) -> torch.Tensor:
    """Rank r's sparse tensor: entries 0..r along the first sparse dimension, zeros along
    the others, so that any two ranks' tensors overlap."""
    indices = torch.reshape(torch.arange(rank + 1), (1, rank + 1))
    shape = [world_size] + [2] * dense_dims
    for _ in range(sparse_dims - 1):
        indices = torch.cat((indices, torch.zeros(1, rank + 1)))
        shape.append(world_size)
    values = torch.ones([rank + 1] + [2] * dense_dims)
    return torch.sparse_coo_tensor(indices, values, shape)


def simple_sparse_reduce_tests(rank: int, world_size: int,
                               num_inputs: int = 1) -> List[Tuple[List[Any], List[Any]]]:
    """(inputs of this rank, expected sums) for sparse all-reduce: 1-3 sparse dimensions,
    then 1-3 dense ones."""
    makers: List[Callable[..., torch.Tensor]] = [
        *(functools.partial(_sparse_case, sparse_dims=d) for d in (1, 2, 3)),
        *(functools.partial(_sparse_case, dense_dims=d) for d in (1, 2, 3)),
    ]
    size = num_inputs * world_size

    def total(make: Callable[..., torch.Tensor]) -> torch.Tensor:
        return functools.reduce(operator.add, [make(r, size) for r in range(size)])

    return [([make(num_inputs * rank + i, size) for i in range(num_inputs)],
             [total(make) for _ in range(num_inputs)]) for make in makers]
