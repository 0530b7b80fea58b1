"""CursorState: a subscription's acknowledgement state in memory (PROTOCOL.md §5 "Cursor state"). Pure: no I/O,
no clock (times come in as arguments), positions ordered by a LedgerLayout.

What it holds:
- mark_delete: every entry at or below it is acknowledged (an entry -1 form means "before that ledger's
  first entry"; EARLIEST-style forms come from the layout's previous_position).
- read_position: the next entry to dispatch; always > mark_delete (set by the dispatcher, reset by rewind).
- individually acked entries after mark_delete, one bitmap per message ledger (bytearray, bit e = entry e of
  that ledger acked). The "holes" are the unset bits between mark_delete and the last confirmed entry. A
  ledger with 10,000,000 entries costs 1.25 MB whatever the pattern of acks.
- per-entry acked batch indexes of partially acked batch entries: {ledger: {entry: (batch_size, mask)}}, bit i
  of mask = message i of the batch acked.
- redelivery counts of unacked entries: {ledger: {entry: count}}, at most `redelivery_counts_max` in all.
  At the bound a NEW position is not tracked (its count reads 0 and stays 0; counts already tracked keep
  growing): each such refusal is counted in `redelivery_counts_untracked` and reported through `log` (the
  first time and then at every power of ten), never silently.
- properties: mark-delete properties, name -> int (dedup keeps producer sequence ids there).
- last_active: wall-clock ms of the last change (the caller passes it).

Invariants (checked by tests, kept by every method):
- no bit is set, no batch mask and no redelivery count is kept for a position <= mark_delete;
- every set bit names an entry the layout contained when it was acked (acks are validated: INVALID_ACK);
- mark_delete never moves backwards except through seek();
- after any ack, mark_delete has slid over every contiguous acked entry after it (across ledger boundaries
  through layout.next_position), so the entry after mark_delete is unacked or does not exist yet;
- `acked_count` = number of set bits.

check_invariants() asserts these (InvariantError naming the invariant and the values), in these names:
ReadAfterMarkDelete (read_position > mark_delete), NothingAtOrBelowMarkDelete (no bit, batch mask or
redelivery count at or below mark_delete: mark_delete is below every individually acked range),
AcksInsideLedgers (a set bit lies inside a ledger the layout has, below its entry count: ledgers only grow, and
retention trims only ledgers below mark-delete), MarkDeleteSlid, MarkDeleteOnlyAdvances (between seek() and
restore() calls), CountsConsistent (acked_count, batch_count and redelivery_tracked match what is held;
redelivery_tracked <= redelivery_counts_max), RangesSortedDisjoint (ranges() are sorted, non-empty, and
neither overlap nor touch), BatchMasksPartial (1 <= size <= batch_size_max, mask short of all `size` bits, the
entry not acked as a whole), RedeliveriesUnacked (counts are kept for unacked entries only).

Rules:
- ack(pos): pos <= mark_delete or already acked: no-op. If pos is the entry right after mark_delete,
  mark_delete moves to pos and slides forward; otherwise its bit is set.
- ack_cumulative(pos) / expire_until(pos): mark_delete moves to pos (an older pos is a no-op), then slides.
- ack_batch_indexes(pos, indexes, size): sets bits of the batch mask; when all `size` are set the entry is
  acked as by ack(pos).
- seek(pos): mark_delete = the position before pos, read_position = pos; every ack, batch mask and redelivery
  count is dropped (a reset replays from pos, as Pulsar's resetCursor).

Cost: an individual ack is a few dict/bytearray operations (about a microsecond); sliding over k contiguous
acked entries costs one C-level scan of k/8 bytes; cumulative acks over ledgers drop whole bitmaps.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

from bksim.model.invariants import InvariantError
from bksim.topics.errors import TopicError
from bksim.topics.layout import LedgerLayout
from bksim.topics.positions import Position

_NOT_FF = re.compile(rb"[^\xff]")
_NOT_00 = re.compile(rb"[^\x00]")
# lowest clear bit of a byte value (8 when none) and lowest set bit (8 when none)
_LOW_ZERO = bytes(((~v & (v + 1)).bit_length() - 1) if v != 0xFF else 8 for v in range(256))
_LOW_ONE = bytes(((v & -v).bit_length() - 1) if v else 8 for v in range(256))
_POPCOUNT = bytes(bin(v).count("1") for v in range(256))


# ---------------------------------------------------------------------------------------------- bitmap helpers
def first_zero(bits: bytearray, i: int) -> int:
    """The lowest clear bit index >= i (len(bits) * 8 when every bit from i on is set)."""
    byte = i >> 3
    if byte >= len(bits):
        return i
    v = bits[byte] | ((1 << (i & 7)) - 1)
    if v != 0xFF:
        return (byte << 3) + _LOW_ZERO[v]
    m = _NOT_FF.search(bits, byte + 1)
    if m is None:
        return len(bits) << 3
    b = m.start()
    return (b << 3) + _LOW_ZERO[bits[b]]


def first_one(bits: bytearray, i: int) -> int:
    """The lowest set bit index >= i, or -1."""
    byte = i >> 3
    if byte >= len(bits):
        return -1
    v = bits[byte] & ~((1 << (i & 7)) - 1) & 0xFF
    if v:
        return (byte << 3) + _LOW_ONE[v]
    m = _NOT_00.search(bits, byte + 1)
    if m is None:
        return -1
    b = m.start()
    return (b << 3) + _LOW_ONE[bits[b]]


def clear_range(bits: bytearray, a: int, b: int) -> int:
    """Clear bits a..b-1 (b clipped to the bitmap); returns how many were set."""
    b = min(b, len(bits) << 3)
    if a >= b:
        return 0
    was = count_range(bits, a, b)
    if not was:
        return 0
    first, last = a >> 3, (b - 1) >> 3
    if first == last:
        bits[first] &= ~(((1 << (b - a)) - 1) << (a & 7)) & 0xFF
        return was
    bits[first] &= (1 << (a & 7)) - 1
    if last > first + 1:
        bits[first + 1:last] = bytes(last - first - 1)
    bits[last] &= ~((1 << (((b - 1) & 7) + 1)) - 1) & 0xFF
    return was


def count_range(bits: bytearray, a: int, b: int) -> int:
    """Set bits among a..b-1."""
    b = min(b, len(bits) << 3)
    if a >= b:
        return 0
    first, last = a >> 3, (b - 1) >> 3
    if first == last:
        return _POPCOUNT[bits[first] & (((1 << (b - a)) - 1) << (a & 7))]
    n = _POPCOUNT[bits[first] >> (a & 7)]
    if last > first + 1:
        n += int.from_bytes(bits[first + 1:last], "little").bit_count()
    return n + _POPCOUNT[bits[last] & ((1 << (((b - 1) & 7) + 1)) - 1)]


def popcount(bits: bytes | bytearray) -> int:
    return int.from_bytes(bits, "little").bit_count()


def run_count(bits: bytes | bytearray) -> int:
    """Maximal runs of set bits."""
    x = int.from_bytes(bits, "little")
    return (x & ~(x << 1)).bit_count()


def runs(bits: bytes | bytearray, limit: int | None = None) -> Iterator[tuple[int, int]]:
    """(first, end) bit index pairs of the maximal runs of set bits, in order (end exclusive)."""
    i = 0
    n = 0
    while limit is None or n < limit:
        s = first_one(bits, i)
        if s < 0:
            return
        e = first_zero(bits, s)
        yield s, e
        n += 1
        i = e


def set_range(bits: bytearray, a: int, b: int) -> None:
    """Set bits a..b-1, growing the bitmap as needed."""
    if a >= b:
        return
    need = ((b - 1) >> 3) + 1
    if len(bits) < need:
        bits.extend(bytes(need - len(bits)))
    first, last = a >> 3, (b - 1) >> 3
    if first == last:
        bits[first] |= ((1 << (b - a)) - 1) << (a & 7)
        return
    bits[first] |= (0xFF << (a & 7)) & 0xFF
    if last > first + 1:
        bits[first + 1:last] = b"\xff" * (last - first - 1)
    bits[last] |= (1 << (((b - 1) & 7) + 1)) - 1


# ---------------------------------------------------------------------------------------------- the state
class CursorState:
    def __init__(self, layout: LedgerLayout, mark_delete: Position, *, redelivery_counts_max: int,
                 batch_size_max: int = 1 << 20, log: Callable[[str], None] = lambda line: None,
                 name: str = "cursor") -> None:
        if redelivery_counts_max <= 0:
            raise ValueError("redelivery_counts_max must be > 0")
        self.layout = layout
        self.name = name
        self._log = log
        self._md = Position(*mark_delete)
        self._read = layout.next_position(self._md)
        self._bits: dict[int, bytearray] = {}
        self._acked = 0
        self._batches: dict[int, dict[int, tuple[int, int]]] = {}
        self._batch_count = 0
        self._redeliveries: dict[int, dict[int, int]] = {}
        self._redelivery_total = 0
        self.redelivery_counts_max = redelivery_counts_max
        self.redelivery_counts_untracked = 0
        self.batch_size_max = batch_size_max
        self.properties: dict[str, int] = {}
        self.last_active = 0
        self.changes = 0  # grows with every change of what a snapshot holds (dirty tracking by the owner)
        self._resets = 0  # seek() and restore() calls: mark_delete may move backwards only through them
        self._seen = (0, self._md)  # (resets, mark_delete) at the last check_invariants()

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def mark_delete(self) -> Position:
        return self._md

    @property
    def read_position(self) -> Position:
        return self._read

    @read_position.setter
    def read_position(self, pos: Position) -> None:
        """The dispatcher moves it; it never goes at or below mark_delete (clamped to the entry after it)."""
        pos = Position(*pos)
        self._read = pos if pos > self._md else self.layout.next_position(self._md)

    def rewind(self) -> None:
        """Read again from the first entry after mark_delete."""
        self._read = self.layout.next_position(self._md)

    @property
    def acked_count(self) -> int:
        """Individually acked entries after mark_delete."""
        return self._acked

    @property
    def batch_count(self) -> int:
        """Partially acked batch entries."""
        return self._batch_count

    @property
    def redelivery_tracked(self) -> int:
        return self._redelivery_total

    def is_acked(self, pos: Position) -> bool:
        ledger, entry = pos
        if pos <= self._md:
            return True
        bits = self._bits.get(ledger)
        return bits is not None and (entry >> 3) < len(bits) and entry >= 0 and bool(bits[entry >> 3] & (1 << (entry & 7)))

    def acked_batch_indexes(self, pos: Position) -> list[int]:
        """Acked message indexes of a partially acked batch entry (empty when none; an entry acked as a whole
        is is_acked())."""
        got = self._batches.get(pos[0], {}).get(pos[1])
        if got is None:
            return []
        size, mask = got
        return [i for i in range(size) if mask >> i & 1]

    def redelivery_count(self, pos: Position) -> int:
        return self._redeliveries.get(pos[0], {}).get(pos[1], 0)

    def backlog(self) -> int:
        """Unacked entries in (mark_delete, last_confirmed]."""
        lc = self.layout.last_confirmed
        if lc <= self._md:
            return 0
        return max(0, self.layout.entries_between(self._md, lc) - self._acked)

    def acked_ledgers(self) -> list[int]:
        """Message ledgers with individually acked entries, in order."""
        return sorted(self._bits)

    def ledger_bits(self, ledger: int) -> bytearray | None:
        """The acked-entry bitmap of one message ledger (owned by the state: do not modify)."""
        return self._bits.get(ledger)

    def ranges(self, limit: int | None = None) -> Iterator[tuple[Position, Position]]:
        """Individually acked ranges as Pulsar prints them: open-closed (a, b] pairs, per ledger, in order."""
        n = 0
        for ledger in sorted(self._bits):
            left = None if limit is None else limit - n
            if left is not None and left <= 0:
                return
            for s, e in runs(self._bits[ledger], left):
                yield Position(ledger, s - 1), Position(ledger, e - 1)
                n += 1

    def range_count(self) -> int:
        return sum(run_count(b) for b in self._bits.values())

    def batches(self) -> Iterator[tuple[Position, int, int]]:
        """(position, batch size, acked mask) of partially acked batch entries, in order."""
        for ledger in sorted(self._batches):
            for entry, (size, mask) in sorted(self._batches[ledger].items()):
                yield Position(ledger, entry), size, mask

    def redeliveries(self) -> Iterator[tuple[Position, int]]:
        for ledger in sorted(self._redeliveries):
            for entry, count in sorted(self._redeliveries[ledger].items()):
                yield Position(ledger, entry), count

    def memory_bytes(self) -> int:
        """Approximate bytes held by the ack state (bitmaps, batch masks, redelivery counts)."""
        bitmap = sum(len(b) + 57 for b in self._bits.values())
        return bitmap + 100 * self._batch_count + 100 * self._redelivery_total

    # -- invariants ---------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks an invariant of the module docstring. Costs a scan of the
        bitmaps (C-level popcounts plus one step per acked range) and of the batch and redelivery tables."""
        md, layout = self._md, self.layout
        if not self._read > md:
            self._broken("ReadAfterMarkDelete", f"read position {self._read}, mark-delete {md}")
        resets, seen_md = self._seen
        if resets == self._resets and md < seen_md:
            self._broken("MarkDeleteOnlyAdvances", f"mark-delete {seen_md} -> {md} without a seek or restore")
        self._seen = (self._resets, md)
        acked = 0
        previous: tuple[Position, Position] | None = None
        for ledger in sorted(self._bits):
            bits = self._bits[ledger]
            if ledger < md.ledger or (ledger == md.ledger and count_range(bits, 0, md.entry + 1)):
                self._broken("NothingAtOrBelowMarkDelete", f"acked entries in ledger {ledger} at or below "
                                                           f"mark-delete {md}: {list(runs(bits, 3))}")
            n = layout.entries_in(ledger)
            if n is None or count_range(bits, n, len(bits) << 3):
                self._broken("AcksInsideLedgers", f"acked entries of ledger {ledger} beyond its "
                                                  f"{n} entries: {list(runs(bits, 3))}")
            acked += popcount(bits)
            for s, e in runs(bits):
                if previous is not None and previous[0] == ledger and previous[1] >= s:
                    self._broken("RangesSortedDisjoint", f"ledger {ledger}: acked range ending at {previous[1]} "
                                                         f"followed by one starting at {s}")
                previous = (ledger, e)
        if acked != self._acked:
            self._broken("CountsConsistent", f"acked_count {self._acked}, {acked} bits set")
        nxt = layout.next_position(md)
        bits = self._bits.get(nxt.ledger)
        if bits is not None and nxt.entry >= 0 and count_range(bits, nxt.entry, nxt.entry + 1):
            self._broken("MarkDeleteSlid", f"mark-delete {md}, but the entry after it, {nxt}, is acked")
        batches = 0
        for ledger, per_ledger in self._batches.items():
            for entry, (size, mask) in per_ledger.items():
                pos = Position(ledger, entry)
                if pos <= md or self.is_acked(pos):
                    self._broken("NothingAtOrBelowMarkDelete", f"batch mask of {pos}, acked (mark-delete {md})")
                if not 1 <= size <= self.batch_size_max or not 0 <= mask < (1 << size) - 1:
                    self._broken("BatchMasksPartial", f"{pos}: batch of {size} with acked mask {mask:#x}")
                batches += 1
        if batches != self._batch_count:
            self._broken("CountsConsistent", f"batch_count {self._batch_count}, {batches} masks held")
        counts = 0
        for ledger, per_ledger in self._redeliveries.items():
            for entry in per_ledger:
                pos = Position(ledger, entry)
                if pos <= md or self.is_acked(pos):
                    self._broken("RedeliveriesUnacked", f"redelivery count of {pos}, acked (mark-delete {md})")
                counts += 1
        if counts != self._redelivery_total or counts > self.redelivery_counts_max:
            self._broken("CountsConsistent", f"redelivery_tracked {self._redelivery_total}, {counts} counts held "
                                             f"(at most {self.redelivery_counts_max})")

    def _broken(self, invariant: str, detail: str):
        raise InvariantError(f"cursor {self.name}", invariant, detail)

    # -- individual acks --------------------------------------------------------------------------------------
    def check(self, pos: Position) -> Position:
        """pos as a Position if the layout contains it or it is a message at or before mark_delete (already
        acknowledged, its ledger perhaps trimmed since: acking it again changes nothing, as in Pulsar), else
        TopicError INVALID_ACK naming it."""
        try:
            if type(pos) is not Position:
                pos = Position(*pos)
        except TypeError:
            raise TopicError("INVALID_ACK", f"cursor {self.name}: {pos!r} is not a position") from None
        if not self.layout.contains(pos) and not (pos.entry >= 0 and pos <= self._md):
            raise TopicError("INVALID_ACK", f"cursor {self.name}: message {pos} does not exist in this topic "
                                            f"(last confirmed {self.layout.last_confirmed})")
        return pos

    def ack(self, positions: Iterable[Position]) -> int:
        """Acknowledge entries; all are validated first (INVALID_ACK and nothing changes). Returns how many
        were newly acked."""
        checked = [self.check(p) for p in positions]
        newly = 0
        for pos in checked:
            newly += self._ack_one(pos)
        if newly:
            self.changes += 1
        return newly

    def _ack_one(self, pos: Position) -> int:
        md = self._md
        if pos <= md:
            return 0
        ledger, entry = pos
        bits = self._bits.get(ledger)
        byte = entry >> 3
        mask = 1 << (entry & 7)
        if bits is not None and byte < len(bits) and bits[byte] & mask:
            return 0
        if self._batches:
            self._drop_batch(ledger, entry)
        if self._redeliveries:
            self._drop_redelivery(ledger, entry)
        if (ledger == md.ledger and entry == md.entry + 1) or (entry == 0 and self.layout.next_position(md) == pos):
            self._md = pos
            self._slide()
            return 1
        if bits is None:
            bits = self._bits[ledger] = bytearray()
        if byte >= len(bits):  # grow geometrically, never beyond the ledger's entries
            whole = ((self.layout.entries_in(ledger) or 0) + 7) >> 3
            bits.extend(bytes(max(byte + 1, min(len(bits) * 3 // 2, whole)) - len(bits)))
        bits[byte] |= mask
        self._acked += 1
        return 1

    def _slide(self) -> None:
        """Move mark_delete over every contiguous acked entry after it; drop state <= it."""
        layout = self.layout
        while True:
            ledger, entry = self._md
            bits = self._bits.get(ledger)
            if bits is not None:
                z = first_zero(bits, entry + 1)
                if z > entry + 1:
                    self._acked -= clear_range(bits, entry + 1, z)
                    entry = z - 1
                    self._md = Position(ledger, entry)
            n = layout.entries_in(ledger)
            if n is not None and entry + 1 < n:
                break
            if bits is not None:
                self._acked -= popcount(bits)  # none should be left: every bit names an entry < n
                del self._bits[ledger]
            nxt = layout.next_position(self._md)
            if nxt.ledger == ledger:
                break  # the current ledger: nothing after it yet
            nbits = self._bits.get(nxt.ledger)
            if nbits is None or nxt.entry < 0 or (nxt.entry >> 3) >= len(nbits) \
                    or not nbits[nxt.entry >> 3] & (1 << (nxt.entry & 7)):
                break
            nbits[nxt.entry >> 3] &= ~(1 << (nxt.entry & 7)) & 0xFF
            self._acked -= 1
            self._md = nxt
        if self._read <= self._md:
            self._read = layout.next_position(self._md)

    # -- cumulative acks, expiry, seek -----------------------------------------------------------------------
    def ack_cumulative(self, pos: Position, properties: dict[str, int] | None = None) -> bool:
        """Everything <= pos is acknowledged (an older pos is a no-op; properties are still merged). Returns
        whether mark_delete moved."""
        pos = self.check(pos)
        if properties:
            self._set_properties(properties)
        return self._move_mark_delete(pos)

    def expire_until(self, pos: Position) -> bool:
        """TTL: like ack_cumulative, with pos clamped to the last confirmed entry instead of validated."""
        pos = Position(*pos)
        lc = self.layout.last_confirmed
        return self._move_mark_delete(min(pos, lc))

    def _move_mark_delete(self, pos: Position) -> bool:
        if pos <= self._md:
            return False
        for ledger in [lg for lg in self._bits if lg < pos.ledger]:
            self._acked -= popcount(self._bits.pop(ledger))
        bits = self._bits.get(pos.ledger)
        if bits is not None:
            self._acked -= clear_range(bits, 0, pos.entry + 1)
        for table, per_ledger in ((self._batches, True), (self._redeliveries, False)):
            if table:
                self._prune(table, pos, per_ledger)
        self._md = pos
        self._slide()
        self.changes += 1
        return True

    def _prune(self, table: dict[int, dict], pos: Position, batches: bool) -> None:
        dropped = 0
        for ledger in [lg for lg in table if lg <= pos.ledger]:
            entries = table[ledger]
            if ledger < pos.ledger:
                dropped += len(entries)
                del table[ledger]
                continue
            gone = [e for e in entries if e <= pos.entry]
            for e in gone:
                del entries[e]
            dropped += len(gone)
            if not entries:
                del table[ledger]
        if batches:
            self._batch_count -= dropped
        else:
            self._redelivery_total -= dropped

    def seek(self, pos: Position) -> None:
        """Reset: mark_delete = the position before pos (clamped to the topic), read_position = pos; all ack
        state, batch masks and redelivery counts are dropped."""
        layout = self.layout
        pos = Position(*pos)
        first = layout.first_position()
        end = layout.next_position(layout.last_confirmed)
        pos = max(first, min(pos, end))
        self._md = layout.previous_position(pos)
        self._resets += 1
        self._bits.clear()
        self._acked = 0
        self._batches.clear()
        self._batch_count = 0
        self._redeliveries.clear()
        self._redelivery_total = 0
        self._read = pos if pos > self._md else layout.next_position(self._md)
        self.changes += 1

    # -- batch indexes ---------------------------------------------------------------------------------------
    def ack_batch_indexes(self, pos: Position, indexes: Iterable[int], batch_size: int) -> bool:
        """Acknowledge messages `indexes` of the batch entry at pos (batch_size messages). Returns True when the
        entry is acked as a whole (now or before)."""
        pos = self.check(pos)
        if self.is_acked(pos):
            return True
        if not 1 <= batch_size <= self.batch_size_max:
            raise TopicError("INVALID_ACK", f"cursor {self.name}: batch size {batch_size} of message {pos} is not "
                                            f"in 1..{self.batch_size_max}")
        mask = 0
        for i in indexes:
            if not 0 <= i < batch_size:
                raise TopicError("INVALID_ACK", f"cursor {self.name}: batch index {i} of message {pos} is not in "
                                                f"0..{batch_size - 1}")
            mask |= 1 << i
        per_ledger = self._batches.get(pos.ledger)
        old = per_ledger.get(pos.entry) if per_ledger is not None else None
        if old is not None:
            if old[0] != batch_size:
                raise TopicError("INVALID_ACK", f"cursor {self.name}: message {pos} was acked as a batch of {old[0]} "
                                                f"messages, now of {batch_size}")
            mask |= old[1]
        if mask == (1 << batch_size) - 1:
            self._ack_one(pos)  # drops the partial mask too
            self.changes += 1
            return True
        if old is None:
            if per_ledger is None:
                per_ledger = self._batches[pos.ledger] = {}
            self._batch_count += 1
        if old is None or old[1] != mask:
            per_ledger[pos.entry] = (batch_size, mask)
            self.changes += 1
        return False

    def _drop_batch(self, ledger: int, entry: int) -> None:
        per_ledger = self._batches.get(ledger)
        if per_ledger is not None and per_ledger.pop(entry, None) is not None:
            self._batch_count -= 1
            if not per_ledger:
                del self._batches[ledger]

    # -- redelivery counts -------------------------------------------------------------------------------------
    def increment_redelivery(self, pos: Position) -> int:
        """One more redelivery of an unacked entry; returns its count (0 for an acked entry, and for an entry
        not tracked because `redelivery_counts_max` counts are kept already: counted and logged)."""
        pos = Position(*pos)
        if self.is_acked(pos):
            return 0
        per_ledger = self._redeliveries.get(pos.ledger)
        count = per_ledger.get(pos.entry) if per_ledger is not None else None
        if count is None:
            if self._redelivery_total >= self.redelivery_counts_max:
                self.redelivery_counts_untracked += 1
                n = self.redelivery_counts_untracked
                if n == 1 or (n >= 10 and str(n).rstrip("0") == "1"):
                    self._log(f"cursor {self.name}: {n} redeliveries not counted: already "
                              f"{self._redelivery_total} redelivery counts kept (topic.redelivery_counts_max); "
                              f"message {pos} reports redelivery count 0")
                return 0
            if per_ledger is None:
                per_ledger = self._redeliveries[pos.ledger] = {}
            self._redelivery_total += 1
            count = 0
        per_ledger[pos.entry] = count + 1
        self.changes += 1
        return count + 1

    def _drop_redelivery(self, ledger: int, entry: int) -> None:
        per_ledger = self._redeliveries.get(ledger)
        if per_ledger is not None and per_ledger.pop(entry, None) is not None:
            self._redelivery_total -= 1
            if not per_ledger:
                del self._redeliveries[ledger]

    # -- properties ------------------------------------------------------------------------------------------
    def set_property(self, name: str, value: int) -> None:
        self._set_properties({name: value})

    def _set_properties(self, properties: dict[str, int]) -> None:
        for name, value in properties.items():
            if not isinstance(name, str) or not isinstance(value, int) or isinstance(value, bool):
                raise TopicError("BAD_REQUEST", f"cursor {self.name}: property {name!r}={value!r} is not str -> int")
            if not -(1 << 63) <= value < (1 << 63):
                raise TopicError("BAD_REQUEST", f"cursor {self.name}: property {name!r}={value} is not a 64-bit int")
        self.properties.update(properties)
        self.changes += 1

    # -- restoring (recovery) --------------------------------------------------------------------------------
    def restore(self, *, mark_delete: Position, acked: dict[int, bytearray], batches: Iterable[tuple[Position, int, int]],
                redeliveries: Iterable[tuple[Position, int]], properties: dict[str, int], last_active: int) -> list[str]:
        """Replace the whole state with a recovered one. Acks the layout no longer contains (ledgers trimmed
        meanwhile, entries beyond the last confirmed one) are dropped; returns a line per such correction."""
        layout = self.layout
        notes: list[str] = []
        md = Position(*mark_delete)
        floor = layout.previous_position(layout.first_position())
        if md < floor:
            notes.append(f"mark-delete {md} is below the topic's first entry: moved to {floor}")
            md = floor
        lc = layout.last_confirmed
        if md > lc:
            notes.append(f"mark-delete {md} is beyond the last confirmed entry {lc}: moved back to it")
            md = lc
        self._md = md
        self._resets += 1
        self._bits = {}
        self._acked = 0
        for ledger, bits in acked.items():
            if ledger < md.ledger:
                continue
            n = layout.entries_in(ledger)
            if n is None:
                notes.append(f"acks in ledger {ledger}, which is not a ledger of this topic: dropped")
                continue
            bits = bytearray(bits)
            if ledger == md.ledger:
                clear_range(bits, 0, md.entry + 1)
            extra = clear_range(bits, n, len(bits) << 3)
            if extra:
                notes.append(f"{extra} acks beyond the {n} entries of ledger {ledger}: dropped")
            if popcount(bits):
                self._bits[ledger] = bits
                self._acked += popcount(bits)
        self._batches, self._batch_count = {}, 0
        for pos, size, mask in batches:
            pos = Position(*pos)
            if pos > md and layout.contains(pos) and not self.is_acked(pos):
                self._batches.setdefault(pos.ledger, {})[pos.entry] = (size, mask)
                self._batch_count += 1
        self._redeliveries, self._redelivery_total = {}, 0
        for pos, count in redeliveries:
            pos = Position(*pos)
            if pos > md and not self.is_acked(pos) and self._redelivery_total < self.redelivery_counts_max:
                self._redeliveries.setdefault(pos.ledger, {})[pos.entry] = count
                self._redelivery_total += 1
        self.properties = dict(properties)
        self.last_active = last_active
        self._read = layout.next_position(md)
        self._slide()
        self.changes += 1
        return notes
