"""Cursor snapshots as bytes: the entries of a cursor ledger and the cursor znode's JSON (PROTOCOL.md §5
"Cursor persistence"). Pure.

A *snapshot* is the whole ack state of a cursor (CursorSnapshot): mark-delete, last active, properties, the
individually acked entries of every message ledger, partially acked batches and redelivery counts. Its
*payload* (little-endian, then zlib-compressed as a whole):

    q mark_delete.ledger, q mark_delete.entry, q last_active_ms
    I properties;   each: H name length, name (UTF-8), q value
    I ledgers;      each: q ledger, B kind, q first entry, I count, then
                      kind 0 BITMAP: `count` bytes, bit i of the run = entry first + i acked
                      kind 1 RUNS:   `count` (gap, length) pairs of q: runs of acked entries, each gap counted
                                     from the end of the previous run (the first from entry 0)
                    (per ledger, whichever of the two is smaller before compression)
    I batches;      each: q ledger, q entry, I batch size, I mask bytes, mask (bit i = message i acked)
    I redeliveries; then three arrays of that length: q ledgers, q entries, I counts

*Cursor ledger entries* are self-describing: 2 magic bytes b"CS", a type byte and a format version byte
(FORMAT_VERSION), then:

    SNAPSHOT (1): Q seq, I crc32(compressed), I payload length, compressed payload     (one-entry snapshot)
    CHUNK    (2): Q seq, I index, I count, bytes                       (a slice of the compressed payload)
    MARKER   (3): Q seq, I crc32(compressed), Q compressed length, I payload length, I chunks,
                  chunks x (q entry id, I size)                        (written after its chunks)

A snapshot whose compressed payload exceeds `chunk_bytes` (topic.cursor_snapshot_chunk_bytes) is written as
chunk entries followed by a marker naming them; only a marker makes the chunks before it a snapshot. Recovery
(`find_last_snapshot`) reads the last entry and walks back over partial tails (chunks without their marker,
damaged entries) to the newest complete SNAPSHOT or MARKER, reading at most RECOVERY_SCAN_ENTRIES_MAX entries;
a CHUNK's index lets it jump over the rest of its group at once.

The znode JSON (`encode_znode` / `decode_znode`), at most `ranges_max` entries per list, lowest first, and the
number left out (never silently):

    {"format": 1, "cursor_ledger": id or -1, "mark_delete": [ledger, entry], "last_active": ms,
     "properties": {name: int}, "acked_ranges": [[ledger, first, last], ...] (entries first..last acked),
     "batch_indexes": [[ledger, entry, size, [index, ...]], ...], "redelivery_counts": [[ledger, entry, n], ...],
     "left_out": {"acked_ranges": k, "batch_indexes": k, "redelivery_counts": k}}

Leaving out the highest ranges is safe: those entries are redelivered (at-least-once), never lost.

Decoding trusts nothing it reads (a cursor ledger or znode may be damaged or written by anyone who can reach
ZooKeeper or a bookie): every failure is a CodecError, and memory stays within stated bounds, checked before
allocating: a payload at most PAYLOAD_BYTES_MAX once decompressed (decompression stops there), acked bitmaps
of at most BITMAP_BYTES_MAX in all, entry ids of acked bits >= 0, batch sizes at most BATCH_SIZE_MAX.
"""
from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable

from bksim.topics.cursor_state import CursorState, first_one, popcount, run_count, runs, set_range
from bksim.topics.positions import Position
from bksim.model.errors import FormatError

MAGIC = b"CS"
FORMAT_VERSION = 1
SNAPSHOT, CHUNK, MARKER = 1, 2, 3
KIND_NAMES = {SNAPSHOT: "SNAPSHOT", CHUNK: "CHUNK", MARKER: "MARKER"}
ZLIB_LEVEL = 6
RECOVERY_SCAN_ENTRIES_MAX = 10_000  # entries recovery reads walking back from the end of a cursor ledger
ZNODE_FORMAT = 1
# Decoding bounds (module docstring). A cursor's bitmaps cost one bit per entry of the ledgers after its
# mark-delete; ledgers roll at topic.ledger_entries_max entries (50,000 by default), so 64 MiB (2^29 entries) is
# far above any real cursor and far below what a hostile id of 2^63 would ask for.
BITMAP_BYTES_MAX = 64 * 1024 * 1024
# bitmaps, plus topic.redelivery_counts_max (10^6) redelivery counts of 20 bytes, batches and properties
PAYLOAD_BYTES_MAX = 2 * BITMAP_BYTES_MAX
BATCH_SIZE_MAX = 1 << 20  # messages in one batch entry a cursor tracks (cursor_state's batch_size_max default)
BITMAP, RUNS = 0, 1

_HEAD = struct.Struct("<2sBB")
_SNAP = struct.Struct("<QII")
_CHUNK = struct.Struct("<QII")
_MARK = struct.Struct("<QIQII")
_MARK_ITEM = struct.Struct("<qI")
_TOP = struct.Struct("<qqq")
_PROP = struct.Struct("<H")
_Q = struct.Struct("<q")
_I = struct.Struct("<I")
_LEDGER = struct.Struct("<qBqI")
_BATCH = struct.Struct("<qqII")


class CodecError(FormatError):
    """Bytes that are not a cursor entry / snapshot / znode of a known format."""


# ---------------------------------------------------------------------------------------------- snapshot
@dataclass
class CursorSnapshot:
    mark_delete: Position
    last_active: int = 0
    properties: dict[str, int] = field(default_factory=dict)
    acked: dict[int, bytearray] = field(default_factory=dict)  # ledger -> bitmap, bit e = entry e acked
    batches: list[tuple[Position, int, int]] = field(default_factory=list)  # (pos, size, acked mask)
    redeliveries: list[tuple[Position, int]] = field(default_factory=list)

    @staticmethod
    def of(state: CursorState) -> "CursorSnapshot":
        """The state as it is now, a copy: a persist may encode it again after the state changed (its fallback to
        the znode after a failed append), and must write this snapshot: its mark-delete with its acks, not with the
        acks the state has by then (the bitmaps are small: one bit per entry of the ledgers with acks after the
        mark-delete)."""
        return CursorSnapshot(state.mark_delete, state.last_active, dict(state.properties),
                              {lg: bytearray(state.ledger_bits(lg)) for lg in state.acked_ledgers()},
                              list(state.batches()), list(state.redeliveries()))

    def restore_into(self, state: CursorState) -> list[str]:
        return state.restore(mark_delete=self.mark_delete, acked=self.acked, batches=self.batches,
                             redeliveries=self.redeliveries, properties=self.properties, last_active=self.last_active)

    def acked_count(self) -> int:
        return sum(popcount(b) for b in self.acked.values())


def _native(a: array) -> bytes:
    if sys.byteorder == "big":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _from_native(typecode: str, data: bytes) -> array:
    a = array(typecode)
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def encode_payload(snap: CursorSnapshot) -> bytes:
    """The uncompressed payload of a snapshot."""
    out = [_TOP.pack(snap.mark_delete[0], snap.mark_delete[1], snap.last_active), _I.pack(len(snap.properties))]
    for name, value in sorted(snap.properties.items()):
        raw = name.encode()
        out += [_PROP.pack(len(raw)), raw, _Q.pack(value)]
    ledgers = []
    for ledger, bits in sorted(snap.acked.items()):
        first = first_one(bits, 0)
        if first >= 0:
            ledgers.append((ledger, bits, first >> 3, len(bits.rstrip(b"\x00"))))
    out.append(_I.pack(len(ledgers)))
    for ledger, bits, lo, hi in ledgers:
        view = memoryview(bits)[lo:hi]
        n_runs = run_count(view)
        if 16 * n_runs < hi - lo:
            pairs = array("q")
            end = 0
            for s, e in runs(bits):
                pairs.append(s - end)
                pairs.append(e - s)
                end = e
            out += [_LEDGER.pack(ledger, RUNS, 0, n_runs), _native(pairs)]
        else:
            out += [_LEDGER.pack(ledger, BITMAP, lo * 8, hi - lo), bytes(view)]
    out.append(_I.pack(len(snap.batches)))
    for pos, size, mask in snap.batches:
        raw = mask.to_bytes((size + 7) // 8, "little")
        out += [_BATCH.pack(pos[0], pos[1], size, len(raw)), raw]
    out.append(_I.pack(len(snap.redeliveries)))
    if snap.redeliveries:
        out.append(_native(array("q", (p[0] for p, _ in snap.redeliveries))))
        out.append(_native(array("q", (p[1] for p, _ in snap.redeliveries))))
        out.append(_native(array("I", (n for _, n in snap.redeliveries))))
    return b"".join(out)


class _Bitmaps:
    """The acked bitmaps being decoded, which together stay within BITMAP_BYTES_MAX."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.acked: dict[int, bytearray] = {}
        self.bytes = 0

    def set_range(self, ledger: int, first: int, end: int) -> None:
        """Mark entries first..end-1 of `ledger` acked; CodecError, before allocating, beyond the bounds."""
        if first < 0 or end <= first:
            raise CodecError(f"{self.what}: bad acked range [{first}, {end}) in ledger {ledger}")
        bits = self.acked.setdefault(ledger, bytearray())
        grow = max(0, ((end - 1) >> 3) + 1 - len(bits))
        if self.bytes + grow > BITMAP_BYTES_MAX:
            raise CodecError(f"{self.what}: acked entries up to {ledger}:{end - 1} need bitmaps of more than "
                             f"{BITMAP_BYTES_MAX} bytes")
        self.bytes += grow
        set_range(bits, first, end)

    def put(self, ledger: int, bits: bytearray) -> None:
        self.bytes -= len(self.acked.pop(ledger, b""))
        if self.bytes + len(bits) > BITMAP_BYTES_MAX:
            raise CodecError(f"{self.what}: the bitmap of ledger {ledger} goes past {BITMAP_BYTES_MAX} bytes")
        self.bytes += len(bits)
        self.acked[ledger] = bits


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.data):
            raise CodecError(f"cursor snapshot payload cut short at byte {self.at} (needs {n} more)")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack(self.take(s.size))


def decode_payload(payload: bytes) -> CursorSnapshot:
    r = _Reader(payload)
    md_ledger, md_entry, last_active = r.unpack(_TOP)
    props = {}
    for _ in range(r.unpack(_I)[0]):
        (n,) = r.unpack(_PROP)
        try:
            name = bytes(r.take(n)).decode()
        except UnicodeDecodeError:
            raise CodecError("cursor snapshot: a property name is not UTF-8") from None
        props[name] = r.unpack(_Q)[0]
    bitmaps = _Bitmaps("cursor snapshot")
    for _ in range(r.unpack(_I)[0]):
        ledger, kind, first, count = r.unpack(_LEDGER)
        if kind == BITMAP:
            if first % 8 or first < 0:
                raise CodecError(f"cursor snapshot: bitmap of ledger {ledger} starts at entry {first}, not a byte")
            raw = r.take(count)
            if count:
                if first // 8 + count > BITMAP_BYTES_MAX:
                    raise CodecError(f"cursor snapshot: bitmap of ledger {ledger} (entries {first} + {8 * count}) "
                                     f"goes past {BITMAP_BYTES_MAX} bytes")
                bits = bytearray(first // 8)
                bits += raw
                bitmaps.put(ledger, bits)
        elif kind == RUNS:
            pairs = _from_native("q", bytes(r.take(16 * count)))
            end = 0
            for i in range(0, len(pairs), 2):
                start = end + pairs[i]
                end = start + pairs[i + 1]
                if pairs[i] < 0 or pairs[i + 1] <= 0:
                    raise CodecError(f"cursor snapshot: bad run ({pairs[i]}, {pairs[i + 1]}) in ledger {ledger}")
                bitmaps.set_range(ledger, start, end)
        else:
            raise CodecError(f"cursor snapshot: unknown encoding {kind} for ledger {ledger}")
    batches = []
    for _ in range(r.unpack(_I)[0]):
        ledger, entry, size, n = r.unpack(_BATCH)
        batches.append((Position(ledger, entry), size, int.from_bytes(r.take(n), "little")))
    (n,) = r.unpack(_I)
    redeliveries = []
    if n:
        ledgers = _from_native("q", bytes(r.take(8 * n)))
        entries = _from_native("q", bytes(r.take(8 * n)))
        counts = _from_native("I", bytes(r.take(4 * n)))
        redeliveries = [(Position(lg, e), c) for lg, e, c in zip(ledgers, entries, counts)]
    if r.at != len(payload):
        raise CodecError(f"cursor snapshot: {len(payload) - r.at} bytes after the end of the payload")
    return CursorSnapshot(Position(md_ledger, md_entry), last_active, props, bitmaps.acked, batches, redeliveries)


# ---------------------------------------------------------------------------------------------- entries
@dataclass(frozen=True)
class Packed:
    """A compressed snapshot ready to be written: `seq` numbers the snapshots of one cursor."""
    seq: int
    compressed: bytes
    payload_bytes: int

    @property
    def crc(self) -> int:
        return zlib.crc32(self.compressed)


def pack(snap: CursorSnapshot, seq: int) -> Packed:
    payload = encode_payload(snap)
    return Packed(seq, zlib.compress(payload, ZLIB_LEVEL), len(payload))


def entries_for(packed: Packed, chunk_bytes: int) -> list[bytes]:
    """One SNAPSHOT entry, or the CHUNK entries (the MARKER follows once their entry ids are known)."""
    data = packed.compressed
    if len(data) <= chunk_bytes:
        return [_HEAD.pack(MAGIC, SNAPSHOT, FORMAT_VERSION) + _SNAP.pack(packed.seq, packed.crc, packed.payload_bytes)
                + data]
    count = (len(data) + chunk_bytes - 1) // chunk_bytes
    return [_HEAD.pack(MAGIC, CHUNK, FORMAT_VERSION) + _CHUNK.pack(packed.seq, i, count)
            + data[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(count)]


def marker_entry(packed: Packed, chunks: list[tuple[int, int]]) -> bytes:
    """The MARKER naming the chunk entries: (entry id, entry size) in order."""
    return (_HEAD.pack(MAGIC, MARKER, FORMAT_VERSION)
            + _MARK.pack(packed.seq, packed.crc, len(packed.compressed), packed.payload_bytes, len(chunks))
            + b"".join(_MARK_ITEM.pack(e, s) for e, s in chunks))


@dataclass(frozen=True)
class Parsed:
    kind: int
    seq: int
    body: bytes = b""                            # SNAPSHOT: compressed payload; CHUNK: its slice
    crc: int = 0
    payload_bytes: int = 0
    index: int = 0                               # CHUNK
    count: int = 0                               # CHUNK
    compressed_bytes: int = 0                    # MARKER
    chunks: tuple[tuple[int, int], ...] = ()     # MARKER: (entry id, size)


def parse_entry(data: bytes) -> Parsed:
    if len(data) < _HEAD.size:
        raise CodecError(f"not a cursor entry: {len(data)} bytes")
    magic, kind, version = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"not a cursor entry: magic {magic!r}")
    if version != FORMAT_VERSION:
        raise CodecError(f"cursor entry format version {version} is not supported (this code reads {FORMAT_VERSION})")
    at = _HEAD.size
    try:
        if kind == SNAPSHOT:
            seq, crc, n = _SNAP.unpack_from(data, at)
            return Parsed(SNAPSHOT, seq, bytes(data[at + _SNAP.size:]), crc, n)
        if kind == CHUNK:
            seq, index, count = _CHUNK.unpack_from(data, at)
            if not index < count:
                raise CodecError(f"cursor chunk {index} of {count}")
            return Parsed(CHUNK, seq, bytes(data[at + _CHUNK.size:]), index=index, count=count)
        if kind == MARKER:
            seq, crc, total, n, count = _MARK.unpack_from(data, at)
            at += _MARK.size
            if len(data) != at + count * _MARK_ITEM.size:
                raise CodecError(f"cursor marker of {count} chunks has {len(data)} bytes")
            chunks = tuple(_MARK_ITEM.unpack_from(data, at + i * _MARK_ITEM.size) for i in range(count))
            return Parsed(MARKER, seq, crc=crc, payload_bytes=n, compressed_bytes=total, chunks=chunks)
    except struct.error as e:
        raise CodecError(f"cursor entry cut short: {e}") from None
    raise CodecError(f"unknown cursor entry type {kind}")


def _decompress(compressed: bytes, crc: int, payload_bytes: int) -> CursorSnapshot:
    if zlib.crc32(compressed) != crc:
        raise CodecError("cursor snapshot checksum mismatch")
    if payload_bytes > PAYLOAD_BYTES_MAX:
        raise CodecError(f"cursor snapshot payload of {payload_bytes} bytes is over {PAYLOAD_BYTES_MAX}")
    inflate = zlib.decompressobj()
    try:
        payload = inflate.decompress(compressed, payload_bytes + 1)  # never more than one byte past the header
    except zlib.error as e:
        raise CodecError(f"cursor snapshot does not decompress: {e}") from None
    if len(payload) > payload_bytes:
        raise CodecError(f"cursor snapshot payload decompresses to more than the {payload_bytes} bytes the header says")
    if not inflate.eof:
        raise CodecError(f"cursor snapshot compressed payload is cut short ({len(payload)} bytes decompressed)")
    if len(payload) != payload_bytes:
        raise CodecError(f"cursor snapshot payload is {len(payload)} bytes, the header says {payload_bytes}")
    return decode_payload(payload)


def unpack_single(parsed: Parsed) -> CursorSnapshot:
    assert parsed.kind == SNAPSHOT
    return _decompress(parsed.body, parsed.crc, parsed.payload_bytes)


def assemble(marker: Parsed, chunk_entries: list[bytes]) -> CursorSnapshot:
    """The snapshot a MARKER names, from its chunk entries (in the marker's order)."""
    assert marker.kind == MARKER
    if len(chunk_entries) != len(marker.chunks):
        raise CodecError(f"cursor marker names {len(marker.chunks)} chunks, {len(chunk_entries)} given")
    parts = []
    for i, (data, (entry_id, size)) in enumerate(zip(chunk_entries, marker.chunks)):
        if len(data) != size:
            raise CodecError(f"cursor chunk at entry {entry_id}: {len(data)} bytes, the marker says {size}")
        chunk = parse_entry(data)
        if chunk.kind != CHUNK or chunk.seq != marker.seq or chunk.index != i or chunk.count != len(marker.chunks):
            raise CodecError(f"entry {entry_id} is not chunk {i} of snapshot {marker.seq}")
        parts.append(chunk.body)
    compressed = b"".join(parts)
    if len(compressed) != marker.compressed_bytes:
        raise CodecError(f"cursor chunks hold {len(compressed)} bytes, the marker says {marker.compressed_bytes}")
    return _decompress(compressed, marker.crc, marker.payload_bytes)


@dataclass(frozen=True)
class Found:
    snapshot: CursorSnapshot
    seq: int
    entry_id: int          # the SNAPSHOT or MARKER entry
    entries_read: int
    skipped: tuple[str, ...]  # why later entries were not used (partial tails, damage)


async def find_last_snapshot(read: Callable[[int, int], Awaitable[list[bytes]]], last_entry_id: int,
                             scan_max: int = RECOVERY_SCAN_ENTRIES_MAX) -> Found | None:
    """The newest complete snapshot of a cursor ledger whose last entry is `last_entry_id`, reading entries
    through `read(first, last)`; None when none is found within `scan_max` entries read (or the ledger is
    empty). Errors of `read` propagate (the ledger is unreadable)."""
    e = last_entry_id
    reads = 0
    skipped: list[str] = []
    while e >= 0 and reads < scan_max:
        [data] = await read(e, e)
        reads += 1
        try:
            parsed = parse_entry(data)
        except CodecError as err:
            skipped.append(f"entry {e}: {err}")
            e -= 1
            continue
        if parsed.kind == SNAPSHOT:
            try:
                return Found(unpack_single(parsed), parsed.seq, e, reads, tuple(skipped))
            except CodecError as err:
                skipped.append(f"entry {e}: {err}")
                e -= 1
                continue
        if parsed.kind == CHUNK:
            skipped.append(f"entry {e}: chunk {parsed.index} of {parsed.count} of snapshot {parsed.seq} without "
                           f"its marker (a partial tail)")
            e -= parsed.index + 1
            continue
        ids = [c[0] for c in parsed.chunks]
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))) or ids[-1] >= e or ids[0] < 0 \
                or reads + len(ids) > scan_max:
            skipped.append(f"entry {e}: marker of snapshot {parsed.seq} names unusable entries {ids[:3]}...")
            e -= 1
            continue
        chunks = await read(ids[0], ids[-1])
        reads += len(ids)
        try:
            return Found(assemble(parsed, chunks), parsed.seq, e, reads, tuple(skipped))
        except CodecError as err:
            skipped.append(f"entry {e}: {err}")
            e = ids[0] - 1
    if e >= 0:
        skipped.append(f"gave up after reading {reads} entries (scan limit {scan_max})")
    return None


# ---------------------------------------------------------------------------------------------- znode
def encode_znode(snap: CursorSnapshot, cursor_ledger: int, ranges_max: int) -> tuple[bytes, dict[str, int]]:
    """The cursor znode's JSON bytes and what was left out ({list name: count}, only non-zero counts)."""
    acked_ranges: list[list[int]] = []
    total_ranges = 0
    for ledger in sorted(snap.acked):
        bits = snap.acked[ledger]
        total_ranges += run_count(bits)
        left = ranges_max - len(acked_ranges)
        if left > 0:
            acked_ranges += [[ledger, s, e - 1] for s, e in runs(bits, left)]
    batches = [[p[0], p[1], size, [i for i in range(size) if mask >> i & 1]]
               for p, size, mask in snap.batches[:ranges_max]]
    counts = [[p[0], p[1], n] for p, n in snap.redeliveries[:ranges_max]]
    left_out = {k: v for k, v in (("acked_ranges", total_ranges - len(acked_ranges)),
                                  ("batch_indexes", len(snap.batches) - len(batches)),
                                  ("redelivery_counts", len(snap.redeliveries) - len(counts))) if v}
    doc = {"format": ZNODE_FORMAT, "cursor_ledger": cursor_ledger, "mark_delete": list(snap.mark_delete),
           "last_active": snap.last_active, "properties": dict(sorted(snap.properties.items())),
           "acked_ranges": acked_ranges, "batch_indexes": batches, "redelivery_counts": counts, "left_out": left_out}
    return json.dumps(doc, separators=(",", ":")).encode(), left_out


def fits_znode(state: CursorState, ranges_max: int) -> bool:
    """Whether the whole state fits the znode's bounds (nothing would be left out)."""
    return (state.batch_count <= ranges_max and state.redelivery_tracked <= ranges_max
            and state.range_count() <= ranges_max)


@dataclass(frozen=True)
class ZnodeState:
    cursor_ledger: int
    snapshot: CursorSnapshot
    left_out: dict[str, int]


def decode_znode(data: bytes, path: str = "") -> ZnodeState:
    try:
        doc = json.loads(data)
        if doc.get("format") != ZNODE_FORMAT:
            raise CodecError(f"cursor znode {path}: format {doc.get('format')!r} is not {ZNODE_FORMAT}")
        bitmaps = _Bitmaps(f"cursor znode {path}")
        for ledger, first, last in doc.get("acked_ranges", []):
            bitmaps.set_range(int(ledger), int(first), int(last) + 1)
        batches = []
        for ledger, entry, size, indexes in doc.get("batch_indexes", []):
            size, mask = int(size), 0
            if not 1 <= size <= BATCH_SIZE_MAX:
                raise CodecError(f"cursor znode {path}: batch of {size} messages at {ledger}:{entry} (1.."
                                 f"{BATCH_SIZE_MAX})")
            for i in indexes:
                if not 0 <= int(i) < size:
                    raise CodecError(f"cursor znode {path}: batch index {i} at {ledger}:{entry} is not in "
                                     f"0..{size - 1}")
                mask |= 1 << int(i)
            batches.append((Position(int(ledger), int(entry)), size, mask))
        counts = [(Position(int(lg), int(e)), int(n)) for lg, e, n in doc.get("redelivery_counts", [])]
        md = Position(*(int(x) for x in doc["mark_delete"]))
        snap = CursorSnapshot(md, int(doc.get("last_active", 0)),
                              {str(k): int(v) for k, v in doc.get("properties", {}).items()}, bitmaps.acked, batches,
                              counts)
        return ZnodeState(int(doc["cursor_ledger"]), snap, dict(doc.get("left_out", {})))
    except CodecError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
        raise CodecError(f"cursor znode {path} is not a cursor's JSON: {e!r}") from None
    except RecursionError:
        raise CodecError(f"cursor znode {path} is not a cursor's JSON: nested too deeply") from None


def positions_of(snap: CursorSnapshot) -> Iterable[Position]:
    """Every individually acked position of a snapshot, in order (for tests and tools)."""
    for ledger in sorted(snap.acked):
        for s, e in runs(snap.acked[ledger]):
            for entry in range(s, e):
                yield Position(ledger, entry)
