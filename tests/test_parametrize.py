"""harness.single_process.parametrize: generated test names, stacking, errors (grids:
test_subtests.py)."""

import enum
import unittest

import pytest
import torch

from harness import TestCase, instantiate_parametrized_tests, parametrize, subtest
from harness.requirements.decorators import REQUIREMENTS_ATTR, skip_if_lt_x_gpu
from tests.upstream_style.ids_declarations import declare, upstream_declarations


class Strategy(enum.Enum):
    FULL_SHARD = 1
    NO_SHARD = 3


def _test_names(cls):
    return sorted(name for name in vars(cls) if name.startswith("test"))


class ParametrizeTest(unittest.TestCase):
    def test_names_follow_upstream_enum_members_and_none_by_index(self):
        calls = []

        class Case(TestCase):
            @parametrize("use_index", [True, False])
            def test_device_id(self, use_index):
                calls.append(use_index)

            @parametrize("sharding_strategy", [Strategy.NO_SHARD, None])
            def test_strategy(self, sharding_strategy):
                calls.append(sharding_strategy)

        instantiate_parametrized_tests(Case)
        self.assertEqual(
            _test_names(Case),
            [
                "test_device_id_use_index_False",
                "test_device_id_use_index_True",
                "test_strategy_sharding_strategy0",
                "test_strategy_sharding_strategy1",
            ],
        )
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(
            sorted(calls, key=repr), sorted([True, False, Strategy.NO_SHARD, None], key=repr)
        )

    def test_stacked_decorators_give_the_product_named_top_first(self):
        seen = []

        class Case(TestCase):
            @parametrize("a", [1, 2])
            @parametrize("b", ["x y", 1.5])
            def test_grid(self, a, b):
                seen.append((a, b))

        instantiate_parametrized_tests(Case)
        self.assertEqual(
            _test_names(Case),
            [
                "test_grid_a_1_b_1_5",
                "test_grid_a_1_b_x y",
                "test_grid_a_2_b_1_5",
                "test_grid_a_2_b_x y",
            ],
        )
        unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(unittest.TestResult())
        self.assertEqual(
            sorted(seen, key=repr), sorted([(1, "x y"), (1, 1.5), (2, "x y"), (2, 1.5)], key=repr)
        )

    def test_comma_names_name_fn_and_subtests(self):
        seen = []

        @instantiate_parametrized_tests
        class Case(TestCase):
            @parametrize("a,b", [(1, Strategy.FULL_SHARD), subtest((2, None), name="two")])
            def test_pair(self, a, b):
                seen.append((a, b))

            @parametrize("x", [3, 4], name_fn=lambda x: f"n{x}")
            def test_named(self, x):
                seen.append(x)

            @parametrize("x", [subtest(5, decorators=[unittest.skip("not five")]), 6])
            def test_skip_one(self, x):
                seen.append(x)

        self.assertEqual(
            _test_names(Case),
            ["test_named_n3", "test_named_n4", "test_pair_a_1_b0", "test_pair_two",
             "test_skip_one_x_5", "test_skip_one_x_6"],
        )
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
        self.assertTrue(result.wasSuccessful())
        self.assertEqual([reason for _, reason in result.skipped], ["not five"])
        self.assertEqual(
            sorted(seen, key=repr),
            sorted([(1, Strategy.FULL_SHARD), (2, None), 3, 4, 6], key=repr),
        )

    def test_two_variants_with_one_name_are_an_error(self):
        class Case(TestCase):
            @parametrize("x", [1, 2], name_fn=lambda x: "same")
            def test_x(self, x):
                pass

        with self.assertRaisesRegex(ValueError, "Redefinition of test test_x_same in Case"):
            instantiate_parametrized_tests(Case)

    def test_wrong_number_of_values_for_comma_names_is_an_error(self):
        message = r"parametrize\('a,b'\): entry 1 has 3 values for 2 names"
        with self.assertRaisesRegex(ValueError, message):
            parametrize("a,b", [(1, 2), (1, 2, 3)])

    def test_generated_methods_are_not_parametrized_again_in_a_subclass(self):
        @instantiate_parametrized_tests
        class Base(TestCase):
            @parametrize("x", [1])
            def test_x(self, x):
                pass

        @instantiate_parametrized_tests
        class Child(Base):
            pass

        self.assertEqual(
            sorted(unittest.defaultTestLoader.getTestCaseNames(Child)), ["test_x_x_1"]
        )

    def test_template_method_is_removed_and_dtypes_named_alone(self):
        class Case(TestCase):
            @parametrize("dtype", [torch.float16, torch.bfloat16])
            def test_dtype(self, dtype):
                pass

        instantiate_parametrized_tests(Case)
        self.assertEqual(_test_names(Case), ["test_dtype_bfloat16", "test_dtype_float16"])

    def test_skip_requirements_survive_generation(self):
        class Case(TestCase):
            @skip_if_lt_x_gpu(2, allow_cpu=True)
            @parametrize("a", [1])
            def test_x(self, a):
                pass

        instantiate_parametrized_tests(Case)
        self.assertTrue(getattr(Case.test_x_a_1, REQUIREMENTS_ATTR))

    def test_no_values_is_an_error_naming_the_parameter(self):
        with self.assertRaisesRegex(ValueError, r"parametrize\('use_index'\): no values given"):
            parametrize("use_index", [])

    def test_unknown_parameter_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "has no parameter 'b'"):

            @parametrize("b", [1])
            def test_x(self, a):
                pass

    def test_same_parameter_twice_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "already parametrized"):

            @parametrize("a", [1])
            @parametrize("a", [2])
            def test_x(self, a):
                pass


@pytest.mark.slow
class DifferentialIdsTest(unittest.TestCase):
    """The same declarations under upstream's installed harness and this one: same ids."""

    def test_generated_ids_kwargs_and_outcomes_match_upstream(self):
        ours = {k: v for k, v in declare("harness").items() if not k.startswith("device_")}
        theirs = {k: v for k, v in upstream_declarations().items() if not k.startswith("device_")}
        self.assertGreater(len(theirs), 60)
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in theirs:
            self.assertEqual(ours[key], theirs[key], key)


if __name__ == "__main__":
    unittest.main()
