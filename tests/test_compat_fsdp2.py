"""harness.compat.fsdp2: fully_shard's param-group pieces resolve in this torch."""

import unittest

import torch

from harness.compat import fsdp2


class FSDP2Test(unittest.TestCase):
    def test_param_group_pieces(self):
        module = fsdp2.param_group_module()
        for name in ("foreach_all_gather", "foreach_reduce"):
            self.assertTrue(callable(vars(module)[name]), name)
        group_cls = fsdp2.param_group_class()
        self.assertIs(group_cls, module.FSDPParamGroup)
        for name in ("unshard", "reshard", "post_backward"):
            self.assertTrue(callable(vars(group_cls)[name]), name)

    def test_register_post_backward_function_is_an_autograd_function(self):
        self.assertTrue(
            issubclass(fsdp2.register_post_backward_function(), torch.autograd.Function)
        )


if __name__ == "__main__":
    unittest.main()
