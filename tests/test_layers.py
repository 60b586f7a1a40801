"""harness/'s import structure, read from its sources: no import cycle, no import back up a layer.

Pure parsing (nothing is imported), so it holds for every module whether or not it imports
cleanly here. Module-level imports make cycles (an import inside a function runs later, when
every module is loaded); any import counts for the layer rules.
"""

from __future__ import annotations

import ast
import unittest
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Set, Tuple

HARNESS = Path(__file__).resolve().parent.parent / "harness"

# Cycles among harness modules that exist and are someone's to break, each named; a cycle not
# listed here fails the test, and so does a listed one that no longer exists.
KNOWN_CYCLES: List[Set[str]] = []

ABOVE_FOUNDATION = ("harness.launch", "harness.process", "harness.threads", "harness.runner",
                    "harness.kit")
# The outcome model (a rank's events and record, the merge, the per-test report) sits below
# every launch mode, the runner and the kit: it imports none of them, and no torch.
OUTCOME = "harness.outcome"
ABOVE_OUTCOME = ABOVE_FOUNDATION


def _modules() -> Dict[str, Path]:
    found = {}
    for path in HARNESS.rglob("*.py"):
        parts = list(path.relative_to(HARNESS.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()

# The foundation (the settings, the requirements and skips, the single-process TestCase and what
# it owns, the mirrored upstream helpers) sits below the launch modes, the runner and the kit: it
# must not import them, at module level or inside code.
FOUNDATION_PACKAGES = ("harness.requirements", "harness.single_process", "harness.upstream")
FOUNDATION = {"harness.settings"} | {
    module for module in MODULES if module.startswith(FOUNDATION_PACKAGES)
}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
    return name == "TYPE_CHECKING"


def _imported(node: ast.AST) -> Iterator[str]:
    """The harness modules one import statement loads (a submodule when it names one)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            yield sub if sub in MODULES else node.module


def _torch_imported(node: ast.AST) -> Iterator[str]:
    """The torch modules one import statement names (`from torch.x import y`: torch.x)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "torch")
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        if node.module.split(".")[0] == "torch":
            yield node.module


def _module_level(body: List[ast.stmt]) -> Iterator[ast.AST]:
    """The import statements that run when the module is imported (not TYPE_CHECKING ones)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _module_level(block)


def imports(module: str, *, module_level: bool) -> Set[str]:
    """Harness modules `module` imports (the package facade `harness` itself left out)."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    nodes = _module_level(tree.body) if module_level else ast.walk(tree)
    names = {name for node in nodes for name in _imported(node)}
    return {name for name in names if name in MODULES and name not in ("harness", module)}


def loads_torch(module: str) -> List[str]:
    """The chain of module-level imports by which importing `module` imports torch (every
    package above a module counts: importing it runs their __init__), empty when it does not."""
    chains = {module: [module]}
    todo = [module]
    while todo:
        current = todo.pop()
        tree = ast.parse(MODULES[current].read_text(), filename=str(MODULES[current]))
        named = {name for node in _module_level(tree.body) for name in _imported(node)}
        if any(name == "torch" or name.startswith("torch.") for name in named):
            return chains[current] + ["torch"]
        parts = current.split(".")
        packages = {".".join(parts[:n]) for n in range(1, len(parts))}
        for name in sorted((named | packages) & set(MODULES)):
            if name not in chains:
                chains[name] = chains[current] + [name]
                todo.append(name)
    return []


def cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[Set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


class CyclesTest(unittest.TestCase):
    def test_the_finder_sees_a_cycle(self) -> None:
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        self.assertEqual(cycles(graph), [{"a", "b", "c"}])
        self.assertEqual(cycles({"a": {"b"}, "b": set()}), [])

    def test_no_import_cycle_among_harness_modules(self) -> None:
        graph = {m: imports(m, module_level=True) for m in MODULES if m != "harness"}
        found = cycles(graph)
        self.assertEqual(
            sorted(map(sorted, found)), sorted(map(sorted, KNOWN_CYCLES)),
            "harness modules import each other in a circle (module level)",
        )


def forbidden_imports(modules: Iterable[str], forbidden: Tuple[str, ...]) -> Dict[str, List[str]]:
    """Each of `modules` that imports (anywhere in its code) a module starting with one of
    `forbidden`, with those imports."""
    found = {
        module: sorted(n for n in imports(module, module_level=False) if n.startswith(forbidden))
        for module in sorted(modules)
    }
    return {module: names for module, names in found.items() if names}


class LayersTest(unittest.TestCase):
    def test_foundation_imports_nothing_above_it(self) -> None:
        self.assertEqual(forbidden_imports(FOUNDATION, ABOVE_FOUNDATION), {})

    def test_each_launch_mode_imports_neither_the_other_nor_the_kit(self) -> None:
        # The kit's bases (FSDPTestContinuous too) sit on the modes: a mode never imports them.
        forbidden = {
            "harness.process": ("harness.threads", "harness.kit", "harness.runner"),
            "harness.threads": ("harness.process", "harness.kit", "harness.runner"),
            "harness.launch": ("harness.process", "harness.threads", "harness.kit",
                               "harness.runner"),
        }
        for package, bad in forbidden.items():
            inside = [m for m in MODULES if m.startswith(package + ".")]
            self.assertEqual(forbidden_imports(inside, bad), {}, package)

    def test_the_pytest_side_sits_on_top_and_nothing_imports_it(self) -> None:
        # The pytest side (plugin, marked functions, rank fixtures, pool, DeepSpeed's shape)
        # drives the launch modes; no layer below reaches back up into it, and it needs
        # neither the runner nor the kit.
        side = "harness.pytest_plugin"
        inside = [m for m in MODULES if m == side or m.startswith(side + ".")]
        self.assertIn(f"{side}.functions", inside)
        others = [m for m in MODULES if m not in inside]
        self.assertEqual(forbidden_imports(others, (side,)), {})
        self.assertEqual(forbidden_imports(inside, ("harness.runner", "harness.kit")), {})

    def test_outcome_imports_no_launch_mode_runner_or_kit(self) -> None:
        outcome = [m for m in MODULES if m == OUTCOME or m.startswith(OUTCOME + ".")]
        self.assertIn(f"{OUTCOME}.merge", outcome)
        self.assertEqual(forbidden_imports(outcome, ABOVE_OUTCOME), {})

    def test_importing_the_outcome_model_imports_no_torch(self) -> None:
        outcome = [m for m in MODULES if m == OUTCOME or m.startswith(OUTCOME + ".")]
        chains = {module: loads_torch(module) for module in sorted(outcome)}
        self.assertEqual({m: c for m, c in chains.items() if c}, {})

    def test_the_torch_finder_follows_imports(self) -> None:
        self.assertEqual(loads_torch("harness.single_process.comparison")[-1], "torch")
        self.assertEqual(loads_torch("harness.requirements.skip_codes"), [])

    def test_testcase_imports_neither_parametrization_nor_launch(self) -> None:
        found = imports("harness.single_process.testcase", module_level=False)
        self.assertNotIn("harness.single_process.parametrize", found)
        self.assertEqual([n for n in found if n.startswith("harness.launch")], [])

    def test_private_torch_modules_are_imported_in_compat_alone(self) -> None:
        # torch's private modules (a `_` part: torch.distributed._shard) are fenced in
        # harness/compat/, one module per concept, so a torch upgrade is fixed there.
        found = {}
        for module, path in MODULES.items():
            if module.startswith("harness.compat."):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            names = [name for node in ast.walk(tree) for name in _torch_imported(node)]
            private = [n for n in names if any(p.startswith("_") for p in n.split(".")[1:])]
            if private:
                found[module] = private
        self.assertEqual(found, {})

    def test_the_reader_sees_imports_inside_functions_and_skips_type_checking(self) -> None:
        tree = ast.parse(
            "import harness.a\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import harness.b\n"
            "def f():\n    import harness.c\n"
        )
        level = [n for node in _module_level(tree.body) for n in _imported(node)]
        self.assertEqual(level, ["harness.a", "typing"])
        every = {n for node in ast.walk(tree) for n in _imported(node)}
        self.assertEqual(every, {"harness.a", "harness.b", "harness.c", "typing"})


if __name__ == "__main__":
    unittest.main()
