"""pytest's assertion rewriting inside rank processes.

pytest rewrites the `assert` statements of the test modules it imports, so that a failing
`assert x == 0` says `assert 10 == 0`. Rank processes import the test module again (in the
forkserver, or each rank itself), outside pytest's import hook, and would get a bare
`AssertionError`. The pytest plugin names the modules pytest rewrote in REWRITE_ENV; this
module, preloaded in the forkserver before any test module, installs an import hook there
that rewrites those modules the same way (pytest's own `rewrite_asserts`). Under any other
runner the variable is unset and nothing changes.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import sys
from types import CodeType
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence

REWRITE_ENV = "HARNESS_PYTEST_REWRITE"
_REWRITTEN_MARK = "@pytest_ar"  # the name pytest's rewriting adds to a module's globals
_names: List[str] = []  # what the pytest plugin asked for, in this process


def rewrite_in_ranks(names: Iterable[str]) -> None:
    """Have rank processes started from now on rewrite these modules (the pytest plugin)."""
    _names[:] = sorted(names)


def settings() -> Dict[str, str]:
    """The environment a forkserver or a spawned rank needs for it: set only while starting
    one, so that other processes this one starts (a subprocess of run_all) are left alone."""
    return {REWRITE_ENV: ",".join(_names)} if _names else {}


def rewritten_by_pytest(modules: Iterable[Any]) -> FrozenSet[str]:
    """The names of those modules whose asserts pytest rewrote when it imported them."""
    return frozenset(
        m.__name__ for m in modules if m is not None and _REWRITTEN_MARK in vars(m)
    )


class _RewritingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the module from its source with pytest's assertion rewriting (never from a
    cached .pyc, which holds the plain compilation)."""

    def get_code(self, fullname: str) -> CodeType:
        from _pytest.assertion.rewrite import rewrite_asserts

        path = self.get_filename(fullname)
        source = self.get_data(path)
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path)
        return compile(tree, path, "exec", dont_inherit=True)


class _RewritingFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules as the path finder does, to load them rewritten."""

    def __init__(self, names: FrozenSet[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None
    ) -> Any:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _RewritingLoader(fullname, spec.loader.path)
        return spec


def install(env: Dict[str, str]) -> None:
    """Rewrite the modules `env` names from now on in this process (once; a no-op when none)."""
    names = frozenset(n for n in env.get(REWRITE_ENV, "").split(",") if n)
    if not names or any(isinstance(f, _RewritingFinder) for f in sys.meta_path):
        return
    try:
        import _pytest.assertion.rewrite  # noqa: F401 - pytest is what asked for it
    except ImportError:
        return
    sys.meta_path.insert(0, _RewritingFinder(names))
