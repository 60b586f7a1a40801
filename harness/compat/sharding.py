"""ShardedTensor and its sharding specs (``torch.distributed._shard``), on which upstream's
sharded-tensor test kit and its state-dict checks build: harness/kit/sharded_tensor.py and
harness/kit/state_dict.py take them from here."""

from __future__ import annotations

from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharding_spec import (
    ChunkShardingSpec,
    EnumerableShardingSpec,
    ShardMetadata,
)

__all__ = [
    "ChunkShardingSpec", "EnumerableShardingSpec", "ShardMetadata", "ShardedTensor",
    "sharded_tensor",
]
