"""Upstream's models for composable-API tests (`common_dist_composable`): Linear/ReLU
stacks on a given device, with parameters created in upstream's order (so that a seed gives
the same values)."""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["CompositeModel", "CompositeParamModel", "FakeSequential", "NestedSequentialModel",
           "UnitModule", "UnitParamModule"]

WIDTH = 100


def _linear(device: torch.device, inputs: int = WIDTH, outputs: int = WIDTH,
            bias: bool = True) -> nn.Linear:
    return nn.Linear(inputs, outputs, bias=bias, device=device)


class UnitModule(nn.Module):
    """l1 -> (ReLU, Linear, ReLU) -> l2, all 100 wide."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.l1 = _linear(device)
        self.seq = nn.Sequential(nn.ReLU(), _linear(device), nn.ReLU())
        self.l2 = _linear(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.seq(self.l1(x)))


class CompositeModel(nn.Module):
    """l1 -> UnitModule u1 -> UnitModule u2 -> l2."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.l1 = _linear(device)
        self.u1 = UnitModule(device)
        self.u2 = UnitModule(device)
        self.l2 = _linear(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.u2(self.u1(self.l1(x))))


class UnitParamModule(nn.Module):
    """l -> (ReLU, Linear, ReLU), multiplied by a 100x100 parameter `p`."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.l = _linear(device)
        self.seq = nn.Sequential(nn.ReLU(), _linear(device), nn.ReLU())
        self.p = nn.Parameter(torch.randn((WIDTH, WIDTH), device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.seq(self.l(x)), self.p)


class CompositeParamModel(nn.Module):
    """l -> u1 -> u2, multiplied by parameter `p`; also a persistent buffer `buffer`."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.l = _linear(device)
        self.u1 = UnitModule(device)
        self.u2 = UnitModule(device)
        self.p = nn.Parameter(torch.randn((WIDTH, WIDTH), device=device))
        self.register_buffer("buffer", torch.randn((WIDTH, WIDTH), device=device),
                             persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.u2(self.u1(self.l(x))), self.p)


class FakeSequential(nn.Module):
    """Runs its modules in order without registering them as children (a wrap-policy test
    needs a sequence that is not an nn.Sequential)."""

    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self._module_sequence = list(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self._module_sequence:
            x = module(x)
        return x


class NestedSequentialModel(nn.Module):
    """Nested Sequential/FakeSequential structure for traversal-order tests (as upstream's,
    it has no usable forward)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.seq1 = nn.Sequential(
            _linear(device, 1, 1),
            FakeSequential(_linear(device, 1, 1), nn.ReLU(),
                           FakeSequential(_linear(device, 1, 1)), nn.ReLU()),
            _linear(device, 1, 2),
        )
        self.lin = _linear(device, 2, 2)
        self.seq2 = nn.Sequential(
            nn.ReLU(), _linear(device, 2, 3),
            FakeSequential(_linear(device, 3, 2, bias=False), _linear(device, 2, 4, bias=False)),
        )
