"""harness.compat.cuda: delaying the CUDA stream really delays it (needs a GPU)."""

import unittest

import torch

from harness.compat import cuda


@unittest.skipUnless(torch.cuda.is_available(), "torch.cuda._sleep needs a CUDA device")
class StreamSleepTest(unittest.TestCase):
    def test_stream_sleep_delays_the_stream(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        cuda.stream_sleep(20)
        end.record()
        end.synchronize()
        self.assertGreaterEqual(start.elapsed_time(end), 10)


if __name__ == "__main__":
    unittest.main()
