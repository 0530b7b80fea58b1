"""Synced file bytes leaving the OS page cache (BookKeeper's journalRemoveFromPageCache).

A bookie writes its journal and entry logs at the add rate and reads them back rarely: the journal only at
replay, an entry log when a reader is behind both write-cache halves and the read cache. Left cached, those bytes
grow the page cache at the add rate. On a VM whose memory the host hands out lazily, every page the cache grows
into is slow the first time (this machine: 1 MiB write() 0.4 ms while the cache reuses pages, 3.3 ms once it
grows), so a steady writer pays that at the add rate. `SyncedPages` drops a file's synced bytes in whole steps.
"""
from __future__ import annotations

from bksim.ports.disk import AppendFile

STEP_BYTES = 1 << 20  # dropped ranges end on multiples of this: whole pages, and at most one call per MiB synced


class SyncedPages:
    """How far one file's pages were dropped; `synced(end)` drops more once `end - lag_bytes` passes a step."""

    __slots__ = ("_file", "_lag", "_dropped")

    def __init__(self, file: AppendFile, lag_bytes: int = 0) -> None:
        self._file, self._lag, self._dropped = file, lag_bytes, 0

    def synced(self, end: int) -> None:
        """Every byte before `end` is synced: drop the pages up to the last step at least the lag behind it."""
        upto = (end - self._lag) // STEP_BYTES * STEP_BYTES
        if upto > self._dropped:
            self._file.drop_cached(self._dropped, upto)
            self._dropped = upto

    def complete(self) -> None:
        """The file is whole and synced (rolled, sealed): drop the rest of it."""
        if self._file.size > self._dropped:
            self._file.drop_cached(self._dropped, self._file.size)
            self._dropped = self._file.size
