"""What a cursor needs to know about its managed ledger: the order of positions (PROTOCOL.md §5).

The managed ledger implements this; cursor code and tests code against it (unit tests with a named fake).
"""
from __future__ import annotations

from typing import Protocol

from bksim.topics.positions import Position


class LedgerLayout(Protocol):
    def next_position(self, pos: Position) -> Position:
        """The position after `pos` in log order, skipping empty ledgers; past the last confirmed entry:
        (current ledger, entry + 1)."""
        ...

    def previous_position(self, pos: Position) -> Position:
        """The position before `pos` (an entry -1 form when `pos` is the first entry of a ledger)."""
        ...

    def first_position(self) -> Position:
        """The first entry of the topic (it may not exist yet)."""
        ...

    @property
    def last_confirmed(self) -> Position:
        """The last entry acknowledged to a producer, in order (reads never go past it)."""
        ...

    def ledger_ids(self) -> list[int]:
        """The topic's ledgers, oldest first, including the one being written."""
        ...

    def entries_in(self, ledger_id: int) -> int | None:
        """Entries of a ledger (the current one: confirmed so far); None if it is not a ledger of this topic."""
        ...

    def entries_between(self, a: Position, b: Position) -> int:
        """The number of entries in (a, b]."""
        ...

    def contains(self, pos: Position) -> bool:
        """`pos` is an existing entry at or below the last confirmed one."""
        ...
