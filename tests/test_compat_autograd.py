"""harness.compat.autograd: a tensor's registered backward hooks can be listed."""

import unittest

import torch

from harness.compat import autograd


class BackwardHooksTest(unittest.TestCase):
    def test_lists_registered_hooks_until_removed(self):
        t = torch.ones(1, requires_grad=True)
        self.assertEqual(autograd.backward_hooks(t), [])
        hook = t.register_hook(lambda g: g)
        self.assertEqual(len(autograd.backward_hooks(t)), 1)
        hook.remove()
        self.assertEqual(autograd.backward_hooks(t), [])


if __name__ == "__main__":
    unittest.main()
