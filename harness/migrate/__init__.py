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

The code, one stage per module (each imports only modules listed above it):
    names.py           what moves where: the upstream modules mirrored, the names provided
    source.py          the source text: statements located and parsed, import lists rendered
    module_imports.py  module imports (`import ... as alias`, dotted names) and their uses
    rewrite.py         one file's rewrite: which names move, block by block (migrate_source)
    files.py           the paths named, one file read and planned, the atomic write
    cli.py             the command line, the report lines, the exit code (main)
"""

from harness.migrate.cli import main, report_line
from harness.migrate.files import (
    SKIP_DIRS,
    FileResult,
    PathError,
    collect,
    migrate_file,
    write_atomically,
)
from harness.migrate.module_imports import Dotted
from harness.migrate.names import (
    HOMES,
    MIRRORED,
    PRIVATE,
    SUITE_NAMES,
    SUITE_REASON,
    SUITES,
    Provided,
    harness_names,
    is_mirrored_module,
    is_private_module,
    is_submodule,
    is_suite,
    provided,
)
from harness.migrate.rewrite import migrate_source
from harness.migrate.source import MAX_LINE, Entry, Source, Statement, render

__all__ = [
    "HOMES", "MAX_LINE", "MIRRORED", "PRIVATE", "SKIP_DIRS", "SUITES", "SUITE_NAMES",
    "SUITE_REASON", "Dotted", "Entry", "FileResult", "PathError", "Provided", "Source",
    "Statement", "collect", "harness_names", "is_mirrored_module", "is_private_module",
    "is_submodule", "is_suite", "main", "migrate_file", "migrate_source", "provided",
    "render", "report_line", "write_atomically",
]
