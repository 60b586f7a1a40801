# Owner(s): ["oncall: distributed"]
"""End-to-end fine-tuning with torch.distributed.checkpoint (DCP) and a simulated restart.

Mirrors upstream's test/distributed/checkpoint/e2e/test_fine_tuning.py, on the current DCP API
(``dcp.save``/``dcp.load`` with ``checkpoint_id``). Unlike the upstream test, it checks the loaded
values: after the restart the trainable parameters and optimizer state must equal what the first
run saved, and the frozen pretrained parameters must equal the pretraining checkpoint. A restarted
run starts from a differently seeded model, so a load that silently does nothing fails.
"""

import os
import sys
from typing import Any, Dict, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from harness import (
    TEST_WITH_DEV_DBG_ASAN,
    DTensorTestBase,
    run_tests,
    skip_if_lt_x_gpu,
    with_comms,
    with_temp_dir,
)
from harness.settings import default_world_size

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

if TEST_WITH_DEV_DBG_ASAN:
    print(
        "Skip dev-asan as torch + multiprocessing spawn have known issues",
        file=sys.stderr,
    )
    sys.exit(0)


DIM = 500
PRETRAIN_PREFIX = "pretrain."
FULL = StateDictOptions(full_state_dict=True)


class PreTrainedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(DIM, DIM)
        self.layer2 = nn.Linear(DIM, DIM)
        self.layer3 = nn.Linear(DIM, DIM)
        self.sequential = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU())
        self.module_list = nn.ModuleList([nn.Linear(DIM, DIM), nn.ReLU()])
        self.relu = nn.ReLU()

    def forward(self, batch):
        x = self.relu(self.layer1(batch))
        x = self.relu(self.layer2(x))
        x = self.relu(self.layer3(x))
        x = self.sequential(x)
        x = self.module_list[1](self.module_list[0](x))
        return x


class FineTuningModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pretrain = PreTrainedModel()
        for p in self.pretrain.parameters():
            p.requires_grad = False

        self.layer1 = nn.Linear(DIM, DIM)
        self.layer2 = nn.Linear(DIM, DIM)
        self.layer3 = nn.Linear(DIM, DIM)
        self.relu = nn.ReLU()

    def forward(self, batch):
        x = self.relu(self.pretrain(batch))
        x = self.relu(self.layer1(x))
        x = self.relu(self.layer2(x))
        x = self.relu(self.layer3(x))
        return x


def _cpu_copy(value: Any) -> Any:
    """A detached CPU copy of a (nested) full state dict, safe from later in-place updates."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _cpu_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(item) for item in value)
    return value


class TestFineTuning(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return min(4, default_world_size())

    @property
    def backend(self):
        # CPU tensors go through gloo; CUDA ones through nccl (a CPU-only torch has no nccl)
        return "cpu:gloo,cuda:nccl" if self.device_type == "cuda" else "cpu:gloo"

    @property
    def _device(self) -> torch.device:
        """The rank's device (FSDP needs it explicitly to compute on the CPU)."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, torch.accelerator.current_device_index())

    def _train(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        for _ in range(3):
            batch = torch.rand(32, DIM, device=self._device)
            loss = model(batch).sum()
            loss.backward()
            optim.step()
            optim.zero_grad()

    def pretrain(self, pretrain_dir: str) -> Dict[str, torch.Tensor]:
        """Pretrain, save with DCP, and return the full saved model state (CPU copies)."""
        device_mesh = init_device_mesh(self.device_type, (self.world_size,))
        torch.manual_seed(0)
        model = PreTrainedModel().to(self._device)
        model = FSDP(model, device_mesh=device_mesh, device_id=self._device)
        optim = torch.optim.Adam(model.parameters(), lr=1e-3)
        self._train(model, optim)
        model_state_dict, optim_state_dict = get_state_dict(model, optimizers=optim)
        saved_state_dict = {"model": model_state_dict, "optim": optim_state_dict}
        dcp.save(saved_state_dict, checkpoint_id=pretrain_dir)
        return _cpu_copy(get_model_state_dict(model, options=FULL))

    def _full_finetune_state(
        self, model: nn.Module, optim: torch.optim.Optimizer
    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        """(trainable params, optimizer state, frozen pretrained params), full and on CPU."""
        model_state = get_model_state_dict(model, options=FULL)
        trainable = {k: v for k, v in model_state.items() if not k.startswith(PRETRAIN_PREFIX)}
        frozen = {
            k[len(PRETRAIN_PREFIX):]: v
            for k, v in model_state.items()
            if k.startswith(PRETRAIN_PREFIX)
        }
        optim_state = get_optimizer_state_dict(model, optim, options=FULL)
        return _cpu_copy(trainable), _cpu_copy(optim_state), _cpu_copy(frozen)

    def finetune(
        self,
        pretrain_dir: str,
        finetune_dir: str,
        pretrained: Dict[str, torch.Tensor],
    ) -> None:
        device_mesh = init_device_mesh(self.device_type, (self.world_size,))
        saved = None
        # Run 0 fine-tunes from the pretrained weights; run 1 simulates a restart: a fresh
        # process state (new model with a different init, new optimizer) that resumes from
        # the fine-tuning checkpoint of run 0
        for run in range(2):
            torch.manual_seed(100 + run)
            model = FineTuningModel().to(self._device)
            model = FSDP(
                model, use_orig_params=True, device_mesh=device_mesh, device_id=self._device
            )
            optim = torch.optim.Adam(model.parameters(), lr=1e-3)

            # Load the pretrained submodule's checkpoint
            model_state_dict = get_model_state_dict(model)
            pretrain_state_dict = {
                k[len(PRETRAIN_PREFIX):]: v
                for k, v in model_state_dict.items()
                if k.startswith(PRETRAIN_PREFIX)
            }
            dcp.load({"model": pretrain_state_dict}, checkpoint_id=pretrain_dir)
            set_model_state_dict(
                model,
                {PRETRAIN_PREFIX + k: v for k, v in pretrain_state_dict.items()},
                options=StateDictOptions(strict=False),
            )
            self.assertEqual(self._full_finetune_state(model, optim)[2], pretrained)

            if run == 0:
                # Nothing was fine-tuned yet, so there is nothing to resume from
                self.assertEqual(os.listdir(finetune_dir), [])
            else:
                # Load the training submodules' checkpoint (frozen params are not in it)
                model_state_dict, optim_state_dict = get_state_dict(
                    model,
                    optimizers=optim,
                    options=StateDictOptions(ignore_frozen_params=True),
                )
                dcp.load(
                    {"model": model_state_dict, "optim": optim_state_dict},
                    checkpoint_id=finetune_dir,
                )
                set_state_dict(
                    model,
                    optimizers=optim,
                    model_state_dict=model_state_dict,
                    optim_state_dict=optim_state_dict,
                    options=StateDictOptions(strict=False),
                )
                trainable, optim_state, frozen = self._full_finetune_state(model, optim)
                self.assertEqual(trainable, saved[0])
                self.assertEqual(optim_state, saved[1])
                self.assertEqual(frozen, pretrained)

            self._train(model, optim)

            # Save the training submodules' checkpoint
            model_state_dict, optim_state_dict = get_state_dict(
                model,
                optimizers=optim,
                options=StateDictOptions(ignore_frozen_params=True),
            )
            self.assertFalse([k for k in model_state_dict if k.startswith(PRETRAIN_PREFIX)])
            saved_state_dict = {"model": model_state_dict, "optim": optim_state_dict}
            dcp.save(saved_state_dict, checkpoint_id=finetune_dir)
            saved = self._full_finetune_state(model, optim)
            # Fine-tuning must not have touched the frozen pretrained parameters
            self.assertEqual(saved[2], pretrained)
            self.assertTrue(saved[1]["state"], "the optimizer has no state to checkpoint")

    @skip_if_lt_x_gpu(4, allow_cpu=True)
    @with_comms
    @with_temp_dir
    def test_fine_tuning(self) -> None:
        self.assertTrue(os.path.exists(self.temp_dir))
        pretrain_dir = os.path.join(self.temp_dir, "pretrain")
        finetune_dir = os.path.join(self.temp_dir, "finetune")
        print(pretrain_dir, finetune_dir)
        if self.rank == 0:
            os.mkdir(pretrain_dir)
            os.mkdir(finetune_dir)
        dist.barrier()
        os.sync()
        self.assertTrue(os.path.exists(pretrain_dir))
        self.assertTrue(os.path.exists(finetune_dir))

        pretrained = self.pretrain(pretrain_dir)
        self.finetune(pretrain_dir, finetune_dir, pretrained)


if __name__ == "__main__":
    run_tests()
