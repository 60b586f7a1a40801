"""A torch.distributed world per thread, for ranks that are threads.

torch.distributed keeps its process-group state (default group, group maps, the group name
registry) in one private module-level `distributed_c10d._world`; rank threads each need their
own, for the duration of a threaded run only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterator

# Fields of c10d's `_World` that hold state, with the value a fresh thread starts from.
# `pg_config_info` is derived from them, so it works unchanged on the per-thread world.
_C10D_WORLD_FIELDS: dict[str, Any] = {
    "default_pg": None,
    "pg_map": dict,
    "pg_names": dict,
    "pg_group_ranks": dict,
    "pg_backend_config": dict,
    "group_count": 0,
    "tags_to_pg": dict,
    "pg_to_tag": dict,
    "pg_coalesce_state": dict,
    "comms": list,
}
_c10d_world_lock = threading.Lock()
_c10d_world_depth = [0]


def _per_thread_field(name: str, default: Any) -> property:
    def get(self: Any) -> Any:
        state = self._per_thread.__dict__
        if name not in state:
            state[name] = default() if callable(default) else default
        return state[name]

    def set_(self: Any, value: Any) -> None:
        self._per_thread.__dict__[name] = value

    return property(get, set_)


@functools.cache
def _thread_local_c10d_world_class() -> type:
    """A subclass of `distributed_c10d._World` whose every field is separate per thread."""
    from torch.distributed import distributed_c10d

    base = distributed_c10d._World
    known = set(_C10D_WORLD_FIELDS) | {"pg_config_info"}
    unknown = sorted(k for k, v in vars(base).items() if isinstance(v, property) and k not in known)
    if unknown:
        raise RuntimeError(
            f"this torch's distributed_c10d._World has fields {unknown} that "
            "this module does not make per-thread; add them to _C10D_WORLD_FIELDS"
        )
    namespace = {name: _per_thread_field(name, d) for name, d in _C10D_WORLD_FIELDS.items()}
    return type("ThreadLocalWorld", (base,), namespace)


def _thread_local_c10d_world() -> Any:
    cls = _thread_local_c10d_world_class()
    world = cls.__new__(cls)
    world._per_thread = threading.local()
    return world


@contextlib.contextmanager
def thread_local_c10d_world() -> Iterator[None]:
    """Give every thread its own torch.distributed world while the context is active.

    Inside, each thread has its own default group, group maps and group-name registry
    (c10d's C++ registry is switched to per-thread mode too), so rank threads can each
    call `init_process_group`. The previous world is restored on exit.
    """
    import torch
    from torch.distributed import distributed_c10d

    set_isolation = getattr(torch._C._distributed_c10d, "_set_thread_isolation_mode", None)
    with _c10d_world_lock:
        saved = distributed_c10d._world
        distributed_c10d._world = _thread_local_c10d_world()
        _c10d_world_depth[0] += 1
        if set_isolation is not None and _c10d_world_depth[0] == 1:
            set_isolation(True)
    try:
        yield
    finally:
        with _c10d_world_lock:
            distributed_c10d._world = saved
            _c10d_world_depth[0] -= 1
            if set_isolation is not None and _c10d_world_depth[0] == 0:
                set_isolation(False)
