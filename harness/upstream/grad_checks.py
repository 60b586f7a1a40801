"""Upstream's gradient checks for tests (`common_utils.gradcheck`, `gradgradcheck`,
`_assertGradAndGradgradChecks`, `dtype2prec_DONTUSE`): torch.autograd's checks with batched
gradients checked and fast mode on by default (PYTORCH_TEST_WITH_SLOW_GRADCHECK=1: slow mode).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from harness import settings

__all__ = ["_assertGradAndGradgradChecks", "dtype2prec_DONTUSE", "gradcheck", "gradgradcheck"]

# Tolerances per dtype some older tests compare with (upstream marks them for removal).
dtype2prec_DONTUSE = {torch.float: 1e-5, torch.double: 1e-5, torch.half: 1e-2,
                      torch.bfloat16: 1e-1}


def _with_test_defaults(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The caller's arguments, with upstream's defaults where a key is missing or None."""
    slow = settings.upstream_flag("PYTORCH_TEST_WITH_SLOW_GRADCHECK")
    defaults = {"check_batched_grad": True, "fast_mode": not slow}
    return {**kwargs, **{k: v for k, v in defaults.items() if kwargs.get(k) is None}}


def gradcheck(fn: Callable, inputs: Any, **kwargs: Any) -> bool:
    """torch.autograd.gradcheck with the test defaults (batched gradients, fast mode)."""
    return torch.autograd.gradcheck(fn, inputs, **_with_test_defaults(kwargs))


def gradgradcheck(fn: Callable, inputs: Any, grad_outputs: Any = None, **kwargs: Any) -> bool:
    """torch.autograd.gradgradcheck with the test defaults (batched gradients, fast mode)."""
    return torch.autograd.gradgradcheck(fn, inputs, grad_outputs, **_with_test_defaults(kwargs))


def _assertGradAndGradgradChecks(test_case: Any, apply_fn: Callable, inputs: Any,  # noqa: N802
                                 **kwargs: Any) -> None:
    """Assert first and second derivatives of `apply_fn` at `inputs` (which check failed is
    the assertion that fails)."""
    test_case.assertTrue(gradcheck(apply_fn, inputs, **kwargs))
    test_case.assertTrue(gradgradcheck(apply_fn, inputs, **kwargs))
