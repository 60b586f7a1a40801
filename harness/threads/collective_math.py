"""The arithmetic of each collective, given every rank's payload, in group-rank order.

Why it exists: what a collective computes is independent of how ranks meet. These
functions run once per collective, in the last rank thread to arrive at the rendezvous
(harness/threads/world.py), and write every rank's outputs in place. Reductions go in rank
order, in the tensors' own dtype, so every rank gets identical bits; bad input (mixed
dtypes, sizes that do not split) raises a one-line error that the rendezvous reports to
every rank of the collective.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def op_name(op: Any) -> str:
    """The name of c10d reduce op `op`, as the reductions here take it."""
    for name in _REDUCE_OPS:
        if op == getattr(dist.ReduceOp, name):
            return name
    raise NotImplementedError(f"the threaded backend does not implement reduce op {op}")


def noop(payloads: list) -> None:
    """A barrier: every rank arriving is the whole of it."""
    return None


def _same_dtype(name: str, tensors: Sequence[torch.Tensor]) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"{name}: ranks passed different dtypes {sorted(map(str, dtypes))}")


def _same_shape(name: str, tensors: Sequence[torch.Tensor]) -> None:
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        raise ValueError(f"{name}: ranks passed different shapes {sorted(shapes)}")


def _copy(name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src), refusing the silent broadcasting copy_ would do on a shape mismatch."""
    if dst.shape != src.shape:
        raise ValueError(
            f"{name}: a tensor of shape {tuple(src.shape)} cannot fill one of shape "
            f"{tuple(dst.shape)}"
        )
    dst.copy_(src)


def _combine(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce in rank order, in the tensors' own dtype, so every rank gets identical bits."""
    _same_dtype("reduce", tensors)
    _same_shape("reduce", tensors)
    acc = tensors[0].clone()
    floating = acc.is_floating_point() or acc.is_complex()
    if op in ("BAND", "BOR", "BXOR") and floating:
        raise TypeError(f"ReduceOp.{op} needs integer or bool tensors, got {acc.dtype}")
    if op == "AVG" and not floating:
        raise TypeError(f"ReduceOp.AVG needs floating-point tensors, got {acc.dtype}")
    for t in tensors[1:]:
        t = t.to(acc.device)
        if op in ("SUM", "AVG"):
            acc.add_(t)
        elif op == "PRODUCT":
            acc.mul_(t)
        elif op == "MIN":
            torch.minimum(acc, t, out=acc)
        elif op == "MAX":
            torch.maximum(acc, t, out=acc)
        elif op == "BAND":
            acc.bitwise_and_(t)
        elif op == "BOR":
            acc.bitwise_or_(t)
        else:
            acc.bitwise_xor_(t)
    if op == "AVG":
        acc.div_(len(tensors))
    return acc


def broadcast(payloads: list, root: int) -> None:
    src = payloads[root]
    for rank, dst in enumerate(payloads):
        if rank != root:
            _same_dtype("broadcast", (src, dst))
            _copy("broadcast", dst, src)


def all_reduce(payloads: list, op: str) -> None:
    for i in range(len(payloads[0])):
        result = _combine([tensors[i] for tensors in payloads], op)
        for tensors in payloads:
            tensors[i].copy_(result)


def reduce(payloads: list, op: str, root: int) -> None:
    payloads[root].copy_(_combine(payloads, op))


def all_gather_coalesced(payloads: list) -> None:
    inputs = [ins[0] for _, ins in payloads]
    _same_dtype("all_gather", inputs)
    for outs, _ in payloads:
        if len(outs) != len(inputs):
            raise ValueError(f"all_gather: {len(outs)} output tensors for {len(inputs)} ranks")
        for out, src in zip(outs, inputs):
            _copy("all_gather", out, src)


def all_gather_coalesced_lists(payloads: list) -> None:
    for outs_per_rank, _ in payloads:
        for src_rank, (_, ins) in enumerate(payloads):
            for out, src in zip(outs_per_rank[src_rank], ins):
                _copy("all_gather_coalesced", out, src)


def all_gather_single(payloads: list) -> None:
    for i in range(len(payloads[0][1])):
        inputs = [ins[i] for _, ins in payloads]
        _same_dtype("all_gather_single", inputs)
        _same_shape("all_gather_single", inputs)
        flat = torch.cat([t.reshape(-1).to(inputs[0].device) for t in inputs])
        for outs, _ in payloads:
            if outs[i].numel() != flat.numel():
                raise ValueError(
                    f"all_gather_single: output has {outs[i].numel()} elements, expected "
                    f"{len(inputs)} x {inputs[0].numel()}"
                )
            outs[i].copy_(flat.view(outs[i].shape))


def reduce_scatter(payloads: list, op: str) -> None:
    for rank, (out, _) in enumerate(payloads):
        _copy("reduce_scatter", out, _combine([ins[rank] for _, ins in payloads], op))


def reduce_scatter_single(payloads: list, op: str) -> None:
    size = len(payloads)
    for i in range(len(payloads[0][1])):
        inputs = [ins[i].reshape(-1) for _, ins in payloads]
        total = _combine(inputs, op)
        if total.numel() % size:
            raise ValueError(
                f"reduce_scatter_single: input of {total.numel()} elements does not split into "
                f"{size} equal parts"
            )
        for rank, chunk in enumerate(total.chunk(size)):
            out = payloads[rank][0][i]
            if out.numel() != chunk.numel():
                raise ValueError(
                    f"reduce_scatter_single: output has {out.numel()} elements, expected "
                    f"{chunk.numel()}"
                )
            out.copy_(chunk.view(out.shape))


def all_to_all(payloads: list) -> None:
    for rank, (outs, _) in enumerate(payloads):
        for src_rank, (_, ins) in enumerate(payloads):
            _copy("all_to_all", outs[src_rank], ins[rank])


def _split(tensor: torch.Tensor, splits: list, size: int, what: str) -> list:
    if not splits:
        if tensor.shape[0] % size:
            raise ValueError(
                f"all_to_all_single: {what} dim 0 of {tensor.shape[0]} not divisible by {size}"
            )
        splits = [tensor.shape[0] // size] * size
    if len(splits) != size or sum(splits) != tensor.shape[0]:
        raise ValueError(
            f"all_to_all_single: {what} splits {splits} do not fit dim 0 of {tensor.shape[0]}"
        )
    return list(tensor.split(splits))


def all_to_all_single(payloads: list) -> None:
    size = len(payloads)
    ins = [_split(p[1], p[3], size, "input") for p in payloads]
    for rank, (out, _, out_splits, _) in enumerate(payloads):
        for src_rank, dst in enumerate(_split(out, out_splits, size, "output")):
            dst.copy_(ins[src_rank][rank])


def gather(payloads: list, root: int) -> None:
    outs = payloads[root][0]
    if len(outs) != len(payloads):
        raise ValueError(f"gather: root has {len(outs)} output tensors for {len(payloads)} ranks")
    for out, (_, src) in zip(outs, payloads):
        _copy("gather", out, src)


def scatter(payloads: list, root: int) -> None:
    ins = payloads[root][1]
    if len(ins) != len(payloads):
        raise ValueError(f"scatter: root has {len(ins)} input tensors for {len(payloads)} ranks")
    for (out, _), src in zip(payloads, ins):
        _copy("scatter", out, src)
