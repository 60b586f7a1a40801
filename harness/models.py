"""Small models the FSDP suites build, wrap and train.

They are deliberately tiny (fast on CPU) but shaped to exercise FSDP: nested wrapping,
shared parameters, buffers of several dtypes. Placement follows the harness device:
``DEVICE_BEFORE``/``DEVICE_AFTER`` mean "the rank's current device", which is the
current CUDA device on accelerators and the CPU otherwise, so the same test runs on
both.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from harness.devices import device_type

GroupArg = Union[dist.ProcessGroup, Tuple[dist.ProcessGroup, dist.ProcessGroup]]


class FSDPInitMode(Enum):
    """Whether a model's ``init`` wraps it with FSDP."""

    NO_FSDP = 1
    RECURSIVE = 2


class DEVICEInitMode(Enum):
    """When a model moves to the rank's device relative to FSDP wrapping.

    The ``CUDA_*`` names are aliases kept for suites written against older upstream code.
    """

    DEVICE_BEFORE = 1
    DEVICE_AFTER = 2
    DEVICE_NEVER = 3
    CUDA_BEFORE = 1
    CUDA_AFTER = 2
    CUDA_NEVER = 3


CUDAInitMode = DEVICEInitMode


def current_device() -> torch.device:
    """The device ``*_BEFORE``/``*_AFTER`` move to: the current accelerator, else the CPU."""
    kind = device_type()
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, torch.cuda.current_device())


def _resolve_device_mode(
    device_init_mode: Optional[DEVICEInitMode], cuda_init_mode: Optional[DEVICEInitMode]
) -> DEVICEInitMode:
    """Accept the current keyword and the upstream ``cuda_init_mode`` spelling, not both."""
    if (device_init_mode is None) == (cuda_init_mode is None):
        raise ValueError("pass exactly one of device_init_mode or cuda_init_mode")
    mode = device_init_mode if device_init_mode is not None else cuda_init_mode
    if not isinstance(mode, DEVICEInitMode):
        raise ValueError(f"device_init_mode must be a DEVICEInitMode, got {mode!r}")
    return mode


def _check_fsdp_mode(fsdp_init_mode: Any) -> FSDPInitMode:
    if not isinstance(fsdp_init_mode, FSDPInitMode):
        raise ValueError(f"fsdp_init_mode must be an FSDPInitMode, got {fsdp_init_mode!r}")
    return fsdp_init_mode


class NestedWrappedModule(nn.Module):
    """Four linear layers in a Sequential, the middle ones wrappable with nested FSDP.

    Layout (``module``): Linear(8, 4), Sequential(Linear(4, 16), Linear(16, 16)),
    Linear(16, 4), Linear(4, 8). With wrapping, the inner Sequential, its first
    Linear and Linear(16, 4) each become an FSDP instance; the top level stays plain.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        wrap_fsdp: bool,
        device_init_mode: DEVICEInitMode,
        deterministic: bool,
        **fsdp_kwargs: Any,
    ) -> None:
        super().__init__()
        self.rank = group.rank()
        self.world_size = group.size()
        if deterministic:
            torch.manual_seed(0)
        place = device_init_mode == DEVICEInitMode.DEVICE_BEFORE
        device = current_device()

        def placed(layer: nn.Module) -> nn.Module:
            return layer.to(device) if place else layer

        def wrapped(layer: nn.Module) -> nn.Module:
            return FSDP(layer, group, **fsdp_kwargs) if wrap_fsdp else layer

        self.module = nn.Sequential(
            placed(nn.Linear(8, 4)),
            wrapped(nn.Sequential(wrapped(placed(nn.Linear(4, 16))), placed(nn.Linear(16, 16)))),
            wrapped(placed(nn.Linear(16, 4))),
            placed(nn.Linear(4, 8)),
        )

    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor]:
        """A (4, 8) batch, different per rank but the same every call."""
        generator = torch.Generator().manual_seed(1 + self.rank)
        return (torch.rand(4, 8, generator=generator).to(device),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def get_loss(self, input: Tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
        return output.sum()

    def run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @staticmethod
    def init(
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: Optional[DEVICEInitMode] = None,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        *,
        cuda_init_mode: Optional[DEVICEInitMode] = None,
    ) -> nn.Module:
        """Build the model; ``RECURSIVE`` wraps the nested layers (not the top level)."""
        mode = _resolve_device_mode(device_init_mode, cuda_init_mode)
        if _check_fsdp_mode(fsdp_init_mode) == FSDPInitMode.NO_FSDP:
            return NestedWrappedModule(group, False, mode, deterministic)
        model = NestedWrappedModule(group, True, mode, deterministic, **(fsdp_kwargs or {}))
        if mode == DEVICEInitMode.DEVICE_AFTER:
            model = model.to(current_device())
        return model


class TransformerWithSharedParams(nn.Module):
    """A tiny ``nn.Transformer`` whose output projection shares the embedding's weight.

    It also holds a float and a long buffer, and optionally a BatchNorm on the target
    embeddings, so wrapping has to deal with shared parameters and mixed buffers.
    """

    VOCAB = 23
    D_MODEL = 16
    BATCH = 2

    def __init__(
        self,
        group: dist.ProcessGroup,
        device_init_mode: DEVICEInitMode,
        add_bn: bool,
        deterministic: bool,
    ) -> None:
        super().__init__()
        self.rank = group.rank()
        self.world_size = group.size()
        if deterministic:
            torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(self.VOCAB, self.D_MODEL)
        layer = nn.TransformerEncoderLayer(self.D_MODEL, nhead=8, dim_feedforward=8, dropout=0.1)
        # Sequence-first inputs cannot use nested tensors; saying so avoids a warning per build.
        encoder = nn.TransformerEncoder(
            layer, 2, nn.LayerNorm(self.D_MODEL), enable_nested_tensor=False
        )
        self.transformer = nn.Transformer(
            d_model=self.D_MODEL,
            num_decoder_layers=2,
            dim_feedforward=8,
            dropout=0.1,
            custom_encoder=encoder,
        )
        self.output_proj = nn.Linear(self.D_MODEL, self.VOCAB)
        self.output_proj.weight = self.embed_tokens.weight
        self.register_buffer("vocab_bias", torch.ones(self.D_MODEL))
        self.register_buffer("long_buffer", torch.zeros(self.D_MODEL, dtype=torch.long))
        self.bn = nn.BatchNorm1d(self.BATCH) if add_bn else nn.Identity()
        if device_init_mode == DEVICEInitMode.DEVICE_BEFORE:
            self.to(current_device())
        if deterministic:
            self.eval()

    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Source (6 x batch) and target (4 x batch) token ids, sequence-first."""
        src = torch.arange(12, device=device).view(6, self.BATCH)
        tgt = torch.arange(self.BATCH * 4, device=device).view(4, self.BATCH)
        return src, tgt

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        src = self.embed_tokens(src_ids) + self.vocab_bias + self.long_buffer
        tgt = self.bn(self.embed_tokens(tgt_ids))
        return self.output_proj(self.transformer(src, tgt))

    def get_loss(
        self, input: Tuple[torch.Tensor, torch.Tensor], output: torch.Tensor
    ) -> torch.Tensor:
        _, tgt = input
        return F.cross_entropy(output.view(-1, output.size(-1)), tgt.view(-1), reduction="sum")

    def run_backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def get_ignored_modules(self) -> list:
        return [self.transformer]

    @staticmethod
    def init(
        group: GroupArg,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: Optional[DEVICEInitMode] = None,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        add_bn: bool = True,
        *,
        cuda_init_mode: Optional[DEVICEInitMode] = None,
    ) -> nn.Module:
        """Build the model; ``RECURSIVE`` wraps it with a top-level FSDP.

        The wrap policy defaults to one FSDP instance per encoder/decoder layer;
        ``fsdp_kwargs["auto_wrap_policy"]`` overrides it. ``group`` may be an
        (intra-node, inter-node) pair for hybrid sharding.
        """
        mode = _resolve_device_mode(device_init_mode, cuda_init_mode)
        model_group = group[0] if isinstance(group, tuple) else group
        model = TransformerWithSharedParams(model_group, mode, add_bn, deterministic)
        if _check_fsdp_mode(fsdp_init_mode) == FSDPInitMode.NO_FSDP:
            return model
        kwargs = dict(fsdp_kwargs or {})
        policy = kwargs.pop(
            "auto_wrap_policy",
            ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}),
        )
        hybrid = kwargs.get("sharding_strategy") in (
            ShardingStrategy.HYBRID_SHARD,
            ShardingStrategy._HYBRID_SHARD_ZERO2,
        )
        # Hybrid sharding with a single group lets FSDP build its intra/inter-node groups.
        fsdp_group = None if hybrid and not isinstance(group, tuple) else group
        fsdp_model = FSDP(model, fsdp_group, auto_wrap_policy=policy, **kwargs)
        if mode == DEVICEInitMode.DEVICE_AFTER:
            fsdp_model = fsdp_model.to(current_device())
        return fsdp_model


class MLP(nn.Module):
    """``out_proj(relu(in_proj(x)))`` (+ an optional buffer): the smallest trainable block."""

    def __init__(
        self,
        dim: int,
        device: Optional[Union[torch.device, str]] = None,
        with_buffer: bool = False,
        dim_multiplier: int = 4,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if dim < 1 or dim_multiplier < 1:
            raise ValueError(
                f"MLP needs dim >= 1 and dim_multiplier >= 1, got {dim} and {dim_multiplier}"
            )
        hidden = dim_multiplier * dim
        self.in_proj = nn.Linear(dim, hidden, device=device, bias=bias)
        self.out_proj = nn.Linear(hidden, dim, device=device, bias=bias)
        self.buffer: Optional[torch.Tensor]
        if with_buffer:
            self.register_buffer("buffer", torch.randn((dim,), device=device))
        else:
            self.buffer = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.out_proj(F.relu(self.in_proj(x)))
        return z if self.buffer is None else z + self.buffer

    def reset_parameters(self) -> None:
        """Re-draw the buffer (the linears reset themselves); used after meta-device init."""
        if self.buffer is not None:
            nn.init.normal_(self.buffer)
