"""NonDurableCursor: the cursor of a reader (Pulsar's Reader and NonDurableCursorImpl; PROTOCOL.md §5).

A reader reads a topic from a position it names (a message id, the earliest or the latest message) without a
durable subscription: its cursor lives in this broker's memory only. No znode, no cursor ledger; it goes away
when the reader disconnects, when the topic is unloaded and when the broker fails. The reader's client then
subscribes again from the last message it returned to the application (bksim.client.Reader does), so nothing
is skipped and nothing returned is returned again.

Start position (`reader_start`, pure; the Subscription dispatches from the entry after the mark-delete):
- earliest: before the first entry the topic still has; latest: after the last confirmed entry (inclusive:
  the last confirmed entry itself is the first one read, when there is one);
- a message id (ledger, entry, batch index): exclusive starts after that message, inclusive at it. A message
  of a batch entry starts at its entry with the batch indexes before it (exclusive: up to and including it)
  reported as already acknowledged, so neither the broker's decoded deliveries nor bksim.client return them;
- exclusive from (ledger, -1) (a position, as Subscribed.start and SeekResult name it): everything from that
  ledger on (a ledger dropped meanwhile because it stayed empty: from the next one);
- a message id before the topic's first entry (its ledger was trimmed by retention) starts at the first entry:
  what was there is gone, as Pulsar's reader does;
- malformed (ledger < 0, entry < -1, entry -1 with a batch index or inclusive, batch index < -1) or unknown
  (after the last confirmed entry, or in a ledger the topic does not have, or past that ledger's entries):
  BAD_REQUEST naming the id and what the topic holds.

Acknowledgement: the subscription acknowledges (cumulatively, in memory) each entry as it dispatches it, as
Pulsar's ReaderImpl acknowledges cumulatively every message it returns; so a reader is bounded by its permits
only, and its acks (if a client sends any) change nothing that matters. Retention and TTL ignore readers: a
reader holds no data back (when its position is trimmed it continues at the first entry left).

Must not: write anything (metadata or ledgers).
"""
from __future__ import annotations

from typing import Callable

from bksim.topics.cursor_state import CursorState
from bksim.topics.errors import TopicError
from bksim.topics.layout import LedgerLayout
from bksim.topics.positions import MessageId, Position
from bksim.model.config import TopicConfig
from bksim.model.status import TopicStatus

READER_NAME_PREFIX = "reader-"  # the broker names a reader "reader-<10 hex>" when its client gives no name


def reader_start(layout: LedgerLayout, *, message_id: MessageId | None, initial: str,
                 inclusive: bool) -> tuple[Position, Position | None, frozenset[int]]:
    """(mark-delete to start after, the entry whose batch indexes are skipped or None, those indexes)."""
    if message_id is None:
        if initial == "earliest":
            return layout.previous_position(layout.first_position()), None, frozenset()
        if initial != "latest":
            raise TopicError(TopicStatus.BAD_REQUEST, f"start {initial!r} is not earliest or latest")
        last = layout.last_confirmed
        if inclusive and layout.contains(last):
            return layout.previous_position(last), None, frozenset()
        return last, None, frozenset()
    ledger, entry, _, batch_index = message_id
    before_ledger = entry == -1 and batch_index == -1 and not inclusive
    if ledger < 0 or (entry < 0 and not before_ledger) or batch_index < -1:
        raise TopicError(TopicStatus.BAD_REQUEST,
                         f"malformed start message id {ledger}:{entry} batch index {batch_index}: ledger and "
                         f"entry are >= 0 (entry -1 only exclusive without a batch index: from that ledger on), "
                         f"the batch index -1 (not a batch) or the message's index in its batch")
    pos = Position(ledger, entry)
    ids = layout.ledger_ids()
    if before_ledger:
        if pos < layout.first_position():
            return layout.previous_position(layout.first_position()), None, frozenset()
        later = [i for i in ids if i >= ledger]
        if later:
            return Position(later[0], -1), None, frozenset()
        raise TopicError(TopicStatus.BAD_REQUEST, f"start position {pos} is after every ledger of this topic "
                                                  f"(last message {layout.last_confirmed})")
    if not layout.contains(pos):
        first = layout.first_position()
        if pos < first and layout.entries_in(pos.ledger) is None:
            return layout.previous_position(first), None, frozenset()  # trimmed: start at what is left
        raise TopicError(TopicStatus.BAD_REQUEST,
                         f"start message id {pos} is not a message of this topic (ledgers "
                         f"{ids[:3]}{'...' if len(ids) > 3 else ''}{ids[-1:] if len(ids) > 3 else ''}, "
                         f"last message {layout.last_confirmed})")
    if batch_index < 0:
        return (layout.previous_position(pos) if inclusive else pos), None, frozenset()
    skip = frozenset(range(batch_index if inclusive else batch_index + 1))
    return layout.previous_position(pos), (pos if skip else None), skip


class NonDurableCursor(CursorState):
    """A CursorState with the ManagedCursor calls the Subscription makes, persisting nothing."""

    def __init__(self, layout: LedgerLayout, name: str, *, config: TopicConfig, mark_delete: Position,
                 skip_position: Position | None = None, skip_indexes: frozenset[int] = frozenset(),
                 log: Callable[[str], None] = lambda line: None) -> None:
        super().__init__(layout, mark_delete, redelivery_counts_max=config.redelivery_counts_max,
                         batch_size_max=config.batch_messages_max, log=log, name=name)
        self._skip_position = skip_position
        self._skip = sorted(skip_indexes)
        self.start = mark_delete
        self.status = "Open"

    @property
    def state(self) -> CursorState:
        """The ack state (ManagedCursor.state): the cursor itself."""
        return self

    @property
    def persisted_mark_delete(self) -> Position:
        return self.mark_delete

    def acked_batch_indexes(self, pos: Position) -> list[int]:
        if pos == self._skip_position:
            return sorted(set(self._skip) | set(super().acked_batch_indexes(pos)))
        return super().acked_batch_indexes(pos)

    async def seek(self, pos: Position) -> None:
        self._skip_position = None
        CursorState.seek(self, pos)

    async def persist(self, force: bool = False) -> bool:
        return False

    async def close(self) -> None:
        self.status = "Closed"

    def abort(self, reason: str) -> None:
        self.status = "Closed"

    async def delete(self) -> None:
        self.status = "Closed"

    def stats_internal(self) -> dict:
        return {"markDeletePosition": str(self.mark_delete), "readPosition": str(self.read_position),
                "durable": False, "startPosition": str(self.start), "state": self.status,
                "backlog": self.backlog()}
