"""FakeLayout: a NAMED FAKE of the managed ledger as cursors see it (topics/layout.py LedgerLayout), for
unit and integration tests of the cursor. Not a managed ledger: no ledgers are read or written; it is a list of
(ledger id, entry count) pairs, the last one being the ledger "being written". Tests grow it (`add_entries`,
`add_ledger`) and trim it (`trim`) to play the managed ledger's part.
"""
from __future__ import annotations

import bisect

from bksim.topics.positions import Position


class FakeLayout:
    def __init__(self, ledgers: list[tuple[int, int]]) -> None:
        assert ledgers, "a managed ledger always has a current ledger"
        ids = [lg for lg, _ in ledgers]
        assert ids == sorted(set(ids)), f"ledger ids must increase: {ids}"
        self._ids = ids
        self._counts = {lg: n for lg, n in ledgers}
        self._reindex()

    def _reindex(self) -> None:
        self._starts = []  # global index of each ledger's entry 0
        total = 0
        for lg in self._ids:
            self._starts.append(total)
            total += self._counts[lg]
        self._total = total

    # -- the managed ledger's part ------------------------------------------------------------------------
    def add_entries(self, n: int) -> None:
        self._counts[self._ids[-1]] += n
        self._total += n

    def add_ledger(self, ledger_id: int, entries: int = 0) -> None:
        assert ledger_id > self._ids[-1]
        self._ids.append(ledger_id)
        self._counts[ledger_id] = entries
        self._reindex()

    def trim(self, ledgers: int) -> None:
        """Drop the oldest `ledgers` ledgers (retention)."""
        for lg in self._ids[:ledgers]:
            del self._counts[lg]
        self._ids = self._ids[ledgers:]
        self._reindex()

    @property
    def total(self) -> int:
        return self._total

    # -- LedgerLayout ----------------------------------------------------------------------------------------
    def next_position(self, pos: Position) -> Position:
        ledger, entry = pos
        n = self._counts.get(ledger)
        if n is not None and entry + 1 < n:
            return Position(ledger, entry + 1)
        i = bisect.bisect_right(self._ids, ledger)
        while i < len(self._ids) and self._counts[self._ids[i]] == 0:
            i += 1
        if i < len(self._ids):
            return Position(self._ids[i], 0)
        last = self._ids[-1]
        return Position(last, self._counts[last] if ledger < last else entry + 1)

    def previous_position(self, pos: Position) -> Position:
        ledger, entry = pos
        if entry > 0:
            return Position(ledger, entry - 1)
        return Position(ledger, -1)

    def first_position(self) -> Position:
        for lg in self._ids:
            if self._counts[lg]:
                return Position(lg, 0)
        return Position(self._ids[-1], 0)

    @property
    def last_confirmed(self) -> Position:
        for lg in reversed(self._ids):
            if self._counts[lg]:
                return Position(lg, self._counts[lg] - 1)
        return Position(self._ids[0], -1)

    def ledger_ids(self) -> list[int]:
        return list(self._ids)

    def entries_in(self, ledger_id: int) -> int | None:
        return self._counts.get(ledger_id)

    def entries_between(self, a: Position, b: Position) -> int:
        return max(0, self._index_of(b) - self._index_of(a))

    def _index_of(self, pos: Position) -> int:
        ledger, entry = pos
        i = bisect.bisect_left(self._ids, ledger)
        if i < len(self._ids) and self._ids[i] == ledger:
            return self._starts[i] + min(entry, self._counts[ledger] - 1)
        if i == len(self._ids):
            return self._total - 1
        return self._starts[i] - 1

    def contains(self, pos: Position) -> bool:
        n = self._counts.get(pos[0])
        return n is not None and 0 <= pos[1] < n
