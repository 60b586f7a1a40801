"""Distributed checkpoint's stream-transform extensions
(``torch.distributed.checkpoint._extension``): the base class a transform subclasses and the
registry a reader looks transforms up in."""

from __future__ import annotations

from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

__all__ = ["ExtensionRegistry", "StreamTransformExtension"]
