"""harness.compat.torch_internals: every private torch lookup resolves in the installed torch."""

import os
import subprocess
import sys
import threading
import unittest

import torch
import torch.distributed as dist
from torch.distributed.fsdp import ShardingStrategy

from harness.compat import c10d_world
from harness.compat import torch_internals as compat


class CompatTest(unittest.TestCase):
    def test_first_attr_takes_the_first_that_exists_and_names_all_tried(self):
        self.assertIs(
            compat.first_attr([("no.such.module", "x"), ("os", "getcwd")]), __import__("os").getcwd
        )
        with self.assertRaisesRegex(ImportError, "no.such.module.x, os.nope"):
            compat.first_attr([("no.such.module", "x"), ("os", "nope")])

    def test_fsdp_reduce_scatter_is_a_real_dist_function(self):
        name = compat.fsdp_reduce_scatter_name()
        self.assertTrue(callable(getattr(dist, name)))

    def test_register_post_backward_function_is_an_autograd_function(self):
        self.assertTrue(
            issubclass(compat.register_post_backward_function(), torch.autograd.Function)
        )

    def test_fsdp1_facts(self):
        self.assertEqual(
            compat.fsdp_homogeneous_attr_names(),
            ("_use_orig_params", "limit_all_gathers", "_use_full_prec_in_eval"),
        )
        self.assertEqual(compat.fsdp_unsafe_setattr_env(), "FSDP_USE_UNSAFE_SETATTR")
        self.assertEqual(compat.fsdp_full_prec_in_eval_env(), "FSDP_USE_FULL_PREC_IN_EVAL")
        self.assertIsInstance(compat.hybrid_shard_zero2(), ShardingStrategy)
        self.assertTrue(issubclass(compat.fsdp1_exec_order_class(), object))

    def test_fsdp_all_gather_is_a_real_dist_function(self):
        name = compat.fsdp_all_gather_name()
        self.assertIn(name, ("all_gather_single", "all_gather_into_tensor"))
        self.assertTrue(callable(getattr(dist, name)))

    def test_fully_shard_param_group_pieces(self):
        module = compat.fsdp_param_group_module()
        for name in ("foreach_all_gather", "foreach_reduce"):
            self.assertTrue(callable(vars(module)[name]), name)
        group_cls = compat.fsdp_param_group_class()
        self.assertIs(group_cls, module.FSDPParamGroup)
        for name in ("unshard", "reshard", "post_backward"):
            self.assertTrue(callable(vars(group_cls)[name]), name)

    def test_fsdp1_no_reshard_after_forward_strategies(self):
        strategies = compat.fsdp1_no_reshard_after_forward_strategies()
        self.assertIn(ShardingStrategy.SHARD_GRAD_OP, strategies)
        self.assertNotIn(ShardingStrategy.FULL_SHARD, strategies)

    def test_fsdp1_assert_idle(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if dist.is_initialized():
            self.skipTest("a default process group already exists in this process")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        errors = []

        class CheckDuringForward(torch.nn.Module):
            def forward(self, x):
                try:
                    compat.fsdp1_assert_idle(model)
                except ValueError as error:
                    errors.append(error)
                return x

        try:
            model = FSDP(
                torch.nn.Sequential(torch.nn.Linear(2, 2), CheckDuringForward()),
                device_id=torch.device("cpu"),
            )
            model(torch.ones(1, 2)).sum().backward()
            compat.fsdp1_assert_idle(model)
            self.assertEqual(1, len(errors), "a root in its forward passed as idle")
        finally:
            dist.destroy_process_group()

    @unittest.skipUnless(torch.cuda.is_available(), "torch.cuda._sleep needs a CUDA device")
    def test_cuda_stream_sleep_delays_the_stream(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        compat.cuda_stream_sleep(20)
        end.record()
        end.synchronize()
        self.assertGreaterEqual(start.elapsed_time(end), 10)

    def test_tensor_backward_hooks(self):
        t = torch.ones(1, requires_grad=True)
        self.assertEqual(compat.tensor_backward_hooks(t), [])
        hook = t.register_hook(lambda g: g)
        self.assertEqual(len(compat.tensor_backward_hooks(t)), 1)
        hook.remove()

    def test_thread_local_world_gives_each_thread_its_own_default_group(self):
        seen = {}
        initialised, checked = threading.Event(), threading.Event()

        def in_thread():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            seen["thread"] = dist.is_initialized()
            initialised.set()
            checked.wait(30)
            dist.destroy_process_group()

        with c10d_world.thread_local_c10d_world():
            thread = threading.Thread(target=in_thread)
            thread.start()
            initialised.wait(30)
            seen["main, while the thread has a group"] = dist.is_initialized()
            checked.set()
            thread.join()
        self.assertEqual(seen, {"thread": True, "main, while the thread has a group": False})
        self.assertFalse(dist.is_initialized())

    def test_every_fault_installs_in_a_fresh_interpreter(self):
        # A fault patches torch for good, so they are installed in a child, never here.
        code = (
            "from harness.compat import torch_internals as compat\n"
            "for name in compat.FAULTS:\n    compat.install_fault(name)\n    print(name)"
        )
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
        )
        self.assertEqual(0, result.returncode, result.stderr[-3000:])
        self.assertEqual(result.stdout.split(), list(compat.FAULTS))
        self.assertTrue(compat.FAULTS)

    def test_unknown_fault_is_a_one_line_error_naming_it(self):
        expected = r"^unknown fault 'no_such_fault'; known faults: "
        with self.assertRaisesRegex(ValueError, expected) as caught:
            compat.install_fault("no_such_fault")
        self.assertNotIn("\n", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
