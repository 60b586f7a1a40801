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
    is_mirrored_module,
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
    """The private modules a file reads by their dotted name
    (`torch.testing._internal.common_utils.TestCase`), imported as such (`import
    torch.testing._internal.common_utils`, no alias) or loaded by another import (upstream's
    modules import each other): per module that moves, the harness module it moves to and
    the spans of its dotted name in the file; the labels of the modules that stay (`left`);
    `read_at`: the line of the first use of each module the file never imports by that name
    (where it is reported); the harness modules to import at the top, where a use stands in
    a scope that no import of it binds; and each dotted private name of a module the harness
    does not mirror, which no import names (`unmirrored`, reported as left)."""

    targets: Dict[str, str] = field(default_factory=dict)
    spans: List[Tuple[int, int, str]] = field(default_factory=list)
    left: Dict[str, List[str]] = field(default_factory=dict)
    read_at: Dict[str, int] = field(default_factory=dict)
    needs_torch: bool = False  # the file reads `torch` otherwise (the import bound it)
    top_imports: List[str] = field(default_factory=list)
    unmirrored: List[Tuple[int, str]] = field(default_factory=list)  # (line, label) left


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _scopes(node: ast.AST, parents: Dict[int, ast.AST]) -> List[Optional[ast.AST]]:
    """The scopes whose names `node` sees, innermost first; None is the module. A class body
    is seen only from its own statements, not from the functions inside it."""
    seen: List[Optional[ast.AST]] = []
    parent = parents.get(id(node))
    while parent is not None:
        if isinstance(parent, _SCOPES) and not (isinstance(parent, ast.ClassDef) and seen):
            seen.append(parent)
        parent = parents.get(id(parent))
    return seen + [None]


def plan_dotted(tree: ast.Module, source: Source, known: Provided) -> Dotted:
    """Which dotted private modules move: those whose every use is an attribute read (or set)
    the harness provides, each use's dotted name exactly as found in the text."""
    plain = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names if alias.asname is None and is_private_module(alias.name)}
    first_read: Dict[str, int] = {}
    for node in ast.walk(tree):
        name = _dotted_name(node) if isinstance(node, ast.Attribute) else None
        if name is not None and name not in plain and is_mirrored_module(name):
            first_read[name] = min(first_read.get(name, node.lineno), node.lineno)
    modules = plain | set(first_read)
    plan = Dotted(read_at=dict(first_read))
    parents: Dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in ast.walk(tree):  # a private name no import names, of a module not mirrored
        chain = _dotted_name(node) if isinstance(node, ast.Attribute) else None
        outer = parents.get(id(node))
        if (chain is not None and is_private_module(chain)
                and not (isinstance(outer, ast.Attribute) and outer.value is node)
                and not any(chain == m or chain.startswith(m + ".") for m in modules)):
            plan.unmirrored.append((node.lineno, f"{chain} (dotted name)"))
    if not modules:
        return plan
    used: Dict[str, set] = {module: set() for module in modules}
    found: Dict[str, List[Tuple[int, int, ast.expr]]] = {module: [] for module in modules}
    opaque: set = set()
    unbound: set = set()  # modules read where no import of them binds the name
    binding: Dict[str, set] = {}  # module -> the scopes a plain import of it binds `torch` in
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is None and alias.name in plain:
                    binding.setdefault(alias.name, set()).add(_scopes(node, parents)[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        module = _dotted_name(node)
        if module not in modules:
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
        if not any(scope in binding.get(module, ()) for scope in _scopes(node, parents)):
            unbound.add(module)
    covered = set()
    for module in sorted(modules):
        attributes = None if module in opaque else frozenset(used[module])
        target = module_target(module, attributes, known)
        if target is None:
            plan.left[module] = module_left(module, attributes, known)
            continue
        plan.targets[module] = target
        for start, end, root in found[module]:
            plan.spans.append((start, end, target))
            covered.add(id(root))
        if module in unbound and target not in plan.top_imports:
            plan.top_imports.append(target)
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
