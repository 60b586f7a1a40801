"""Finding a private torch name that has lived in more than one place.

Private modules move between torch releases; a lookup tries each known location, newest first,
so that a move means adding one candidate instead of breaking every caller.
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
