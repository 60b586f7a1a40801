"""FSDP test bases: a default process group per test, on the rank's own device.

`FSDPTest` gives each rank process what FSDP tests expect before the body runs: the
default group initialised through the test's private rendezvous file with the backend
for this machine (nccl on GPUs, gloo on CPU), the rank's device selected, and a barrier
so no rank starts early; after the body, a barrier (unless this rank failed) and the
group's destruction. `FSDPTestContinuous` gives the same on upstream's shared-process base
(harness/process/continuous.py), with one group per class. `FSDPTestMixin` adds upstream's
parity helpers (`_test_fsdp_parity`, `_train_for_several_steps`, the `_check_*` assertions)
to FSDPTest and FSDPTestContinuous.
"""

from __future__ import annotations

import contextlib
import unittest
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import settings
from harness.compat import fsdp1
from harness.compat import local_tensor as compat_local_tensor
from harness.kit.fsdp_helpers import _zero_model, get_full_params
from harness.kit.models import DEVICEInitMode, FSDPInitMode, fsdp_kwargs_for_device
from harness.process.continuous import MultiProcContinuousTest, class_device_type
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.process.rank import destroy_default_group
from harness.requirements.decorators import require_accelerator_per_rank
from harness.requirements.world_size import BaseWorldSize
from harness.threads.multithreaded_case import MultiThreadedTestCase
from harness.threads.world import RankReleased


class _RankDevice:
    """`device`, `device_type` and `process_group` of a rank, as overridable properties."""

    rank: int

    @property
    def device_type(self) -> str:
        return settings.device_type()

    @property
    def device(self) -> torch.device:
        """This rank's device: its own GPU, or the CPU."""
        return settings.rank_device(max(self.rank, 0))

    @property
    def process_group(self) -> Any:
        """The default process group of this rank."""
        return dist.group.WORLD


class _AcceleratorPerRank:
    """FSDP's bases give each rank its own accelerator: with fewer accelerators than ranks the
    test skips before any rank starts (on CPU too, unless the CPU is allowed), as upstream's
    FSDP ranks skip."""

    def checked_rank_settings(self) -> Tuple[int, float]:
        """The base's checks, then one accelerator per rank unless the CPU is allowed."""
        world_size, timeout = super().checked_rank_settings()  # type: ignore[misc]
        require_accelerator_per_rank(self, world_size)  # type: ignore[arg-type]
        return world_size, timeout


class FSDPTestMixin:
    """Upstream's FSDP parity helpers: train a model under FSDP1 and under a data-parallel
    reference (DDP by default) from the same initial state and compare losses and parameters.

    Mixed into the bases whose ranks hold an initialised default group (FSDPTest,
    FSDPTestContinuous). Everything runs on the rank's device (``self.device``), so the
    helpers work on CPU with gloo wherever FSDP1 does.
    """

    rank: int
    device: torch.device
    process_group: Any
    assertEqual: Callable[..., None]
    assertRaisesRegex: Callable[..., Any]

    def _check_cpu_offload(self, fsdp_model: FSDP, cpu_offload: CPUOffload) -> None:
        self.assertEqual(cpu_offload, fsdp_model.cpu_offload)

    def _check_backward_prefetch(
        self, fsdp_model: FSDP, backward_prefetch: Optional[BackwardPrefetch]
    ) -> None:
        self.assertEqual(backward_prefetch, fsdp_model.backward_prefetch)

    def _check_forward_prefetch(self, fsdp_model: FSDP, forward_prefetch: bool) -> None:
        self.assertEqual(forward_prefetch, fsdp_model.forward_prefetch)

    def _train_for_several_steps(
        self,
        model: nn.Module,
        num_steps: int,
        autocast: bool,
        lr: float = 0.01,
        fsdp_cpu_offload: Optional[CPUOffload] = None,
        save_model: bool = False,
        mixed_precision: Optional[MixedPrecision] = None,
        enable_sharded_grad_scaler: bool = False,
        use_pure_fp16: bool = False,
        sharded_grad_scaler_kwargs: Optional[Dict[str, Any]] = None,
    ) -> torch.Tensor:
        """Run ``num_steps`` SGD-with-momentum steps of ``model.module``'s own input and loss;
        return the last loss. ``model`` is a DDP/FSDP-style wrapper (it has ``.module``).

        Checks along the way: offloaded FSDP parameters stay on the CPU, the loss dtype is
        what the precision settings imply, and an FSDP root ends the step idle. With
        ``save_model``, each step also round-trips the state dict through a zeroed model.
        """
        offload_params = bool(fsdp_cpu_offload and fsdp_cpu_offload.offload_params)
        model_device = next(model.parameters()).device
        scaler_kwargs = dict(sharded_grad_scaler_kwargs or {})
        scaler_kwargs.setdefault("device", self.device.type)
        scaler = ShardedGradScaler(enabled=enable_sharded_grad_scaler, **scaler_kwargs)
        # SGD with momentum, not Adam: Adam is scale invariant, which hides gradient errors.
        optim = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        is_fsdp = isinstance(model, FSDP)
        keeps_unsharded = fsdp1.no_reshard_after_forward_strategies()
        cpu = torch.device("cpu")
        loss = torch.zeros(())
        for _ in range(num_steps):
            optim.zero_grad()
            # float16: CUDA autocast's default, made explicit so that CPU autocasts alike
            # (its own default is bfloat16).
            with torch.amp.autocast(self.device.type, dtype=torch.float16, enabled=autocast):
                inp = model.module.get_input(self.device)  # type: ignore[operator, union-attr]
                if use_pure_fp16 or (mixed_precision and not is_fsdp):
                    inp = inp.half() if isinstance(inp, torch.Tensor) else tuple(
                        x.half() for x in inp
                    )
                output = model(*inp)
                if offload_params and is_fsdp and model.sharding_strategy not in keeps_unsharded:
                    for param in model.parameters():
                        self.assertEqual(param.device, cpu)
                loss = model.module.get_loss(inp, output).to(model_device)  # type: ignore[operator, union-attr]
                if autocast and not is_fsdp:
                    # CUDA autocast reduces in float32; CPU autocast keeps float16: match CUDA.
                    loss = loss.float()
            loss = scaler.scale(loss)
            if not mixed_precision and not use_pure_fp16:
                self.assertEqual(
                    loss.dtype, torch.float32, msg="loss must be float32 like the parameters"
                )
            elif use_pure_fp16:
                self.assertEqual(loss.dtype, torch.float16)
            elif is_fsdp:  # FSDP computes in the low precision, DDP under autocast in fp32
                assert mixed_precision is not None
                self.assertEqual(loss.dtype, mixed_precision.param_dtype)
            else:
                self.assertEqual(loss.dtype, torch.float32)
            model.module.run_backward(loss)  # type: ignore[operator, union-attr]
            if offload_params and is_fsdp:
                for param in model.parameters():
                    self.assertEqual(param.device, cpu)
            scaler.step(optim)
            scaler.update()
            if save_model:
                state_dict = {k: v.clone() for k, v in model.state_dict().items()}
                _zero_model(model)  # a load that restores nothing now breaks parity
                model.load_state_dict(state_dict)
        if is_fsdp:
            fsdp1.assert_idle(model)
        return loss.detach()

    def _test_fsdp_parity(
        self,
        model_class: type,
        fsdp_init_mode: FSDPInitMode,
        device_init_mode: DEVICEInitMode,
        ref_init_fn: Optional[Callable[[nn.Module], nn.Module]] = None,
        num_iters: int = 2,
        save_model: bool = True,
        cpu_offload: CPUOffload = CPUOffload(),  # noqa: B008 - upstream's default, never mutated
        backward_prefetch: Optional[BackwardPrefetch] = None,
        sharding_strategy: Optional[ShardingStrategy] = None,
        mixed_precision: Optional[MixedPrecision] = None,
        forward_prefetch: bool = False,
        use_orig_params: bool = False,
        enable_sharded_grad_scaler: bool = False,
        use_pure_fp16: bool = False,
        init_kwargs: Optional[Dict[str, Any]] = None,
        sharded_grad_scaler_kwargs: Optional[Dict[str, Any]] = None,
        **fsdp_kwargs: Any,
    ) -> None:
        """Train ``model_class`` under FSDP1 and under a reference, and require the same loss and
        (without reduced precision) the same final parameters.

        The reference is ``ref_init_fn(model)`` or DDP over the unwrapped model built with
        ``DEVICE_BEFORE``; the FSDP model is ``model_class.init(..., fsdp_init_mode,
        device_init_mode, fsdp_kwargs)``, wrapped at the top level when ``init`` did not.
        Offloading parameters with ``DEVICE_AFTER`` must raise FSDP's device error. On CPU,
        offloading parameters skips: FSDP1 pins the offloaded memory, which needs an
        accelerator.
        """
        if fsdp_init_mode == FSDPInitMode.NO_FSDP:
            raise ValueError("_test_fsdp_parity needs an fsdp_init_mode that wraps with FSDP")
        device = self.device
        offload_params = cpu_offload is not None and cpu_offload.offload_params
        if offload_params and device.type == "cpu":
            raise unittest.SkipTest(
                "FSDP1 parameter CPU offloading pins memory, which needs an accelerator"
            )
        init_kwargs = dict(init_kwargs or {})
        lr = 1e-2
        model = model_class.init(
            self.process_group,
            FSDPInitMode.NO_FSDP,
            DEVICEInitMode.DEVICE_BEFORE,
            deterministic=True,
            **init_kwargs,
        )
        if ref_init_fn is not None:
            ref_model = ref_init_fn(model)
        elif device.type == "cpu":
            ref_model = DDP(model)
        else:
            ref_model = DDP(model, device_ids=[device], output_device=device)
        if use_pure_fp16:
            ref_model = ref_model.half()
        ref_loss = self._train_for_several_steps(
            ref_model,
            num_iters,
            autocast=mixed_precision is not None,
            lr=lr,
            fsdp_cpu_offload=cpu_offload,
            mixed_precision=mixed_precision,
            enable_sharded_grad_scaler=enable_sharded_grad_scaler,
            use_pure_fp16=use_pure_fp16,
            sharded_grad_scaler_kwargs=sharded_grad_scaler_kwargs,
        )
        ref_params = list(ref_model.parameters())
        fsdp_kwargs.update(
            {
                "cpu_offload": cpu_offload,
                "backward_prefetch": backward_prefetch,
                "sharding_strategy": sharding_strategy,
                "mixed_precision": mixed_precision,
                "forward_prefetch": forward_prefetch,
                "use_orig_params": use_orig_params,
            }
        )
        try:
            fsdp_model = model_class.init(
                self.process_group,
                fsdp_init_mode,
                device_init_mode,
                fsdp_kwargs,
                deterministic=True,
                **init_kwargs,
            )
        except Exception as error:
            raise ValueError(f"Initializing {model_class} raised error {error}") from error
        if not isinstance(fsdp_model, FSDP):
            # The reference is data parallel over the whole model: wrap the top level too.
            fsdp_model = FSDP(
                fsdp_model, self.process_group, **fsdp_kwargs_for_device(fsdp_kwargs)
            )
        if use_pure_fp16:
            fsdp_model = fsdp_model.half()
        if device_init_mode == DEVICEInitMode.DEVICE_AFTER:
            fsdp_model = fsdp_model.to(device)
        after = device_init_mode == DEVICEInitMode.DEVICE_AFTER
        expects_device_error = offload_params and after
        if offload_params and not after:
            for param in fsdp_model.parameters():
                self.assertEqual(param.device, torch.device("cpu"))
        context = (
            self.assertRaisesRegex(
                RuntimeError,
                "An FSDP-managed module with parameter CPU offloading enabled has parameters "
                f"on {device.type}",
            )
            if expects_device_error
            else contextlib.nullcontext()
        )
        with context:
            fsdp_loss = self._train_for_several_steps(
                fsdp_model,
                num_iters,
                autocast=False,
                lr=lr,
                fsdp_cpu_offload=cpu_offload,
                save_model=save_model,
                mixed_precision=mixed_precision,
                enable_sharded_grad_scaler=enable_sharded_grad_scaler,
                use_pure_fp16=use_pure_fp16,
                sharded_grad_scaler_kwargs=sharded_grad_scaler_kwargs,
            )
        if expects_device_error:
            return
        if offload_params:
            for param in fsdp_model.parameters():
                self.assertEqual(param.device, torch.device("cpu"))
            fsdp_loss = fsdp_loss.to(device)
        fsdp_params = get_full_params(fsdp_model)
        # The losses' dtypes may differ under mixed precision (DDP autocasts, FSDP casts).
        torch.testing.assert_close(ref_loss, fsdp_loss, check_dtype=False)
        # Reduced precision trains differently (DDP's fp16 optimizer vs FSDP's fp32), so only
        # full precision compares parameters.
        if mixed_precision is None and not use_pure_fp16:
            self.assertEqual(
                ref_params, fsdp_params, exact_device=True, msg="FSDP did not match DDP"
            )


class FSDPTest(FSDPTestMixin, _AcceleratorPerRank, _RankDevice, MultiProcessTestCase):
    """MultiProcessTestCase whose ranks run each test inside an initialised default group.

    `device`, `device_type` and `process_group` are properties, so suites may override them
    (upstream suites do, e.g. `process_group` returning the default group). As upstream, the
    world size defaults to the accelerator count (1 without one), and a test skips with
    fewer accelerators than ranks, on CPU too, unless the CPU is allowed (HARNESS_ALLOW_CPU=1
    or the test's `skip_if_lt_x_gpu(n, allow_cpu=True)`).
    """

    world_size: int = BaseWorldSize(per_device=True, launched=True)  # type: ignore[assignment]

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """False, as upstream's FSDPTest: its own tearDown destroys the group."""
        return False

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()  # as upstream's: the rest of a subclass's setUp is the parent's

    def rank_set_up(self) -> None:
        """In a rank, before the test method: the default group (upstream's fake backend when
        the class sets `fake_pg`), the rank's device, a barrier; then the seeding."""
        device = self.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if getattr(self, "fake_pg", False):
            compat_local_tensor.init_fake_process_group(self.world_size, rank=self.rank)
        elif not dist.is_initialized():  # a suite's own `_run` may have made it already
            dist.init_process_group(
                backend=settings.backend_for(self.device_type),
                init_method=self.init_method,
                rank=self.rank,
                world_size=self.world_size,
            )
        dist.barrier()
        super().rank_set_up()

    def rank_tear_down(self) -> None:
        """In a rank, after the test method: a barrier (unless this rank failed: its peers
        may be stuck elsewhere), then the group's destruction."""
        if dist.is_initialized():
            if not self.rank_failed():
                dist.barrier()
            destroy_default_group()
        super().rank_tear_down()


class FSDPTestMultiThread(_RankDevice, MultiThreadedTestCase):
    """FSDPTest for thread ranks (harness/threads/multithreaded_case.py): same device, group and
    barriers.

    Each rank thread's default group (backend `threaded`) is initialised before setUp, the
    rank's device is selected and a barrier keeps the ranks together; after the case, a
    barrier (skipped when this rank failed) and the group's destruction. `device`,
    `device_type` and `process_group` are properties, as in FSDPTest. The world size defaults
    to the accelerator count (1 without one), as upstream's.
    """

    world_size: int = BaseWorldSize(per_device=True)  # type: ignore[assignment]

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()  # as upstream's: the rest of a subclass's setUp is the parent's

    def start_rank_thread(self) -> None:
        super().start_rank_thread()
        device = self.device
        if device.type == "cuda":
            torch.cuda.set_device(device)  # per thread, like the rank's process would
        dist.barrier()

    def finish_rank_thread(self, passed: bool) -> None:
        if passed and dist.is_initialized():
            with contextlib.suppress(RankReleased):  # a peer failed: its failure is the report
                dist.barrier()
        super().finish_rank_thread(passed)


class FSDPTestContinuous(FSDPTestMixin, _AcceleratorPerRank, MultiProcContinuousTest):
    """Upstream's `FSDPTestContinuous`: the FSDP parity helpers on MultiProcContinuousTest.

    The backend follows the device type (nccl on GPUs, gloo on CPU); each rank uses its own
    device (`self.device`); `process_group` is the class's `pg`. The ranks meet before each
    test (the shared ranks' barrier); unlike upstream there is no barrier after it, where a
    rank whose peer failed would wait for it in vain. With fewer accelerators than ranks (on
    CPU: always, unless the CPU is allowed) the test skips before any rank starts, as
    upstream's ranks do.
    """

    @classmethod
    def backend_str(cls) -> str:
        return settings.backend_for(class_device_type(cls))

    @classmethod
    def device_type(cls) -> str:
        return settings.device_type()

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        device = settings.rank_device(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        super()._init_pg(rank, world_size, rdvz_file)

    @property
    def device(self) -> torch.device:
        """This rank's device: its own GPU, or the CPU."""
        return settings.rank_device(max(self.rank, 0))

    @property
    def process_group(self) -> Any:
        return type(self).pg
