"""Which collective each rank of a hung test is in, and whether the ranks agree.

On a real distributed hang every rank's Python stack says "inside a collective"; what the
user needs is *which* one: rank 0 in all_reduce #7 of the default group, rank 1 in
broadcast #7. Process ranks learn it from torch's flight recorder (it covers gloo; see
harness/compat/flight_recorder.py), thread ranks from the threaded backend's own log
(harness/threads/world.py). Both become `CollectiveCall` records, so one function words
the report for either mode.
"""

from __future__ import annotations

import json
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

DEFAULT_GROUP = "the default group"

# c10 scalar type names (what the flight recorder writes) -> torch dtype names.
_DTYPE_NAMES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}


class CollectiveCall(NamedTuple):
    """One collective a rank entered: what, on which group, its number there, its inputs."""

    op: str  # "all_reduce", "broadcast", ...
    group: str  # "the default group" or "group <name>"
    seq: int  # 1-based number of this call on its group, as this rank counts them
    inputs: Tuple[str, ...]  # "float32[4, 2]" per input tensor
    completed: bool

    def describe(self, with_group: bool = True) -> str:
        where = f" of {self.group}" if with_group else ""
        shown = f" ({', '.join(self.inputs)})" if self.inputs else ""
        return f"{self.op} #{self.seq}{where}{shown}"

    def key(self) -> Tuple[str, str, int]:
        return self.op, self.group, self.seq


def tensor_text(dtype: str, shape: Sequence[int]) -> str:
    return f"{dtype}[{', '.join(str(int(n)) for n in shape)}]"


def _group_name(pg_name: str, desc: str) -> str:
    if desc == "default_pg":
        return DEFAULT_GROUP
    return f"group {pg_name}" if desc in ("", "undefined") else f"group {pg_name} ({desc})"


def from_flight_recorder(dump: str) -> List[CollectiveCall]:
    """The collectives in a flight-recorder JSON dump, oldest first (p2p calls left out)."""
    calls = []
    for entry in json.loads(dump).get("entries", []):
        if entry.get("is_p2p"):
            continue
        pg_name, desc = (list(entry.get("process_group") or ["?", ""]) + [""])[:2]
        dtypes = [_DTYPE_NAMES.get(d, d.lower()) for d in entry.get("input_dtypes", [])]
        inputs = tuple(tensor_text(d, s) for d, s in zip(dtypes, entry.get("input_sizes", [])))
        calls.append(CollectiveCall(
            op=str(entry.get("profiling_name", "?")).split(":")[-1],
            group=_group_name(str(pg_name), str(desc)),
            seq=int(entry.get("collective_seq_id", 0)),
            inputs=inputs,
            completed=bool(entry.get("retired")) or entry.get("state") == "completed",
        ))
    return calls


def waiting_in(calls: Sequence[CollectiveCall]) -> Optional[CollectiveCall]:
    """The oldest collective the rank entered and that has not completed: where it waits."""
    return next((call for call in calls if not call.completed), None)


def rank_line(rank: int, calls: Optional[Sequence[CollectiveCall]]) -> str:
    if calls is None:
        return f"rank {rank}: its collectives could not be read"
    waiting = waiting_in(calls)
    if waiting is not None:
        return f"rank {rank}: waits in {waiting.describe()}"
    if calls:
        return f"rank {rank}: not in a collective; last completed {calls[-1].describe()}"
    return f"rank {rank}: entered no collective"


def disagreement(calls_by_rank: Dict[int, Optional[Sequence[CollectiveCall]]]) -> Optional[str]:
    """One line when the ranks are not all waiting in the same collective, else None."""
    known = {rank: calls for rank, calls in calls_by_rank.items() if calls is not None}
    waiting = {rank: waiting_in(calls) for rank, calls in known.items()}
    if len(known) < 2 or not any(waiting.values()):
        return None
    if len({w.key() if w else None for w in waiting.values()}) == 1:
        return None
    parts, last_group = [], None
    for rank in sorted(waiting):
        call = waiting[rank]
        if call is None:
            parts.append(f"rank {rank} is in no collective")
            continue
        verb = "waits in " if not parts else "in "
        parts.append(f"rank {rank} {verb}{call.describe(with_group=call.group != last_group)}")
        last_group = call.group
    return "ranks disagree: " + ", ".join(parts)


def collectives_section(calls_by_rank: Dict[int, Optional[Sequence[CollectiveCall]]]) -> str:
    """The report's block: a disagreement line when there is one, then a line per rank."""
    if all(calls is None for calls in calls_by_rank.values()):
        return ""
    lines = ["Collectives of each rank:"]
    mismatch = disagreement(calls_by_rank)
    if mismatch:
        lines.append(mismatch)
    lines.extend(rank_line(rank, calls) for rank, calls in sorted(calls_by_rank.items()))
    return "\n".join(lines)
