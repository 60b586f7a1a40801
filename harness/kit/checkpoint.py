"""Upstream's checkpoint test utilities (`distributed.checkpoint_utils`): an example stream
transform for checkpoint extensions, the registry that knows it, and a logging-level
decorator. (`with_temp_dir` of the same upstream module is the DTensor kit's.)
"""

from __future__ import annotations

import functools
import io
import logging
import os
from typing import IO, Any, Callable, Optional

from harness.compat.checkpoint_extension import ExtensionRegistry, StreamTransformExtension

__all__ = ["Rot13Example", "get_test_extension_registry", "with_checkpoint_logging"]


def _swap_case(buffer: Any, count: int) -> None:
    """Upstream's "rot13": swaps the case of ASCII letters in the first `count` bytes, in place
    (its own inverse, like rot13; checkpoints written with it keep upstream's bytes)."""
    view = memoryview(buffer)
    for index in range(count):
        byte = view[index]
        if ord("A") <= byte <= ord("Z"):
            view[index] = byte + 32
        elif ord("a") <= byte <= ord("z"):
            view[index] = byte - 32


class _Writer(io.RawIOBase):
    def __init__(self, output: IO[bytes]) -> None:
        self.output = output

    def writeable(self) -> bool:  # upstream's spelling, kept
        return True

    def write(self, b: Any) -> Optional[int]:
        chunk = bytearray(b)
        _swap_case(chunk, len(chunk))
        return self.output.write(chunk)

    def flush(self) -> None:
        self.output.flush()


class _Reader(io.RawIOBase):
    def __init__(self, source: IO[bytes]) -> None:
        self.source = source

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> Optional[int]:
        if hasattr(self.source, "readinto"):
            count = self.source.readinto(b)
        else:
            data = self.source.read(len(memoryview(b)))
            count = None if data is None else len(data)
            if data is not None:
                memoryview(b)[:count] = data
        if count:
            _swap_case(b, count)
        return count

    def seekable(self) -> bool:
        return self.source.seekable()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.source.seek(offset, whence)

    def tell(self) -> int:
        return self.source.tell()


class Rot13Example(StreamTransformExtension):
    """An example checkpoint stream transform (registered as "stream.rot13", version 1)."""

    def __init__(self, chunk_size: int = io.DEFAULT_BUFFER_SIZE) -> None:
        super().__init__()
        self._chunk_size = chunk_size

    @staticmethod
    def from_descriptor(version: str) -> Rot13Example:
        if version.partition(".")[0] != "1":
            raise ValueError(f"Unknown extension {version=}")
        return Rot13Example()

    @staticmethod
    def registry_name() -> str:
        return "stream.rot13"

    def get_descriptor(self) -> str:
        return f"{self.registry_name()}/1"

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        return _Writer(output)  # type: ignore[return-value]

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:  # noqa: A002 - upstream's name
        return _Reader(input)  # type: ignore[return-value]


def get_test_extension_registry() -> ExtensionRegistry:
    """An extension registry that knows Rot13Example."""
    registry = ExtensionRegistry()
    registry.register(Rot13Example)
    return registry


def with_checkpoint_logging(func: Optional[Callable] = None,
                            logger_name: str = "torch.distributed.checkpoint",
                            level: int = logging.INFO) -> Callable:
    """Run the test with `logger_name` at `level`, restored afterwards."""
    if func is None:
        raise AssertionError("Expected func to not be None")

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        logger = logging.getLogger(logger_name)
        saved = logger.level
        logger.setLevel(level)
        try:
            func(self, *args, **kwargs)
        finally:
            logger.setLevel(saved)

    return wrapper
