"""`python -m harness.migrate PATH...`: move `torch.testing._internal` imports to `harness`.

Users bring test files written against PyTorch's private testing modules; the first wall
they hit is changing every import by hand. This command rewrites each
`from torch.testing._internal.<module> import a, b` whose names `harness.__all__` provides
(under the same name) into `from harness import ...`, and leaves everything else as it is.
The modules are those the harness stands in for (MIRRORED: common_utils, common_device_type,
common_distributed, common_fsdp, common_cuda, distributed._tensor.common_dtensor,
distributed.checkpoint_utils, inductor_utils, triton_utils) and those mirrored by a harness
module of their own (HOMES: distributed.fake_pg, the sharded-tensor kit, ...); a name of a
HOMES module that `harness` exports as something else (the sharded-tensor `with_comms`) moves
to `from <that harness module> import ...`. A name imported from any other private module
stays. Imports of upstream's own test suites (SUITES: RPC fixtures, DistributedTest, op_db,
...) stay, reported with SUITE_REASON, and do not count as private imports left.

Module imports of a MIRRORED or HOMES module move to a harness module that carries its names
(`harness`, or for a HOMES module its own harness module where `harness` lacks one of the
names), so that attribute access works as upstream's (`common_utils.TestCase`,
`common_distributed.TEST_SKIPS`), in every form:
- `import torch.testing._internal.<module> as alias` becomes `import harness as alias`;
- `from torch.testing._internal[.<package>] import <module>[ as alias], ...` becomes
  `import harness as <module>` (or `as alias`), one line per module, in the statement's
  place; what else the statement imported follows it (names the harness provides in their
  own `from harness import ...`, the rest, such as an upstream test suite, where they were);
- `import torch.testing._internal.<module>`, read by its dotted name
  (`torch.testing._internal.common_utils.TestCase`), becomes `import harness`, and each
  dotted name of the module in the file's code becomes `harness` (`harness.TestCase`):
  only these spans change, found as the `ast.Attribute` nodes whose dotted chain is the
  module's name and whose text is that name (spaces aside; a span with a comment inside, or
  an ast position that is off, keeps the module where it is). `import torch` goes before
  it when the file reads `torch` otherwise and no other import binds it there; an `import
  harness` the same block already has above (from a rewrite too) is not repeated (the
  statement's line goes, unless it carries a comment or other code).
Such a module moves only when every attribute the file reads (or sets) on it is provided
under that name, and the file uses it only so (never passed around or assigned). Otherwise
the import stays as it is, and each attribute the harness does not provide is reported by
name (`torch.testing._internal.common_utils.TEST_WITH_CROSSREF (module attribute)`), or the
import itself when it is used other than by attribute (`... (module import)`). Module state
a file sets through the module (`common_utils.SEED = 99`) reaches the harness module that
reads it: assigning a public name on `harness` also assigns it in its home module
(harness/__init__.py), and the harness's SEED seeds each test as upstream's does.

How the rewrite works (why it can be trusted on real files):
- The source text is edited in place: `ast` only finds the import statements (and the
  dotted names of a module imported by its dotted name) and their exact spans, `tokenize`
  reads the names and comments inside them. Everything outside the touched statements and
  dotted names keeps its bytes (formatting, comments, newline style, encoding).
- In each block (module body, or the body of an `if`/`try`/function), the names moved from
  all private imports that stand alone on their lines become one `from harness import ...`
  at the place of the first of them, with that block's indentation; at module level an
  existing simple `from harness import ...` is extended instead. The names are sorted as
  the file already sorts its import lists (case-insensitively, as upstream does, or
  constants/classes/functions, as ruff does); when the lists follow neither order, the
  existing order is kept and new names are appended. A line longer than 100 characters,
  or one carrying comments between names, becomes a parenthesised one-name-per-line list.
- A private import sharing its line with other code (`x = 1; from ... import a`) is
  rewritten where it stands, without merging.
- Names it cannot map stay in their private import, which is rewritten with just those
  names (one line if it fits, else one name per line, as ruff/black format it; a list that
  was spread over parenthesised lines stays spread); module imports that cannot move (see
  above), imports of other private modules, and star imports stay too. All are reported.
- The result must parse (`ast.parse`) before it is written; files are written atomically
  (a temp file in the same folder renamed over the original, keeping its mode).
- A second run changes nothing.

Paths: files or folders; a folder means every `*.py` below it, skipping hidden folders,
`__pycache__` and virtual environments (folders holding `pyvenv.cfg`), so that running it
on a checkout never rewrites an installed torch. A path that does not exist (or is not a
file or folder) is an error: one line each on stderr and exit 2, before any file is
written. A file that cannot be read or parsed is reported in one line and left untouched;
the other files are still migrated, and the exit code is 1 (it may hide private imports).

Output (stdout), one line per file that moved names or keeps private imports, then a summary:
    path/test_x.py: moved 5 names to harness (FSDPTest, ...); left 1: <module>.TEST_HPU
    migrate: 3 files changed, 2 unchanged, 1 private imports left
`--check` writes nothing and says "would move" / "would change"; it exits 1 when a file
would change. Exit codes: 0 nothing private left (and, with --check, nothing to change);
1 a private import remains, a file would change (--check), or a file could not be read,
parsed or written; 2 bad command line or path.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import os
import re
import stat
import sys
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

PRIVATE = "torch.testing._internal"
# The upstream modules the harness stands in for (DESIGN.md). Only names imported from these
# move: a same-named thing elsewhere (`with_comms` of `distributed._shard.sharded_tensor`)
# is a different thing.
MIRRORED = frozenset(f"{PRIVATE}.{module}" for module in (
    "common_cuda", "common_device_type", "common_distributed", "common_fsdp", "common_utils",
    "distributed._tensor.common_dtensor", "distributed.checkpoint_utils", "inductor_utils",
    "triton_utils"))
# Upstream modules mirrored by a harness module of their own. Their names move to
# `from harness import ...` where `harness` exports the same object, else (a name `harness`
# exports for another module, such as the sharded-tensor `with_comms`) to that module.
HOMES = {f"{PRIVATE}.{module}": home for module, home in (
    ("distributed.fake_pg", "harness.kit.fake_pg"),
    ("distributed._shard.sharded_tensor", "harness.kit.sharded_tensor"),
    ("distributed._shard.sharded_tensor._test_st_common", "harness.kit.sharded_tensor"),
    ("distributed._shard.sharded_tensor._test_ops_common", "harness.kit.sharded_tensor"),
    ("distributed._shard.test_common", "harness.kit.sharded_tensor"),
    ("distributed.common_state_dict", "harness.kit.state_dict"),
    ("distributed.distributed_utils", "harness.kit.mock_pg"),
    ("common_dist_composable", "harness.kit.composable_models"),
    ("two_tensor", "harness.kit.two_tensor"),
    ("logging_utils", "harness.kit.logging_case"),
)}
# Upstream's own test suites, which some files import to re-run them: not harness API. Such
# imports stay private, are reported with SUITE_REASON, and do not fail the command.
SUITES = tuple(f"{PRIVATE}.{module}" for module in (
    "distributed.rpc", "distributed.rpc_utils", "distributed.distributed_test",
    "distributed.ddp_under_dist_autograd_test", "distributed.nn.api.remote_module_test",
    "distributed.pipe_with_ddp_test", "common_methods_invocations", "opinfo",
    "common_ops_unbacked"))
SUITE_NAMES = frozenset({(f"{PRIVATE}.common_device_type", "ops"),
                         (f"{PRIVATE}.common_device_type", "OpDTypes")})
SUITE_REASON = "upstream's own test suite, not harness API"
MAX_LINE = 100
SKIP_DIRS = ("__pycache__",)


class PathError(Exception):
    """A path named on the command line that cannot be migrated (exit code 2)."""


def harness_names() -> frozenset:
    """The names the harness provides, read at run time so that new names map at once."""
    import harness

    return frozenset(name for name in harness.__all__ if hasattr(harness, name))


@dataclass(frozen=True)
class Provided:
    """What the harness provides: the names `harness` exports and, per upstream module with a
    harness module of its own, that module and the names it holds (and, of those, the ones
    `harness` exports as something else)."""

    names: frozenset
    homes: Dict[str, Tuple[str, frozenset, frozenset]] = field(default_factory=dict)

    def target(self, module: str, name: str) -> Optional[str]:
        """The harness module `from module import name` moves to; None: it stays."""
        home = self.homes.get(module)
        if home is not None:
            home_module, held, shadowed = home
            if name in held:
                return "harness" if name in self.names and name not in shadowed else home_module
            return None
        return "harness" if module in MIRRORED and name in self.names else None


def provided() -> Provided:
    """Read at run time from `harness` and its modules, so that new names map at once."""
    import importlib

    import harness

    homes: Dict[str, Tuple[str, frozenset, frozenset]] = {}
    for module, home in HOMES.items():
        loaded = importlib.import_module(home)
        held = frozenset(n for n in getattr(loaded, "__all__", ()) if hasattr(loaded, n))
        shadowed = frozenset(n for n in held if getattr(harness, n, None) is not getattr(loaded, n))
        homes[module] = (home, held, shadowed)
    return Provided(harness_names(), homes)


def is_suite(module: str, name: Optional[str] = None) -> bool:
    """Whether an import is of upstream's own test suites (stays private, does not fail)."""
    return (module, name) in SUITE_NAMES or any(
        module == suite or module.startswith(suite + ".") for suite in SUITES)


@dataclass
class Entry:
    """One imported name with the comments that travel with it."""

    name: str
    asname: Optional[str] = None
    before: List[str] = field(default_factory=list)
    trailing: List[str] = field(default_factory=list)
    after: List[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return f"{self.name} as {self.asname}" if self.asname else self.name

    @property
    def has_comments(self) -> bool:
        return bool(self.before or self.trailing or self.after)


@dataclass
class Statement:
    """A `from X import ...` statement located in the source text."""

    node: ast.ImportFrom
    module: str
    start: int
    end: int
    alone: bool
    indent: str
    multiline: bool
    entries: List[Entry]
    index: int


@dataclass
class FileResult:
    """What migrating one file did (or would do)."""

    path: str
    moved: List[str] = field(default_factory=list)
    left: List[str] = field(default_factory=list)
    new_source: Optional[str] = None
    encoding: str = "utf-8"
    error: Optional[str] = None

    @property
    def suites(self) -> List[str]:
        """The private imports left that are upstream's own test suites (not harness API)."""
        return [label for label in self.left if label.endswith(f"({SUITE_REASON})")]


def is_private_module(module: Optional[str]) -> bool:
    return module is not None and (module == PRIVATE or module.startswith(PRIVATE + "."))


def _torch_root() -> Optional[Path]:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent.parent


def is_submodule(module: str, name: str) -> bool:
    """Whether `from module import name` imports a module (looked up on disk, not imported,
    so that the private testing modules are never loaded)."""
    if module == PRIVATE:
        return True
    root = _torch_root()
    if root is None:
        return False
    base = root.joinpath(*module.split("."), name)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


# ----------------------------------------------------------------------------- source text


class Source:
    """A file's text with the line table that turns ast positions into string offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
        self.starts: List[int] = []
        offset = 0
        for line in self.lines:
            self.starts.append(offset)
            offset += len(line)
        first_end = re.search(r"\r\n|\r|\n", text)
        self.newline = first_end.group(0) if first_end else "\n"

    def line(self, lineno: int) -> str:
        return self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""

    def offset(self, lineno: int, col_bytes: int) -> int:
        """ast columns count UTF-8 bytes; string offsets count characters."""
        line = self.line(lineno)
        col = len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="replace"))
        start = self.starts[lineno - 1] if lineno - 1 < len(self.starts) else len(self.text)
        return start + col


def _parse_entries(text: str) -> Tuple[List[Entry], bool]:
    """Names and comments of one `from X import ...` statement's text (plus any comment
    that follows it on its last line). Also says whether the names were parenthesised."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text + "\n").readline)
              if t.type not in (tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT,
                                tokenize.DEDENT)]
    index = next(i for i, t in enumerate(tokens)
                 if t.type == tokenize.NAME and t.string == "import")
    entries: List[Entry] = []
    pending: List[str] = []
    last_row = -1
    parenthesised = False
    closed = False
    i = index + 1
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == tokenize.NAME:
            entry = Entry(tok.string, before=pending)
            pending = []
            last_row = tok.end[0]
            j = i + 1
            while j < len(tokens) and tokens[j].type == tokenize.NL:
                j += 1
            if j < len(tokens) and tokens[j].type == tokenize.NAME and tokens[j].string == "as":
                j += 1
                while tokens[j].type == tokenize.NL:
                    j += 1
                entry.asname = tokens[j].string
                last_row = tokens[j].end[0]
                i = j
            entries.append(entry)
        elif tok.type == tokenize.COMMENT:
            comment = tok.string.rstrip()
            if entries and (tok.start[0] == last_row or closed):
                target = entries[-1].after if closed and entries[-1].trailing else (
                    entries[-1].trailing)
                target.append(comment)
            else:
                pending.append(comment)
        elif tok.type == tokenize.OP and tok.string == "(":
            parenthesised = True
        elif tok.type == tokenize.OP and tok.string == ")":
            closed = True
            if pending and entries:
                entries[-1].after.extend(pending)
                pending = []
        i += 1
    if pending and entries:
        entries[-1].after.extend(pending)
    return entries, parenthesised


def _locate(source: Source, node: ast.stmt) -> Tuple[int, int, bool, str, str]:
    """Span of a statement: whole lines when it stands alone on them (its trailing comment
    included), else exactly its ast span. Also its indentation and the statement's text
    with the trailing comment."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    start = source.offset(node.lineno, node.col_offset)
    end = source.offset(node.end_lineno, node.end_col_offset)
    first = source.line(node.lineno)
    prefix = source.text[source.starts[node.lineno - 1]:start]
    last_start = source.starts[node.end_lineno - 1]
    rest = source.line(node.end_lineno)[end - last_start:].rstrip("\r\n")
    alone = prefix.strip() == "" and (rest.strip() == "" or rest.strip().startswith("#"))
    indent = first[: len(first) - len(first.lstrip())] if alone else ""
    if not alone:
        return start, end, False, indent, source.text[start:end]
    text = source.text[start:end] + ("  " + rest.strip() if rest.strip() else "")
    line_end = last_start + len(source.line(node.end_lineno))
    return source.starts[node.lineno - 1], line_end, True, indent, text


# ----------------------------------------------------------------------------- ordering


def _natural(text: str) -> Tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _upstream_key(entry: Entry) -> Tuple:
    """Upstream's import lists: case-insensitive (usort)."""
    return (entry.name.lower(), entry.name, entry.asname or "")


def _ruff_key(entry: Entry) -> Tuple:
    """ruff's isort default: CONSTANTS, then Classes, then functions, each natural order."""
    name = entry.name
    kind = 0 if len(name) > 1 and name.isupper() else 1 if name[:1].isupper() else 2
    return (kind, _natural(name.lower()), name, entry.asname or "")


def _choose_order(lists: Sequence[Sequence[Entry]]) -> Optional[Callable[[Entry], Tuple]]:
    """The sort key every given import list already follows; None: keep the order."""
    for key in (_upstream_key, _ruff_key):
        if all([key(e) for e in entries] == sorted(key(e) for e in entries) for entries in lists):
            return key
    return None


def _merge(lists: Sequence[Sequence[Entry]]) -> List[Entry]:
    """Entries of all lists, each name (with its alias) once, comments merged."""
    merged: Dict[Tuple[str, Optional[str]], Entry] = {}
    for entries in lists:
        for entry in entries:
            key = (entry.name, entry.asname)
            if key in merged:
                kept = merged[key]
                kept.before += entry.before
                kept.trailing += entry.trailing
                kept.after += entry.after
            else:
                merged[key] = Entry(entry.name, entry.asname, list(entry.before),
                                    list(entry.trailing), list(entry.after))
    return list(merged.values())


def render(indent: str, module: str, entries: Sequence[Entry], newline: str,
           multiline: bool = False) -> str:
    """`from module import ...` text: one line when it fits and carries no inner comments,
    else parenthesised with one name per line (the form ruff/black produce)."""
    only_trailing_last = all(not e.before and not e.after for e in entries) and all(
        not e.trailing for e in entries[:-1])
    if not multiline and only_trailing_last:
        line = f"{indent}from {module} import {', '.join(e.text for e in entries)}"
        if entries[-1].trailing:
            line += "  " + "  ".join(entries[-1].trailing)
        if len(line) <= MAX_LINE:
            return line + newline
    lines = [f"{indent}from {module} import ("]
    inner = indent + "    "
    for entry in entries:
        lines += [inner + comment for comment in entry.before]
        line = f"{inner}{entry.text},"
        if entry.trailing:
            line += "  " + "  ".join(entry.trailing)
        lines.append(line)
        lines += [inner + comment for comment in entry.after]
    lines.append(f"{indent})")
    return newline.join(lines) + newline


# ----------------------------------------------------------------------------- one file


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


def _left_label(module: str, name: str) -> str:
    if is_submodule(module, name):
        label = f"{module}.{name} (module import)"
    else:
        label = f"{module}.{name}"
    suite = is_suite(module, name) or is_suite(f"{module}.{name}")
    return f"{label} ({SUITE_REASON})" if suite else label


def _alias_uses(tree: ast.Module) -> Dict[str, Optional[frozenset]]:
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


def _alias_target(module: str, used: Optional[frozenset], known: Provided) -> Optional[str]:
    """The harness module that can stand in for `import <module> as alias`: one that provides
    every attribute the file reads from the alias under the same name."""
    if used is None:
        return None
    targets = {known.target(module, attribute) for attribute in used}
    if None in targets:
        return None
    if len(targets) > 1:
        home = known.homes.get(module)
        return home[0] if home and all(a in home[1] for a in used) else None
    return targets.pop() if targets else ("harness" if module in MIRRORED else (
        known.homes[module][0] if module in known.homes else None))


def is_mirrored_module(module: str) -> bool:
    """Whether a harness module carries the names of upstream's `module`."""
    return module in MIRRORED or module in HOMES


def _module_left(module: str, used: Optional[frozenset], known: Provided) -> List[str]:
    """What a module import that stays is reported as: each attribute the file reads from it
    that the harness does not provide, by name, else the import itself."""
    if used and is_mirrored_module(module):
        missing = sorted(a for a in used if known.target(module, a) is None)
        if missing:
            return [f"{module}.{attribute} (module attribute)" for attribute in missing]
    return [_left_label(*module.rsplit(".", 1))]


def _entry_left(module: str, entry: Entry, uses: Dict[str, Optional[frozenset]],
                known: Provided) -> List[str]:
    """What a name of `from module import ...` that stays is reported as."""
    full = f"{module}.{entry.name}"
    if is_mirrored_module(full):
        return _module_left(full, uses.get(entry.asname or entry.name, frozenset()), known)
    return [_left_label(module, entry.name)]


def _module_entries(statement: Statement, uses: Dict[str, Optional[frozenset]],
                    known: Provided) -> List[Tuple[str, Entry]]:
    """The entries of `from PKG import X, ...` that are upstream modules the harness mirrors
    and can stand in for (the file reads from X only what it provides): (harness module,
    entry)."""
    found = []
    for entry in statement.entries:
        full = f"{statement.module}.{entry.name}"
        if is_mirrored_module(full):
            target = _alias_target(full, uses.get(entry.asname or entry.name, frozenset()), known)
            if target is not None:
                found.append((target, entry))
    return found


def _plan_from_modules(source: Source, statement: Statement, modules: List[Tuple[str, Entry]],
                       uses: Dict[str, Optional[frozenset]], known: Provided,
                       moved: List[Tuple[int, str]],
                       left: List[Tuple[int, str]]) -> Tuple[int, int, str]:
    """`from PKG import X[ as Z], ...` with X a module that moves: `import <harness module>
    as X` (or Z) in its place, followed by what else the statement imported (its names the
    harness provides in their own `from harness import ...`, the rest where they were)."""
    nl = source.newline
    lineno = statement.node.lineno
    moving = {id(entry) for _, entry in modules}
    by_target: Dict[str, List[Entry]] = {}
    kept: List[Entry] = []
    for entry in statement.entries:
        if id(entry) in moving:
            moved.append((lineno, f"{statement.module}.{entry.name} as "
                                  f"{entry.asname or entry.name}"))
            continue
        target = known.target(statement.module, entry.name)
        if target is None:
            kept.append(entry)
            left.extend((lineno, label) for label in _entry_left(statement.module, entry, uses,
                                                                 known))
        else:
            by_target.setdefault(target, []).append(entry)
            moved.append((lineno, entry.text))
    targets = sorted(by_target.items(), key=lambda item: (item[0] != "harness", item[0]))
    if not statement.alone:
        parts = [f"import {target} as {entry.asname or entry.name}" for target, entry in modules]
        parts += [render("", module, entries, nl).rstrip("\r\n") for module, entries in targets]
        if kept:
            parts.append(render("", statement.module, kept, nl).rstrip("\r\n"))
        return statement.start, statement.end, "; ".join(parts)
    indent = statement.indent
    lines: List[str] = []
    for target, entry in modules:
        lines += [indent + comment for comment in entry.before]
        line = f"{indent}import {target} as {entry.asname or entry.name}"
        lines.append(line + "".join("  " + comment for comment in entry.trailing))
        lines += [indent + comment for comment in entry.after]
    text = nl.join(lines) + nl
    text += "".join(render(indent, module, entries, nl) for module, entries in targets)
    if kept:
        text += render(indent, statement.module, kept, nl, statement.multiline)
    if not source.text[statement.start:statement.end].endswith(("\n", "\r")):
        text = text.rstrip("\r\n")
    return statement.start, statement.end, text


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


def _plan_dotted(tree: ast.Module, source: Source, known: Provided) -> Dotted:
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
        target = _alias_target(module, attributes, known)
        if target is None:
            plan.left[module] = _module_left(module, attributes, known)
            continue
        plan.targets[module] = target
        for start, end, root in found[module]:
            plan.spans.append((start, end, target))
            covered.add(id(root))
    plan.needs_torch = bool(plan.targets) and any(
        isinstance(node, ast.Name) and node.id == "torch" and id(node) not in covered
        for node in ast.walk(tree))
    return plan


def _binds_torch(node: ast.stmt, dotted: Dotted) -> bool:
    """Whether an import statement binds `torch` (and keeps binding it after the rewrite)."""
    if isinstance(node, ast.ImportFrom):
        return any((alias.asname or alias.name) == "torch" for alias in node.names)
    if not isinstance(node, ast.Import):
        return False
    return any(alias.asname == "torch" or (
        alias.asname is None and alias.name.split(".")[0] == "torch"
        and alias.name not in dotted.targets) for alias in node.names)


def _module_scope(tree: ast.Module) -> List[ast.stmt]:
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


def _plan_module_import(source: Source, node: ast.Import, uses: Dict[str, Optional[frozenset]],
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
            target = _alias_target(alias.name, used, known)
            if target is None:
                parts.append(_alias_text(alias))
                left.extend((node.lineno, label) for label in _module_left(alias.name, used, known))
                continue
            parts.append(f"{target} as {alias.asname}")
            moved.append((node.lineno, _alias_text(alias)))
            changed = True
            continue
        target = dotted.targets.get(alias.name)
        if target is None:
            parts.append(alias.name)
            labels = dotted.left.get(alias.name) or [_left_label(*alias.name.rsplit(".", 1))]
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
    line_start, line_end, alone, indent, _ = _locate(source, node)
    if not parts:  # all it imported is imported above already
        if alone and source.text[end:line_end].strip() == "":
            return line_start, line_end, ""
        parts = [dotted.targets[node.names[0].name]]
    if len(node.names) == 1 and len(parts) > 1:
        separator = f"{source.newline}{indent}import " if alone else "; import "
        return start, end, "import " + separator.join(parts)
    return start, end, "import " + ", ".join(parts)


def migrate_source(text: str, names: frozenset | Provided) -> Tuple[str, List[str], List[str]]:
    """The migrated text, the names moved (as imported) and the private imports left.
    Raises SyntaxError/ValueError when the text does not parse."""
    known = names if isinstance(names, Provided) else Provided(frozenset(names))
    tree = ast.parse(text)
    source = Source(text)
    uses = _alias_uses(tree)
    dotted = _plan_dotted(tree, source, known)
    edits: List[Tuple[int, int, str]] = list(dotted.spans)
    moved: List[Tuple[int, str]] = []
    left: List[Tuple[int, str]] = []
    module_binds_torch = any(_binds_torch(node, dotted) for node in _module_scope(tree))
    for block, top in _blocks(tree):
        privates: List[Statement] = []
        existing: Optional[Statement] = None
        bound = {"torch"} if module_binds_torch or any(
            _binds_torch(node, dotted) for node in block) else set()
        for index, node in enumerate(block):
            if isinstance(node, ast.Import):
                edit = _plan_module_import(source, node, uses, dotted, bound, known, moved, left)
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
            start, end, alone, indent, stmt_text = _locate(source, node)
            entries, parens = _parse_entries(stmt_text)
            statement = Statement(node, node.module or "", start, end, alone, indent,
                                  parens and node.lineno != node.end_lineno, entries, index)
            if node.module == "harness":
                if top and alone and existing is None:
                    existing = statement
                continue
            modules = _module_entries(statement, uses, known)
            if modules:
                edits.append(_plan_from_modules(source, statement, modules, uses, known, moved,
                                                left))
                continue
            mapped, kept = _split(statement, known)
            left += [(node.lineno, label) for e in kept
                     for label in _entry_left(statement.module, e, uses, known)]
            if mapped:
                privates.append(statement)
        if privates:
            edits += _plan_block(source, privates, existing, block, known, moved)
    new_text = text
    for start, end, replacement in sorted(edits, reverse=True):
        new_text = new_text[:start] + replacement + new_text[end:]
    by_line = sorted(moved, key=lambda item: item[0]), sorted(left, key=lambda item: item[0])
    return new_text, [text for _, text in by_line[0]], [text for _, text in by_line[1]]


def _split(statement: Statement, known: Provided) -> Tuple[List[Tuple[str, Entry]], List[Entry]]:
    """The statement's entries the harness provides (with the harness module each moves to),
    and the others."""
    mapped: List[Tuple[str, Entry]] = []
    kept: List[Entry] = []
    for entry in statement.entries:
        target = known.target(statement.module, entry.name)
        if target is None:
            kept.append(entry)
        else:
            mapped.append((target, entry))
    return mapped, kept


def _render_targets(indent: str, targets: Dict[str, List[Entry]], order: Optional[Callable],
                    newline: str) -> str:
    """One `from <harness module> import ...` per module other than `harness` itself."""
    text = ""
    for module in sorted(targets):
        entries = _merge([targets[module]])
        if order is not None:
            entries = sorted(entries, key=order)
        text += render(indent, module, entries, newline)
    return text


def _plan_block(source: Source, privates: List[Statement], existing: Optional[Statement],
                block: List[ast.stmt], known: Provided,
                moved: List[Tuple[int, str]]) -> List[Tuple[int, int, str]]:
    """The edits for one block: inline statements in place, the others merged."""
    nl = source.newline
    edits: List[Tuple[int, int, str]] = []
    group = [s for s in privates if s.alone]
    for statement in privates:
        if statement.alone:
            continue
        mapped, kept = _split(statement, known)
        moved += [(statement.node.lineno, e.text) for _, e in mapped]
        by_target: Dict[str, List[Entry]] = {}
        for target, entry in mapped:
            by_target.setdefault(target, []).append(entry)
        parts = [render("", module, entries, nl).rstrip("\r\n")
                 for module, entries in sorted(by_target.items(), key=lambda i: i[0] != "harness")]
        if kept:
            parts.append(render("", statement.module, kept, nl).rstrip("\r\n"))
        edits.append((statement.start, statement.end, "; ".join(parts)))
    if not group:
        return edits
    first = group[0].index
    if existing is not None and existing.index > first and not all(
            isinstance(node, (ast.Import, ast.ImportFrom)) for node in block[first:existing.index]):
        existing = None  # code between them might use the names before the harness import
    splits = [_split(s, known) for s in group]
    lists = [s.entries for s in group] + ([existing.entries] if existing else [])
    order = _choose_order([entries for entries in lists if len(entries) > 1])
    to_harness = [[e for t, e in mapped if t == "harness"] for mapped, _ in splits]
    elsewhere: Dict[str, List[Entry]] = {}
    for mapped, _ in splits:
        for target, entry in mapped:
            if target != "harness":
                elsewhere.setdefault(target, []).append(entry)
    combined = _merge(([existing.entries] if existing else []) + to_harness)
    if order is not None:
        combined = sorted(combined, key=order)
    moved += [(s.node.lineno, e.text) for s, (mapped, _) in zip(group, splits) for _, e in mapped]
    anchor = existing or group[0]
    harness_text = ""
    if combined:
        harness_text = render(anchor.indent, "harness", combined, nl,
                              existing.multiline if existing else False)
        if not source.text[anchor.start:anchor.end].endswith(("\n", "\r")):
            harness_text = harness_text.rstrip("\r\n")
    if existing is not None and len(combined) > len(existing.entries):
        edits.append((existing.start, existing.end, harness_text))
    for position, (statement, (_, kept)) in enumerate(zip(group, splits)):
        text = ""
        if kept:
            text = render(statement.indent, statement.module, kept, nl, statement.multiline)
            if not source.text[statement.start:statement.end].endswith(("\n", "\r")):
                text = text.rstrip("\r\n")
        if position == 0:
            head = harness_text if existing is None else ""
            if head and not head.endswith(nl):
                head += nl
            head += _render_targets(statement.indent, elsewhere, order, nl)
            if not text and not source.text[statement.start:statement.end].endswith(("\n", "\r")):
                head = head.rstrip("\r\n")
            text = head + text
        edits.append((statement.start, statement.end, text))
    return edits


# ----------------------------------------------------------------------------- files


def collect(paths: Sequence[str]) -> List[str]:
    """The files named or found below the folders named; raises PathError for each bad path
    (all reported, in one exception's lines)."""
    problems = []
    files: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                                 and not os.path.isfile(os.path.join(root, d, "pyvenv.cfg")))
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.isfile(path):
            files.append(path)
        elif os.path.lexists(path) and not os.path.exists(path):
            problems.append(f"{path}: broken symbolic link")
        elif os.path.exists(path):
            problems.append(f"{path}: not a file or folder")
        else:
            problems.append(f"{path}: no such file or folder")
    if problems:
        raise PathError("\n".join(problems))
    unique: Dict[str, str] = {}
    for file in files:
        unique.setdefault(os.path.realpath(file), file)
    return list(unique.values())


def _read(path: str) -> Tuple[str, str]:
    with open(path, "rb") as handle:
        data = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def migrate_file(path: str, names: frozenset | Provided) -> FileResult:
    """Work out one file's migration without writing it."""
    result = FileResult(path)
    try:
        text, result.encoding = _read(path)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as error:
        result.error = f"cannot read: {_one_line(error)}"
        return result
    try:
        new_text, result.moved, result.left = migrate_source(text, names)
    except (SyntaxError, ValueError) as error:
        where = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        message = getattr(error, "msg", None) or str(error)
        result.error = f"cannot parse: {_one_line(message)}{where}"
        return result
    try:
        ast.parse(new_text)
    except (SyntaxError, ValueError) as error:
        result.error = f"the rewrite would not parse ({_one_line(error)}); please report it"
        return result
    if new_text != text:
        result.new_source = new_text
    return result


def _one_line(error: object) -> str:
    return " ".join(str(error).split())


def write_atomically(path: str, text: str, encoding: str) -> None:
    """Replace the file's content in one rename (a reader never sees half a file), keeping
    its mode; a symbolic link keeps pointing at the file it named."""
    real = os.path.realpath(path)
    mode = stat.S_IMODE(os.stat(real).st_mode)
    folder, name = os.path.split(real)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".migrate")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode(encoding))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _names_list(names: Sequence[str]) -> str:
    return f"{len(names)} name{'s' if len(names) != 1 else ''}"


def report_line(result: FileResult, check: bool) -> Optional[str]:
    if result.error:
        return f"{result.path}: {result.error}; left untouched"
    parts = []
    if result.moved:
        verb = "would move" if check else "moved"
        parts.append(f"{verb} {_names_list(result.moved)} to harness ({', '.join(result.moved)})")
    if result.left:
        parts.append(f"left {len(result.left)}: {', '.join(result.left)}")
    return f"{result.path}: {'; '.join(parts)}" if parts else None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command; returns the exit code (0 clean, 1 private imports left or a file
    not migrated or, with --check, a file would change; 2 bad command line or path)."""
    parser = _Parser(prog="python -m harness.migrate",
                     description="Move torch.testing._internal imports to harness.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (*.py below)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file would change or a private "
                             "import remains")
    args = parser.parse_args(argv)
    try:
        files = collect(args.paths)
    except PathError as error:
        for line in str(error).splitlines():
            print(f"{parser.prog}: error: {line}", file=sys.stderr)
        return 2
    known = provided()
    results = [migrate_file(path, known) for path in files]
    failed = False
    for result in results:
        if result.new_source is not None and not args.check:
            try:
                write_atomically(result.path, result.new_source, result.encoding)
            except OSError as error:
                result.error = f"cannot write: {_one_line(error)}"
                result.moved = []
        line = report_line(result, args.check)
        if line:
            print(line)
        failed = failed or result.error is not None
    changed = sum(r.new_source is not None and r.error is None for r in results)
    left = sum(len(r.left) - len(r.suites) for r in results)
    suites = sum(len(r.suites) for r in results)
    errors = sum(r.error is not None for r in results)
    summary = (f"migrate: {changed} files {'would change' if args.check else 'changed'}, "
               f"{len(results) - changed} unchanged, {left} private imports left")
    if suites:
        summary += f", {suites} imports of upstream's own test suites kept"
    if errors:
        summary += f", {errors} not migrated"
    print(summary)
    return 1 if failed or left or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
