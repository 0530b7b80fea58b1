"""MemoryCursor: a NON-durable, in-memory test stand-in for ManagedCursor (CursorState whose persist() only
records the mark-delete as persisted_mark_delete), so subscription and topic tests run without cursor ledgers. Durable cursors are tested in test_managed_cursor.py
and on the real cluster."""
from __future__ import annotations

from bksim.topics.cursor_state import CursorState
from bksim.topics.positions import Position


class MemoryCursor(CursorState):
    def __init__(self, layout, name: str, initial_position: str = "earliest") -> None:
        md = layout.last_confirmed if initial_position == "latest" else layout.previous_position(layout.first_position())
        super().__init__(layout, md, redelivery_counts_max=1_000_000, name=name)
        self.persists = 0
        self.closed = False
        self.deleted = False
        self.persisted_mark_delete = self.mark_delete

    async def seek(self, pos: Position) -> None:  # noqa: D401 - async like ManagedCursor.seek
        CursorState.seek(self, pos)

    async def persist(self, force: bool = False) -> None:
        self.persists += 1
        self.persisted_mark_delete = self.mark_delete

    async def close(self) -> None:
        self.closed = True

    def abort(self, reason: str) -> None:
        self.closed = True

    async def delete(self) -> None:
        self.deleted = True

    def stats_internal(self) -> dict:
        return {"markDeletePosition": str(self.mark_delete), "readPosition": str(self.read_position)}
