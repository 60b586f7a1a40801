"""Moving module imports: `import torch.testing._internal.X as alias`, and `import
torch.testing._internal.X` read by its dotted name.

A module import can move only when the harness module it moves to provides every attribute
the file reads (or sets) on it, so this stage first reads how the file uses each bound name
(`alias_uses`) and each dotted module name (`plan_dotted`), then rewrites the import
statements (`plan_module_import`). The dotted names in the code are edited too, span by span.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from harness.migrate.names import (
    Provided,
    is_private_module,
    left_label,
    module_left,
    module_target,
)
from harness.migrate.source import Source, locate


def alias_uses(tree: ast.Module) -> Dict[str, Optional[frozenset]]:
    """Per name bound in the file, the attributes read from it; None where the name is also
    used otherwise (passed, called, assigned), so that what it must provide is unknown."""
    attributes: Dict[str, set] = {}
    opaque: set = set()
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attributes.setdefault(node.value.id, set()).add(node.attr)
            inside.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and id(node) not in inside:
            opaque.add(node.id)
    names = set(attributes) | opaque
    return {n: None if n in opaque else frozenset(attributes.get(n, ())) for n in names}


def _dotted_name(node: ast.expr) -> Optional[str]:
    """`a.b.c` of an attribute chain on a name; None for anything else."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


@dataclass
class Dotted:
    """The private modules a file imports by their dotted name (`import
    torch.testing._internal.common_utils`, no alias) and reads as such
    (`torch.testing._internal.common_utils.TestCase`): per module that moves, the harness
    module it moves to and the spans of its dotted name in the file; and the labels of the
    modules that stay."""

    targets: Dict[str, str] = field(default_factory=dict)
    spans: List[Tuple[int, int, str]] = field(default_factory=list)
    left: Dict[str, List[str]] = field(default_factory=dict)
    needs_torch: bool = False  # the file reads `torch` otherwise (the import bound it)


def plan_dotted(tree: ast.Module, source: Source, known: Provided) -> Dotted:
    """Which dotted private module imports move: those whose every use is an attribute read
    (or set) the harness provides, each use's dotted name exactly as found in the text."""
    plain = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names if alias.asname is None and is_private_module(alias.name)}
    plan = Dotted()
    if not plain:
        return plan
    parents: Dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    used: Dict[str, set] = {module: set() for module in plain}
    found: Dict[str, List[Tuple[int, int, ast.expr]]] = {module: [] for module in plain}
    opaque: set = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        module = _dotted_name(node)
        if module not in plain:
            continue
        parent = parents.get(id(node))
        assert node.end_lineno is not None and node.end_col_offset is not None
        start = source.offset(node.lineno, node.col_offset)
        end = source.offset(node.end_lineno, node.end_col_offset)
        # Only a span whose text is the dotted name (spaces aside) is rewritten: never one
        # with comments inside, nor one whose ast position is off (f-strings before 3.12).
        if (not isinstance(parent, ast.Attribute) or parent.value is not node
                or re.sub(r"[\s\\]", "", source.text[start:end]) != module):
            opaque.add(module)
            continue
        used[module].add(parent.attr)
        found[module].append((start, end, _root(node)))
    covered = set()
    for module in sorted(plain):
        attributes = None if module in opaque else frozenset(used[module])
        target = module_target(module, attributes, known)
        if target is None:
            plan.left[module] = module_left(module, attributes, known)
            continue
        plan.targets[module] = target
        for start, end, root in found[module]:
            plan.spans.append((start, end, target))
            covered.add(id(root))
    plan.needs_torch = bool(plan.targets) and any(
        isinstance(node, ast.Name) and node.id == "torch" and id(node) not in covered
        for node in ast.walk(tree))
    return plan


def binds_torch(node: ast.stmt, dotted: Dotted) -> bool:
    """Whether an import statement binds `torch` (and keeps binding it after the rewrite)."""
    if isinstance(node, ast.ImportFrom):
        return any((alias.asname or alias.name) == "torch" for alias in node.names)
    if not isinstance(node, ast.Import):
        return False
    return any(alias.asname == "torch" or (
        alias.asname is None and alias.name.split(".")[0] == "torch"
        and alias.name not in dotted.targets) for alias in node.names)


def module_scope(tree: ast.Module) -> List[ast.stmt]:
    """The statements that bind names of the module (not inside a function or class)."""
    found: List[ast.stmt] = []
    stack: List[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.stmt))
        for sub in getattr(node, "handlers", []) + getattr(node, "cases", []):
            stack.extend(sub.body)
    return found


def _alias_text(alias: ast.alias) -> str:
    return f"{alias.name} as {alias.asname}" if alias.asname else alias.name


def plan_module_import(source: Source, node: ast.Import, uses: Dict[str, Optional[frozenset]],
                       dotted: Dotted, bound: set, known: Provided,
                       moved: List[Tuple[int, str]],
                       left: List[Tuple[int, str]]) -> Optional[Tuple[int, int, str]]:
    """`import torch.testing._internal.X as alias` becomes `import <harness module> as alias`
    when that module provides all the file reads from it; `import torch.testing._internal.X`
    read by its dotted name becomes `import harness` (preceded by `import torch` where the
    file reads `torch` otherwise and nothing else binds it). `bound`: the plain imports the
    block already has before this statement (one of these is not repeated)."""
    parts: List[str] = []
    changed = False
    for alias in node.names:
        if not is_private_module(alias.name):
            parts.append(_alias_text(alias))
            if alias.asname is None:
                bound.add(alias.name)
            continue
        if alias.asname is not None:
            used = uses.get(alias.asname, frozenset())
            target = module_target(alias.name, used, known)
            if target is None:
                parts.append(_alias_text(alias))
                left.extend((node.lineno, label) for label in module_left(alias.name, used, known))
                continue
            parts.append(f"{target} as {alias.asname}")
            moved.append((node.lineno, _alias_text(alias)))
            changed = True
            continue
        target = dotted.targets.get(alias.name)
        if target is None:
            parts.append(alias.name)
            labels = dotted.left.get(alias.name) or [left_label(*alias.name.rsplit(".", 1))]
            left.extend((node.lineno, label) for label in labels)
            continue
        for needed in (["torch"] if dotted.needs_torch else []) + [target]:
            if needed not in bound:
                parts.append(needed)
                bound.add(needed)
        moved.append((node.lineno, alias.name))
        changed = True
    if not changed:
        return None
    assert node.end_lineno is not None and node.end_col_offset is not None
    start = source.offset(node.lineno, node.col_offset)
    end = source.offset(node.end_lineno, node.end_col_offset)
    line_start, line_end, alone, indent, _ = locate(source, node)
    if not parts:  # all it imported is imported above already
        if alone and source.text[end:line_end].strip() == "":
            return line_start, line_end, ""
        parts = [dotted.targets[node.names[0].name]]
    if len(node.names) == 1 and len(parts) > 1:
        separator = f"{source.newline}{indent}import " if alone else "; import "
        return start, end, "import " + separator.join(parts)
    return start, end, "import " + ", ".join(parts)
