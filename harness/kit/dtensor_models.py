"""The models upstream's DTensor / tensor-parallel tests build (common_dtensor).

Structure, parameter names and shapes, initialisation order (so the same seed gives the
same weights) and inputs are upstream's: tests written against them compare numbers and
parameter counts. `Transformer.parallelize` applies upstream's tensor-parallel plan
(with sequence parallelism and expert parallelism as options).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from harness.compat import local_tensor as compat_local_tensor


class RMSNormPython(nn.Module):
    """RMSNorm written out in Python ops (upstream tests shard it as a custom norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x) * self.weight


class MLPModule(nn.Module):
    """Linear(10, 16) -> ReLU -> Linear(16, 10), seeded with 5 so every rank builds the same."""

    def __init__(self, device: Any, bias: bool = True) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.net1 = nn.Linear(10, 16, bias=bias, device=device)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10, bias=bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))

    def reset_parameters(self) -> None:
        self.net1.reset_parameters()
        self.net2.reset_parameters()


class MLPStacked(nn.Module):
    """`n_layers` MLPModules in a ModuleList named `layers`."""

    def __init__(self, device: Any, n_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MLPModule(device) for _ in range(n_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass
class ModelArgs:
    """Transformer sizes and switches (upstream's defaults: a tiny 2-layer model)."""

    n_layers: int = 2
    vocab_size: int = 8
    max_seq_len: int = 16
    dim: int = 16
    n_heads: int = 4
    dropout_p: float = 0.1
    use_attn_mask: bool = True
    weight_tying: bool = True
    checkpoint_activations: bool = False
    num_experts: int = 0


class Attention(nn.Module):
    """Multi-head causal self-attention with bias-free q/k/v/o projections."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.dim % args.n_heads != 0:
            raise AssertionError(
                f"Expected args.dim % args.n_heads == 0, got {args.dim} % {args.n_heads}"
            )
        self.head_dim = args.dim // args.n_heads
        self.n_heads = args.n_heads
        self.dropout_p = args.dropout_p
        self.resid_dropout = nn.Dropout(args.dropout_p)
        self.use_attn_mask = args.use_attn_mask
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def _heads(self, x: torch.Tensor, bsz: int, seq_len: int) -> torch.Tensor:
        # n_heads may be the per-rank count after parallelize(local_output_for_attn=True)
        return x.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.size()
        queries = self._heads(self.wq(x), bsz, seq_len)
        keys = self._heads(self.wk(x), bsz, seq_len)
        values = self._heads(self.wv(x), bsz, seq_len)
        output = F.scaled_dot_product_attention(
            queries, keys, values, None,
            self.dropout_p if self.training else 0,
            self.use_attn_mask,
        )
        output = output.transpose(1, 2).reshape(bsz, seq_len, -1)
        return self.resid_dropout(self.wo(output))


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear -> Dropout."""

    def __init__(self, dim: int, hidden_dim: int, dropout_p: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(hidden_dim, dim)
        self.resid_dropout = nn.Dropout(dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.w2(self.gelu(self.w1(x))))


class Experts(nn.Module):
    """`num_experts` GELU MLPs held as two batched weights; every token goes through all."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.reset_parameters()
        self.gelu = nn.GELU()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w1, std=0.02)
        nn.init.normal_(self.w2, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Sharded weights are DTensors while x arrives as a plain tensor: use local shards.
        w1, w2 = self.w1, self.w2
        if isinstance(w1, DTensor):
            w1, w2 = w1.to_local(), w2.to_local()
        x_per_expert = x.unsqueeze(0).expand(w1.shape[0], -1, -1)
        hidden = self.gelu(torch.bmm(x_per_expert, w1.transpose(-2, -1)))
        return torch.bmm(hidden, w2.transpose(-2, -1)).sum(dim=0)


class ExpertLayer(nn.Module):
    """Experts over flattened tokens, averaged over the experts."""

    def __init__(self, num_experts: int, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.experts = Experts(dim=dim, hidden_dim=hidden_dim, num_experts=num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, slen, dim = x.shape
        out = self.experts(x.view(-1, dim)) / self.num_experts
        return out.view(bs, slen, dim)


class TensorParallelForExpert(ParallelStyle):
    """Tensor parallelism for Experts: w1 column-wise (Shard(1)), w2 row-wise (Shard(2)).

    With sequence parallelism pass input_layouts=Shard(0) and output_layouts=Shard(0):
    tokens are all-gathered before and reduce-scattered after.
    """

    def __init__(self, *, input_layouts: Any = None, output_layouts: Any = None) -> None:
        super().__init__()
        self.input_layouts = input_layouts
        self.output_layouts = output_layouts or Replicate()

    def _partition_fn(self, name: str, mod: nn.Module, device_mesh: DeviceMesh) -> None:
        shard_dims = {"w1": 1, "w2": 2}
        for param_name, param in list(mod.named_parameters(recurse=False)):
            if param_name in shard_dims:
                placement = [Shard(shard_dims[param_name])]
                mod.register_parameter(
                    param_name, nn.Parameter(distribute_tensor(param, device_mesh, placement))
                )

    def _input_fn(self, mod: nn.Module, inputs: Tuple[Any, ...], device_mesh: DeviceMesh) -> Any:
        if self.input_layouts is None:
            return inputs
        x = DTensor.from_local(inputs[0], device_mesh, [self.input_layouts])
        return (x.redistribute(device_mesh, [Replicate()]).to_local(),)

    def _output_fn(self, mod: nn.Module, outputs: torch.Tensor, device_mesh: DeviceMesh) -> Any:
        partial = DTensor.from_local(outputs, device_mesh, [Partial()])
        return partial.redistribute(device_mesh, [self.output_layouts]).to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh,
            partition_fn=self._partition_fn, input_fn=self._input_fn, output_fn=self._output_fn,
        )


class ExpertParallel(ParallelStyle):
    """Experts split across ranks (Shard(0)); tokens all-gathered in, reduce-scattered out."""

    def _partition_fn(self, name: str, mod: nn.Module, device_mesh: DeviceMesh) -> None:
        for param_name, param in list(mod.named_parameters(recurse=False)):
            mod.register_parameter(
                param_name, nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)]))
            )

    def _token_dispatch(
        self, mod: nn.Module, inputs: Tuple[Any, ...], device_mesh: DeviceMesh
    ) -> Tuple[torch.Tensor]:
        (x,) = inputs
        return (compat_local_tensor.all_gather_along_dim0(x, device_mesh.get_group()),)

    def _token_combine(
        self, mod: nn.Module, output: torch.Tensor, device_mesh: DeviceMesh
    ) -> torch.Tensor:
        return compat_local_tensor.reduce_scatter_sum_along_dim0(output, device_mesh.get_group())

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh,
            partition_fn=self._partition_fn,
            input_fn=self._token_dispatch,
            output_fn=self._token_combine,
        )


class ExpertParallelWithTP(ParallelStyle):
    """Expert parallelism on `ep_mesh` combined with tensor parallelism on `tp_mesh`.

    Applied to an ExpertLayer: expert weights live on the 2-D (ep, tp) mesh as
    [Shard(0), Shard(1 or 2)]; the layer all-gathers tokens over ep before and
    reduce-scatters after, and its Experts all-reduce over tp.
    """

    def __init__(self, ep_mesh: DeviceMesh, tp_mesh: DeviceMesh) -> None:
        super().__init__()
        self.ep_mesh = ep_mesh
        self.tp_mesh = tp_mesh
        self.ep_tp_mesh = compat_local_tensor.concatenate_meshes([ep_mesh, tp_mesh])

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        experts = module.experts
        tp_dims = {"w1": 1, "w2": 2}
        for param_name, param in list(experts.named_parameters(recurse=False)):
            if param_name in tp_dims:
                placements = [Shard(0), Shard(tp_dims[param_name])]
                experts.register_parameter(
                    param_name,
                    nn.Parameter(distribute_tensor(param, self.ep_tp_mesh, placements)),
                )
        ep_group, tp_mesh = self.ep_mesh.get_group(), self.tp_mesh

        def ep_dispatch(mod: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[torch.Tensor]:
            return (compat_local_tensor.all_gather_along_dim0(inputs[0], ep_group),)

        def ep_combine(mod: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
            return compat_local_tensor.reduce_scatter_sum_along_dim0(output, ep_group)

        def tp_input_grad_all_reduce(mod: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[Any]:
            x = DTensor.from_local(inputs[0], tp_mesh, [Replicate()])
            return (x.to_local(grad_placements=[Partial()]),)

        def tp_reduce(mod: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
            partial = DTensor.from_local(output, tp_mesh, [Partial()])
            return partial.redistribute(tp_mesh, [Replicate()]).to_local()

        module.register_forward_pre_hook(ep_dispatch)
        module.register_forward_hook(ep_combine)
        experts.register_forward_pre_hook(tp_input_grad_all_reduce)
        experts.register_forward_hook(tp_reduce)
        return module


class TransformerBlock(nn.Module):
    """Pre-norm attention then pre-norm feed-forward (or experts when num_experts > 0)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.has_experts = args.num_experts > 0
        if self.has_experts:
            self.expert_layer = ExpertLayer(args.num_experts, dim=args.dim, hidden_dim=4 * args.dim)
        else:
            self.feed_forward = FeedForward(
                args.dim, hidden_dim=4 * args.dim, dropout_p=args.dropout_p
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        mlp = self.expert_layer if self.has_experts else self.feed_forward
        return h + mlp(self.ffn_norm(h))


def _root_plan(use_seq_parallel: bool) -> dict:
    if use_seq_parallel:
        return {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            "norm": SequenceParallel(),
        }
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    }


def _layer_plan(
    layer: TransformerBlock, use_seq_parallel: bool, local_output_for_attn: bool, has_ep: bool
) -> dict:
    plan: dict = {}
    if use_seq_parallel:
        plan["attention"] = PrepareModuleInput(
            input_layouts=Shard(1), desired_input_layouts=Replicate()
        )
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    for name in ("wq", "wk", "wv"):
        plan[f"attention.{name}"] = ColwiseParallel(use_local_output=local_output_for_attn)
    plan["attention.wo"] = (
        RowwiseParallel(output_layouts=Shard(1)) if use_seq_parallel else RowwiseParallel()
    )
    if not layer.has_experts:
        plan["feed_forward.w1"] = (
            ColwiseParallel(input_layouts=Shard(1)) if use_seq_parallel else ColwiseParallel()
        )
        plan["feed_forward.w2"] = (
            RowwiseParallel(output_layouts=Shard(1)) if use_seq_parallel else RowwiseParallel()
        )
    elif not has_ep:
        plan["expert_layer.experts"] = (
            TensorParallelForExpert(input_layouts=Shard(0), output_layouts=Shard(0))
            if use_seq_parallel
            else TensorParallelForExpert()
        )
    return plan


class Transformer(nn.Module):
    """A toy nanoGPT-like transformer: token + position embeddings, blocks, norm, output."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.vocab_size is None:
            raise AssertionError("Expected args.vocab_size to not be None")
        if args.max_seq_len is None:
            raise AssertionError("Expected args.max_seq_len to not be None")
        self.model_args = args
        self.max_seq_len = args.max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.dropout = nn.Dropout(args.dropout_p)
        self.layers = nn.ModuleList([TransformerBlock(args) for _ in range(args.n_layers)])
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.weight_tying:
            self.output.weight = self.tok_embeddings.weight
        self.checkpoint_activations = args.checkpoint_activations

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, seq_len = tokens.size()
        if seq_len > self.max_seq_len:
            raise AssertionError(
                f"Expected seq_len <= max_seq_len, got {seq_len} > {self.max_seq_len}"
            )
        positions = torch.arange(0, seq_len, device=tokens.device)
        h = self.dropout(self.tok_embeddings(tokens) + self.pos_embeddings(positions))
        for layer in self.layers:
            if self.checkpoint_activations:
                h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        return self.output(self.norm(h)).float()

    @staticmethod
    def parallelize(
        module: Transformer,
        tp_mesh: Optional[DeviceMesh],
        use_seq_parallel: bool,
        local_output_for_attn: bool = False,
        ep_mesh: Optional[DeviceMesh] = None,
    ) -> nn.Module:
        """Apply upstream's tensor-parallel plan on tp_mesh and/or expert parallelism on ep_mesh."""
        if not isinstance(module, Transformer):
            raise AssertionError(f"Requires Transformer but got {module}")
        if tp_mesh is None and ep_mesh is None:
            raise ValueError("At least one of tp_mesh or ep_mesh must be provided")
        if tp_mesh is not None:
            parallelize_module(module, tp_mesh, _root_plan(use_seq_parallel))
        for layer in module.layers:
            if tp_mesh is not None:
                plan = _layer_plan(
                    layer, use_seq_parallel, local_output_for_attn, has_ep=ep_mesh is not None
                )
                parallelize_module(layer, tp_mesh, plan)
            if ep_mesh is not None and layer.has_experts:
                if tp_mesh is not None:
                    parallelize_module(
                        layer.expert_layer, ep_mesh, ExpertParallelWithTP(ep_mesh, tp_mesh)
                    )
                else:
                    parallelize_module(layer.expert_layer.experts, ep_mesh, ExpertParallel())
        if tp_mesh is not None:
            # With weight tying, output.weight must be sharded like tok_embeddings.weight
            # (row-wise), which costs the all-reduce of a column-wise output plan.
            output_plan = (
                ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
                if use_seq_parallel
                else ColwiseParallel(output_layouts=Replicate())
            )
            parallelize_module(module.output, tp_mesh, output_plan)
            if local_output_for_attn:
                for layer in module.layers:
                    layer.attention.n_heads = module.model_args.n_heads // tp_mesh.size()
            if module.model_args.weight_tying:
                module.output.weight = module.tok_embeddings.weight  # share params and grads
        return module
