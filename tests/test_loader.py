"""harness.loader: -k matching, selection errors, shards and repeats."""

from __future__ import annotations

import unittest

from harness.loader import UsageError, name_matcher, repeat, select, shard


class _Named(unittest.TestCase):
    """A stand-in test with a chosen id, for the selection functions."""

    def __init__(self, test_id: str) -> None:
        super().__init__("runTest")
        self._id = test_id

    def runTest(self) -> None:  # noqa: N802 - unittest's naming
        """Never run."""

    def id(self) -> str:
        return self._id


class TestSelectionFunctions(unittest.TestCase):
    IDS = [f"suite.mod{m}.TestC.test_{n}" for m in (1, 2) for n in ("a", "b", "c", "grid")]

    def plan(self):
        return [
            (module, [_Named(i) for i in self.IDS if i.startswith(module)])
            for module in ("suite.mod1", "suite.mod2")
        ]

    def test_pattern_without_star_matches_a_substring(self) -> None:
        match = name_matcher("test_b")
        self.assertTrue(match("suite.mod1.TestC.test_b"))
        self.assertFalse(match("suite.mod1.TestC.test_a"))
        self.assertTrue(name_matcher("*mod2.*_a")("suite.mod2.TestC.test_a"))
        self.assertFalse(name_matcher("*mod2.*_a")("suite.mod2.TestC.test_a_x"))

    def test_select_rejects_unmatched_and_empty_patterns(self) -> None:
        with self.assertRaisesRegex(UsageError, "-k 'zzz' matches no test"):
            select(self.plan(), ["test_a", "zzz"])
        with self.assertRaisesRegex(UsageError, "empty pattern"):
            select(self.plan(), [""])
        kept = select(self.plan(), ["*mod2*grid"])
        self.assertEqual([[t.id() for t in tests] for _, tests in kept],
                         [["suite.mod2.TestC.test_grid"]])

    def test_shards_partition_the_run(self) -> None:
        for count in (1, 2, 3, 5, 9):
            with self.subTest(count=count):
                ids = [t.id() for i in range(1, count + 1)
                       for _, tests in shard(self.plan(), i, count) for t in tests]
                self.assertEqual(sorted(ids), sorted(self.IDS))

    def test_repeat_makes_fresh_instances(self) -> None:
        plan = [("m", [unittest.FunctionTestCase(lambda: None)])]
        self.assertIs(repeat(plan, 1), plan)
        plan = [("m", [TestSelectionFunctions("test_repeat_makes_fresh_instances")])]
        tests = repeat(plan, 3)[0][1]
        self.assertEqual(len(tests), 3)
        self.assertEqual(len({id(t) for t in tests}), 3)


if __name__ == "__main__":
    unittest.main()
