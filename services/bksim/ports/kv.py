"""An ordered key-value store (RocksDB in production, a sorted dict in unit tests)."""
from __future__ import annotations

from typing import Iterator, Protocol


class KeyValueStore(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def floor(self, key: bytes) -> tuple[bytes, bytes] | None:
        """The greatest (key, value) with key <= `key`, or None (a reverse seek)."""

    def items_from(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with key >= `key`, in key order."""

    async def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], sync: bool) -> None:
        """Apply all puts and deletes atomically; with sync, durable when it returns."""

    def close(self) -> None: ...
