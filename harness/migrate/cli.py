"""The command line: `python -m harness.migrate [--check] PATH...`, its report lines and its
exit code (the package docstring says what each means)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Optional, Sequence

from harness.migrate.files import (
    FileResult,
    PathError,
    collect,
    migrate_file,
    one_line,
    write_atomically,
)
from harness.migrate.names import provided


def _names_list(names: Sequence[str]) -> str:
    return f"{len(names)} name{'s' if len(names) != 1 else ''}"


def report_line(result: FileResult, check: bool) -> Optional[str]:
    """The file's line of the report; None for a file with nothing to say."""
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
    """argparse's, but a bad command line's message is one line (no usage dump), exit 2."""

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
                result.error = f"cannot write: {one_line(error)}"
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
