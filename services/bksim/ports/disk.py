"""Files as the storage engine sees them. Paths are plain strings.

Durability contract: bytes passed to AppendFile.write are NOT durable until a later `sync()` returns.
Methods that may block on the device (sync, write_synced, atomic_write, sync_dir) are coroutines so a
production adapter can run them off the event loop.
"""
from __future__ import annotations

from typing import Protocol


class AppendFile(Protocol):
    path: str

    @property
    def size(self) -> int:
        """Bytes in the file, including writes not yet synced."""

    def write(self, data: bytes) -> None:
        """Append `data` (not durable until sync)."""

    async def write_chunks(self, chunks: list[bytes]) -> None:
        """Append chunks back to back, off the event loop (not durable until sync)."""

    async def write_chunks_synced(self, chunks: list[bytes]) -> None:
        """Append chunks back to back and fdatasync, as one step off the event loop (a checkpoint's entry-log
        step): every byte written before the call and these chunks are durable when it returns."""

    async def sync(self) -> None:
        """fdatasync: every byte written before the call is durable when it returns."""

    async def write_synced(self, *parts: bytes) -> None:
        """Append `parts` back to back and fdatasync, as one step off the event loop (the journal's group
        commit)."""

    def write_synced_now(self, *parts: bytes) -> None:
        """Append `parts` back to back and fdatasync on the calling thread (blocks it for one device sync)."""

    def pwrite(self, offset: int, data: bytes) -> None:
        """Overwrite bytes in place (entry-log header patch); not durable until sync."""

    def drop_cached(self, start: int, end: int) -> None:
        """Advise that bytes [start, end), already synced, will not be read soon: the OS may drop them from its
        page cache. Advisory only: contents and durability are unchanged, and a refusal is not an error."""

    def close(self) -> None: ...


class Disk(Protocol):
    def create(self, path: str) -> AppendFile:
        """Create a new, empty file (fails if it exists)."""

    def open_append(self, path: str) -> AppendFile:
        """Open an existing file for appending."""

    def read(self, path: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` (short at end of file). Raises OSError if unreadable."""

    def read_all(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def list_dir(self, path: str) -> list[str]:
        """Names in a directory, sorted; [] if it does not exist."""

    def makedirs(self, path: str) -> None: ...

    def remove(self, path: str) -> None: ...

    async def delete(self, path: str) -> None:
        """`remove` without blocking the event loop (unlinking a large file frees its extents: ~10 ms for 64 MiB)."""

    def rename(self, src: str, dst: str) -> None:
        """Move a file (may cross file systems: then copy, fsync, delete)."""

    async def truncate(self, path: str, size: int) -> None:
        """Cut a file to `size` bytes, durably."""

    async def atomic_write(self, path: str, data: bytes) -> None:
        """Replace a file's content all-or-nothing: write temp, fsync, rename, fsync the directory."""

    async def sync_dir(self, path: str) -> None:
        """fsync a directory so that created, renamed or removed names in it are durable."""

    def usage(self, path: str) -> tuple[int, int]:
        """(total bytes, free bytes) of the file system holding `path`."""
