"""tests/faults.py: every fault installs in this torch, and an unknown name says so."""

import os
import subprocess
import sys
import unittest

import pytest

from tests.faults import FAULTS, install_fault

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FaultsTest(unittest.TestCase):
    @pytest.mark.slow
    def test_every_fault_installs_in_a_fresh_interpreter(self):
        # A fault patches torch for good, so they are installed in a child, never here.
        code = (
            "from tests.faults import FAULTS, install_fault\n"
            "for name in FAULTS:\n    install_fault(name)\n    print(name)"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        self.assertEqual(0, result.returncode, result.stderr[-3000:])
        self.assertEqual(result.stdout.split(), list(FAULTS))
        self.assertTrue(FAULTS)

    def test_unknown_fault_is_a_one_line_error_naming_it(self):
        expected = r"^unknown fault 'no_such_fault'; known faults: "
        with self.assertRaisesRegex(ValueError, expected) as caught:
            install_fault("no_such_fault")
        self.assertNotIn("\n", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
