"""What moves where: the upstream modules the harness stands in for, the names it provides,
and what a private import that stays is reported as.

The rest of the package asks this module every "does it move, and to which harness module"
question; the names are read at run time from `harness` (and its HOMES modules), so that a
name added to the harness maps at once, without a table to update here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PRIVATE = "torch.testing._internal"
# The upstream modules the harness stands in for (docs/design.md). Only names imported from these
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


def is_private_module(module: Optional[str]) -> bool:
    """Whether `module` is `torch.testing._internal` or one of its modules."""
    return module is not None and (module == PRIVATE or module.startswith(PRIVATE + "."))


def is_mirrored_module(module: str) -> bool:
    """Whether a harness module carries the names of upstream's `module`."""
    return module in MIRRORED or module in HOMES


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


def module_target(module: str, used: Optional[frozenset], known: Provided) -> Optional[str]:
    """The harness module that can stand in for upstream's `module` imported as a module:
    one that provides every attribute the file reads from it (`used`; None: the file also
    uses the module otherwise, so it stays) under the same name."""
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


def left_label(module: str, name: str) -> str:
    """How `from module import name` that stays is reported (a module import, a suite)."""
    if is_submodule(module, name):
        label = f"{module}.{name} (module import)"
    else:
        label = f"{module}.{name}"
    suite = is_suite(module, name) or is_suite(f"{module}.{name}")
    return f"{label} ({SUITE_REASON})" if suite else label


def module_left(module: str, used: Optional[frozenset], known: Provided) -> List[str]:
    """What a module import that stays is reported as: each attribute the file reads from it
    that the harness does not provide, by name, else the import itself."""
    if used and is_mirrored_module(module):
        missing = sorted(a for a in used if known.target(module, a) is None)
        if missing:
            return [f"{module}.{attribute} (module attribute)" for attribute in missing]
    return [left_label(*module.rsplit(".", 1))]
