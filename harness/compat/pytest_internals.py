"""pytest's private API (`_pytest.*`), which the harness touches here only: assertion rewriting
and the comparison explainer that rank processes use to fail an `assert` as pytest would, and
pytest's rule for a CI machine.

pytest changes these between minor releases (9.1 gave `assertrepr_compare` keyword arguments
instead of a config, 9.2 made it a lazy iterator cut through a budget), so this module calls
the highest-level entry points, as read in the source of each release from PYTEST_FLOOR to
9.2.0, the newest tested. A symbol that is missing or changed raises PytestInternalsError
naming it and the installed pytest: the harness's own tests
(tests/test_compat_pytest_internals.py) fail on it, and a rank says it in the failed
assertion instead of losing the explanation silently.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
from importlib import import_module
from types import SimpleNamespace
from typing import Any, Callable, Iterator, List, Optional

# pytest 8.4 is the first with the truncation_limit_lines/_chars settings the plugin reads
# (8.0-8.3 fail the run at collection: "unknown configuration value"), and the last line that
# supports Python 3.9, so every Python the harness supports has a supported pytest.
PYTEST_FLOOR = (8, 4)
_DIFF_STYLE = "ndiff"  # pytest's default assertion_text_diff_style (9.1+); ranks are not told


class PytestInternalsError(RuntimeError):
    """A private pytest symbol the harness uses is missing or changed in the installed pytest."""


def check_supported_pytest(version: str) -> Optional[str]:
    """The one line to stop a run with when pytest `version` is older than PYTEST_FLOOR (its
    rank processes would fail inside pytest's internals with a traceback); None otherwise."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) >= PYTEST_FLOOR:
        return None
    floor = "{}.{}".format(*PYTEST_FLOOR)
    return (f"torch-dist-harness needs pytest {floor} or newer, this is pytest {version}: "
            f"pip install 'pytest>={floor}', or run without the harness's plugin "
            "(-p no:harness.pytest_plugin)")


@contextlib.contextmanager
def _private(symbol: str) -> Iterator[None]:
    """Any error while using `symbol` is the installed pytest's change: say which and where."""
    try:
        yield
    except Exception as error:
        import pytest

        raise PytestInternalsError(
            f"{symbol} of pytest {pytest.__version__}: {type(error).__name__}: {error}"
        ) from error


def running_on_ci() -> bool:
    """pytest's own rule for a CI machine (where it never cuts an explanation): in
    `_pytest.compat` from 9.0, `_pytest.assertion.util` before. False where neither has it:
    the ranks' pytest applies the rule itself when it cuts, so nothing is lost."""
    for module_name in ("_pytest.compat", "_pytest.assertion.util"):
        with contextlib.suppress(ImportError):
            rule = getattr(import_module(module_name), "running_on_ci", None)
            if rule is not None:
                return bool(rule())
    return False


def leave_unrewritten(package: str) -> bool:
    """Have pytest's import hook load `package`'s modules from now on as Python does, without
    rewriting their asserts; returns whether it could.

    pytest rewrites every module of a distribution that registers a pytest11 plugin, so
    importing the harness under pytest parsed, rewrote and compiled its ~100 modules anew in
    every session where no bytecode is cached (PYTHONDONTWRITEBYTECODE, a read-only
    site-packages): about 0.7 s here, for asserts of the harness's own that no user reads.
    Test modules and conftests are still rewritten (pytest's rules for them are apart)."""
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        cache = getattr(finder, "_marked_for_rewrite_cache", None)
        if type(finder).__name__ == "AssertionRewritingHook":
            if not isinstance(marked, set) or not isinstance(cache, dict):
                return False
            marked.discard(package)
            for name in [n for n in cache if n == package or n.startswith(package + ".")]:
                del cache[name]
            return True
    return False


def fixture_home(item: Any, name: str) -> Optional[str]:
    """The module defining the fixture `name` that the test `item` gets (pytest's closest
    definition: a conftest's overrides a plugin's), or None when it gets none."""
    with _private("_pytest.python.Function._fixtureinfo.name2fixturedefs"):
        definitions = item._fixtureinfo.name2fixturedefs.get(name)
    if not definitions:
        return None
    return getattr(definitions[-1].func, "__module__", None)


def rewrite_asserts(tree: ast.Module, source: bytes, path: str) -> None:
    """Rewrite the asserts of a module's parsed `tree` in place, as pytest's import hook does."""
    with _private("_pytest.assertion.rewrite.rewrite_asserts"):
        from _pytest.assertion.rewrite import rewrite_asserts as rewrite

        rewrite(tree, source, path)


def was_rewritten(module: Any) -> bool:
    """Whether pytest rewrote this module's asserts when it imported it (its rewriting adds
    `@pytest_ar`, its helpers' module, to the module's globals)."""
    return "@pytest_ar" in vars(module)


def set_comparison_explainer(explain: Callable[[str, Any, Any], Optional[str]]) -> None:
    """Have rewritten asserts in this process explain a failed comparison through `explain`
    (`util._reprcompare`, which pytest sets only while it runs a test in its own process)."""
    with _private("_pytest.assertion.util._reprcompare"):
        from _pytest.assertion import util

        if not hasattr(util, "_reprcompare"):
            raise AttributeError("the rewritten asserts no longer read it")
        util._reprcompare = explain


class _RunSettings:
    """The pytest config that pytest's explainer and truncation read, from the settings of the
    run that started this rank: assertion verbosity, truncation limits, plain text."""

    def __init__(self, verbosity: int, max_lines: int, max_chars: int) -> None:
        self._verbosity = verbosity
        self._ini = {"truncation_limit_lines": max_lines, "truncation_limit_chars": max_chars,
                     "assertion_text_diff_style": _DIFF_STYLE}
        self.pluginmanager = SimpleNamespace(has_plugin=lambda name: False)  # no terminal

    def get_verbosity(self, verbosity_type: Optional[str] = None) -> int:
        return self._verbosity

    def getini(self, name: str) -> Any:
        if name not in self._ini:  # a setting a newer pytest reads: _private names it
            raise ValueError(f"unknown configuration value: {name!r}")
        return self._ini[name]

    def get_terminal_writer(self) -> _RunSettings:
        return self

    def _highlight(self, source: str, lexer: str = "python") -> str:
        return source


def explain_comparison(op: str, left: Any, right: Any, verbosity: int, max_lines: int,
                       max_chars: int) -> Optional[List[str]]:
    """pytest's explanation of a failed `left op right` (None: it adds nothing), cut as it cuts
    in its own process: pytest's hook implementation, then the truncation its callback applies
    (`truncate_if_required` up to 9.1; 9.2's `materialize_with_truncation`)."""
    settings = _RunSettings(verbosity, max_lines, max_chars)
    with _private("_pytest.assertion.pytest_assertrepr_compare"):
        from _pytest.assertion import pytest_assertrepr_compare

        lines = pytest_assertrepr_compare(config=settings, op=op, left=left, right=right)
    if not lines:
        return None
    with _private("_pytest.assertion.truncate"):
        from _pytest.assertion import truncate

        if hasattr(truncate, "materialize_with_truncation"):
            return list(truncate.materialize_with_truncation(lines, settings))
        return list(truncate.truncate_if_required(lines, SimpleNamespace(config=settings)))
