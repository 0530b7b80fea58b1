"""The delayed-delivery tracker of one subscription (Pulsar's InMemoryDelayedDeliveryTracker; PROTOCOL.md §5).

A producer may give a message a delivery time (formats/message.py: deliver_at_ms, wall-clock ms since the
epoch; such a message is never batched, so the time is its entry's). On Shared and Key_Shared subscriptions
the dispatcher reads such an entry, and if its time has not come it records (position, time) here instead of
delivering it and reads on; once the time has come the position goes to the replay set and is delivered like
a redelivery (with redelivery count 0 unless it was negatively acknowledged before). On Exclusive and
Failover subscriptions the time is ignored and the message is delivered at once (as in Pulsar).

Contracts:
- pure and in memory: no I/O, no clock (the caller passes `now_ms`). A position is tracked at most once
  (adding it again keeps the first time);
- strict: `pop_due(now)` returns only positions whose time is <= now, so nothing is delivered before its time
  (Pulsar's isDelayedDeliveryDeliverAtTimeStrict; its default tick lets messages out up to a tick early);
- bounded: at most `limit` positions (topic.delayed_messages_per_subscription_max). `add` refuses one more
  (returns False); the dispatcher then stops reading at that entry until some come due, so nothing is
  delivered early and nothing is skipped;
- not persisted: the positions are the unacknowledged entries themselves, so a new owner (failover, unload)
  or a rewind rebuilds the tracker as its dispatcher reads the backlog again from the mark-delete position.
"""
from __future__ import annotations

import heapq

from bksim.topics.positions import Position


class DelayedDeliveryTracker:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a delayed-delivery tracker holds at least 1 message, not {limit}")
        self.limit = limit
        self._at: dict[Position, int] = {}
        self._heap: list[tuple[int, Position]] = []   # (time, position); entries not in _at are stale

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, pos: Position) -> bool:
        return pos in self._at

    @property
    def full(self) -> bool:
        return len(self._at) >= self.limit

    def add(self, pos: Position, deliver_at_ms: int) -> bool:
        """Hold `pos` until `deliver_at_ms`; True if it is held (now or already), False if the tracker is full."""
        if pos in self._at:
            return True
        if self.full:
            return False
        self._at[pos] = deliver_at_ms
        heapq.heappush(self._heap, (deliver_at_ms, pos))
        return True

    def next_due_ms(self) -> int | None:
        """The earliest delivery time held, or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int, max_n: int | None = None) -> list[Position]:
        """Positions whose time is <= now_ms (earliest time first, position order among equal times), removed
        from the tracker; at most `max_n`."""
        out: list[Position] = []
        while self._heap and (max_n is None or len(out) < max_n):
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                break
            _, pos = heapq.heappop(self._heap)
            del self._at[pos]
            out.append(pos)
        return out

    def discard(self, pos: Position) -> None:
        """Forget `pos` (acknowledged before its time)."""
        self._at.pop(pos, None)
        if not self._at:
            self._heap.clear()

    def clear(self) -> None:
        self._at.clear()
        self._heap.clear()

    def _drop_stale(self) -> None:
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
