"""One file's rewrite: `migrate_source` finds the private imports block by block, decides
for each imported name whether it moves (`_split`, the one rule), and turns the decisions
into text edits.

Per block, the names moved from private imports standing alone on their lines become one
`from harness import ...` at the place of the first of them (extending an existing one at
module level); a private import sharing its line with other code is rewritten where it
stands. The edits are spans of the original text, applied from the end, so that nothing
else in the file changes.
"""

from __future__ import annotations

import ast
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from harness.migrate.module_imports import (
    alias_uses,
    binds_torch,
    module_scope,
    plan_dotted,
    plan_module_import,
)
from harness.migrate.names import (
    PRIVATE,
    Provided,
    is_mirrored_module,
    is_private_module,
    left_label,
    module_left,
    module_target,
)
from harness.migrate.source import (
    Entry,
    Source,
    Statement,
    choose_order,
    locate,
    merge,
    parse_entries,
    render,
)

Edit = Tuple[int, int, str]  # replace text[start:end] with the string
Mapped = List[Tuple[str, Entry]]  # entries that move, each with its harness module


def _blocks(tree: ast.Module) -> Iterator[Tuple[List[ast.stmt], bool]]:
    """Every statement list of the file, the module body first (flagged True)."""
    yield tree.body, True
    stack: List[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop(0)
        bodies: List[List[ast.stmt]] = []
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                bodies.append(value)
        for sub in getattr(node, "handlers", []) + getattr(node, "cases", []):
            bodies.append(sub.body)
        for body in bodies:
            yield body, False
            stack.extend(body)


def _entry_left(module: str, entry: Entry, uses: Dict[str, Optional[frozenset]],
                known: Provided) -> List[str]:
    """What a name of `from module import ...` that stays is reported as."""
    full = f"{module}.{entry.name}"
    if is_mirrored_module(full):
        return module_left(full, uses.get(entry.asname or entry.name, frozenset()), known)
    return [left_label(module, entry.name)]


def _module_entries(statement: Statement, uses: Dict[str, Optional[frozenset]],
                    known: Provided) -> Mapped:
    """The entries of `from PKG import X, ...` that are upstream modules the harness mirrors
    and can stand in for (the file reads from X only what it provides): (harness module,
    entry)."""
    found = []
    for entry in statement.entries:
        full = f"{statement.module}.{entry.name}"
        if is_mirrored_module(full):
            target = module_target(full, uses.get(entry.asname or entry.name, frozenset()), known)
            if target is not None:
                found.append((target, entry))
    return found


def _split(statement: Statement, known: Provided,
           modules: Sequence[Tuple[str, Entry]] = ()) -> Tuple[Mapped, List[Entry]]:
    """Which of the statement's names move: those the harness provides (with the harness
    module each moves to), and the others, which stay. Entries in `modules` (upstream modules
    moving as modules, `_module_entries`) are in neither list."""
    moving = {id(entry) for _, entry in modules}
    mapped: Mapped = []
    kept: List[Entry] = []
    for entry in statement.entries:
        if id(entry) in moving:
            continue
        target = known.target(statement.module, entry.name)
        if target is None:
            kept.append(entry)
        else:
            mapped.append((target, entry))
    return mapped, kept


def _by_target(mapped: Mapped) -> List[Tuple[str, List[Entry]]]:
    """The mapped entries grouped per harness module, `harness` first."""
    groups: Dict[str, List[Entry]] = {}
    for target, entry in mapped:
        groups.setdefault(target, []).append(entry)
    return sorted(groups.items(), key=lambda item: (item[0] != "harness", item[0]))


def _inline(statement: Statement, imports: List[str], mapped: Mapped, kept: List[Entry],
            newline: str) -> Edit:
    """A statement sharing its line with other code, rewritten where it stands: its parts
    (`imports`, then the moved names per harness module, then what stays) joined by `; `."""
    parts = imports + [render("", module, entries, newline).rstrip("\r\n")
                       for module, entries in _by_target(mapped)]
    if kept:
        parts.append(render("", statement.module, kept, newline).rstrip("\r\n"))
    return statement.start, statement.end, "; ".join(parts)


def _ends_line(source: Source, statement: Statement) -> bool:
    """Whether the statement's span ends with its line's newline (not so on a last line
    without one, where the replacement must not add one)."""
    return source.text[statement.start:statement.end].endswith(("\n", "\r"))


def _plan_from_modules(source: Source, statement: Statement, modules: Mapped, mapped: Mapped,
                       kept: List[Entry], moved: List[Tuple[int, str]]) -> Edit:
    """`from PKG import X[ as Z], ...` with X a module that moves: `import <harness module>
    as X` (or Z) in its place, followed by what else the statement imported (its names the
    harness provides in their own `from harness import ...`, the rest where they were)."""
    nl = source.newline
    labels = {id(entry): f"{statement.module}.{entry.name} as {entry.asname or entry.name}"
              for _, entry in modules}
    labels.update((id(entry), entry.text) for _, entry in mapped)
    moved += [(statement.node.lineno, labels[id(entry)]) for entry in statement.entries
              if id(entry) in labels]
    if not statement.alone:
        imports = [f"import {target} as {entry.asname or entry.name}" for target, entry in modules]
        return _inline(statement, imports, mapped, kept, nl)
    indent = statement.indent
    lines: List[str] = []
    for target, entry in modules:
        lines += [indent + comment for comment in entry.before]
        line = f"{indent}import {target} as {entry.asname or entry.name}"
        lines.append(line + "".join("  " + comment for comment in entry.trailing))
        lines += [indent + comment for comment in entry.after]
    text = nl.join(lines) + nl
    text += "".join(render(indent, module, entries, nl) for module, entries in _by_target(mapped))
    if kept:
        text += render(indent, statement.module, kept, nl, statement.multiline)
    if not _ends_line(source, statement):
        text = text.rstrip("\r\n")
    return statement.start, statement.end, text


def _render_targets(indent: str, targets: Dict[str, List[Entry]], order: Optional[Callable],
                    newline: str) -> str:
    """One `from <harness module> import ...` per module other than `harness` itself."""
    text = ""
    for module in sorted(targets):
        entries = merge([targets[module]])
        if order is not None:
            entries = sorted(entries, key=order)
        text += render(indent, module, entries, newline)
    return text


def _plan_block(source: Source, privates: List[Statement], existing: Optional[Statement],
                block: List[ast.stmt], known: Provided,
                moved: List[Tuple[int, str]]) -> List[Edit]:
    """The edits for one block: inline statements in place, the others merged."""
    nl = source.newline
    edits: List[Edit] = []
    group = [s for s in privates if s.alone]
    for statement in privates:
        if statement.alone:
            continue
        mapped, kept = _split(statement, known)
        moved += [(statement.node.lineno, e.text) for _, e in mapped]
        edits.append(_inline(statement, [], mapped, kept, nl))
    if not group:
        return edits
    first = group[0].index
    if existing is not None and existing.index > first and not all(
            isinstance(node, (ast.Import, ast.ImportFrom)) for node in block[first:existing.index]):
        existing = None  # code between them might use the names before the harness import
    splits = [_split(s, known) for s in group]
    lists = [s.entries for s in group] + ([existing.entries] if existing else [])
    order = choose_order([entries for entries in lists if len(entries) > 1])
    to_harness = [[e for t, e in mapped if t == "harness"] for mapped, _ in splits]
    elsewhere: Dict[str, List[Entry]] = {}
    for mapped, _ in splits:
        for target, entry in mapped:
            if target != "harness":
                elsewhere.setdefault(target, []).append(entry)
    combined = merge(([existing.entries] if existing else []) + to_harness)
    if order is not None:
        combined = sorted(combined, key=order)
    moved += [(s.node.lineno, e.text) for s, (mapped, _) in zip(group, splits) for _, e in mapped]
    anchor = existing or group[0]
    harness_text = ""
    if combined:
        harness_text = render(anchor.indent, "harness", combined, nl,
                              existing.multiline if existing else False)
        if not _ends_line(source, anchor):
            harness_text = harness_text.rstrip("\r\n")
    if existing is not None and len(combined) > len(existing.entries):
        edits.append((existing.start, existing.end, harness_text))
    for position, (statement, (_, kept)) in enumerate(zip(group, splits)):
        text = ""
        if kept:
            text = render(statement.indent, statement.module, kept, nl, statement.multiline)
            if not _ends_line(source, statement):
                text = text.rstrip("\r\n")
        if position == 0:
            head = harness_text if existing is None else ""
            if head and not head.endswith(nl):
                head += nl
            head += _render_targets(statement.indent, elsewhere, order, nl)
            if not text and not _ends_line(source, statement):
                head = head.rstrip("\r\n")
            text = head + text
        edits.append((statement.start, statement.end, text))
    return edits


def _sorted_texts(found: Sequence[Tuple[int, str]]) -> List[str]:
    """The texts in line order (those of one line in the order they were found)."""
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def _top_imports(tree: ast.Module, source: Source, modules: List[str]) -> List[Edit]:
    """`import <module>` for each of `modules` the module scope does not import yet, placed
    after the imports that open the file (else after its docstring and `__future__`)."""
    have = {alias.name for node in module_scope(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.asname is None}
    missing = [module for module in modules if module not in have]
    if not missing:
        return []
    body = list(tree.body)
    head = 1 if body and _is_docstring(body[0]) else 0
    opening = head  # the imports that open the file (`__future__` ones among them)
    while opening < len(body) and isinstance(body[opening], (ast.Import, ast.ImportFrom)):
        opening += 1
    if opening > head:
        at = source.offset((body[opening - 1].end_lineno or body[opening - 1].lineno) + 1, 0)
    elif head < len(body):
        first = body[head]
        at = source.offset(min([first.lineno] + [
            d.lineno for d in getattr(first, "decorator_list", [])]), 0)
    else:
        at = len(source.text)
    text = "".join(f"import {module}{source.newline}" for module in missing)
    if at == len(source.text) and source.text and not source.text.endswith(("\n", "\r")):
        text = source.newline + text
    return [(at, at, text)]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
        node.value.value, str)


def migrate_source(text: str, names: frozenset | Provided) -> Tuple[str, List[str], List[str]]:
    """The migrated text, the names moved (as imported) and the private imports left.
    Raises SyntaxError/ValueError when the text does not parse."""
    known = names if isinstance(names, Provided) else Provided(frozenset(names))
    tree = ast.parse(text)
    source = Source(text)
    uses = alias_uses(tree)
    dotted = plan_dotted(tree, source, known)
    edits: List[Edit] = list(dotted.spans)
    moved: List[Tuple[int, str]] = []
    left: List[Tuple[int, str]] = []
    module_binds_torch = any(binds_torch(node, dotted) for node in module_scope(tree))
    for block, top in _blocks(tree):
        privates: List[Statement] = []
        existing: Optional[Statement] = None
        bound = {"torch"} if module_binds_torch or any(
            binds_torch(node, dotted) for node in block) else set()
        for index, node in enumerate(block):
            if isinstance(node, ast.Import):
                edit = plan_module_import(source, node, uses, dotted, bound, known, moved, left)
                if edit is not None:
                    edits.append(edit)
                continue
            if not isinstance(node, ast.ImportFrom) or node.level:
                continue
            if node.module == "torch.testing":
                left += [(node.lineno, f"{PRIVATE} (module import)")
                         for a in node.names if a.name == "_internal"]
                continue
            star = any(a.name == "*" for a in node.names)
            if is_private_module(node.module) and star:
                left.append((node.lineno, f"{node.module}.* (star import)"))
                continue
            if not (is_private_module(node.module) or node.module == "harness") or star:
                continue
            start, end, alone, indent, stmt_text = locate(source, node)
            entries, parens = parse_entries(stmt_text)
            statement = Statement(node, node.module or "", start, end, alone, indent,
                                  parens and node.lineno != node.end_lineno, entries, index)
            if node.module == "harness":
                if top and alone and existing is None:
                    existing = statement
                continue
            modules = _module_entries(statement, uses, known)
            mapped, kept = _split(statement, known, modules)
            left += [(node.lineno, label) for e in kept
                     for label in _entry_left(statement.module, e, uses, known)]
            if modules:
                edits.append(_plan_from_modules(source, statement, modules, mapped, kept, moved))
            elif mapped:
                privates.append(statement)
        if privates:
            edits += _plan_block(source, privates, existing, block, known, moved)
    moved += [(line, module) for module, line in dotted.read_at.items()
              if module in dotted.targets]
    left += [(line, label) for module, line in dotted.read_at.items()
             for label in dotted.left.get(module, ())] + dotted.unmirrored
    edits += _top_imports(tree, source, dotted.top_imports)
    new_text = text
    for start, end, replacement in sorted(edits, reverse=True):
        new_text = new_text[:start] + replacement + new_text[end:]
    return new_text, _sorted_texts(moved), _sorted_texts(left)
