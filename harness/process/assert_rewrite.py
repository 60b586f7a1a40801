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
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import sys
from types import CodeType
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

REWRITE_ENV = "HARNESS_PYTEST_REWRITE"
EXPLAIN_ENV = "HARNESS_PYTEST_EXPLAIN"  # "verbosity,max lines,max chars"; limits 0,0: no cut
PYTEST_TRUNCATION = (8, 640)  # pytest's own limits (lines, characters) when its ini sets none
_REWRITTEN_MARK = "@pytest_ar"  # the name pytest's rewriting adds to a module's globals
_names: List[str] = []  # what the pytest plugin asked for, in this process
_explain_settings: List[str] = []


def rewrite_in_ranks(names: Iterable[str], verbosity: int = 0,
                     truncation: Tuple[int, int] = PYTEST_TRUNCATION) -> None:
    """Have rank processes started from now on rewrite these modules (the pytest plugin),
    explaining failed comparisons at this assertion `verbosity`, cut to `truncation` (lines,
    characters; (0, 0) never cuts), as pytest would in its own process."""
    _names[:] = sorted(names)
    _explain_settings[:] = [f"{verbosity},{truncation[0]},{truncation[1]}"]


def settings() -> Dict[str, str]:
    """The environment a forkserver or a spawned rank needs for it: set only while starting
    one, so that other processes this one starts (a subprocess of run_all) are left alone."""
    if not _names:
        return {}
    return {REWRITE_ENV: ",".join(_names), EXPLAIN_ENV: _explain_settings[0]}


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


class _AssertionSettings:
    """What pytest's comparison explainer reads from its config: the assertion verbosity, and
    a terminal writer that does not colour."""

    def __init__(self, verbosity: int) -> None:
        self.verbosity = verbosity

    def get_verbosity(self, verbosity_type: Optional[str] = None) -> int:
        return self.verbosity

    def get_terminal_writer(self) -> _AssertionSettings:
        return self

    def _highlight(self, source: str, lexer: str = "python") -> str:
        return source


def _explainer(verbosity: int, max_lines: int, max_chars: int) -> Callable[..., Optional[str]]:
    """A rank's `util._reprcompare`: pytest's explanation of a failed comparison, cut and
    escaped as pytest's own callback does it in the test process."""
    from _pytest.assertion import truncate, util

    settings = _AssertionSettings(verbosity)
    cut = verbosity < 2 and (max_lines > 0 or max_chars > 0)

    def explain(op: str, left: Any, right: Any) -> Optional[str]:
        try:
            lines = util.assertrepr_compare(settings, op, left, right)
            if not lines:
                return None
            if cut:
                lines = truncate._truncate_explanation(lines, max_lines, max_chars)
        except Exception:  # a pytest whose explainer reads more than this: the plain assert
            return None
        return "\n~".join(line.replace("\n", "\\n") for line in lines).replace("%", "%%")

    return explain


def install(env: Dict[str, str]) -> None:
    """Rewrite the modules `env` names from now on in this process (the finder once; a no-op
    when none), and explain failed comparisons as the pytest run that started it does."""
    names = frozenset(n for n in env.get(REWRITE_ENV, "").split(",") if n)
    if not names:
        return
    try:
        from _pytest.assertion import util  # pytest is what asked for it
    except ImportError:
        return
    explain = env.get(EXPLAIN_ENV, "0,{},{}".format(*PYTEST_TRUNCATION))
    verbosity, max_lines, max_chars = (int(v) for v in explain.split(","))
    util._reprcompare = _explainer(verbosity, max_lines, max_chars)
    if not any(isinstance(f, _RewritingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RewritingFinder(names))
