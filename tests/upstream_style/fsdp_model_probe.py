"""Describe every common_fsdp test model, built from harness or from upstream, into a file.

`python tests/upstream_style/fsdp_model_probe.py harness|upstream OUT` builds each model the
same way (same seeds, rank 1 of 2, no FSDP, on CPU), runs its own input through forward,
loss and backward, and saves module types, parameter names/shapes/values, outputs,
gradients and the generator state each step leaves behind. tests/test_models.py compares
the two files: the harness's models must be upstream's, value for value.
"""

import sys
from typing import Any, Callable, Dict

import torch
import torch.nn as nn


def _load(source: str) -> Any:
    if source == "harness":
        import harness

        return harness
    if source == "upstream":
        from torch.testing._internal import common_fsdp

        return common_fsdp
    raise SystemExit(f"fsdp_model_probe: source must be 'harness' or 'upstream', got {source!r}")


def _describe(model: nn.Module) -> Dict[str, Any]:
    return {
        "modules": [(name, type(module).__name__) for name, module in model.named_modules()],
        "params": [
            (name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()
        ],
        "state": {name: value.clone() for name, value in model.state_dict().items()},
    }


def _run_fsdp_test_model(model: nn.Module, backward: bool) -> Dict[str, Any]:
    inp = model.get_input(torch.device("cpu"))
    after_input = torch.rand(3)  # what a later random draw sees after get_input
    out = model(*inp)
    loss = model.get_loss(inp, out)
    record = {"input": inp, "after_input": after_input, "output": out.detach(), "loss": loss}
    if backward:
        model.run_backward(loss)
        record["grads"] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return record


def _run_plain(model: nn.Module, dim: int) -> Dict[str, Any]:
    out = model(torch.randn(2, dim))
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.sum() for o in outs).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"output": tuple(o.detach() for o in outs), "grads": grads}


def probe(source: str) -> Dict[str, Any]:
    """Every model's description and run, keyed by case name."""
    lib = _load(source)
    group = lib.DummyProcessGroup(rank=1, size=2)
    no_fsdp, never = lib.FSDPInitMode.NO_FSDP, lib.DEVICEInitMode.DEVICE_NEVER
    fsdp_models: Dict[str, Callable[[], nn.Module]] = {
        "NestedWrappedModule": lambda: lib.NestedWrappedModule.init(
            group, no_fsdp, never, deterministic=True
        ),
        "AlwaysWrapNestedWrappedModule": lambda: lib.AlwaysWrapNestedWrappedModule.init(
            group, no_fsdp, never, deterministic=True
        ),
        "NonUniformReqGradNWM": lambda: lib.NonUniformReqGradNWM.init(
            group, no_fsdp, never, deterministic=True
        ),
        "NestedWrappedModuleWithDelay": lambda: lib.NestedWrappedModuleWithDelay.init(
            group, no_fsdp, never, deterministic=True
        ),
        "MixtureOfExperts": lambda: lib.MixtureOfExperts.init(
            group, no_fsdp, never, deterministic=True
        ),
        "TransformerWithSharedParams": lambda: lib.TransformerWithSharedParams.init(
            group, no_fsdp, never, deterministic=True
        ),
        "TransformerWithSharedParams_no_bn": lambda: lib.TransformerWithSharedParams.init(
            group, no_fsdp, never, deterministic=True, add_bn=False
        ),
        # Not deterministic: training mode, so dropout draws from the generator get_input seeds.
        "TransformerWithSharedParams_train": lambda: lib.TransformerWithSharedParams.init(
            group, no_fsdp, never
        ),
    }
    plain_models: Dict[str, Callable[[], nn.Module]] = {
        "MLP": lambda: lib.MLP(8),
        "MLP_buffer_x3": lambda: lib.MLP(8, with_buffer=True, dim_multiplier=3),
        "MLP_no_bias": lambda: lib.MLP(8, bias=False),
        "MLPStack": lambda: lib.MLPStack(8),
        "MLPStack_seq_parallel": lambda: lib.MLPStack(8, with_seq_parallel=True),
        "DoubleLinear": lambda: lib.DoubleLinear(8),
        "DoubleLinear_single": lambda: lib.DoubleLinear(8, use_second_linear=False),
        "DummyDDP": lambda: lib.DummyDDP(lib.MLP(8)),
    }
    # Built outside enable_wrap(), so wrap() leaves them plain; they take 10 features.
    wrap_models: Dict[str, Callable[[], nn.Module]] = {
        "SkipModule": lambda: lib.SkipModule(),
        "NestedLinear": lambda: lib.NestedLinear(fsdp_wrap=True),
        "SkipModel": lambda: lib.SkipModel(double_nest=True),
    }
    results: Dict[str, Any] = {}
    for name, build in fsdp_models.items():
        torch.manual_seed(0)
        model = build()
        # MixtureOfExperts without FSDP all-reduces its gradients itself: no group here.
        results[name] = {
            **_describe(model),
            **_run_fsdp_test_model(model, backward=name != "MixtureOfExperts"),
        }
    for name, build in plain_models.items():
        torch.manual_seed(0)
        model = build()
        results[name] = {**_describe(model), **_run_plain(model, 8)}
    for name, build in wrap_models.items():
        torch.manual_seed(0)
        model = build()
        results[name] = {**_describe(model), **_run_plain(model, 10)}
    results["DummyProcessGroup"] = {"rank": group.rank(), "size": group.size()}
    return results


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: fsdp_model_probe.py harness|upstream OUT")
    torch.save(probe(sys.argv[1]), sys.argv[2])
