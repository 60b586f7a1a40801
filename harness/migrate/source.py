"""The source-text model: a file's text, the `from X import ...` statements found in it, and
the text that replaces them.

The rewrite edits the text in place rather than regenerating it from the ast, so that every
byte outside the touched statements (formatting, comments, newline style) survives: `ast`
gives the statements' spans (`locate`), `tokenize` reads the names and the comments inside
them (`parse_entries`), and `render` writes a statement back as ruff/black format it, in the
order the file already sorts its import lists (`choose_order`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

MAX_LINE = 100


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


def parse_entries(text: str) -> Tuple[List[Entry], bool]:
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


def locate(source: Source, node: ast.stmt) -> Tuple[int, int, bool, str, str]:
    """Span of a statement: whole lines when it stands alone on them (its trailing comment
    included), else exactly its ast span. Also whether it stands alone, its indentation and
    the statement's text with the trailing comment."""
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


# The orders an import list can follow. A merged list keeps the file's order, so that the
# rewrite does not fight the file's formatter.


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


def choose_order(lists: Sequence[Sequence[Entry]]) -> Optional[Callable[[Entry], Tuple]]:
    """The sort key every given import list already follows; None: keep the order."""
    for key in (_upstream_key, _ruff_key):
        if all([key(e) for e in entries] == sorted(key(e) for e in entries) for entries in lists):
            return key
    return None


def merge(lists: Sequence[Sequence[Entry]]) -> List[Entry]:
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
