"""harness.compat.c10d_world: inside it, each thread has its own default process group."""

import threading
import unittest

import torch.distributed as dist

from harness.compat import c10d_world


class ThreadLocalWorldTest(unittest.TestCase):
    def test_gives_each_thread_its_own_default_group(self):
        seen = {}
        initialised, checked = threading.Event(), threading.Event()

        def in_thread():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            seen["thread"] = dist.is_initialized()
            initialised.set()
            checked.wait(30)
            dist.destroy_process_group()

        with c10d_world.thread_local_c10d_world():
            thread = threading.Thread(target=in_thread)
            thread.start()
            initialised.wait(30)
            seen["main, while the thread has a group"] = dist.is_initialized()
            checked.set()
            thread.join()
        self.assertEqual(seen, {"thread": True, "main, while the thread has a group": False})
        self.assertFalse(dist.is_initialized())


if __name__ == "__main__":
    unittest.main()
