"""pytest's assertion rewriting inside rank processes.

pytest rewrites the `assert` statements of the test modules it imports, so that a failing
`assert x == 0` says `assert 10 == 0`. Rank processes import the test module again (in the
forkserver, or each rank itself), outside pytest's import hook, and would get a bare
`AssertionError`. The pytest plugin names the modules pytest rewrote in REWRITE_ENV; this
module, preloaded in the forkserver before any test module, installs an import hook there
that rewrites those modules the same way (pytest's own `rewrite_asserts`). Under any other
runner the variable is unset and nothing changes.

A rewritten assert explains a comparison (`At index 2 diff: 3 != 4`) through a callback pytest
sets only while it runs a test in its own process; a rank sets its own (`_explain`), with the
settings of the pytest run that started it (EXPLAIN_ENV: the assertion verbosity and the
truncation limits), so that a rank's failure reads as it would in pytest itself. Conftest
`pytest_assertrepr_compare` hooks do not run in a rank (the rank has no pytest config).

pytest's private functions for all this are harness/compat/pytest_internals.py's. Where one
cannot be used (a pytest that changed it), a rank's failed assert still fails plainly, with
one line saying why its explanation is missing: never silently, never with a traceback.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import sys
from types import CodeType
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from harness.compat import pytest_internals

REWRITE_ENV = "HARNESS_PYTEST_REWRITE"
EXPLAIN_ENV = "HARNESS_PYTEST_EXPLAIN"  # "verbosity,max lines,max chars"; limits 0,0: no cut
PYTEST_TRUNCATION = (8, 640)  # pytest's own limits (lines, characters) when its ini sets none
_names: List[str] = []  # what the pytest plugin asked for, in this process
_explain_settings: List[str] = []


def rewrite_in_ranks(names: Iterable[str], verbosity: int = 0,
                     truncation: Tuple[int, int] = PYTEST_TRUNCATION) -> None:
    """Have rank processes started from now on rewrite these modules (the pytest plugin),
    explaining failed comparisons at this assertion `verbosity`, cut to `truncation` (lines,
    characters; (0, 0) never cuts), as pytest would in its own process."""
    _names[:] = sorted(names)
    # int(): a conftest may set `config.option.verbose = True`, which pytest accepts as 1
    _explain_settings[:] = [f"{int(verbosity)},{truncation[0]},{truncation[1]}"]


def settings() -> Dict[str, str]:
    """The environment a forkserver or a spawned rank needs for it: set only while starting
    one, so that other processes this one starts (a subprocess of run_all) are left alone."""
    if not _names:
        return {}
    return {REWRITE_ENV: ",".join(_names), EXPLAIN_ENV: _explain_settings[0]}


def rewritten_by_pytest(modules: Iterable[Any]) -> FrozenSet[str]:
    """The names of those modules whose asserts pytest rewrote when it imported them."""
    return frozenset(
        m.__name__ for m in modules if m is not None and pytest_internals.was_rewritten(m)
    )


class _RewritingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the module from its source with pytest's assertion rewriting (never from a
    cached .pyc, which holds the plain compilation). Where rewriting, or the explainer, cannot
    be used, the module's bare asserts say why (`unexplained`): never a silent bare
    AssertionError, never a traceback at import."""

    def __init__(self, fullname: str, path: str, unexplained: Optional[str]) -> None:
        super().__init__(fullname, path)
        self.unexplained = unexplained

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        source = self.get_data(path)
        tree = _parse(source, path, self.unexplained)
        try:
            pytest_internals.rewrite_asserts(tree, source, path)
        except pytest_internals.PytestInternalsError as error:
            tree = _parse(source, path, _unexplained("assertion rewriting", error))
        return compile(tree, path, "exec", dont_inherit=True)


def _parse(source: bytes, path: str, unexplained: Optional[str]) -> ast.Module:
    """The module's tree; with `unexplained`, that line is the message of its bare asserts."""
    tree = ast.parse(source, filename=path)
    if unexplained is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and node.msg is None:
                node.msg = ast.copy_location(ast.Constant(unexplained), node)
    return tree


class _RewritingFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules as the path finder does, to load them rewritten."""

    def __init__(self, names: FrozenSet[str], unexplained: Optional[str]) -> None:
        self.names = names
        self.unexplained = unexplained

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None
    ) -> Any:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _RewritingLoader(fullname, spec.loader.path, self.unexplained)
        return spec


def _unexplained(what: str, error: pytest_internals.PytestInternalsError) -> str:
    """The one line a rank's failed assert carries when pytest's `what` could not be used
    (`error` names the symbol and the pytest version)."""
    reason = " ".join(str(error).split())
    return f"(harness: pytest's {what} could not be used in the ranks: {reason})"


def _plain_repr(obj: Any) -> str:
    """`obj` as a plain failed assert shows it (its repr, the middle cut beyond pytest's 240
    characters), for when pytest's explainer cannot be used; never raises."""
    try:
        text = repr(obj)
    except Exception as error:
        return f"<{type(obj).__name__} object: repr raised {type(error).__name__}>"
    return text if len(text) <= 240 else f"{text[:118]}...{text[-119:]}"


def _explainer(verbosity: int, max_lines: int, max_chars: int) -> Callable[..., Optional[str]]:
    """A rank's `util._reprcompare`: pytest's explanation of a failed comparison, cut and
    escaped as pytest's own callback does it in the test process; where pytest's explainer
    cannot be used, the plain comparison and one line saying why."""

    def explain(op: str, left: Any, right: Any) -> Optional[str]:
        try:
            lines = pytest_internals.explain_comparison(op, left, right, verbosity, max_lines,
                                                        max_chars)
        except pytest_internals.PytestInternalsError as error:
            lines = [f"{_plain_repr(left)} {op} {_plain_repr(right)}",
                     _unexplained("assertion explainer", error)]
        if not lines:
            return None
        return "\n~".join(line.replace("\n", "\\n") for line in lines).replace("%", "%%")

    return explain


def install(env: Dict[str, str]) -> None:
    """Rewrite the modules `env` names from now on in this process (the finder once; a no-op
    when none), and explain failed comparisons as the pytest run that started it does."""
    names = frozenset(n for n in env.get(REWRITE_ENV, "").split(",") if n)
    if not names:
        return
    explain = env.get(EXPLAIN_ENV, "0,{},{}".format(*PYTEST_TRUNCATION))
    verbosity, max_lines, max_chars = (int(v) for v in explain.split(","))
    try:
        pytest_internals.set_comparison_explainer(_explainer(verbosity, max_lines, max_chars))
        unexplained = None
    except pytest_internals.PytestInternalsError as error:
        unexplained = _unexplained("assertion explainer", error)
    if not any(isinstance(f, _RewritingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RewritingFinder(names, unexplained))
