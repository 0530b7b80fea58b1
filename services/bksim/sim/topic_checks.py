"""What the simulated producers and consumers know about one topic, and the topic invariants of PROTOCOL.md §7
the topic world must keep (checked as things happen and, for the end state, by the scenario).

Owns the history of a topic simulation:
- every receipt a producer got (producer, highest sequence id of the Send, position or "duplicate", broker);
- every delivery a consumer got (subscription, consumer, position, the (producer, sequence id) and key of
  each message of the entry, redelivery count);
- every managed-ledger list written (all brokers' stores are wrapped in TopicCheckedStore): which broker
  incarnation first listed each ledger (its writer), and how many entries each closed ledger holds;
- per subscription, the highest durable (persisted) mark-delete seen on any broker, and the positions the
  last clean close left acknowledged.

Invariants (each raised as InvariantViolation(name, detail)):
- ReceiptedMessagesAreConsumed (lost = 0): every (producer, sequence id) with a receipt is delivered to every
  subscription (checked at the end, after the drain), but for messages stored before the subscription's last seek
  position, which the seek skips (Pulsar's seek: everything before it counts as acknowledged), and for messages a
  seek had skipped when their ledger was trimmed: a later seek back to a position there starts at the topic's first
  entry (Pulsar's getNextValidPosition), they are not in the topic any more, and, where messages expire (a message
  TTL, message_age backlog eviction), for messages the subscription's mark-delete passed on the owner (the
  scenario's probe sees it in memory) since its last seek: expired. A receipt that names a position names the one
  where a consumer found that message (ReceiptNamesItsPosition; a copy every subscription let expire unseen is not
  looked for).
- ExpiredOnlyWhenOld: a message a subscription never got and whose mark-delete passed it was not expired before its
  time: the probe first saw that mark-delete later than the message's Send was made plus the expiry age (the
  broker's publish time is at or after the Send was made, and it expires an entry only once its publish time is
  more than that age ago; the probe, every PROBE_MS, sees the expiry at or after it happened).
- NoDuplicateWithDedup: with dedup on, no (producer, sequence id) is stored at two positions (seen in
  deliveries and receipts).
- OrderPerKey: on Key_Shared, a message of a key delivered for the first time is never below a position of the
  same key delivered before; OrderOnExclusive: the same for every message on Exclusive and Failover (a
  redelivery of something delivered before may come later: that is not a new message). Both compare deliveries
  the broker sent between the same two seeks of the subscription: a seek restarts the stream at its position
  (Pulsar disconnects the consumers, resets the cursor, and the client drops what it got before), so a seek back
  may deliver for the first time a message an earlier seek had skipped, below what came before it. With expiry, a
  message that could have expired when the one above it was delivered is not out of order either: the cursor
  passed over it, and a crash before that was persisted brought it back.
- OneOpenLedger / LedgersOrdered: in every managed-ledger list written, ledger ids strictly increase and at
  most the last ledger is open; ClosedLedgerKeepsItsEntries: a closed ledger's entry count never changes;
  TrimOnlyAPrefix: ledgers that hold entries leave the list only from its front (an empty one may be dropped
  anywhere).
- CursorNeverRegresses: a subscription's persisted mark-delete, seen on the owner (the broker that wrote the
  managed-ledger list last), never goes below the highest seen before (a seek resets it: the client asked). From
  the moment a seek is asked until it is answered (or its broker dies) the broker may apply it at any time (it
  waits for the cursor's lock, behind a persist under way): meanwhile nothing is checked nor taken as a floor.
- TrimBelowPersistedMarkDelete (checked by the scenario when a list drops ledgers): every ledger trimmed lies at
  or below every cursor's persisted mark-delete on the broker that trims (the dedup cursor's too).
- OneOwnerAtATime (checked by the scenario's probe): at most one broker with a live session serves the topic.
- AckedNotRedeliveredAfterCleanClose: after a clean close of the topic, nothing the closed cursor held as
  acknowledged is delivered again (until the next seek of that subscription). Only a cursor whose close persisted
  its whole state counts: a close that failed is a crash for that cursor (the last snapshot written comes back).
- PositionsTotallyOrdered: no two Sends are acknowledged at one position, and the receipts on one producer
  connection name increasing positions (checked by the scenario).
- DelayedNotBeforeItsTime (checked by the scenario as a broker delivers): on Shared and Key_Shared no message is
  delivered before its delivery time; such a message is out of order by design, so OrderPerKey leaves it out.
- StickyRangesHonoured (checked by the scenario): a sticky Key_Shared consumer gets only keys in its slots.
- AcksOfDeliveriesAccepted (checked by the scenario): the broker accepts every ack a consumer sends (it acks only
  what it was delivered, as its subscription type allows), also of a message the TTL passed and retention trimmed.
- ReaderInOrder: a reader reads each message once, in position (and batch index) order, across reconnects;
  ReaderSkipsOnlyTrimmed (at the end, and the drain waits for it): every message stored in the topic was read
  by the reader, or lies in a ledger retention had trimmed before the reader read past it.
- OneOwnerPerLedger: every receipt naming a position in ledger L comes from the broker incarnation that created
  L; AcceptedWritesSurviveTakeover: no receipt names an entry at or beyond the entry count of a ledger another
  broker closed (a write accepted by an owner that was already taken over).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

from bksim.model.errors import ConnectionLossError, FormatError
from bksim.ports.metadata import ANY_VERSION, MetadataStore
from bksim.sim.bookie_checks import InvariantViolation
from bksim.topics.managed_ledger import ManagedLedgerInfo
from bksim.topics.positions import Position

MessageKey = tuple[str, int]  # (producer name, sequence id)


@dataclass(slots=True)
class SubscriptionRecord:
    name: str
    sub_type: str
    delivered: dict[MessageKey, set[Position]] = field(default_factory=dict)
    positions: set[Position] = field(default_factory=set)          # every position delivered
    highest_of_key: dict[tuple[int, str | None], Position] = field(default_factory=dict)  # (seeks, key) -> pos
    highest_at: dict[tuple[int, str | None], float] = field(default_factory=dict)  # ... when it was delivered
    durable_floor: Position | None = None   # highest persisted mark-delete seen (None: reset by a seek)
    acked_at_close: set[Position] = field(default_factory=set)
    seek_target: Position | None = None     # the last seek's position: nothing stored before it is owed any more
    # ledger trimmed -> the seek position in force then: what the ledger held before it is never owed again
    trimmed_skipped: dict[int, Position] = field(default_factory=dict)
    target_in_doubt: Position | None = None  # with seeks under way: the highest position that may be in force
    seeks_under_way: int = 0                # seeks asked and not answered yet (the mark-delete may drop any time)
    seeks: int = 0                          # seeks asked so far: a delivery is ordered among those sent after as many
    # the owner's in-memory mark-delete since the last seek, each time it was first seen higher: (time, position)
    passed: list[tuple[float, Position]] = field(default_factory=list)


class TopicChecks:
    def __init__(self, ml_path: str, subscriptions: dict[str, str], dedup: bool, log: Callable[[str], None],
                 on_violation: Callable[[InvariantViolation], None], *, expiry_ms: int = 0) -> None:
        self.ml_path = ml_path
        self.dedup = dedup
        self.expiry_ms = expiry_ms  # a message older than this may expire: a TTL, message_age eviction (0: never)
        self._log = log
        self._on_violation = on_violation
        self.violation: InvariantViolation | None = None
        self.subs = {name: SubscriptionRecord(name, t) for name, t in subscriptions.items()}
        self.receipts: dict[MessageKey, list[Position | None]] = {}  # per Send (its highest sequence id)
        self.sends: dict[MessageKey, tuple[MessageKey, ...]] = {}    # Send key -> every message of it
        self.made_at: dict[MessageKey, float] = {}                    # Send key -> when it was made (virtual ms)
        self.send_of: dict[MessageKey, MessageKey] = {}               # message -> the Send it was made in
        self.stored: dict[MessageKey, set[Position]] = {}            # where each message was seen stored
        self.send_at: dict[Position, MessageKey] = {}                 # the Send a receipt put at each position
        self.ledger_writer: dict[int, str] = {}   # ledger id -> broker incarnation whose store listed it first
        self.closed_entries: dict[int, int] = {}  # ledger id -> entries, once listed closed
        self._last_list: list[int] = []
        self.ml_writer = ""  # the broker incarnation that wrote the list last (the owner)
        self.trimmed_ledgers: set[int] = set()
        # the reader (if the world has one): what it read, in order, and each step past unread positions
        self.reader = False
        self.reader_got: set[tuple[MessageKey, Position]] = set()
        self.reader_last: tuple[Position, int] | None = None
        self.reader_steps: list[tuple[Position | None, Position, frozenset[int]]] = []  # (from, to, trimmed then)
        # called with (broker, [(ledger id, entries)]) when a list drops ledgers that held entries (the scenario
        # checks TrimBelowPersistedMarkDelete against that broker's cursors)
        self.on_trim: Callable[[str, list[tuple[int, int]]], None] = lambda broker, trimmed: None
        self.stats = {"receipts": 0, "duplicate_receipts": 0, "deliveries": 0, "redeliveries": 0, "ml_writes": 0,
                      "ledgers": 0, "trimmed": 0, "reader_reads": 0, "expired": 0}

    def fail(self, invariant: str, detail: str) -> None:
        v = InvariantViolation(invariant, detail)
        self._log(f"VIOLATION {v}")
        if self.violation is None:
            self.violation = v
            self._on_violation(v)

    # -- producers --------------------------------------------------------------------------------------------
    def send_made(self, send: MessageKey, messages: tuple[MessageKey, ...], at_ms: float) -> None:
        self.sends[send] = messages
        self.made_at.setdefault(send, at_ms)
        for m in messages:
            self.send_of[m] = send

    def receipt(self, send: MessageKey, pos: Position | None, broker: str) -> None:
        """A producer got a receipt for a Send (pos None: the broker answered "duplicate")."""
        self.stats["receipts"] += 1
        self.receipts.setdefault(send, []).append(pos)
        if pos is None:
            self.stats["duplicate_receipts"] += 1
            return
        writer = self.ledger_writer.get(pos.ledger)
        if writer is not None and writer != broker:
            self.fail("OneOwnerPerLedger", f"{broker} acknowledged {send} at {pos}, but ledger {pos.ledger} was "
                                           f"created by {writer}")
        closed = self.closed_entries.get(pos.ledger)
        if closed is not None and pos.entry >= closed:
            self.fail("AcceptedWritesSurviveTakeover", f"{broker} acknowledged {send} at {pos}, but ledger "
                                                       f"{pos.ledger} was closed with {closed} entries")
        other = self.send_at.setdefault(pos, send)
        if other != send:
            self.fail("PositionsTotallyOrdered", f"{broker} acknowledged {send} at {pos}, where {other} was "
                                                 f"acknowledged before")
        for m in self.sends.get(send, (send,)):
            self._stored(m, pos, f"receipt from {broker}")

    def _stored(self, m: MessageKey, pos: Position, how: str) -> None:
        where = self.stored.setdefault(m, set())
        where.add(pos)
        if self.dedup and len(where) > 1:
            self.fail("NoDuplicateWithDedup", f"message {m[0]}/{m[1]} is stored at {sorted(map(str, where))} "
                                              f"with dedup on ({how})")

    # -- consumers --------------------------------------------------------------------------------------------
    def seeks(self, sub: str) -> int:
        """How many seeks `sub` was asked: the scenario tags a delivery with it as the broker sends it."""
        rec = self.subs.get(sub)
        return rec.seeks if rec is not None else 0

    def delivered(self, sub: str, consumer: str, pos: Position, messages: list[tuple[MessageKey, str | None]],
                  redelivery_count: int, *, delayed: bool = False, seeks: int | None = None,
                  at_ms: float = 0.0) -> None:
        """`seeks`: how many seeks the subscription was asked when the broker sent it (None: as many as now);
        order is judged among deliveries sent between the same two seeks (see OrderPerKey). `at_ms`: when it
        arrived. With expiry, a message new to the subscription below one delivered before is in order if it could
        have expired by then: the cursor passed over it, and a crash before that was persisted brought it back."""
        rec = self.subs[sub]
        self.stats["deliveries"] += 1
        new = pos not in rec.positions
        if not new:
            self.stats["redeliveries"] += 1
        if pos in rec.acked_at_close:
            self.fail("AckedNotRedeliveredAfterCleanClose", f"subscription {sub}: {consumer} got {pos} again, "
                                                            f"acknowledged when the topic was closed cleanly")
        rec.positions.add(pos)
        key = messages[0][1] if messages else None
        if rec.sub_type in ("Exclusive", "Failover") or (rec.sub_type == "Key_Shared" and not delayed):
            order_key = key if rec.sub_type == "Key_Shared" else None
            stream = (rec.seeks if seeks is None else seeks, order_key)
            highest = rec.highest_of_key.get(stream)
            if new and highest is not None and pos < highest and not self._expirable(messages,
                                                                                      rec.highest_at[stream]):
                what = "OrderPerKey" if rec.sub_type == "Key_Shared" else "OrderOnExclusive"
                self.fail(what, f"subscription {sub} ({rec.sub_type}): {consumer} got {pos} (key {order_key}) for "
                                f"the first time after {highest} of the same "
                                f"{'key' if order_key is not None else 'topic'}")
            if highest is None or pos > highest:
                rec.highest_of_key[stream] = pos
                rec.highest_at[stream] = at_ms
        for m, _ in messages:
            rec.delivered.setdefault(m, set()).add(pos)
            self._stored(m, pos, f"delivered to {sub}")

    def _expirable(self, messages: list[tuple[MessageKey, str | None]], at_ms: float) -> bool:
        """With expiry: whether every one of `messages` could have expired by `at_ms` (its Send was made more than
        the expiry age before: the broker's publish time is at or after that)."""
        if not self.expiry_ms:
            return False
        made = [self.made_at.get(self.send_of.get(m, m)) for m, _ in messages]
        return None not in made and all(t + self.expiry_ms < at_ms for t in made)

    def reader_read(self, pos: Position, read: list[tuple[int, MessageKey]]) -> None:
        """The reader's application got these messages ((batch index, message)) of the entry at `pos`."""
        for index, m in read:
            self.stats["reader_reads"] += 1
            last = self.reader_last
            if last is not None and (pos, index) <= last:
                self.fail("ReaderInOrder", f"the reader read {m[0]}/{m[1]} at {pos} index {index} after {last[0]} "
                                           f"index {last[1]}")
            if last is None or pos != last[0]:
                self.reader_steps.append((last[0] if last else None, pos, frozenset(self.trimmed_ledgers)))
            self.reader_last = (pos, index)
            self.reader_got.add((m, pos))
            self._stored(m, pos, "read by the reader")

    def reader_behind(self) -> list[MessageKey]:
        """Messages stored after the reader's last read that it has not read and retention has not trimmed."""
        if not self.reader:
            return []
        last = self.reader_last[0] if self.reader_last else None
        return [m for m, where in sorted(self.stored.items())
                if any((m, p) not in self.reader_got and (last is None or p > last)
                       and p.ledger not in self.trimmed_ledgers for p in where)]

    def _reader_final(self) -> None:
        for m, where in sorted(self.stored.items()):
            for p in sorted(where):
                if (m, p) in self.reader_got:
                    continue
                step = next(((a, b, t) for a, b, t in self.reader_steps if (a is None or a < p) and p < b), None)
                trimmed = step[2] if step is not None else self.trimmed_ledgers
                if p.ledger not in trimmed:
                    self.fail("ReaderSkipsOnlyTrimmed", f"the reader never read {m[0]}/{m[1]} at {p}" + (
                        f": it went from {step[0]} to {step[1]} while ledger {p.ledger} was still in the topic"
                        if step is not None else f" (it read up to {self.reader_last})"))
                    return

    def seek_started(self, sub: str, target: Position) -> None:
        """The client asked `sub` to seek to `target`: until the seek is answered its persisted mark-delete may go
        down at any moment (the broker applies it when it gets the cursor's lock, maybe behind a persist under way),
        and a message stored before `target` is no longer owed to it (a seek past messages not delivered yet skips
        them: in Key_Shared and Shared, and with delayed messages, a consumer may have been given a later position
        first)."""
        rec = self.subs[sub]
        rec.seeks += 1  # what the broker sends from now on is a new stream (OrderPerKey / OrderOnExclusive)
        # until it is applied, the seek in force before it may still be the one that skipped what a trim removes
        before = rec.target_in_doubt if rec.seeks_under_way else rec.seek_target
        rec.target_in_doubt = target if before is None else max(before, target)
        rec.seeks_under_way += 1
        rec.durable_floor = None
        rec.acked_at_close.clear()
        rec.seek_target = target
        rec.passed.clear()  # what the mark-delete passed before the seek is owed again from its position on

    def seek_ended(self, sub: str) -> None:
        """The seek was answered, failed (it may have been applied all the same) or its broker died: the floor starts
        again from the next persisted mark-delete seen."""
        rec = self.subs[sub]
        rec.seeks_under_way -= 1
        rec.durable_floor = None
        rec.acked_at_close.clear()

    def clean_close(self, sub: str, acked: set[Position], *, persisted: bool) -> None:
        """The owner closed the topic; `acked`: what `sub`'s cursor held acknowledged then. `persisted`: its close
        put all of it where the next owner reads it (the cursor's closed_cleanly). A close that failed (a metadata or
        ledger error, the session lost meanwhile, the topic's close stopped before the cursor's) binds nothing: the
        next owner recovers the last snapshot written, and acks after it come back (at-least-once); what an earlier
        clean close recorded still stands."""
        if persisted:
            self.subs[sub].acked_at_close = set(acked)

    def persisted_mark_delete(self, sub: str, pos: Position, where: str) -> None:
        rec = self.subs.get(sub)
        if rec is None:
            return
        if rec.seeks_under_way:
            return  # a seek may lower it any time until it is answered: neither a regression nor a floor
        floor = rec.durable_floor
        if floor is not None and pos < floor:
            self.fail("CursorNeverRegresses", f"subscription {sub}: persisted mark-delete {pos} on {where}, below "
                                              f"{floor} seen durable before")
        if floor is None or pos > floor:
            rec.durable_floor = pos

    def mark_delete_seen(self, sub: str, pos: Position, at_ms: float) -> None:
        """The owner's in-memory mark-delete of `sub` at `at_ms` (the probe's look; none while a seek is under way:
        the mark-delete seen may be the one before the seek)."""
        rec = self.subs.get(sub)
        if rec is None or rec.seeks_under_way:
            return
        if not rec.passed or pos > rec.passed[-1][1]:
            rec.passed.append((at_ms, pos))

    def _expired_in_time(self, sub: str, send: MessageKey, passed_ms: float) -> bool:
        """ExpiredOnlyWhenOld for a Send `sub` never got, whose mark-delete the probe first saw past it at
        `passed_ms` (True: in time)."""
        made = self.made_at.get(send)
        if made is None or passed_ms > made + self.expiry_ms:
            return True
        self.fail("ExpiredOnlyWhenOld", f"subscription {sub}: the mark-delete passed {send[0]}/{send[1]} (never "
                                         f"delivered) by {passed_ms:.1f} ms; it was made at {made:.1f} ms and "
                                         f"may expire {self.expiry_ms} ms after")
        return False

    def _passed_at(self, rec: SubscriptionRecord, pos: Position) -> float | None:
        """When the probe first saw `rec`'s mark-delete at or past `pos` since its last seek (None: not seen)."""
        i = bisect.bisect_left(rec.passed, pos, key=lambda seen: seen[1])
        return rec.passed[i][0] if i < len(rec.passed) else None

    # -- the managed-ledger list ------------------------------------------------------------------------------
    def ml_written(self, data: bytes, broker: str) -> None:
        self.stats["ml_writes"] += 1
        try:
            info = ManagedLedgerInfo.from_bytes(data)
        except FormatError as e:
            self.fail("ManagedLedgerListReadable", f"{broker} wrote {e}")
            return
        ids = [i.ledger_id for i in info.ledgers]
        if ids != sorted(set(ids)):
            self.fail("LedgersOrdered", f"{broker} wrote the ledger list {ids}")
        open_ = [i.ledger_id for i in info.ledgers if not i.closed_ms]
        if len(open_) > 1 or (open_ and open_[0] != ids[-1]):
            self.fail("OneOpenLedger", f"{broker} wrote the ledger list {ids} with open ledgers {open_}")
        previous = self._last_list
        gone = [i for i in previous if i not in ids]
        held = [i for i in previous if self.closed_entries.get(i, 0) > 0]  # empty ledgers may go from anywhere
        trimmed = [i for i in gone if self.closed_entries.get(i, 0) > 0]
        if trimmed != held[:len(trimmed)]:
            self.fail("TrimOnlyAPrefix", f"{broker} wrote {ids}: ledgers {trimmed} left the list {previous}")
        for lid in gone:
            if lid not in self.closed_entries:  # an empty open ledger dropped at takeover: never held an entry
                self.closed_entries[lid] = 0
        if trimmed:
            self.stats["trimmed"] += len(trimmed)
            self.trimmed_ledgers.update(trimmed)
            for rec in self.subs.values():  # what a seek skipped in these ledgers is gone for good
                skipped_below = rec.target_in_doubt if rec.seeks_under_way else rec.seek_target
                if skipped_below is not None:
                    for lid in trimmed:
                        rec.trimmed_skipped[lid] = skipped_below
            self.on_trim(broker, [(lid, self.closed_entries[lid]) for lid in trimmed])
        for i in info.ledgers:
            if i.ledger_id not in self.ledger_writer:
                self.ledger_writer[i.ledger_id] = broker
                self.stats["ledgers"] += 1
            if i.closed_ms:
                known = self.closed_entries.get(i.ledger_id)
                if known is not None and known != i.entries:
                    self.fail("ClosedLedgerKeepsItsEntries", f"{broker} lists ledger {i.ledger_id} closed with "
                                                             f"{i.entries} entries; it was closed with {known}")
                self.closed_entries[i.ledger_id] = i.entries
        self._last_list = ids
        self.ml_writer = broker

    # -- the end ------------------------------------------------------------------------------------------------
    def receipted_messages(self) -> list[MessageKey]:
        out = []
        for send in sorted(self.receipts):
            out += list(self.sends.get(send, (send,)))
        return out

    def missing(self, sub: str) -> list[MessageKey]:
        """Messages with a receipt that `sub` owes and has not delivered (those stored only before its last seek's
        position, or in a ledger trimmed while a seek had skipped them, or, with expiry, that its mark-delete passed
        since that seek, are not owed)."""
        return self._owed(sub)[0]

    @staticmethod
    def _skipped(rec: SubscriptionRecord, p: Position | None) -> bool:
        """A receipt's position (None: "duplicate") that `rec`'s seeks skipped: stored before the last seek's position,
        or in a ledger trimmed while a seek had skipped it."""
        target = rec.seek_target
        if target is None:
            return False
        if p is None or p < target:
            return True
        skipped_below = rec.trimmed_skipped.get(p.ledger)
        return skipped_below is not None and p < skipped_below

    def _owed(self, sub: str) -> tuple[list[MessageKey], list[tuple[MessageKey, float]]]:
        """(messages `sub` owes and has not delivered, [(Send, when the probe first saw the mark-delete past it)]
        for the Sends it did not deliver because they expired)."""
        rec = self.subs[sub]
        out, expired = [], []
        for send in sorted(self.receipts):
            positions = self.receipts[send]
            if all(self._skipped(rec, p) for p in positions):
                continue
            undelivered = [m for m in self.sends.get(send, (send,)) if m not in rec.delivered]
            if undelivered and self.expiry_ms:
                passed = [self._passed_at(rec, p) for p in self._places(send) if not self._skipped(rec, p)]
                if passed and None not in passed:
                    expired.append((send, min(passed)))
                    continue
            out += undelivered
        return out, expired

    def _places(self, send: MessageKey) -> set[Position]:
        """Where the Send is stored as far as anyone saw (receipts, deliveries, the reader); for a Send whose only
        receipts said "duplicate" and that no one saw, the first position known of a later Send of its producer: it
        lies before that (a producer's Sends are stored in sequence order), so a mark-delete past that position
        passed it, no later than the mark-delete was first seen there."""
        places = {p for p in self.receipts.get(send, ()) if p is not None}
        for m in self.sends.get(send, (send,)):
            places.update(self.stored.get(m, ()))
        if not places:
            producer, seq = send
            later = [p for (name, s), where in self.receipts.items() if name == producer and s > seq
                     for p in where if p is not None]
            if later:
                places.add(min(later))
        return places

    def final(self) -> None:
        """After the drain: lost = 0 on every subscription, nothing expired before its time, every receipt's
        position holds its message."""
        for sub in sorted(self.subs):
            lost, expired = self._owed(sub)
            if lost:
                self.fail("ReceiptedMessagesAreConsumed", f"subscription {sub}: {len(lost)} messages with a receipt "
                                                          f"never delivered: {lost[:5]}")
                return
            for send, passed_ms in expired:
                if not self._expired_in_time(sub, send, passed_ms):
                    return
            self.stats["expired"] += len(expired)
        for send, positions in sorted(self.receipts.items()):
            for pos in positions:
                if pos is None:
                    continue
                for m in self.sends.get(send, (send,)):
                    seen = {p for rec in self.subs.values() for p in rec.delivered.get(m, ())}
                    if pos in seen:
                        continue
                    passed = {sub: self._passed_at(rec, pos) if self.expiry_ms else None
                              for sub, rec in self.subs.items() if not self._skipped(rec, pos)}
                    if None not in passed.values():  # every subscription skipped this copy or let it expire
                        if all(self._expired_in_time(sub, send, ms) for sub, ms in sorted(passed.items())):
                            continue
                        return
                    self.fail("ReceiptNamesItsPosition", f"{send} was acknowledged at {pos}; consumers found "
                                                         f"message {m} at {sorted(map(str, seen))}")
                    return
        if self.reader:
            self._reader_final()


class TopicCheckedStore:
    """A broker's MetadataStore (a SessionView, swappable on session renewal) that reports every write of the
    topic's managed-ledger list to TopicChecks, and fails calls while a ZooKeeper connection loss is injected
    (reads before they reach the store; writes half of the time after they were applied: the outcome of a
    request without an answer is unknown)."""

    def __init__(self, session: MetadataStore, checks: TopicChecks, label: str, rng) -> None:
        self.session = session
        self.checks = checks
        self.label = label
        self._rng = rng
        self.connection_lost = False

    def _lost(self, what: str):
        return ConnectionLossError(f"{self.label}: {what}: connection loss")

    async def _write(self, what: str, call):
        if self.connection_lost:
            if self._rng.random() < 0.5:
                raise self._lost(what)
            await call()
            raise self._lost(what)
        return await call()

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        async def call():
            return await self.session.create(path, data, ephemeral=ephemeral, sequential=sequential,
                                             make_parents=make_parents)
        return await self._write(f"create {path}", call)

    async def set(self, path: str, data: bytes, version: int) -> int:
        async def call():
            v = await self.session.set(path, data, version)
            if path == self.checks.ml_path:
                self.checks.ml_written(data, self.label)
            return v
        return await self._write(f"set {path}", call)

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        async def call():
            return await self.session.delete(path, version)
        return await self._write(f"delete {path}", call)

    async def get(self, path: str) -> tuple[bytes, int]:
        if self.connection_lost:
            raise self._lost(f"get {path}")
        return await self.session.get(path)

    async def children(self, path: str) -> list[str]:
        if self.connection_lost:
            raise self._lost(f"children {path}")
        return await self.session.children(path)

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        if self.connection_lost:
            raise self._lost(f"children {path}")
        return await self.session.children_with_cversion(path)

    async def exists(self, path: str) -> int | None:
        if self.connection_lost:
            raise self._lost(f"exists {path}")
        return await self.session.exists(path)

    async def sync(self, path: str) -> None:
        if self.connection_lost:
            raise self._lost(f"sync {path}")
        return await self.session.sync(path)
