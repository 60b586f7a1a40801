"""harness.threads.collective_math: what each collective computes from every rank's payload.

Payloads are built the way harness/threads/backend.py builds them, one per rank in group-rank
order; results are checked against values worked out by hand.
"""

from __future__ import annotations

import unittest
from typing import List

import torch
import torch.distributed as dist

from harness.threads import collective_math as cm

# Three ranks' inputs of one all_reduce; every result below is exact in int64 and float32.
RANK_VALUES = ([1, 6, 3], [4, 2, 5], [2, 3, 7])
EXPECTED = {
    "SUM": [7, 11, 15],
    "PRODUCT": [8, 36, 105],
    "MIN": [1, 2, 3],
    "MAX": [4, 6, 7],
    "BAND": [0, 2, 1],
    "BOR": [7, 7, 7],
    "BXOR": [7, 7, 1],
}


def ranks(dtype: torch.dtype) -> List[List[torch.Tensor]]:
    """all_reduce payloads: each rank's list holding its one tensor."""
    return [[torch.tensor(v, dtype=dtype)] for v in RANK_VALUES]


class OpName(unittest.TestCase):
    def test_every_c10d_op_maps_to_its_name(self) -> None:
        for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
            self.assertEqual(cm.op_name(getattr(dist.ReduceOp, name)), name)

    def test_premul_sum_is_not_implemented(self) -> None:
        with self.assertRaisesRegex(NotImplementedError, "does not implement reduce op"):
            cm.op_name(dist.ReduceOp.PREMUL_SUM)


class AllReduce(unittest.TestCase):
    def test_every_op_on_integers(self) -> None:
        for op, expected in EXPECTED.items():
            with self.subTest(op=op):
                payloads = ranks(torch.int64)
                cm.all_reduce(payloads, op)
                for (tensor,) in payloads:
                    self.assertEqual(tensor.tolist(), expected)
                    self.assertEqual(tensor.dtype, torch.int64)

    def test_arithmetic_ops_on_floats(self) -> None:
        for op in ("SUM", "PRODUCT", "MIN", "MAX"):
            with self.subTest(op=op):
                payloads = ranks(torch.float32)
                cm.all_reduce(payloads, op)
                for (tensor,) in payloads:
                    self.assertEqual(tensor.tolist(), [float(x) for x in EXPECTED[op]])

    def test_avg_divides_the_sum_by_world_size(self) -> None:
        payloads = ranks(torch.float32)
        cm.all_reduce(payloads, "AVG")
        for (tensor,) in payloads:
            self.assertTrue(torch.equal(tensor, torch.tensor([7.0, 11.0, 15.0]) / 3))

    def test_avg_on_integers_is_rejected(self) -> None:
        payloads = ranks(torch.int64)
        with self.assertRaisesRegex(TypeError, "ReduceOp.AVG needs floating-point tensors"):
            cm.all_reduce(payloads, "AVG")
        self.assertEqual(payloads[0][0].tolist(), RANK_VALUES[0])  # nothing written

    def test_bitwise_ops_on_floats_are_rejected(self) -> None:
        for op in ("BAND", "BOR", "BXOR"):
            with self.subTest(op=op):
                with self.assertRaisesRegex(TypeError, f"ReduceOp.{op} needs integer or bool"):
                    cm.all_reduce(ranks(torch.float32), op)

    def test_bitwise_ops_on_bools(self) -> None:
        values = ([True, True, False, False], [True, False, True, False])
        expected = {
            "BAND": [True, False, False, False],
            "BOR": [True, True, True, False],
            "BXOR": [False, True, True, False],
        }
        for op, want in expected.items():
            with self.subTest(op=op):
                payloads = [[torch.tensor(v)] for v in values]
                cm.all_reduce(payloads, op)
                self.assertEqual([t.tolist() for (t,) in payloads], [want, want])

    def test_mixed_dtypes_are_rejected(self) -> None:
        payloads = [[torch.ones(2)], [torch.ones(2, dtype=torch.float64)]]
        with self.assertRaisesRegex(TypeError, "ranks passed different dtypes"):
            cm.all_reduce(payloads, "SUM")

    def test_coalesced_tensors_reduce_position_by_position(self) -> None:
        payloads = [
            [torch.tensor([1, 2]), torch.tensor([10])],
            [torch.tensor([3, 4]), torch.tensor([20])],
        ]
        cm.all_reduce(payloads, "SUM")
        for first, second in payloads:
            self.assertEqual((first.tolist(), second.tolist()), ([4, 6], [30]))

    def test_ranks_get_copies_not_a_shared_tensor(self) -> None:
        payloads = ranks(torch.int64)
        cm.all_reduce(payloads, "MAX")
        payloads[0][0].zero_()
        self.assertEqual(payloads[1][0].tolist(), EXPECTED["MAX"])

    def test_single_rank_is_the_identity(self) -> None:
        payloads = [[torch.tensor([2.0, -1.0])]]
        cm.all_reduce(payloads, "AVG")
        self.assertEqual(payloads[0][0].tolist(), [2.0, -1.0])


class Broadcast(unittest.TestCase):
    def test_every_rank_gets_roots_tensor(self) -> None:
        payloads = [torch.zeros(2, 2), torch.arange(4.0).view(2, 2), torch.full((2, 2), 9.0)]
        cm.broadcast(payloads, 1)
        for tensor in payloads:
            self.assertEqual(tensor.tolist(), [[0.0, 1.0], [2.0, 3.0]])

    def test_mixed_dtypes_are_rejected(self) -> None:
        with self.assertRaisesRegex(TypeError, "broadcast: ranks passed different dtypes"):
            cm.broadcast([torch.zeros(2), torch.zeros(2, dtype=torch.int32)], 0)


class Reduce(unittest.TestCase):
    def test_only_root_gets_the_result(self) -> None:
        payloads = [torch.tensor(v) for v in RANK_VALUES]
        cm.reduce(payloads, "SUM", 2)
        self.assertEqual([t.tolist() for t in payloads], [*RANK_VALUES[:2], EXPECTED["SUM"]])

    def test_product_at_root_zero(self) -> None:
        payloads = [torch.tensor(v) for v in RANK_VALUES]
        cm.reduce(payloads, "PRODUCT", 0)
        self.assertEqual([t.tolist() for t in payloads], [EXPECTED["PRODUCT"], *RANK_VALUES[1:]])


class AllGather(unittest.TestCase):
    def test_all_gather_single_concatenates_in_rank_order(self) -> None:
        outs = [torch.zeros(3, 2) for _ in range(3)]
        payloads = [([out], [torch.full((1, 2), float(r))]) for r, out in enumerate(outs)]
        cm.all_gather_single(payloads)
        for out in outs:
            self.assertEqual(out.tolist(), [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])

    def test_all_gather_single_coalesced(self) -> None:
        outs = [[torch.zeros(4), torch.zeros(2)] for _ in range(2)]
        payloads = [
            (outs[0], [torch.tensor([1.0, 2.0]), torch.tensor([5.0])]),
            (outs[1], [torch.tensor([3.0, 4.0]), torch.tensor([6.0])]),
        ]
        cm.all_gather_single(payloads)
        for first, second in outs:
            self.assertEqual((first.tolist(), second.tolist()), ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0]))

    def test_all_gather_single_wrong_output_size(self) -> None:
        payloads = [([torch.zeros(3)], [torch.ones(2)]), ([torch.zeros(3)], [torch.ones(2)])]
        with self.assertRaisesRegex(
            ValueError, r"all_gather_single: output has 3 elements, expected 2 x 2"
        ):
            cm.all_gather_single(payloads)

    def test_all_gather_into_lists(self) -> None:
        outs = [[torch.zeros(2) for _ in range(3)] for _ in range(3)]
        payloads = [(outs[r], [torch.tensor([r, 10.0 * r])]) for r in range(3)]
        cm.all_gather_coalesced(payloads)
        for rank_outs in outs:
            self.assertEqual([t.tolist() for t in rank_outs], [[0, 0], [1, 10], [2, 20]])

    def test_all_gather_coalesced_lists(self) -> None:
        outs = [[[torch.zeros(1), torch.zeros(2)] for _ in range(2)] for _ in range(2)]
        payloads = [
            (outs[r], [torch.tensor([float(r)]), torch.tensor([r + 0.5, r + 0.25])])
            for r in range(2)
        ]
        cm.all_gather_coalesced_lists(payloads)
        for per_rank in outs:
            self.assertEqual(
                [[t.tolist() for t in pair] for pair in per_rank],
                [[[0.0], [0.5, 0.25]], [[1.0], [1.5, 1.25]]],
            )

    def test_all_gather_list_length_must_match_world(self) -> None:
        payloads = [([torch.zeros(1)], [torch.ones(1)]), ([torch.zeros(1)], [torch.ones(1)])]
        with self.assertRaisesRegex(ValueError, "all_gather: 1 output tensors for 2 ranks"):
            cm.all_gather_coalesced(payloads)


class ReduceScatter(unittest.TestCase):
    def test_single_sums_then_splits_in_rank_order(self) -> None:
        outs = [torch.zeros(2) for _ in range(2)]
        payloads = [
            ([outs[0]], [torch.tensor([1.0, 2.0, 3.0, 4.0])]),
            ([outs[1]], [torch.tensor([10.0, 20.0, 30.0, 40.0])]),
        ]
        cm.reduce_scatter_single(payloads, "SUM")
        self.assertEqual([o.tolist() for o in outs], [[11.0, 22.0], [33.0, 44.0]])

    def test_single_keeps_output_shape(self) -> None:
        outs = [torch.zeros(1, 2) for _ in range(2)]
        payloads = [([o], [torch.arange(4).view(2, 2) + r]) for r, o in enumerate(outs)]
        cm.reduce_scatter_single(payloads, "MAX")
        self.assertEqual([o.tolist() for o in outs], [[[1, 2]], [[3, 4]]])

    def test_single_uneven_input_is_rejected(self) -> None:
        payloads = [([torch.zeros(1)], [torch.ones(3)]), ([torch.zeros(1)], [torch.ones(3)])]
        with self.assertRaisesRegex(
            ValueError, "input of 3 elements does not split into 2 equal parts"
        ):
            cm.reduce_scatter_single(payloads, "SUM")

    def test_single_wrong_output_size_is_rejected(self) -> None:
        payloads = [([torch.zeros(3)], [torch.ones(4)]), ([torch.zeros(2)], [torch.ones(4)])]
        with self.assertRaisesRegex(
            ValueError, "reduce_scatter_single: output has 3 elements, expected 2"
        ):
            cm.reduce_scatter_single(payloads, "SUM")

    def test_list_form_reduces_each_ranks_slot(self) -> None:
        outs = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        payloads = [
            (outs[0], [torch.tensor([3]), torch.tensor([5])]),
            (outs[1], [torch.tensor([6]), torch.tensor([4])]),
        ]
        cm.reduce_scatter(payloads, "MIN")
        self.assertEqual([o.item() for o in outs], [3, 4])


class AllToAll(unittest.TestCase):
    def test_single_even_splits(self) -> None:
        outs = [torch.zeros(4) for _ in range(2)]
        payloads = [
            (outs[0], torch.tensor([0.0, 1.0, 2.0, 3.0]), [], []),
            (outs[1], torch.tensor([10.0, 11.0, 12.0, 13.0]), [], []),
        ]
        cm.all_to_all_single(payloads)
        self.assertEqual(
            [o.tolist() for o in outs], [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]
        )

    def test_single_with_splits(self) -> None:
        # rank 0 sends [1] to itself and [2, 3] to rank 1; rank 1 sends [10, 11, 12] to rank 0.
        outs = [torch.zeros(4), torch.zeros(2)]
        payloads = [
            (outs[0], torch.tensor([1.0, 2.0, 3.0]), [1, 3], [1, 2]),
            (outs[1], torch.tensor([10.0, 11.0, 12.0]), [2, 0], [3, 0]),
        ]
        cm.all_to_all_single(payloads)
        self.assertEqual([o.tolist() for o in outs], [[1.0, 10.0, 11.0, 12.0], [2.0, 3.0]])

    def test_single_splits_along_dim_0(self) -> None:
        outs = [torch.zeros(2, 2), torch.zeros(2, 2)]
        payloads = [(o, torch.full((2, 2), float(r)), [], []) for r, o in enumerate(outs)]
        cm.all_to_all_single(payloads)
        for out in outs:
            self.assertEqual(out.tolist(), [[0.0, 0.0], [1.0, 1.0]])

    def test_single_bad_splits_are_rejected(self) -> None:
        payloads = [
            (torch.zeros(2), torch.ones(2), [], [1, 2]),
            (torch.zeros(2), torch.ones(2), [], []),
        ]
        with self.assertRaisesRegex(
            ValueError, r"all_to_all_single: input splits \[1, 2\] do not fit dim 0 of 2"
        ):
            cm.all_to_all_single(payloads)

    def test_single_indivisible_dim_is_rejected(self) -> None:
        payloads = [(torch.zeros(3), torch.ones(3), [], []) for _ in range(2)]
        with self.assertRaisesRegex(ValueError, "input dim 0 of 3 not divisible by 2"):
            cm.all_to_all_single(payloads)

    def test_list_form(self) -> None:
        outs = [[torch.zeros(1) for _ in range(2)] for _ in range(2)]
        payloads = [
            (outs[r], [torch.tensor([10.0 * r + dst]) for dst in range(2)]) for r in range(2)
        ]
        cm.all_to_all(payloads)
        self.assertEqual(
            [[t.item() for t in o] for o in outs], [[0.0, 10.0], [1.0, 11.0]]
        )


class GatherScatter(unittest.TestCase):
    def test_gather_fills_only_roots_list(self) -> None:
        root_outs = [torch.zeros(2) for _ in range(3)]
        payloads = [([], torch.tensor([0.0, 1.0])), (root_outs, torch.tensor([2.0, 3.0])),
                    ([], torch.tensor([4.0, 5.0]))]
        cm.gather(payloads, 1)
        self.assertEqual([t.tolist() for t in root_outs], [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
        self.assertEqual(payloads[0][0], [])

    def test_gather_root_list_length_must_match_world(self) -> None:
        payloads = [([torch.zeros(1)], torch.ones(1)), ([], torch.ones(1))]
        with self.assertRaisesRegex(ValueError, "gather: root has 1 output tensors for 2 ranks"):
            cm.gather(payloads, 0)

    def test_scatter_sends_roots_tensors_in_rank_order(self) -> None:
        outs = [torch.zeros(2) for _ in range(3)]
        chunks = [torch.tensor([float(r), -float(r)]) for r in range(3)]
        payloads = [(outs[0], []), (outs[1], []), (outs[2], chunks)]
        cm.scatter(payloads, 2)
        self.assertEqual([o.tolist() for o in outs], [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]])

    def test_scatter_root_list_length_must_match_world(self) -> None:
        payloads = [(torch.zeros(1), [torch.ones(1)] * 3), (torch.zeros(1), [])]
        with self.assertRaisesRegex(ValueError, "scatter: root has 3 input tensors for 2 ranks"):
            cm.scatter(payloads, 0)


class Noop(unittest.TestCase):
    def test_barrier_touches_nothing(self) -> None:
        self.assertIsNone(cm.noop([None, None]))


if __name__ == "__main__":
    unittest.main()


class ShapeMismatches(unittest.TestCase):
    """Mismatched shapes are errors, never a silent broadcast by copy_."""

    def test_broadcast(self) -> None:
        with self.assertRaisesRegex(ValueError, r"broadcast: .* shape \(1,\) cannot fill .*\(3,\)"):
            cm.broadcast([torch.tensor([7.0]), torch.zeros(3)], 0)

    def test_all_gather_single_inputs_of_different_sizes(self) -> None:
        payloads = [([torch.zeros(3)], [torch.ones(1)]), ([torch.zeros(3)], [torch.ones(2)])]
        with self.assertRaisesRegex(ValueError, "all_gather_single: ranks passed different shapes"):
            cm.all_gather_single(payloads)

    def test_all_reduce_of_different_shapes(self) -> None:
        with self.assertRaisesRegex(ValueError, "reduce: ranks passed different shapes"):
            cm.all_reduce([[torch.ones(3)], [torch.ones(1)]], "SUM")

    def test_gather_into_a_wrongly_sized_output(self) -> None:
        payloads = [([torch.zeros(2), torch.zeros(2)], torch.ones(1)), ([], torch.ones(1))]
        with self.assertRaisesRegex(ValueError, "gather: .* cannot fill"):
            cm.gather(payloads, 0)
