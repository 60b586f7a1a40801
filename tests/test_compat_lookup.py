"""harness.compat.lookup: a private name is found at the first location that has it."""

import os
import unittest

from harness.compat.lookup import first_attr


class FirstAttrTest(unittest.TestCase):
    def test_takes_the_first_that_exists(self):
        self.assertIs(first_attr([("no.such.module", "x"), ("os", "getcwd")]), os.getcwd)

    def test_error_names_every_candidate_tried(self):
        with self.assertRaisesRegex(ImportError, "no.such.module.x, os.nope"):
            first_attr([("no.such.module", "x"), ("os", "nope")])


if __name__ == "__main__":
    unittest.main()
