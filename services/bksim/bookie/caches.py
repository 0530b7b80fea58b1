"""The double-buffered write cache and the read cache (PROTOCOL.md §2.2 "Write cache").

WriteCache: two halves. `active` takes adds; at a checkpoint it becomes `flushing` (swap) while a fresh
half takes adds; once the flushed entries are in the entry log and the index, `flushing` is cleared.
Reads look in active, then flushing. Both halves are bounded by `bytes_max // 2` of entry bytes.
"""
from __future__ import annotations

Key = tuple[int, int]


class _Half:
    __slots__ = ("entries", "nbytes", "last_entry")

    def __init__(self) -> None:
        self.entries: dict[Key, bytes] = {}
        self.nbytes = 0
        self.last_entry: dict[int, int] = {}


class WriteCache:
    def __init__(self, bytes_max: int) -> None:
        self.half_bytes_max = bytes_max // 2
        self._active = _Half()
        self._flushing = _Half()

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Insert (or replace: re-adds are idempotent). False when the active half has no room."""
        half = self._active
        key = (ledger_id, entry_id)
        old = half.entries.get(key)
        size = len(entry) - (len(old) if old is not None else 0)
        if half.nbytes + size > self.half_bytes_max:
            return False
        half.entries[key] = entry
        half.nbytes += size
        if entry_id > half.last_entry.get(ledger_id, -1):
            half.last_entry[ledger_id] = entry_id
        return True

    def has_room(self, size: int) -> bool:
        """Could an entry of `size` bytes go into the active half now?"""
        return self._active.nbytes + size <= self.half_bytes_max

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        entry = self._active.entries.get(key)
        if entry is None:
            entry = self._flushing.entries.get(key)
        return entry

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id of the ledger held in either half, or -1."""
        return max(self._active.last_entry.get(ledger_id, -1), self._flushing.last_entry.get(ledger_id, -1))

    @property
    def active_bytes(self) -> int:
        return self._active.nbytes

    @property
    def flushing_bytes(self) -> int:
        return self._flushing.nbytes

    def swap(self) -> list[tuple[Key, bytes]]:
        """Make the active half the flushing half; return its entries sorted by (ledger, entry)."""
        assert not self._flushing.entries, "swap while the previous flush is unfinished"
        self._active, self._flushing = self._flushing, self._active
        return sorted(self._flushing.entries.items())

    def flushing_entries(self) -> list[tuple[Key, bytes]]:
        """The flushing half's entries, sorted (to retry a flush that failed after its swap)."""
        return sorted(self._flushing.entries.items())

    def flushed(self) -> None:
        """The flushing half is durable in the entry log and index: drop it."""
        self._flushing = _Half()

    def __len__(self) -> int:
        return len(self._active.entries) + len(self._flushing.entries)


class ReadCache:
    """Entries read from entry logs, bounded by bytes: two generations; when the young one fills, the old
    one is dropped (cheap approximate LRU, like BookKeeper's segmented ReadCache)."""

    def __init__(self, bytes_max: int) -> None:
        self._gen_bytes_max = max(1, bytes_max // 2)
        self._young: dict[Key, bytes] = {}
        self._young_bytes = 0
        self._old: dict[Key, bytes] = {}

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        entry = self._young.get(key)
        if entry is None:
            entry = self._old.get(key)
        return entry

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        if len(entry) > self._gen_bytes_max or (ledger_id, entry_id) in self._young:
            return
        if self._young_bytes + len(entry) > self._gen_bytes_max:
            self._old, self._young, self._young_bytes = self._young, {}, 0
        self._young[(ledger_id, entry_id)] = entry
        self._young_bytes += len(entry)
