"""Files: which ones a command line names, one file's migration worked out without writing
it, and the atomic write.

A file that cannot be read or parsed is reported in its `FileResult` and left untouched, so
that one bad file does not stop the others; a bad path is a `PathError`, raised before any
file is written.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from harness.migrate.names import SUITE_REASON, Provided
from harness.migrate.rewrite import migrate_source

SKIP_DIRS = ("__pycache__",)


class PathError(Exception):
    """A path named on the command line that cannot be migrated (exit code 2)."""


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
    """The file's text and encoding (its coding cookie or BOM, as Python reads it)."""
    with open(path, "rb") as handle:
        data = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def one_line(error: object) -> str:
    """An error's message on one line (the report has one line per file)."""
    return " ".join(str(error).split())


def migrate_file(path: str, names: frozenset | Provided) -> FileResult:
    """Work out one file's migration without writing it."""
    result = FileResult(path)
    try:
        text, result.encoding = _read(path)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as error:
        result.error = f"cannot read: {one_line(error)}"
        return result
    try:
        new_text, result.moved, result.left = migrate_source(text, names)
    except (SyntaxError, ValueError) as error:
        where = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        message = getattr(error, "msg", None) or str(error)
        result.error = f"cannot parse: {one_line(message)}{where}"
        return result
    try:
        ast.parse(new_text)
    except (SyntaxError, ValueError) as error:
        result.error = f"the rewrite would not parse ({one_line(error)}); please report it"
        return result
    if new_text != text:
        result.new_source = new_text
    return result


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
