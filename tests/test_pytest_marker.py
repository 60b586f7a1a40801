"""harness/pytest_plugin/marker.py: reading `@pytest.mark.ranks` and placing its ranks (fast:
the device count is an argument, so the accelerator rules are tested here without one)."""

from __future__ import annotations

import pytest

from harness.pytest_plugin.marker import (
    MarkerError,
    Ranks,
    placement,
    read_ranks,
    size_id,
)


class TestReadRanks:
    def test_one_size_adds_no_id_and_a_list_does(self) -> None:
        assert read_ranks((2,), {}) == Ranks((2,), listed=False)
        assert read_ranks(([2, 4],), {"mode": "shared"}) == Ranks((2, 4), True, "shared")
        assert size_id(4) == "ranks4"

    def test_leak_checks_to_skip_take_a_name_or_several(self) -> None:
        assert read_ranks((2,), {"skip_leak_checks": "environ"}).skip_leak_checks == ("environ",)
        waived = read_ranks((2,), {"skip_leak_checks": ("environ", "threads")})
        assert waived.skip_leak_checks == ("environ", "threads")

    @pytest.mark.parametrize("args,kwargs,error", [
        ((0,), {}, "world size 0 is below 1"),
        (([2, -1],), {}, "world size -1 is below 1"),
        (("2",), {}, "world size '2' is not an int"),
        ((True,), {}, "world size True is not an int"),
        (([],), {}, "no world size given"),
        (([2, 2],), {}, "world size listed twice"),
        ((), {}, "takes one world size or a list"),
        ((2, 4), {}, "takes one world size or a list"),
        ((2,), {"mode": "processes"}, "unknown mode 'processes'"),
        ((2,), {"device": "tpu"}, "unknown device 'tpu'"),
        ((2,), {"colour": 1}, "unknown option 'colour'"),
        ((2,), {"timeout": 0}, "timeout must be a positive number"),
        ((2,), {"init": "yes"}, "init must be True or False"),
        ((2,), {"backend": 3}, "backend must be a name"),
        ((2,), {"skip_leak_checks": ("environment",)},
         "skip_leak_checks: unknown check 'environment'"),
        ((2,), {"skip_leak_checks": 1}, "skip_leak_checks must be a tuple of check names"),
    ])
    def test_bad_input_is_one_line_naming_it(self, args: tuple, kwargs: dict, error: str) -> None:
        with pytest.raises(MarkerError, match=error) as raised:
            read_ranks(args, kwargs)
        assert "\n" not in str(raised.value)


class TestPlacement:
    def test_auto_takes_one_accelerator_per_rank_where_enough_exist(self) -> None:
        assert placement(Ranks((2,)), 2, accelerators=2).device_type == "cuda"
        assert placement(Ranks((2,)), 2, accelerators=2).backend == "nccl"
        assert placement(Ranks((4,)), 4, accelerators=2) == placement(Ranks((4,)), 4, 0)
        assert placement(Ranks((4,)), 4, accelerators=0).backend == "gloo"

    def test_cuda_without_enough_skips_naming_what_is_missing(self) -> None:
        skip = placement(Ranks((2,), device="cuda"), 2, accelerators=1).skip
        assert skip is not None and "needs 2 CUDA device(s), 1 available here" in skip

    def test_allow_cpu_or_its_variable_lets_the_cpu_stand_in(self) -> None:
        cuda = Ranks((2,), device="cuda", allow_cpu=True)
        assert placement(cuda, 2, accelerators=0).device_type == "cpu"
        assert placement(Ranks((2,), device="cuda"), 2, 0, allow_cpu_env=True).skip is None

    def test_the_cpu_stands_in_only_without_any_accelerator(self) -> None:
        cuda = Ranks((2,), device="cuda", allow_cpu=True)
        assert placement(cuda, 2, accelerators=1).skip == "needs 2 CUDA device(s), 1 available here"
        assert placement(Ranks((2,), device="cuda"), 2, 1, allow_cpu_env=True).skip is not None

    def test_cpu_and_threads_stay_on_the_cpu_and_a_backend_wins(self) -> None:
        assert placement(Ranks((2,), device="cpu"), 2, accelerators=8).device_type == "cpu"
        assert placement(Ranks((2,), mode="threads"), 2, accelerators=8).device_type == "cpu"
        assert placement(Ranks((2,), backend="mpi"), 2, accelerators=0).backend == "mpi"
