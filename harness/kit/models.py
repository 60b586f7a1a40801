"""Small models the FSDP suites build, wrap and train: upstream common_fsdp's test models.

They keep upstream's structure, parameter counts, ``init`` signatures, inputs and losses, so a
test file written against upstream's ``common_fsdp`` builds the same models here.
Placement follows the harness device: ``DEVICE_BEFORE``/``DEVICE_AFTER`` mean "the rank's
current device", the current CUDA device on accelerators and the CPU otherwise, and on CPU the
models hand FSDP1 the CPU as its ``device_id`` (FSDP1 refuses a CPU module otherwise), so the
same test runs on both.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Tuple, Union
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, always_wrap_policy, wrap
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from harness.compat import cuda, distributed, fsdp1, fsdp_collectives
from harness.settings import device_type

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


def fsdp_kwargs_for_device(fsdp_kwargs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A copy of ``fsdp_kwargs`` that FSDP1 accepts on this machine.

    Without an accelerator FSDP1 refuses to wrap unless ``device_id`` names the CPU, so on
    CPU ``device_id`` defaults to it; on accelerators the kwargs are unchanged (upstream's).
    """
    kwargs = dict(fsdp_kwargs or {})
    if device_type() == "cpu":
        kwargs.setdefault("device_id", torch.device("cpu"))
    return kwargs


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


def _placed(layer: nn.Module, move: bool) -> nn.Module:
    return layer.to(current_device()) if move else layer


def _delay(ms: float) -> None:
    """Hold back the rank for ``ms``: its GPU stream on CUDA (as upstream), the host on CPU."""
    if ms <= 0:
        return
    if device_type() == "cuda":
        cuda.stream_sleep(ms)
    else:
        time.sleep(ms / 1000)


class FSDPTestModel(nn.Module, ABC):
    """The interface FSDP parity tests expect from a model (inputs, loss, backward, init)."""

    @abstractmethod
    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor, ...]:
        """An input for the model, as a tuple of positional arguments."""

    @abstractmethod
    def get_loss(self, input: Any, output: Any) -> torch.Tensor:
        """The loss for ``output`` computed from ``input``."""

    @abstractmethod
    def run_backward(self, loss: torch.Tensor) -> None:
        """The backward pass (``loss.backward()`` plus whatever the model adds)."""

    @staticmethod
    @abstractmethod
    def init(*args: Any, **kwargs: Any) -> nn.Module:
        """Build an instance (optionally FSDP-wrapped)."""


class NestedWrappedModule(FSDPTestModel):
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
        move = device_init_mode == DEVICEInitMode.DEVICE_BEFORE
        kwargs = fsdp_kwargs_for_device(fsdp_kwargs) if wrap_fsdp else {}

        def wrapped(layer: nn.Module) -> nn.Module:
            return FSDP(layer, group, **kwargs) if wrap_fsdp else layer

        if deterministic:
            torch.manual_seed(0)
        head = [
            _placed(nn.Linear(8, 4), move),
            wrapped(
                nn.Sequential(
                    wrapped(_placed(nn.Linear(4, 16), move)), _placed(nn.Linear(16, 16), move)
                )
            ),
        ]
        self.module = nn.Sequential(*head, *self._tail(wrapped, move))

    @staticmethod
    def _tail(wrapped: Callable[[nn.Module], nn.Module], move: bool) -> List[nn.Module]:
        """The layers after the nested block (built after it: the seeded init order counts)."""
        return [wrapped(_placed(nn.Linear(16, 4), move)), _placed(nn.Linear(4, 8), move)]

    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor]:
        """A (4, 8) batch, different per rank but the same every call.

        As upstream, it reseeds torch's global generator with ``1 + rank`` (later random
        draws, such as dropout, then also repeat across runs).
        """
        torch.manual_seed(1 + self.rank)
        return (torch.rand(4, 8, device=device),)

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
        return NestedWrappedModule._build(group, fsdp_init_mode, mode, fsdp_kwargs, deterministic)

    @classmethod
    def _build(
        cls,
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        mode: DEVICEInitMode,
        fsdp_kwargs: Optional[Dict[str, Any]],
        deterministic: bool,
    ) -> nn.Module:
        """`init` of this class and its variants: nested FSDP (no top level) or none."""
        if _check_fsdp_mode(fsdp_init_mode) == FSDPInitMode.NO_FSDP:
            return cls(group, False, mode, deterministic)
        model = cls(group, True, mode, deterministic, **(fsdp_kwargs or {}))
        if mode == DEVICEInitMode.DEVICE_AFTER:
            model = model.to(current_device())
        return model


class AlwaysWrapNestedWrappedModule(NestedWrappedModule):
    """NestedWrappedModule whose ``RECURSIVE`` init wraps every module, top level included
    (FSDP with ``always_wrap_policy`` on the default group)."""

    @staticmethod
    def init(  # type: ignore[override]
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: Optional[DEVICEInitMode] = None,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        *,
        cuda_init_mode: Optional[DEVICEInitMode] = None,
    ) -> nn.Module:
        mode = _resolve_device_mode(device_init_mode, cuda_init_mode)
        model = NestedWrappedModule.init(
            group, FSDPInitMode.NO_FSDP, mode, deterministic=deterministic
        )
        if _check_fsdp_mode(fsdp_init_mode) == FSDPInitMode.NO_FSDP:
            return model
        fsdp_model = FSDP(
            model, auto_wrap_policy=always_wrap_policy, **fsdp_kwargs_for_device(fsdp_kwargs)
        )
        if mode == DEVICEInitMode.DEVICE_AFTER:
            fsdp_model = fsdp_model.to(current_device())
        return fsdp_model


class NonUniformReqGradNWM(NestedWrappedModule):
    """NestedWrappedModule whose last two linears sit in one FSDP-wrapped Sequential and are the
    only parameters that require gradients, so some ranks hold no trainable (non-empty) shard;
    ``ShardedGradScaler`` and ``use_orig_params=True`` must cope with that."""

    REQ_GRAD_PATTERN = re.compile(r"module\.2.*\.1.*")

    @staticmethod
    def _tail(wrapped: Callable[[nn.Module], nn.Module], move: bool) -> List[nn.Module]:
        """The last two linears in one wrapped Sequential."""
        return [
            wrapped(nn.Sequential(_placed(nn.Linear(16, 4), move), _placed(nn.Linear(4, 8), move)))
        ]

    @staticmethod
    def _set_nonuniform_req_grad(model: nn.Module, req_grad_mask: re.Pattern[str]) -> None:
        for name, param in model.named_parameters():
            if not re.match(req_grad_mask, name):
                param.requires_grad_(False)

    @staticmethod
    def init(  # type: ignore[override]
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: Optional[DEVICEInitMode] = None,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        *,
        cuda_init_mode: Optional[DEVICEInitMode] = None,
    ) -> nn.Module:
        """Build it (``RECURSIVE``: nested FSDP, no top level) and freeze all but ``module.2.1``."""
        mode = _resolve_device_mode(device_init_mode, cuda_init_mode)
        model = NonUniformReqGradNWM._build(group, fsdp_init_mode, mode, fsdp_kwargs, deterministic)
        NonUniformReqGradNWM._set_nonuniform_req_grad(model, NonUniformReqGradNWM.REQ_GRAD_PATTERN)
        return model


class ModuleWithDelay(FSDPTestModel):
    """Wraps an FSDPTestModel and delays the rank after the loss and/or before each gradient
    reduce-scatter, to shake out races between computation and communication."""

    def __init__(
        self, module: nn.Module, delay_after_loss_ms: int, delay_before_reduction_ms: int
    ) -> None:
        super().__init__()
        self.delay_after_loss_ms = delay_after_loss_ms
        self.delay_before_reduction_ms = delay_before_reduction_ms
        self.module = module

    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor, ...]:
        return self.module.get_input(device)  # type: ignore[operator]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def get_loss(self, input: Any, output: Any) -> torch.Tensor:
        loss = self.module.get_loss(input, output)  # type: ignore[operator]
        _delay(self.delay_after_loss_ms)
        return loss

    def run_backward(self, loss: torch.Tensor) -> None:
        name = fsdp_collectives.reduce_scatter_name()
        orig_reduce_scatter = getattr(dist, name)

        def delayed_reduce_scatter(*args: Any, **kwargs: Any) -> Any:
            _delay(self.delay_before_reduction_ms)
            return orig_reduce_scatter(*args, **kwargs)

        with mock.patch.object(dist, name, delayed_reduce_scatter):
            self.module.run_backward(loss)  # type: ignore[operator]

    @staticmethod
    def init(  # type: ignore[override]
        module_class: type,
        *model_args: Any,
        delay_after_loss_ms: int,
        delay_before_reduction_ms: int,
        **model_kwargs: Any,
    ) -> nn.Module:
        """``module_class.init(*model_args, **model_kwargs)`` wrapped with the delays (in ms)."""
        return ModuleWithDelay(
            module_class.init(*model_args, **model_kwargs),
            delay_after_loss_ms,
            delay_before_reduction_ms,
        )


class NestedWrappedModuleWithDelay(ModuleWithDelay):
    """A NestedWrappedModule inside ModuleWithDelay (``DEVICE_AFTER`` by default, as upstream)."""

    @staticmethod
    def init(  # type: ignore[override]
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: DEVICEInitMode = DEVICEInitMode.DEVICE_AFTER,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        delay_after_loss_ms: int = 0,
        delay_before_reduction_ms: int = 0,
    ) -> nn.Module:
        return ModuleWithDelay.init(
            NestedWrappedModule,
            group=group,
            fsdp_init_mode=fsdp_init_mode,
            device_init_mode=device_init_mode,
            fsdp_kwargs=fsdp_kwargs,
            deterministic=deterministic,
            delay_after_loss_ms=delay_after_loss_ms,
            delay_before_reduction_ms=delay_before_reduction_ms,
        )


class DummyDDP(nn.Module):
    """A pass-through wrapper with DDP's ``.module`` attribute (a reference without DDP's hooks)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class MixtureOfExperts(NestedWrappedModule):
    """Linear(8, 12), a shared Linear(12, 23), a per-rank expert Linear(23, 12), Linear(12, 8).

    The expert's parameters (marked ``p.expert = True``) differ per rank and are never reduced;
    with wrapping, the expert gets an FSDP instance over a one-rank group (no sharding) and
    the shared layer one over ``group``.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        wrap_fsdp: bool,
        device_init_mode: DEVICEInitMode,
        delay_before_free_ms: int,
        deterministic: bool,
        **fsdp_kwargs: Any,
    ) -> None:
        super().__init__(
            group=group,
            wrap_fsdp=wrap_fsdp,
            device_init_mode=device_init_mode,
            deterministic=deterministic,
        )
        self.group = group
        self.delay_before_free_ms = delay_before_free_ms
        self.wrap_fsdp = wrap_fsdp
        self.move_to_device = device_init_mode == DEVICEInitMode.DEVICE_BEFORE
        if deterministic:
            torch.manual_seed(42 + self.rank)  # each rank its own expert
        d_expert, d_shared, d_input = 23, 12, 8
        expert: nn.Module = _placed(nn.Linear(d_expert, d_shared), self.move_to_device)
        self.num_expert_params = sum(p.numel() for p in expert.parameters())
        for param in expert.parameters():
            param.expert = True  # type: ignore[attr-defined]
        if deterministic:
            torch.manual_seed(0)  # everything else the same on every rank
        shared: nn.Module = _placed(nn.Linear(d_shared, d_expert), self.move_to_device)
        if wrap_fsdp:
            kwargs = fsdp_kwargs_for_device(fsdp_kwargs)
            expert_group = dist.new_group([group.rank()])  # one rank: the expert is not sharded
            expert = FSDP(expert, expert_group, **kwargs)
            shared = FSDP(shared, group, **kwargs)
        self.module = nn.Sequential(
            _placed(nn.Linear(d_input, d_shared), self.move_to_device),
            shared,
            expert,
            _placed(nn.Linear(d_shared, d_input), self.move_to_device),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = self.module[2]
        if self.delay_before_free_ms > 0 and isinstance(expert, FSDP):
            runtime = fsdp1.runtime_module()
            orig_reshard = runtime._reshard

            def delayed_reshard(*args: Any, **kwargs: Any) -> Any:
                _delay(self.delay_before_free_ms)
                return orig_reshard(*args, **kwargs)

            with mock.patch.object(runtime, "_reshard", delayed_reshard):
                return self.module(x)
        return self.module(x)

    def run_backward(self, loss: torch.Tensor) -> None:
        """Backward; without FSDP, average the non-expert gradients over ``group`` by hand."""
        loss.backward()
        if self.wrap_fsdp:
            return
        with torch.no_grad():
            for param in self.parameters():
                if hasattr(param, "expert") or param.grad is None:
                    continue
                param.grad.div_(self.world_size)
                dist.all_reduce(param.grad, group=self.group)

    @staticmethod
    def init(  # type: ignore[override]
        group: dist.ProcessGroup,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: Optional[DEVICEInitMode] = None,
        fsdp_kwargs: Optional[Dict[str, Any]] = None,
        deterministic: bool = False,
        delay_before_free_ms: int = 0,
        *,
        cuda_init_mode: Optional[DEVICEInitMode] = None,
    ) -> nn.Module:
        """Build it; ``RECURSIVE`` wraps the expert and shared layers (not the top level)."""
        mode = _resolve_device_mode(device_init_mode, cuda_init_mode)
        if _check_fsdp_mode(fsdp_init_mode) == FSDPInitMode.NO_FSDP:
            return MixtureOfExperts(group, False, mode, delay_before_free_ms, deterministic)
        model = MixtureOfExperts(
            group, True, mode, delay_before_free_ms, deterministic, **(fsdp_kwargs or {})
        )
        if mode == DEVICEInitMode.DEVICE_AFTER:
            model = model.to(current_device())
        return model


class TransformerWithSharedParams(FSDPTestModel):
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
        # Upstream's nn.Transformer builds this same encoder (same draws from the generator);
        # sequence-first inputs cannot use nested tensors, and saying so avoids a warning.
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
        self.register_buffer("vocab_bias", self.embed_tokens.weight.new_ones((self.D_MODEL,)))
        self.register_buffer("long_buffer", torch.zeros_like(self.vocab_bias, dtype=torch.long))
        self.bs = self.BATCH
        self.bn = nn.BatchNorm1d(self.BATCH) if add_bn else nn.Identity()
        if device_init_mode == DEVICEInitMode.DEVICE_BEFORE:
            self.to(current_device())
        if deterministic:
            self.eval()

    def get_input(self, device: Union[torch.device, str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Source (6 x batch) and target (4 x batch) token ids, sequence-first.

        As upstream, it reseeds torch's global generator with ``1 + rank`` so that dropout
        draws repeat across runs.
        """
        torch.manual_seed(1 + self.rank)
        src = torch.arange(12, device=device).view(6, self.BATCH)
        tgt = torch.arange(self.BATCH * 4, device=device).view(4, self.BATCH)
        return src, tgt

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        src = self.embed_tokens(src_ids)
        src = src + self.vocab_bias + self.long_buffer.type_as(src)
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
        kwargs = fsdp_kwargs_for_device(fsdp_kwargs)
        policy = kwargs.pop(
            "auto_wrap_policy",
            ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}),
        )
        hybrid = kwargs.get("sharding_strategy") in (
            ShardingStrategy.HYBRID_SHARD,
            fsdp1.hybrid_shard_zero2(),
        )
        # Hybrid sharding with a single group lets FSDP build its intra/inter-node groups.
        fsdp_group = None if hybrid and not isinstance(group, tuple) else group
        fsdp_model = FSDP(model, fsdp_group, auto_wrap_policy=policy, **kwargs)
        if mode == DEVICEInitMode.DEVICE_AFTER:
            fsdp_model = fsdp_model.to(current_device())
        return fsdp_model


class MLP(nn.Module):
    """``relu(out_proj(relu(in_proj(x))))`` (+ an optional buffer): the smallest trainable block."""

    def __init__(
        self,
        dim: int,
        device: Optional[Union[torch.device, str]] = None,
        *,
        bias: bool = True,
        with_buffer: bool = False,
        dim_multiplier: int = 4,
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
        z = F.relu(self.out_proj(F.relu(self.in_proj(x))))
        return z if self.buffer is None else z + self.buffer

    def reset_parameters(self) -> None:
        """Re-draw the buffer (the linears reset themselves); used after meta-device init."""
        if self.buffer is not None:
            nn.init.normal_(self.buffer)


class MLPStack(nn.Sequential):
    """Three MLPs (hidden x3, x4, x3: uneven shards) plus, for sequence parallelism, a LayerNorm;
    ``parallelize`` applies tensor parallelism over ``tp_mesh`` and ``fully_shard`` over
    ``dp_mesh`` (2D)."""

    def __init__(self, mlp_dim: int, *, with_seq_parallel: bool = False) -> None:
        modules: list[nn.Module] = [
            MLP(mlp_dim, dim_multiplier=3),
            MLP(mlp_dim),
            MLP(mlp_dim, dim_multiplier=3),
        ]
        if with_seq_parallel:
            modules.append(nn.LayerNorm(mlp_dim, bias=False))
        super().__init__(*modules)
        self.with_seq_parallel = with_seq_parallel

    def parallelize(
        self,
        tp_mesh: DeviceMesh,
        dp_mesh: DeviceMesh,
        use_activation_checkpointing: bool,
        **fsdp_kwargs: Any,
    ) -> MLPStack:
        """Tensor-parallel each MLP (activations stay DTensors), then shard each and the stack."""
        last_out = (
            RowwiseParallel(output_layouts=Shard(1))
            if self.with_seq_parallel
            else RowwiseParallel()
        )
        plan: Dict[str, Any] = {
            "0.in_proj": ColwiseParallel(use_local_output=False),
            "0.out_proj": RowwiseParallel(use_local_output=False),
            "1.in_proj": ColwiseParallel(use_local_output=False),
            "1.out_proj": RowwiseParallel(use_local_output=False),
            "2.in_proj": ColwiseParallel(use_local_output=False),
            "2.out_proj": last_out,
        }
        if self.with_seq_parallel:
            plan["3"] = SequenceParallel(sequence_dim=1)
        parallelize_module(self, device_mesh=tp_mesh, parallelize_plan=plan)
        for module in self:
            if isinstance(module, nn.LayerNorm):
                continue
            if use_activation_checkpointing:
                distributed.composable_checkpoint(module)
            fully_shard(module, mesh=dp_mesh, **fsdp_kwargs)
        fully_shard(self, mesh=dp_mesh, **fsdp_kwargs)
        return self


class DoubleLinear(nn.Module):
    """Two linears on the same input: two outputs (``use_second_linear=True``) or an unused
    module (``False``), for tests of multiple outputs and of unused parameters."""

    def __init__(self, dim: int, use_second_linear: bool = True) -> None:
        super().__init__()
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)
        self.relu = nn.ReLU()
        self.use_second_linear = use_second_linear

    def forward(self, x: torch.Tensor) -> Union[Tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        if self.use_second_linear:
            return self.relu(self.lin1(x)), self.relu(self.lin2(x))
        return self.relu(self.lin1(x))


class SkipModule(nn.Module):
    """A bias-free Linear(10, 10): the module wrap tests leave out of FSDP wrapping."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class NestedLinear(nn.Module):
    """A bias-free Linear(10, 10) on the test device, passed through ``wrap()`` when ``fsdp_wrap``
    (which wraps it only inside an ``enable_wrap`` context)."""

    def __init__(self, fsdp_wrap: bool) -> None:
        super().__init__()
        linear = nn.Linear(10, 10, bias=False).to(device_type())
        self.nested_linear = wrap(linear) if fsdp_wrap else linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nested_linear(x)


class SkipModel(nn.Module):
    """Linear -> SkipModule -> ``wrap()``-ed NestedLinear (itself wrapped inside when
    ``double_nest``), all on the test device: for ``enable_wrap``/``wrap`` tests."""

    def __init__(self, double_nest: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(10, 10, bias=False).to(device_type())
        self.linear_skip = SkipModule().to(device_type())
        self.nested_linear = wrap(NestedLinear(fsdp_wrap=double_nest), device_id=device_type())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nested_linear(self.linear_skip(self.linear(x)))
