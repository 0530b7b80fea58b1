"""The double-buffered write cache and the read cache (PROTOCOL.md §2.2 "Write cache").

WriteCache: two halves. `active` takes adds; at a checkpoint it becomes `flushing` (swap) while a fresh
half takes adds; once the flushed entries are in the entry log and the index, `flushing` is cleared.
Reads look in active, then flushing. Both halves are bounded by `bytes_max // 2` of entry bytes.
"""
from __future__ import annotations

from typing import Iterable, Sequence

Key = tuple[int, int]


class _Ledger:
    """One ledger's entries in one half, the highest entry id among them, and whether they were inserted in
    ascending order (the usual case: then a flush needs no sort)."""
    __slots__ = ("entries", "last", "in_order")

    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.last = -1
        self.in_order = True


class _Half:
    """One half: entries grouped per ledger, so an add needs no tuple key and a flush sorts small integer
    keys per ledger (already in order when adds arrive in order: timsort is then linear)."""
    __slots__ = ("ledgers", "nbytes")

    def __init__(self) -> None:
        self.ledgers: dict[int, _Ledger] = {}
        self.nbytes = 0

    def sorted_runs(self) -> list[tuple[int, Iterable[tuple[int, bytes]]]]:
        runs = []
        for ledger_id in sorted(self.ledgers):
            ledger = self.ledgers[ledger_id]
            runs.append((ledger_id, ledger.entries.items() if ledger.in_order else sorted(ledger.entries.items())))
        return runs

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self.ledgers.get(ledger_id)
        return ledger.entries.get(entry_id) if ledger is not None else None

    def count(self) -> int:
        return sum(len(ledger.entries) for ledger in self.ledgers.values())


class WriteCache:
    def __init__(self, bytes_max: int, entry_overhead: int = 0) -> None:
        """Two halves of bytes_max // 2 each. An entry counts its length plus `entry_overhead` bytes (what its
        objects cost beyond the bytes), so the bound holds for memory, not only for entry bytes."""
        self.half_bytes_max = bytes_max // 2
        self.entry_overhead = entry_overhead
        self._limit = self.half_bytes_max  # what the active half may hold (less only after shorten_active)
        self._active = _Half()
        self._flushing = _Half()

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Insert (or replace: re-adds are idempotent). False when the active half has no room."""
        half = self._active
        ledger = half.ledgers.get(ledger_id)
        if ledger is None:
            ledger = half.ledgers[ledger_id] = _Ledger()
        entries = ledger.entries
        old = entries.get(entry_id)
        size = len(entry) + self.entry_overhead if old is None else len(entry) - len(old)
        if half.nbytes + size > self._limit:
            return False
        entries[entry_id] = entry
        half.nbytes += size
        if entry_id > ledger.last:
            ledger.last = entry_id
        elif old is None:
            ledger.in_order = False
        return True

    def put_run(self, ledger_id: int, entry_ids: list[int], entries: Sequence[bytes], nbytes: int) -> bool:
        """put() of every (entry_ids[i], entries[i]) at once, for `entry_ids` ascending and above every entry id the
        active half holds of the ledger, `nbytes` the entries' total length. False, and nothing inserted, when
        the active half lacks room for all of them or holds an entry id >= entry_ids[0] of the ledger."""
        half = self._active
        size = nbytes + len(entry_ids) * self.entry_overhead
        if half.nbytes + size > self._limit:
            return False
        ledger = half.ledgers.get(ledger_id)
        if ledger is None:
            ledger = half.ledgers[ledger_id] = _Ledger()
        elif entry_ids[0] <= ledger.last:
            return False
        ledger.entries.update(zip(entry_ids, entries))
        ledger.last = entry_ids[-1]
        half.nbytes += size
        return True

    def shorten_active(self, bytes_max: int) -> None:
        """Until the next swap the active half holds at most `bytes_max` (clamped to 0..half_bytes_max): an add
        that finds it full asks for a checkpoint that much sooner."""
        self._limit = max(0, min(bytes_max, self.half_bytes_max))

    def has_room(self, size: int) -> bool:
        """Could an entry of `size` bytes go into the active half now?"""
        return self._active.nbytes + size + self.entry_overhead <= self._limit

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entry = self._active.get(ledger_id, entry_id)
        if entry is None:
            entry = self._flushing.get(ledger_id, entry_id)
        return entry

    def entry_ids(self, ledger_id: int, first_entry: int = 0) -> list[int]:
        """The ledger's entry ids >= `first_entry` held in either half, ascending, each once."""
        ids: set[int] = set()
        for half in (self._active, self._flushing):
            ledger = half.ledgers.get(ledger_id)
            if ledger is not None:
                ids.update(entry_id for entry_id in ledger.entries if entry_id >= first_entry)
        return sorted(ids)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id of the ledger held in either half, or -1."""
        active = self._active.ledgers.get(ledger_id)
        flushing = self._flushing.ledgers.get(ledger_id)
        return max(active.last if active is not None else -1, flushing.last if flushing is not None else -1)

    @property
    def active_bytes(self) -> int:
        return self._active.nbytes

    @property
    def flushing_bytes(self) -> int:
        return self._flushing.nbytes

    def swap(self) -> list[tuple[int, Iterable[tuple[int, bytes]]]]:
        """Make the active half the flushing half; return its entries as runs sorted by ledger, each
        [(ledger id, [(entry id, entry), ...sorted by entry id])]."""
        assert not self._flushing.ledgers, "swap while the previous flush is unfinished"
        self._active, self._flushing = self._flushing, self._active
        self._limit = self.half_bytes_max
        return self._flushing.sorted_runs()

    def flushing_runs(self) -> list[tuple[int, Iterable[tuple[int, bytes]]]]:
        """The flushing half's runs, as swap() returned them (to retry a flush that failed after its swap)."""
        return self._flushing.sorted_runs()

    def flushed(self) -> None:
        """The flushing half is durable in the entry log and index: drop it."""
        self._flushing = _Half()

    def __len__(self) -> int:
        return self._active.count() + self._flushing.count()


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

    def discard_runs(self, runs: Iterable[tuple[int, Iterable[tuple[int, bytes]]]]) -> None:
        """Forget the cached copies of entries a write-cache half is about to index at new locations: a re-add
        (a copy restored by recovery or re-replication) may carry other bytes than the copy read before."""
        if not self._young and not self._old:
            return
        for ledger_id, entries in runs:
            for entry_id, _entry in entries:
                key = (ledger_id, entry_id)
                entry = self._young.pop(key, None)
                if entry is not None:
                    self._young_bytes -= len(entry)
                self._old.pop(key, None)

    def drop_ledgers(self, ledger_ids: set[int]) -> None:
        """Forget every cached entry of these ledgers (garbage collection deleted them)."""
        for gen in (self._young, self._old):
            for key in [k for k in gen if k[0] in ledger_ids]:
                entry = gen.pop(key)
                if gen is self._young:
                    self._young_bytes -= len(entry)
