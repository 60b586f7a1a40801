"""harness.compat.inductor: the Triton check answers, compile threads are set and restored."""

import unittest

import torch._inductor.config as inductor_config

from harness.compat import inductor


class InductorTest(unittest.TestCase):
    def test_has_triton_is_a_bool(self):
        self.assertIsInstance(inductor.has_triton(), bool)

    def test_compile_threads_set_for_the_block_and_restored(self):
        saved = inductor_config.compile_threads
        with self.assertRaises(RuntimeError):
            with inductor.compile_threads(saved + 3):
                self.assertEqual(saved + 3, inductor_config.compile_threads)
                raise RuntimeError("leaves the block")
        self.assertEqual(saved, inductor_config.compile_threads)


if __name__ == "__main__":
    unittest.main()
