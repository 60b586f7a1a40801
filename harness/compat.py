"""The one place that touches private torch symbols.

Private names move between torch releases; each lookup below says what it is for and
tries the locations known for this torch (2.13) and earlier ones, so a move breaks
one function here instead of every suite.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Sequence, Tuple


def first_attr(candidates: Sequence[Tuple[str, str]]) -> Any:
    """The first `module.attr` of `candidates` that exists; ImportError naming all tried."""
    for module_name, attr in candidates:
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
    tried = ", ".join(f"{m}.{a}" for m, a in candidates)
    raise ImportError(f"none of these exist in this torch: {tried}")
