"""The DTensor kit: DTensorTestBase, with_comms (both forms), init_pg, the LocalTensor
variants, and the differential run of the upstream-style files in tests/upstream_style/
under upstream's harness and this one."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Dict, List, Tuple
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from harness import settings
from harness.compat import local_tensor as compat_local_tensor
from harness.kit.dtensor import (
    DTensorContinuousTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    LocalDTensorContinuousTestBase,
    LocalDTensorOpTestBase,
    LocalDTensorTestBase,
    _convert_shard_order_dict_to_ShardOrder,
    create_local_tensor_test_class,
    generate_shard_orders,
    make_full_tensor,
    map_local_for_rank,
    map_local_tensor_for_rank,
    num_devices,
    patched_distribute_tensor,
    redistribute,
    reduce_local_int,
    shard_order_to_placement,
    validate_sharding_rule_sample,
    validate_sharding_rule_sample_backward,
    with_comms,
    with_temp_dir,
)
from tests.fixtures import child_env, upstream_env
from tests.upstream_style.dtensor_driver import rewrite_for_upstream

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_STYLE = ROOT / "tests" / "upstream_style"
DIFFERENTIAL_FILES = ("dtensor_api", "dtensor_ops", "dtensor_redistribute")
DIFFERENTIAL_TIMEOUT_S = 1500  # upstream's harness starts 4 fresh interpreters per test


@pytest.mark.slow
class TestDTensorBase(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def test_no_group_without_with_comms(self) -> None:
        self.assertFalse(dist.is_initialized())

    @with_comms
    def test_with_comms_gives_a_group_and_a_mesh(self) -> None:
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_world_size(), 2)
        self.assertEqual(dist.get_backend(), self.backend)
        mesh = self.build_device_mesh()
        self.assertEqual(mesh.device_type, self.device_type)
        sharded = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        self.assertEqual(sharded.to_local(), torch.arange(4.0)[2 * self.rank: 2 * self.rank + 2])
        self.assertEqual(sharded.full_tensor(), torch.arange(4.0))

    @with_comms(eager_init=True, backend="gloo")
    def test_with_comms_called_hands_backend_to_init_pg(self) -> None:
        self.assertEqual(dist.get_backend(), "gloo")
        replicated = distribute_tensor(torch.ones(2), self.build_device_mesh(), [Replicate()])
        self.assertEqual(replicated.full_tensor(), torch.ones(2))

    @with_comms()
    def test_with_comms_called_without_arguments(self) -> None:
        self.assertEqual(dist.get_world_size(), 2)

    @with_comms
    def test_init_manual_seed_for_rank_differs_per_rank(self) -> None:
        self.init_manual_seed_for_rank()
        drawn = torch.rand(3)
        self.assertEqual(drawn, torch.rand(3, generator=torch.Generator().manual_seed(self.rank)))
        gathered = [torch.empty(3), torch.empty(3)]
        dist.all_gather(gathered, drawn)
        self.assertNotEqual(gathered[0], gathered[1])

    @with_comms
    @with_temp_dir
    def test_with_temp_dir_is_shared(self) -> None:
        self.assertTrue(os.path.isdir(self.temp_dir))
        paths = [None, None]
        dist.all_gather_object(paths, self.temp_dir)
        self.assertEqual(paths[0], paths[1])
        with open(os.path.join(self.temp_dir, f"rank{self.rank}"), "w") as f:
            f.write("written")
        dist.barrier()
        self.assertEqual(sorted(os.listdir(self.temp_dir)), ["rank0", "rank1"])

    def rank_tear_down(self) -> None:  # each rank, after the test (tearDown: the parent's)
        super().rank_tear_down()
        self.assertFalse(dist.is_initialized(), "with_comms left the group behind")
        if self.rank == 0 and hasattr(self, "temp_dir"):
            self.assertFalse(os.path.exists(self.temp_dir), "with_temp_dir left its dir behind")


class TestDTensorOpBase(DTensorOpTestBase):
    def test_threads_have_a_group_and_four_ranks(self) -> None:
        self.assertEqual(self.world_size, num_devices())
        self.assertEqual(dist.get_world_size(), self.world_size)
        sharded = distribute_tensor(torch.ones(8, 2), self.build_device_mesh(), [Shard(0)])
        self.assertEqual(sharded.full_tensor(), torch.ones(8, 2))

    @with_comms
    def test_with_comms_passes_through_without_init_pg(self) -> None:
        self.assertEqual(dist.get_world_size(), self.world_size)


class ContinuousSample(DTensorContinuousTestBase):
    world_size = 2

    @with_comms  # passes through: the class's group already exists
    def test_group_and_mesh(self) -> None:
        self.assertEqual(dist.get_world_size(), 2)
        expected = "fake" if self.is_local_tensor_enabled else type(self).backend_str()
        self.assertEqual(dist.get_backend(), expected)
        sharded = distribute_tensor(torch.ones(4), self.build_device_mesh(), [Shard(0)])
        self.assertEqual(sharded.to_local(), torch.ones(2))


ContinuousSampleWithLocalTensor = create_local_tensor_test_class(
    ContinuousSample, base_class=LocalDTensorContinuousTestBase
)
pytest.mark.slow(ContinuousSample)  # its ranks are processes; the twin made above is not


class TestShardingRuleChecks(DTensorOpTestBase):
    """validate_sharding_rule_sample(_backward) give upstream's verdicts on the same samples."""

    def test_forward_verdicts_match_upstream(self) -> None:
        from torch.testing._internal.distributed._tensor import common_dtensor as upstream

        mesh = self.build_device_mesh()
        x = torch.arange(16.0).reshape(8, 2)
        column_sum = functools.partial(torch.sum, dim=0)
        cases = [
            (torch.add, (x, x), [Shard(0), Shard(0)], [Shard(0)], True),
            (torch.add, (x, x), [Shard(0), Shard(0)], [Shard(1)], False),
            (column_sum, (x,), [Shard(0)], [Partial()], True),
            (column_sum, (x,), [Shard(0)], [Replicate()], False),
        ]
        for op, args, placements_in, placements_out, expected in cases:
            mine = validate_sharding_rule_sample(op, args, {}, placements_in, placements_out, mesh)
            theirs = upstream.validate_sharding_rule_sample(
                op, args, {}, placements_in, placements_out, mesh
            )
            self.assertEqual((mine, theirs), (expected, expected))

    def test_backward_verdicts_match_upstream(self) -> None:
        from torch.testing._internal.distributed._tensor import common_dtensor as upstream

        mesh = self.build_device_mesh()
        x = torch.arange(16.0).reshape(8, 2)
        cases = [
            (torch.mul, (x, x), [Shard(0), Shard(0)], True),
            (torch.mul, (x, x), [Shard(0), Replicate()], True),
            (torch.add, (x.long(), x.long()), [Shard(0), Shard(0)], None),
        ]
        for op, args, placements, expected in cases:
            mine = validate_sharding_rule_sample_backward(op, args, {}, placements, mesh)
            theirs = upstream.validate_sharding_rule_sample_backward(op, args, {}, placements, mesh)
            self.assertEqual((mine, theirs), (expected, expected))


@pytest.mark.slow
class _OneRank(DTensorTestBase):
    """A one-rank DTensorTestBase driven in this process, to call init_pg/destroy_pg directly."""

    @property
    def world_size(self) -> int:
        return 1

    def runTest(self) -> None:  # noqa: N802 - unittest's naming
        """Not run: the case only carries init_pg and destroy_pg."""


class TestInitPg(unittest.TestCase):
    def _case(self) -> _OneRank:
        work = tempfile.mkdtemp(prefix="harness-test-init-pg-")
        self.addCleanup(shutil.rmtree, work, True)
        case = _OneRank()
        case.rank = 0
        case.file_name = os.path.join(work, "rendezvous")
        case.init_method = f"file://{case.file_name}"
        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())
        return case

    def test_defaults(self) -> None:
        case = DTensorTestBase()
        self.assertEqual(case.world_size, num_devices())
        self.assertEqual(case.backend, dist.get_default_backend_for_device(case.device_type))
        self.assertFalse(case.is_local_tensor_enabled)
        # The accelerator only with one per rank (one GPU and four ranks: the CPU).
        with mock.patch.object(settings, "accelerator_count", return_value=0):
            self.assertEqual(case.device_type, "cpu")
        with mock.patch.object(settings, "accelerator_count", return_value=case.world_size), \
                mock.patch.object(settings, "device_type", return_value="cuda"):
            self.assertEqual(case.device_type, "cuda")

    @pytest.mark.slow
    def test_a_bad_device_knob_does_not_break_import(self) -> None:
        env = dict(os.environ, HARNESS_DEVICE="bogus")
        code = "import harness; print(harness.NUM_DEVICES, harness.DEVICE_TYPE, harness.PG_BACKEND)"
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual((proc.returncode, proc.stdout), (0, "4 cpu gloo\n"), proc.stderr)

    def test_init_pg_uses_default_backend_then_destroy_pg_removes_group(self) -> None:
        case = self._case()
        case.init_pg(False)
        self.assertEqual(dist.get_backend(), case.backend)
        self.assertEqual(dist.get_world_size(), 1)
        case.destroy_pg()
        self.assertFalse(dist.is_initialized())

    @unittest.skipIf(settings.accelerator_count() > 0, "checks the CPU path of eager_init")
    def test_init_pg_eager_on_cpu_with_explicit_backend(self) -> None:
        case = self._case()
        case.init_pg(True, "cpu:gloo")
        self.assertEqual(dist.get_backend(), "cpu:gloo")
        case.destroy_pg(device_id=0)
        self.assertFalse(dist.is_initialized())

    def test_init_pg_rejects_unknown_backend(self) -> None:
        with self.assertRaisesRegex(RuntimeError, r"^Backend bogus not supported!$"):
            self._case().init_pg(False, "bogus")
        self.assertFalse(dist.is_initialized())

    @unittest.skipIf(settings.accelerator_count() > 0, "checks the no-accelerator path")
    def test_init_pg_with_accelerator_backend_skips_without_devices(self) -> None:
        with self.assertRaisesRegex(unittest.SkipTest, "Need at least 1 CUDA device.*nccl"):
            self._case().init_pg(False, "nccl")
        self.assertFalse(dist.is_initialized())


class _Recorder:
    """Stands in for a test case: records the init_pg / destroy_pg calls with_comms makes."""

    def __init__(self) -> None:
        self.calls: List[Tuple[Any, ...]] = []

    def init_pg(self, eager_init: bool, backend: Any = None) -> None:
        self.calls.append(("init_pg", eager_init, backend))

    def destroy_pg(self) -> None:
        self.calls.append(("destroy_pg",))


class TestWithComms(unittest.TestCase):
    def test_bare_decorator_inits_with_defaults_and_destroys(self) -> None:
        @with_comms
        def test_x(case: _Recorder) -> str:
            case.calls.append(("body",))
            return "result"

        case = _Recorder()
        self.assertEqual(test_x(case), "result")
        self.assertEqual(case.calls, [("init_pg", False, None), ("body",), ("destroy_pg",)])
        self.assertEqual(test_x.__name__, "test_x")

    def test_called_decorator_hands_its_arguments_to_init_pg(self) -> None:
        @with_comms(eager_init=True, backend="gloo")
        def test_x(case: _Recorder) -> None:
            case.calls.append(("body",))

        case = _Recorder()
        test_x(case)
        self.assertEqual(case.calls, [("init_pg", True, "gloo"), ("body",), ("destroy_pg",)])
        self.assertEqual(test_x.__name__, "test_x")

    def test_called_positionally(self) -> None:
        case = _Recorder()
        with_comms(True)(lambda c: None)(case)
        self.assertEqual(case.calls[0], ("init_pg", True, None))

    def test_failing_body_skips_destroy_pg_and_propagates(self) -> None:
        @with_comms
        def test_x(case: _Recorder) -> None:
            raise AssertionError("body failed")

        case = _Recorder()
        with self.assertRaisesRegex(AssertionError, "body failed"):
            test_x(case)
        self.assertEqual(case.calls, [("init_pg", False, None)])

    def test_passes_through_on_a_case_without_init_pg(self) -> None:
        ran = []
        with_comms(lambda case: ran.append(case))("plain")
        self.assertEqual(ran, ["plain"])

    def test_bad_arguments_are_one_line_errors(self) -> None:
        bad_flag = r"^with_comms: eager_init must be a bool, got 'yes'$"
        with self.assertRaisesRegex(TypeError, bad_flag):
            with_comms(eager_init="yes")
        bad_backend = r"^with_comms: backend must be a str or None, got 3$"
        with self.assertRaisesRegex(TypeError, bad_backend):
            with_comms(backend=3)

    def test_with_temp_dir_needs_comms(self) -> None:
        @with_temp_dir
        def test_x(self: object) -> None:
            raise AssertionError("must not run")

        with self.assertRaisesRegex(RuntimeError, "test_x needs a process group: put @with_comms"):
            test_x(object())


# --- LocalTensor variants -------------------------------------------------------------------


class LocalSample(DTensorTestBase):
    """A DTensor class whose LocalTensor twin below runs in this process."""

    @with_comms
    def test_shards_per_simulated_rank(self) -> None:
        mesh = self.build_device_mesh()
        full = torch.arange(8.0).reshape(4, 2)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        expected = map_local_tensor_for_rank(full, self.rank, lambda t, r: t[r: r + 1])
        self.assertEqual(sharded.to_local(), expected)
        self.assertEqual(sharded.full_tensor(), full)

    def test_to_skip(self) -> None:
        self.assertFalse(self.is_local_tensor_enabled, "in skipped_tests: the twin must not run it")


LocalSampleWithLocalTensor = create_local_tensor_test_class(
    LocalSample, skipped_tests=["test_to_skip"]
)
pytest.mark.slow(LocalSample)  # its ranks are processes; the twin made above is not


class TestCreateLocalTensorTestClass(unittest.TestCase):
    def _run(self, cls: type, name: str) -> unittest.TestResult:
        result = unittest.TestResult()
        cls(name).run(result)
        return result

    def test_name_module_bases_and_ids(self) -> None:
        cls = LocalSampleWithLocalTensor
        self.assertEqual(cls.__name__, "LocalSampleWithLocalTensor")
        self.assertEqual(cls.__qualname__, "LocalSampleWithLocalTensor")
        self.assertEqual(cls.__module__, __name__)
        self.assertEqual(cls.__bases__, (LocalDTensorTestBase, DTensorTestBase))
        names = unittest.TestLoader().getTestCaseNames(cls)
        self.assertEqual(list(names), ["test_shards_per_simulated_rank", "test_to_skip"])
        self.assertEqual(
            cls("test_to_skip").id(), f"{__name__}.LocalSampleWithLocalTensor.test_to_skip"
        )

    def test_runs_in_this_process_with_every_rank_simulated(self) -> None:
        seen: Dict[str, Any] = {}

        class Probe(DTensorTestBase):
            @with_comms
            def test_probe(self) -> None:
                seen["backend"] = dist.get_backend()
                seen["world"] = dist.get_world_size()
                seen["local"] = self.is_local_tensor_enabled
                seen["ranks"] = reduce_local_int(self.rank, dict)

        probe = create_local_tensor_test_class(Probe)
        children_before = len(_children())
        result = self._run(probe, "test_probe")
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(seen, {"backend": "fake", "world": 4, "local": True,
                                "ranks": {0: 0, 1: 1, 2: 2, 3: 3}})
        self.assertEqual(len(_children()), children_before)
        self.assertFalse(dist.is_initialized())

    def test_sharding_matches_per_rank_expectation(self) -> None:
        result = self._run(LocalSampleWithLocalTensor, "test_shards_per_simulated_rank")
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)

    def test_skipped_tests_skip(self) -> None:
        result = self._run(LocalSampleWithLocalTensor, "test_to_skip")
        self.assertEqual([reason for _, reason in result.skipped], ["Skipped test"])

    def test_a_wrong_per_rank_expectation_does_not_pass(self) -> None:
        class Wrong(DTensorTestBase):
            @with_comms
            def test_wrong(self) -> None:
                mesh = self.build_device_mesh()
                sharded = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
                self.assertEqual(sharded.to_local(), torch.tensor([0.0]))  # only rank 0's

        # Comparing a LocalTensor whose ranks disagree raises inside torch's comparison
        # (an error, as under upstream's harness); either way the test must not pass.
        result = self._run(create_local_tensor_test_class(Wrong), "test_wrong")
        self.assertEqual(len(result.failures) + len(result.errors), 1)
        self.assertIn("test_wrong", (result.failures + result.errors)[0][1])
        self.assertFalse(dist.is_initialized(), "the fake group outlived a failing test")

    def test_op_test_base_variant_starts_no_threads(self) -> None:
        seen: Dict[str, Any] = {}

        class Ops(DTensorOpTestBase):
            @with_comms
            def test_ops(self) -> None:
                seen["world"] = dist.get_world_size()
                seen["mesh"] = self.build_device_mesh().size()

        cls = create_local_tensor_test_class(Ops, base_class=LocalDTensorOpTestBase)
        self.assertEqual(cls.__name__, "OpsWithLocalTensor")
        result = self._run(cls, "test_ops")
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(seen, {"world": 4, "mesh": 4})

    def test_continuous_variant_shares_one_fake_group_for_the_class(self) -> None:
        suite = unittest.TestLoader().loadTestsFromTestCase(ContinuousSampleWithLocalTensor)
        result = unittest.TestResult()
        suite.run(result)
        self.assertEqual((result.testsRun, result.errors, result.failures), (1, [], []))
        self.assertFalse(dist.is_initialized(), "tearDownClass left the fake group")

    def test_rejects_a_non_class(self) -> None:
        with self.assertRaisesRegex(TypeError, "expected a test class, got 3"):
            create_local_tensor_test_class(3)  # type: ignore[arg-type]


class TestMapForRank(unittest.TestCase):
    def test_outside_local_tensor_mode_calls_once(self) -> None:
        tensor = torch.arange(4)
        self.assertEqual(map_local_tensor_for_rank(tensor, 2, lambda t, r: t[r]), torch.tensor(2))
        self.assertEqual(map_local_for_rank(3, lambda r: r * 10), 30)

    def test_under_local_tensor_mode_runs_per_rank(self) -> None:
        with compat_local_tensor.local_tensor_mode(3):
            rank = compat_local_tensor.local_rank(3)
            mapped = map_local_tensor_for_rank(torch.arange(3), rank, lambda t, r: t[r] * 10)
        self.assertTrue(compat_local_tensor.is_local_tensor(mapped))
        per_rank = {r: int(t) for r, t in mapped._local_tensors.items()}
        self.assertEqual(per_rank, {0: 0, 1: 10, 2: 20})


class _MeshShape:
    """Stands in for a DeviceMesh where only its number of dims matters."""

    def __init__(self, ndim: int) -> None:
        self.ndim = ndim


class TestShardOrderHelpers(unittest.TestCase):
    """The shard-order helpers give what upstream's give (upstream imported for comparison)."""

    @classmethod
    def setUpClass(cls) -> None:
        from torch.testing._internal.distributed._tensor import common_dtensor

        cls.upstream = common_dtensor

    def test_generate_shard_orders_and_placements_match_upstream(self) -> None:
        for ndim in (1, 2, 3):
            for tensor_rank in (1, 2, 3):
                with self.subTest(ndim=ndim, tensor_rank=tensor_rank):
                    mesh = _MeshShape(ndim)
                    mine = list(generate_shard_orders(mesh, tensor_rank))
                    theirs = list(self.upstream.generate_shard_orders(mesh, tensor_rank))
                    self.assertEqual(mine, theirs)
                    self.assertGreater(len(mine), 0)
                    for order in mine:
                        self.assertEqual(shard_order_to_placement(order, mesh),
                                         self.upstream.shard_order_to_placement(order, mesh))

    def test_distribute_in_order_and_gather_back(self) -> None:
        compat_local_tensor.init_fake_process_group(4)
        self.addCleanup(dist.destroy_process_group)
        full = torch.arange(16.0).reshape(4, 4)
        with compat_local_tensor.local_tensor_mode(4):
            with compat_local_tensor.maybe_disable_local_tensor_mode():
                mesh = init_device_mesh("cpu", (2, 2))
            order = _convert_shard_order_dict_to_ShardOrder({0: [1, 0]})
            mine = patched_distribute_tensor(full, mesh, None, order)
            theirs = self.upstream.patched_distribute_tensor(full, mesh, None, order)
            self.assertEqual(mine.placements, (Shard(0), Shard(0)))
            self.assertEqual(mine._spec.shard_order, theirs._spec.shard_order)
            mine_local, theirs_local = mine.to_local(), theirs.to_local()
            gathered = make_full_tensor(mine)
            to_dim1 = _convert_shard_order_dict_to_ShardOrder({1: [1]})
            moved = redistribute(mine, mesh, None, to_dim1).to_local()
            moved_upstream = self.upstream.redistribute(theirs, mesh, None, to_dim1).to_local()
        self.assertEqual(_per_rank(mine_local), _per_rank(theirs_local))
        self.assertEqual(_per_rank(gathered), {r: full.tolist() for r in range(4)})
        self.assertEqual(_per_rank(moved), _per_rank(moved_upstream))
        self.assertEqual(_per_rank(moved)[1], full[:, 2:].tolist())  # rank 1: mesh coords (0, 1)


def _per_rank(tensor: torch.Tensor) -> Dict[int, Any]:
    return {r: t.tolist() for r, t in tensor._local_tensors.items()}


def _children() -> List[str]:
    """This process's child pids (to show a LocalTensor test starts none)."""
    path = f"/proc/{os.getpid()}/task/{os.getpid()}/children"
    with open(path) as f:
        return f.read().split()


# --- the differential run against upstream's harness ------------------------------------------

def _run_variant(
    directory: Path, sources: Dict[str, str], upstream: bool = False
) -> Tuple[Dict[str, Any], str]:
    """Write the files into `directory` beside the driver, run them; (outcomes by test, log).
    `upstream`: the files import upstream's harness (tests/fixtures.upstream_env)."""
    for name, source in sources.items():
        (directory / f"{name}.py").write_text(source)
    shutil.copy(UPSTREAM_STYLE / "dtensor_driver.py", directory)
    out = directory / "outcomes.json"
    env = (upstream_env if upstream else child_env)()
    env["PYTHONPATH"] = os.pathsep.join([str(directory), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, str(directory / "dtensor_driver.py"), str(out), *sources],
        cwd=directory, env=env, capture_output=True, text=True, timeout=DIFFERENTIAL_TIMEOUT_S,
    )
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"driver failed in {directory.name}:\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text()), proc.stderr


class TestRewriteForUpstream(unittest.TestCase):
    def test_harness_imports_go_to_upstream_modules(self) -> None:
        source = (
            "import torch\n"
            "from harness import (\n    DTensorTestBase,\n    run_tests,\n    with_comms,\n)\n"
            "from harness.compat.local_tensor import AsyncCollectiveTensor\n"
        )
        self.assertEqual(rewrite_for_upstream(source), (
            "import torch\n"
            "from torch.testing._internal.common_utils import run_tests\n"
            "from torch.testing._internal.distributed._tensor.common_dtensor import "
            "DTensorTestBase, with_comms\n"
            "from torch.distributed._functional_collectives import AsyncCollectiveTensor\n"
        ))

    def test_unknown_names_and_leftover_imports_are_errors(self) -> None:
        with self.assertRaisesRegex(KeyError, "no upstream home known for 'Nope'"):
            rewrite_for_upstream("from harness import Nope\n")
        with self.assertRaisesRegex(ValueError, "an import of harness is left"):
            rewrite_for_upstream("import harness\n")


@pytest.mark.slow
class TestUpstreamStyleDifferential(unittest.TestCase):
    """tests/upstream_style/dtensor_*.py under upstream's harness and under this one.

    Slow (upstream starts four interpreters per multi-process test): the files are run
    once for the class. Every test that passes under upstream must pass here, with the
    same id.
    """

    upstream: Dict[str, Dict[str, str]] = {}
    here: Dict[str, Dict[str, str]] = {}
    here_log = ""

    @classmethod
    def setUpClass(cls) -> None:
        sources = {n: (UPSTREAM_STYLE / f"{n}.py").read_text() for n in DIFFERENTIAL_FILES}
        with tempfile.TemporaryDirectory(prefix="harness-dtensor-diff-") as tmp:
            upstream_dir, here_dir = Path(tmp, "upstream"), Path(tmp, "harness")
            upstream_dir.mkdir()
            here_dir.mkdir()
            cls.upstream, _ = _run_variant(
                upstream_dir, {n: rewrite_for_upstream(s) for n, s in sources.items()},
                upstream=True,
            )
            cls.here, cls.here_log = _run_variant(here_dir, sources)

    def test_same_tests_with_the_same_ids(self) -> None:
        self.assertEqual(sorted(self.here), sorted(self.upstream))
        for key, outcome in self.upstream.items():
            self.assertEqual(self.here[key]["id"], outcome["id"], key)

    def test_every_upstream_pass_passes_here(self) -> None:
        passed = [k for k, v in self.upstream.items() if v["outcome"] == "pass"]
        self.assertGreaterEqual(len(passed), 20, "the files should give upstream 20+ passes")
        not_here = {k: self.here.get(k, {}).get("outcome") for k in passed
                    if self.here.get(k, {}).get("outcome") != "pass"}
        self.assertEqual(not_here, {}, f"what failed here:\n{self.here_log[-8000:]}")

    def test_local_tensor_and_threaded_classes_took_part(self) -> None:
        classes = {key.split(".")[1] for key, v in self.here.items() if v["outcome"] == "pass"}
        self.assertTrue({"DTensorTestWithLocalTensor", "DistTensorOpsTest",
                         "DistTensorOpsTestWithLocalTensor"} <= classes, classes)


if __name__ == "__main__":
    unittest.main()
