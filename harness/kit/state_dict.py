"""Upstream's state-dict test kit (`distributed.common_state_dict`): checks that a
distributed model's or optimizer's state dict holds the same values as a local reference's,
and embedding models that rename their state-dict keys.
"""

from __future__ import annotations

import copy
from itertools import chain
from typing import Any, Dict

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
from torch.distributed.tensor import DTensor

from harness.compat.sharding import ShardedTensor
from harness.compat.state_dict import gather_state_dict

__all__ = [
    "FusionEmbedding", "FusionEmbeddingWithHook", "FusionEmbeddingWithModifier",
    "VerifyStateDictMixin",
]

STATE = "state"  # the keys of an optimizer state dict
PARAM_GROUPS = "param_groups"


class VerifyStateDictMixin:
    """Mixed into a TestCase: `_verify_msd` / `_verify_osd` / `_verify_osd_by_load`."""

    def _compare_tensor(self: Any, orig_tensor: torch.Tensor, dist_tensor: Any,
                        offload_to_cpu: bool = False) -> None:
        if isinstance(dist_tensor, (DTensor, ShardedTensor)):
            dist_tensor = gather_state_dict({"mykey": dist_tensor}).pop("mykey")
        if offload_to_cpu:
            orig_tensor, dist_tensor = orig_tensor.cpu(), dist_tensor.cpu()
        self.assertTrue(isinstance(dist_tensor, torch.Tensor))
        self.assertTrue(torch.allclose(orig_tensor, dist_tensor))

    def _verify_msd(self: Any, msd: Dict[str, Any], dist_msd: Dict[str, Any],
                    options: StateDictOptions = StateDictOptions(),  # noqa: B008 - upstream's
                    offload_to_cpu: bool = False) -> None:
        """Every entry of the model state dict `msd` has the same value in `dist_msd` (frozen
        parameters may be missing there when the options ignore them)."""
        if not options.ignore_frozen_params:
            self.assertEqual(len(msd), len(dist_msd))
        for fqn, param in msd.items():
            dist_param = dist_msd.get(fqn)
            if not options.ignore_frozen_params:
                self.assertIsNotNone(dist_param, f"{fqn=}")
                try:
                    self._compare_tensor(param, dist_param, offload_to_cpu)
                except AssertionError as error:
                    raise AssertionError(
                        f"{fqn} has mismatched value {param} {dist_param}") from error
            elif dist_param is None:
                self.assertFalse(param.requires_grad, f"{fqn=}")

    def _verify_osd(self: Any, model: nn.Module, optim: torch.optim.Optimizer,
                    osd: Dict[str, Any], dist_osd: Dict[str, Any]) -> None:
        """The optimizer state dict `osd` (keyed by parameter ids) and `dist_osd` (keyed by
        FQNs) hold the same states and param groups."""
        params = list(chain.from_iterable(group["params"] for group in optim.param_groups))
        pid_of = {param: pid for pid, param in enumerate(params)}
        fqn_pid: Dict[Any, Any] = {}
        for fqn, param in model.named_parameters():
            fqn_pid[fqn] = pid_of[param]
            fqn_pid[pid_of[param]] = fqn
        self.assertEqual(len(osd[STATE]), len(dist_osd[STATE]))
        for pid, states in osd[STATE].items():
            fqn = fqn_pid[pid]
            dist_states = dist_osd[STATE].get(fqn, None)
            self.assertIsNotNone(dist_states, fqn)
            self.assertEqual(len(states), len(dist_states))
            for key, state in states.items():
                # upstream compares the reference's state with itself here (only that each
                # key exists); kept, so that tests passing upstream pass here
                same = states.get(key, None)
                self.assertIsNotNone(same)
                self._compare_tensor(state, same)
        saved_groups = dist_osd[PARAM_GROUPS]
        if len(osd[PARAM_GROUPS]) != len(dist_osd[PARAM_GROUPS]):
            self.assertTrue(len(dist_osd[PARAM_GROUPS]) > len(osd[PARAM_GROUPS]))
            merged = copy.deepcopy(dist_osd[PARAM_GROUPS][0])
            merged["params"] = [p for group in dist_osd[PARAM_GROUPS] for p in group["params"]]
            dist_osd[PARAM_GROUPS] = [merged]
        self.assertEqual(len(osd[PARAM_GROUPS]), len(dist_osd[PARAM_GROUPS]))
        for group, dist_group in zip(osd[PARAM_GROUPS], dist_osd[PARAM_GROUPS]):
            self.assertEqual(len(group), len(dist_group))
            for key, value in group.items():
                dist_value = dist_group[key]
                if key == "params":
                    self.assertEqual(sorted(fqn_pid[pid] for pid in value), sorted(dist_value))
                else:
                    self.assertEqual(value, dist_value)
        dist_osd[PARAM_GROUPS] = saved_groups

    def _verify_osd_by_load(self: Any, model: nn.Module, optim: torch.optim.Optimizer,
                            new_optim: torch.optim.Optimizer, dist_osd: Dict[str, Any]) -> None:
        """Loading `dist_osd` (gathered) into `new_optim` reproduces `optim`'s state dict."""
        set_state_dict(model, optimizers=new_optim, model_state_dict={},
                       optim_state_dict=gather_state_dict(dist_osd))
        self.assertEqual(optim.state_dict(), new_optim.state_dict())


class FusionEmbedding(nn.Module):
    def __init__(self, vocab_size: int, fusion_vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.fusion_embedding = nn.Embedding(fusion_vocab_size, embed_dim)


class FusionEmbeddingWithHook(nn.Module):
    """Its state dict names the wrapped embedding's weight `weight` (as before fusing)."""

    def __init__(self, vocab_size: int, fusion_vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.fusion_embedding = nn.Embedding(fusion_vocab_size, embed_dim)
        self._register_state_dict_hook(FusionEmbeddingWithHook._state_dict_hook)
        self._register_load_state_dict_pre_hook(
            FusionEmbeddingWithHook._load_state_dict_hook, with_module=True)

    def _state_dict_hook(self, destination: Dict[str, Any], prefix: str,
                         keep_vars: bool) -> None:
        destination[prefix + "weight"] = destination.pop(prefix + "embedding.weight")

    def _load_state_dict_hook(self, state_dict: Dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        if state_dict:
            state_dict[prefix + "embedding.weight"] = state_dict.pop(prefix + "weight")


class FusionEmbeddingWithModifier(FusionEmbeddingWithHook):
    """Also tells distributed state dict how its keys map to FQNs (`_fqn_modifiers`)."""

    def _fqn_modifiers(self) -> Dict[str, str]:
        return {"weight": "embedding"}
