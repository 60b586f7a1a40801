"""The harness's threaded backend gives the same results as gloo, never deadlocks on a failure,
and leaves torch's own `threaded` backend (upstream's test utilities) working beside it.

Every collective runs the same script (`collectives_script`) on thread ranks with the
threaded backend and on gloo rank processes, for world sizes 1 to 4 and the dtypes FSDP
uses; results must be equal bit for bit (inputs are small integers, exact in every
dtype, so the order of reduction cannot matter). Calls that gloo rejects must be
rejected too. The gloo side runs once, in a pool of 4 spawned processes.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
import unittest
from functools import cache
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.distributed as dist

from harness.compat import c10d_world
from harness.single_process.testcase import TestCase
from harness.threads import backend as threaded_pg
from harness.threads import world as thread_world
from harness.threads.multithreaded_case import MultiThreadedTestCase

WORLD_SIZES = (1, 2, 3, 4)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
RAISED = "raised"


def collectives_script(rank: int, world_size: int) -> Dict[str, Any]:
    """Every collective the backend implements, on the default group; results by name."""
    results: Dict[str, Any] = {}
    last = world_size - 1
    evens = list(range(0, world_size, 2))
    subgroup = dist.new_group(evens)  # every rank must call new_group

    def record(name: str, fn: Callable[[], Any]) -> None:
        try:
            results[name] = fn()
        except Exception:
            results[name] = RAISED

    def calls_in(dtype: torch.dtype) -> None:
        tag = str(dtype).replace("torch.", "")

        def x(shift: int = 0, n: int = 6) -> torch.Tensor:
            return ((torch.arange(n) + rank + shift) % 3 + 1).to(dtype)

        def all_reduce(op: str, **kw: Any) -> torch.Tensor:
            t = x()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), **kw)
            return t

        for op in REDUCE_OPS:
            record(f"all_reduce/{op}/{tag}", lambda op=op: all_reduce(op))

        def all_reduce_async() -> torch.Tensor:
            t = x(1)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            return t

        def broadcast(src: int) -> torch.Tensor:
            t = x(2)
            dist.broadcast(t, src)
            return t

        def reduce(dst: int, op: str) -> Optional[torch.Tensor]:
            t = x()
            dist.reduce(t, dst, op=getattr(dist.ReduceOp, op))
            return t if rank == dst else None

        def all_gather() -> List[torch.Tensor]:
            outs = [torch.zeros(6, dtype=dtype) for _ in range(world_size)]
            dist.all_gather(outs, x())
            return outs

        def all_gather_single() -> torch.Tensor:
            out = torch.zeros(world_size * 6, dtype=dtype)
            dist.all_gather_single(out, x())
            return out

        def all_gather_coalesced() -> List[List[torch.Tensor]]:
            outs = [[torch.zeros(6, dtype=dtype), torch.zeros(2, dtype=dtype)]
                    for _ in range(world_size)]
            dist.all_gather_coalesced(outs, [x(), x(1, 2)])
            return outs

        def all_reduce_coalesced() -> List[torch.Tensor]:
            tensors = [x(), x(1, 3)]
            dist.all_reduce_coalesced(tensors)
            return tensors

        def reduce_scatter(op: str) -> torch.Tensor:
            out = torch.zeros(6, dtype=dtype)
            dist.reduce_scatter(out, [x(k) for k in range(world_size)],
                                op=getattr(dist.ReduceOp, op))
            return out

        def reduce_scatter_single() -> torch.Tensor:
            out = torch.zeros(2, 3, dtype=dtype)
            dist.reduce_scatter_single(out, x(0, 6 * world_size).view(-1, 3))
            return out

        def all_to_all() -> List[torch.Tensor]:
            outs = [torch.zeros(4, dtype=dtype) for _ in range(world_size)]
            dist.all_to_all(outs, [x(k, 4) for k in range(world_size)])
            return outs

        def all_to_all_single(uneven: bool) -> torch.Tensor:
            if not uneven:
                out = torch.zeros(3 * world_size, dtype=dtype)
                dist.all_to_all_single(out, x(0, 3 * world_size))
                return out
            in_splits = [j + 1 for j in range(world_size)]  # rank j gets j + 1 rows from me
            out_splits = [rank + 1] * world_size
            out = torch.zeros(sum(out_splits), 2, dtype=dtype)
            src = x(0, 2 * sum(in_splits)).view(-1, 2)
            dist.all_to_all_single(out, src, out_splits, in_splits)
            return out

        def gather(dst: int) -> Optional[List[torch.Tensor]]:
            outs = [torch.zeros(6, dtype=dtype) for _ in range(world_size)]
            dist.gather(x(), outs if rank == dst else None, dst)
            return outs if rank == dst else None

        def scatter(src: int) -> torch.Tensor:
            out = torch.zeros(6, dtype=dtype)
            dist.scatter(out, [x(k) for k in range(world_size)] if rank == src else None, src)
            return out

        def subgroup_all_reduce() -> Optional[torch.Tensor]:
            if rank not in evens:
                return None
            t = x()
            dist.all_reduce(t, group=subgroup)
            return t

        record(f"all_reduce_async/{tag}", all_reduce_async)
        record(f"all_reduce_coalesced/{tag}", all_reduce_coalesced)
        record(f"broadcast/src0/{tag}", lambda: broadcast(0))
        record(f"broadcast/src_last/{tag}", lambda: broadcast(last))
        record(f"reduce/SUM/dst_last/{tag}", lambda: reduce(last, "SUM"))
        record(f"reduce/MAX/dst0/{tag}", lambda: reduce(0, "MAX"))
        record(f"all_gather/{tag}", all_gather)
        record(f"all_gather_single/{tag}", all_gather_single)
        record(f"all_gather_coalesced/{tag}", all_gather_coalesced)
        record(f"reduce_scatter/SUM/{tag}", lambda: reduce_scatter("SUM"))
        record(f"reduce_scatter/MIN/{tag}", lambda: reduce_scatter("MIN"))
        record(f"reduce_scatter_single/{tag}", reduce_scatter_single)
        record(f"all_to_all/{tag}", all_to_all)
        record(f"all_to_all_single/even/{tag}", lambda: all_to_all_single(False))
        record(f"all_to_all_single/uneven/{tag}", lambda: all_to_all_single(True))
        record(f"gather/dst_last/{tag}", lambda: gather(last))
        record(f"scatter/src0/{tag}", lambda: scatter(0))
        record(f"subgroup_all_reduce/{tag}", subgroup_all_reduce)

    for dtype in DTYPES:
        calls_in(dtype)

    def objects() -> Dict[str, Any]:
        mine = {"rank": rank, "name": f"r{rank}", "tensor": torch.arange(3) * rank}
        gathered: List[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        to_root: Optional[List[Any]] = [None] * world_size if rank == last else None
        dist.gather_object(mine, to_root, dst=last)
        broadcasted = [mine, "x" * rank]
        dist.broadcast_object_list(broadcasted, src=last)
        scattered: List[Any] = [None]
        dist.scatter_object_list(scattered, [("s", i) for i in range(world_size)], src=0)
        return {"all_gather": gathered, "gather": to_root, "broadcast": broadcasted,
                "scatter": scattered}

    record("objects", objects)
    record("barrier", lambda: dist.barrier() or "passed")
    dist.destroy_process_group(subgroup)
    return results


# --- gloo reference: rank processes ------------------------------------------------------
def _gloo_rank(args: Tuple[str, int, int]) -> Dict[str, Any]:
    path, rank, world_size = args
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    store = dist.FileStore(path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        return collectives_script(rank, world_size)
    finally:
        dist.destroy_process_group()


@cache
def gloo_reference() -> Dict[int, List[Dict[str, Any]]]:
    """What gloo gives every rank, for each world size (computed once per test process)."""
    context = multiprocessing.get_context("spawn")
    reference = {}
    with tempfile.TemporaryDirectory() as tmp, context.Pool(max(WORLD_SIZES)) as pool:
        for world_size in WORLD_SIZES:
            path = os.path.join(tmp, f"store{world_size}")
            jobs = [(path, rank, world_size) for rank in range(world_size)]
            reference[world_size] = pool.map(_gloo_rank, jobs, chunksize=1)
    return reference


# --- thread ranks with the threaded backend ----------------------------------------------
def run_on_threads(
    world_size: int,
    fn: Callable[[int, int], Any],
    timeout: float = 60.0,
    collective_timeout: Optional[float] = None,
) -> Tuple[List[Any], List[Optional[BaseException]]]:
    """Run `fn(rank, world_size)` on thread ranks bound to one world: (results, errors)."""
    threaded_pg.register()
    world = thread_world.ThreadedWorld(world_size, collective_timeout or timeout)
    results: List[Any] = [None] * world_size
    errors: List[Optional[BaseException]] = [None] * world_size

    def main(rank: int) -> None:
        thread_world.bind_thread(world, rank)
        torch.autograd.set_multithreading_enabled(False)
        try:
            dist.init_process_group(threaded_pg.BACKEND_NAME, rank=rank, world_size=world_size,
                                    store=world.store)
            results[rank] = fn(rank, world_size)
        except BaseException as error:
            errors[rank] = error
        finally:
            world.rank_exited(rank, "failed its test" if errors[rank] else "finished its test")
            if dist.is_initialized():
                dist.destroy_process_group()
            thread_world.unbind_thread()

    with c10d_world.thread_local_c10d_world():
        threads = [threading.Thread(target=main, args=(r,), daemon=True)
                   for r in range(world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        stuck = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if stuck:
        world.abort("test helper gave up")
        raise AssertionError(f"rank threads {stuck} did not finish within {timeout}s")
    return results, errors


@pytest.mark.slow
class TestAgainstGloo(TestCase):
    """Same script, same inputs: the threaded backend's results equal gloo's."""

    def test_every_collective_matches_gloo(self) -> None:
        reference = gloo_reference()
        for world_size in WORLD_SIZES:
            results, errors = run_on_threads(world_size, collectives_script)
            self.assertEqual(errors, [None] * world_size)
            for rank in range(world_size):
                expected, actual = reference[world_size][rank], results[rank]
                self.assertEqual(sorted(actual), sorted(expected))
                for name in expected:
                    with self.subTest(world_size=world_size, rank=rank, call=name):
                        self.assertEqual(actual[name], expected[name], atol=0, rtol=0)

    def test_reference_exercises_every_collective(self) -> None:
        """Guard against a script where gloo rejects (almost) everything."""
        ok = {name for name, v in gloo_reference()[2][0].items() if v != RAISED}
        rejected = {name for name, v in gloo_reference()[2][0].items() if v == RAISED}
        floats = ("float32", "float16", "bfloat16")
        expected = [f"all_reduce/{op}/{t}" for op in ("BAND", "BOR", "BXOR") for t in floats]
        self.assertEqual(sorted(rejected), sorted([*expected, "all_reduce/AVG/int64"]))
        self.assertGreaterEqual(len(ok), 90)


def _collective_calls(world_size: int) -> Dict[str, Callable[[], Any]]:
    """One call per collective kind, each of which waits for every rank of the group."""
    t = lambda n=4: torch.ones(n)  # noqa: E731
    return {
        "barrier": lambda: dist.barrier(),
        "broadcast": lambda: dist.broadcast(t(), 0),
        "all_reduce": lambda: dist.all_reduce(t()),
        "reduce": lambda: dist.reduce(t(), 0),
        "all_gather": lambda: dist.all_gather([t() for _ in range(world_size)], t()),
        "all_gather_single": lambda: dist.all_gather_single(t(4 * world_size), t()),
        "reduce_scatter": lambda: dist.reduce_scatter(t(), [t() for _ in range(world_size)]),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(t(), t(4 * world_size)),
        "all_to_all": lambda: dist.all_to_all([t() for _ in range(world_size)],
                                              [t() for _ in range(world_size)]),
        "all_to_all_single": lambda: dist.all_to_all_single(t(world_size), t(world_size)),
        "gather": lambda: dist.gather(t(), None, 0),
        "scatter": lambda: dist.scatter(t(), None, 0),
        "all_gather_object": lambda: dist.all_gather_object([None] * world_size, 1),
        "async_all_reduce": lambda: dist.all_reduce(t(), async_op=True).wait(),
    }


class TestFailureReleasesWaiters(TestCase):
    """A rank that fails while the others wait in a collective releases them at once."""

    def test_each_collective_kind(self) -> None:
        world_size = 3
        for kind in _collective_calls(world_size):

            def body(rank: int, size: int, kind: str = kind) -> None:
                if rank == 0:
                    time.sleep(0.2)  # let the others reach the collective and wait
                    raise ValueError("rank 0 breaks")
                _collective_calls(size)[kind]()

            with self.subTest(kind=kind):
                _, errors = run_on_threads(world_size, body, timeout=30.0)
                self.assertIsInstance(errors[0], ValueError)
                for rank in (1, 2):
                    self.assertIsInstance(errors[rank], thread_world.RankReleased)
                    self.assertIn("rank 0 failed its test without joining it", str(errors[rank]))

    def test_abort_releases_waiters_and_later_calls(self) -> None:
        def body(rank: int, size: int) -> None:
            if rank == 0:
                time.sleep(0.2)
                thread_world.current_world().abort("stopped by the test")
                return
            with self.assertRaisesRegex(thread_world.RankReleased, "stopped by the test"):
                dist.all_reduce(torch.ones(1))
            with self.assertRaisesRegex(thread_world.RankReleased, "stopped by the test"):
                dist.barrier()

        _, errors = run_on_threads(2, body)
        self.assertEqual(errors, [None, None])


class TestBackendBehaviour(TestCase):
    def test_mismatched_collectives_fail_on_every_rank(self) -> None:
        def body(rank: int, size: int) -> None:
            if rank == 0:
                dist.all_reduce(torch.ones(2))
            else:
                dist.broadcast(torch.ones(2), 0)

        _, errors = run_on_threads(2, body)
        for error in errors:
            self.assertIsInstance(error, thread_world.CollectiveError)
            self.assertIn("collective mismatch", str(error))
            self.assertIn("all_reduce(SUM)", str(error))
            self.assertIn("broadcast(0)", str(error))

    def test_collective_timeout_names_missing_ranks(self) -> None:
        def body(rank: int, size: int) -> None:
            if rank == 1:
                time.sleep(1.5)
                return
            dist.all_reduce(torch.ones(1))

        _, errors = run_on_threads(2, body, collective_timeout=0.5)
        self.assertIsInstance(errors[0], thread_world.CollectiveError)
        self.assertIn("timed out after 0.5s waiting for ranks [1]", str(errors[0]))

    def test_unimplemented_calls_name_the_collective(self) -> None:
        def body(rank: int, size: int) -> None:
            with self.assertRaisesRegex(NotImplementedError, "does not implement send"):
                dist.send(torch.ones(1), dst=1 - rank)

        _, errors = run_on_threads(2, body)
        self.assertEqual(errors, [None, None])

    def test_dtensor_redistribution(self) -> None:
        """DTensor's path: functional collectives that resolve the group by name, in C++."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

        def body(rank: int, size: int) -> Dict[str, Any]:
            mesh = init_device_mesh("cpu", (size,))
            full = torch.arange(12.0).view(4, 3)
            sharded = distribute_tensor(full, mesh, [Shard(0)])
            # Each rank holds its share of a sum: ones * (rank + 1).
            partial = DTensor.from_local(torch.ones(4, 3) * (rank + 1), mesh, [Partial()])
            return {
                "local": sharded.to_local().clone(),
                "gathered": sharded.full_tensor(),
                "reduced": partial.redistribute(mesh, [Replicate()]).to_local().clone(),
                "scattered": partial.redistribute(mesh, [Shard(0)]).to_local().clone(),
            }

        results, errors = run_on_threads(2, body)
        self.assertEqual(errors, [None, None])
        full = torch.arange(12.0).view(4, 3)
        for rank in range(2):
            self.assertEqual(results[rank]["local"], full[2 * rank:2 * rank + 2])
            self.assertEqual(results[rank]["gathered"], full)
            self.assertEqual(results[rank]["reduced"], torch.full((4, 3), 3.0))
            self.assertEqual(results[rank]["scattered"], torch.full((2, 3), 3.0))

    def test_async_work_and_future(self) -> None:
        def body(rank: int, size: int) -> Dict[str, Any]:
            work = dist.all_reduce(torch.full((1,), rank + 1.0), async_op=True)
            value = work.get_future().wait()
            return {"future": value, "completed": work.is_completed(), "ok": work.is_success()}

        results, errors = run_on_threads(2, body)
        self.assertEqual(errors, [None, None])
        for result in results:
            self.assertEqual(result, {"future": [torch.tensor([3.0])], "completed": True,
                                      "ok": True})

    def test_single_tensor_collectives_accept_nccl_shapes(self) -> None:
        """Stacked all_gather output and shaped reduce_scatter input, as NCCL accepts them."""

        def body(rank: int, size: int) -> Dict[str, torch.Tensor]:
            stacked = torch.zeros(size, 2, 3)
            dist.all_gather_single(stacked, torch.full((2, 3), float(rank)))
            shaped = torch.zeros(2, 3)
            dist.reduce_scatter_single(shaped, torch.arange(6.0 * size) + rank)
            return {"stacked": stacked, "shaped": shaped}

        results, errors = run_on_threads(3, body)
        self.assertEqual(errors, [None] * 3)
        expected_stack = torch.stack([torch.full((2, 3), float(r)) for r in range(3)])
        total = sum(torch.arange(18.0) + r for r in range(3))
        for rank in range(3):
            self.assertEqual(results[rank]["stacked"], expected_stack)
            self.assertEqual(results[rank]["shaped"], total[6 * rank:6 * rank + 6].view(2, 3))

    def test_without_a_bound_world_init_fails_clearly(self) -> None:
        threaded_pg.register()
        with c10d_world.thread_local_c10d_world():
            with self.assertRaisesRegex(RuntimeError, "bound to a ThreadedWorld"):
                dist.init_process_group(threaded_pg.BACKEND_NAME, rank=0, world_size=1,
                                        store=dist.HashStore())
        self.assertFalse(dist.is_initialized())


class _OurThreads(MultiThreadedTestCase):
    """A MultiThreadedTestCase of the harness, run before torch's own threaded helpers."""

    @property
    def world_size(self) -> int:
        return 2

    def test_all_reduce(self) -> None:
        value = torch.ones(1)
        dist.all_reduce(value)
        self.assertEqual(value.item(), 2.0)
        self.assertEqual(dist.get_backend(), threaded_pg.BACKEND_NAME)


def _upstream_spawned_cases() -> type:
    """A TestCase of upstream's harness using upstream's spawn_threads_and_init_comms."""
    from torch.testing._internal.common_distributed import spawn_threads_and_init_comms
    from torch.testing._internal.common_utils import TestCase as UpstreamTestCase

    class Spawned(UpstreamTestCase):
        @spawn_threads_and_init_comms(world_size=2)
        def test_sum(self) -> None:
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == 2.0
            assert dist.get_backend() == "threaded"

        @spawn_threads_and_init_comms(world_size=2)
        def test_wrong_sum(self) -> None:
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == 3.0, "wrong sum"

    return Spawned


class TorchOwnThreadedBackendTest(unittest.TestCase):
    """Upstream's own thread helpers keep working after the harness's threads ran (they broke
    when this backend took over the name `threaded`: their threads died before reporting)."""

    def test_upstream_spawn_helper_after_ours(self) -> None:
        spawned = _upstream_spawned_cases()  # registers torch's own `threaded` backend
        ours = unittest.TestResult()
        _OurThreads("test_all_reduce").run(ours)
        self.assertTrue(ours.wasSuccessful(), ours.failures + ours.errors)
        self.assertIn("threaded", dist.Backend.backend_list)
        self.assertIn(threaded_pg.BACKEND_NAME, dist.Backend.backend_list)
        passing, failing = unittest.TestResult(), unittest.TestResult()
        spawned("test_sum").run(passing)
        spawned("test_wrong_sum").run(failing)
        self.assertTrue(passing.wasSuccessful(), passing.failures + passing.errors)
        self.assertEqual(failing.testsRun, 1)
        self.assertFalse(failing.wasSuccessful())
        self.assertIn("wrong sum", str(failing.failures + failing.errors))
        again = unittest.TestResult()
        _OurThreads("test_all_reduce").run(again)  # and ours still works after theirs
        self.assertTrue(again.wasSuccessful(), again.failures + again.errors)


if __name__ == "__main__":
    unittest.main()
