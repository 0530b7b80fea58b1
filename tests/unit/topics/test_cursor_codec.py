"""cursor_codec: snapshot payloads, cursor-ledger entries (single, chunks + marker), recovery's walk back over
partial tails and damage, and the znode JSON with its bounds."""
from __future__ import annotations

import asyncio
import json
import random
import zlib

import pytest

from bksim.topics import cursor_codec as codec
from bksim.topics.cursor_codec import CursorSnapshot
from bksim.topics.cursor_state import CursorState
from bksim.topics.positions import Position as P
from fakes.layout import FakeLayout


def bits_of(entries, size=None) -> bytearray:
    out = bytearray(((max(entries) if entries else 0) >> 3) + 1 if size is None else size)
    for e in entries:
        out[e >> 3] |= 1 << (e & 7)
    return out


def same_bits(a: bytes, b: bytes) -> bool:
    return bytes(a).rstrip(b"\x00") == bytes(b).rstrip(b"\x00")


def sample() -> CursorSnapshot:
    return CursorSnapshot(P(7, 41), 1_700_000_000_123, {"dedup/p1": 99, "ü": -5},
                          {8: bits_of(range(0, 20000, 2)), 9: bits_of([3, 4, 5, 100_000]), 12: bits_of([7])},
                          [(P(8, 1), 10, 0b1000000011), (P(9, 0), 3, 0b10)], [(P(8, 3), 4), (P(9, 7), 1)])


def assert_same(a: CursorSnapshot, b: CursorSnapshot) -> None:
    assert (a.mark_delete, a.last_active, a.properties, a.batches, a.redeliveries) == \
           (b.mark_delete, b.last_active, b.properties, b.batches, b.redeliveries)
    assert a.acked.keys() == b.acked.keys()
    assert all(same_bits(a.acked[k], b.acked[k]) for k in a.acked)


def test_payload_round_trip_uses_the_smaller_encoding_per_ledger():
    snap = sample()
    payload = codec.encode_payload(snap)
    assert_same(codec.decode_payload(payload), snap)
    # ledger 8 (every other entry) as a bitmap of 2,500 bytes; ledger 9 (2 runs, sparse) as runs: far smaller
    # than its 12,501-byte bitmap
    assert 2500 < len(payload) < 2500 + 400
    empty = CursorSnapshot(P(-1, -1))
    assert_same(codec.decode_payload(codec.encode_payload(empty)), empty)


def test_payload_damage_is_an_error_not_a_wrong_state():
    payload = codec.encode_payload(sample())
    for cut in (3, 30, len(payload) - 1):
        with pytest.raises(codec.CodecError):
            codec.decode_payload(payload[:cut])
    with pytest.raises(codec.CodecError):
        codec.decode_payload(payload + b"\x00")


def test_one_entry_snapshot_and_chunked_snapshot_with_marker():
    snap = sample()
    packed = codec.pack(snap, seq=5)
    [single] = codec.entries_for(packed, chunk_bytes=1 << 20)
    parsed = codec.parse_entry(single)
    assert (parsed.kind, parsed.seq) == (codec.SNAPSHOT, 5) and single[:4] == b"CS\x01\x01"
    assert_same(codec.unpack_single(parsed), snap)
    chunks = codec.entries_for(packed, chunk_bytes=40)
    assert len(chunks) == (len(packed.compressed) + 39) // 40 > 2
    assert [codec.parse_entry(c).index for c in chunks] == list(range(len(chunks)))
    marker = codec.parse_entry(codec.marker_entry(packed, [(10 + i, len(c)) for i, c in enumerate(chunks)]))
    assert marker.kind == codec.MARKER and marker.chunks[0] == (10, len(chunks[0]))
    assert_same(codec.assemble(marker, chunks), snap)
    with pytest.raises(codec.CodecError):
        codec.assemble(marker, chunks[:-1])
    with pytest.raises(codec.CodecError):  # chunks of another snapshot
        codec.assemble(marker, codec.entries_for(codec.pack(snap, seq=6), chunk_bytes=40))
    with pytest.raises(codec.CodecError):
        codec.assemble(marker, [chunks[1], chunks[0], *chunks[2:]])


def test_entries_are_self_describing_and_unknown_ones_refused():
    for data, what in ((b"", "0 bytes"), (b"XX\x01\x01....", "magic"), (b"CS\x09\x01", "unknown cursor entry type"),
                       (b"CS\x01\x02" + bytes(20), "version 2"), (b"CS\x03\x01\x00", "cut short")):
        with pytest.raises(codec.CodecError) as info:
            codec.parse_entry(data)
        assert what in str(info.value)


class Ledger:
    """Entries of a cursor ledger in a list; counts reads."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.reads = 0

    def write(self, snap: CursorSnapshot, seq: int, chunk_bytes: int, marker: bool = True) -> None:
        packed = codec.pack(snap, seq)
        parts = codec.entries_for(packed, chunk_bytes)
        first = len(self.entries)
        self.entries += parts
        if len(parts) > 1 and marker:
            self.entries.append(codec.marker_entry(packed, [(first + i, len(p)) for i, p in enumerate(parts)]))

    async def read(self, first: int, last: int) -> list[bytes]:
        self.reads += last - first + 1
        return self.entries[first:last + 1]

    def find(self, scan_max=codec.RECOVERY_SCAN_ENTRIES_MAX):
        return asyncio.run(codec.find_last_snapshot(self.read, len(self.entries) - 1, scan_max))


def snap_with(md_entry: int) -> CursorSnapshot:
    rng = random.Random(md_entry)
    return CursorSnapshot(P(3, md_entry), md_entry, {}, {4: bytearray(rng.randbytes(3000))})


def test_recovery_reads_the_last_snapshot_whole_or_chunked():
    ledger = Ledger()
    ledger.write(snap_with(1), 1, chunk_bytes=1000)
    ledger.write(snap_with(2), 2, chunk_bytes=100_000)
    found = ledger.find()
    assert found.seq == 2 and found.entry_id == len(ledger.entries) - 1 and found.entries_read == 1
    assert_same(found.snapshot, snap_with(2))
    ledger.write(snap_with(3), 3, chunk_bytes=1000)
    found = ledger.find()
    assert found.seq == 3 and found.entries_read == 1 + 4 and found.skipped == ()
    assert_same(found.snapshot, snap_with(3))


def test_a_partial_tail_of_chunks_without_marker_falls_back_to_the_previous_complete_snapshot():
    ledger = Ledger()
    ledger.write(snap_with(1), 1, chunk_bytes=1000)
    ledger.write(snap_with(2), 2, chunk_bytes=1000, marker=False)
    found = ledger.find()
    assert found.seq == 1 and "without its marker" in found.skipped[0]
    assert_same(found.snapshot, snap_with(1))
    # only part of the chunks made it: the walk jumps over them by the chunk index
    ledger.entries = ledger.entries[:-2]
    assert ledger.find().seq == 1


def test_damaged_entries_are_skipped_and_recovery_is_bounded():
    ledger = Ledger()
    ledger.write(snap_with(1), 1, chunk_bytes=100_000)
    ledger.write(snap_with(2), 2, chunk_bytes=1000)
    ledger.entries[-2] = ledger.entries[-2][:-1] + bytes([ledger.entries[-2][-1] ^ 1])  # a chunk's last byte
    found = ledger.find()
    assert found.seq == 1 and "checksum" in " ".join(found.skipped)
    ledger.entries.append(b"garbage")
    assert ledger.find().seq == 1
    ledger.entries += [b"garbage"] * 10
    assert ledger.find(scan_max=5) is None
    assert Ledger().find() is None  # empty ledger


def test_znode_round_trip_and_bounds_say_what_was_left_out():
    snap = sample()
    raw, left_out = codec.encode_znode(snap, 17, ranges_max=1000)
    doc = json.loads(raw)
    assert doc["cursor_ledger"] == 17 and doc["mark_delete"] == [7, 41] and doc["left_out"] == {"acked_ranges": 9003}
    assert left_out == {"acked_ranges": 9003}  # 10,000 + 2 + 1 ranges, 1,000 kept
    z = codec.decode_znode(raw)
    assert z.cursor_ledger == 17 and z.left_out == left_out
    assert z.snapshot.properties == snap.properties and z.snapshot.batches == snap.batches
    assert z.snapshot.redeliveries == snap.redeliveries
    # the ranges kept are the lowest: ledger 8's first 1,000 acked entries, nothing of ledgers 9 and 12
    assert list(z.snapshot.acked) == [8]
    assert same_bits(z.snapshot.acked[8], bits_of(range(0, 2000, 2)))
    raw, left_out = codec.encode_znode(snap, -1, ranges_max=1)
    assert left_out == {"acked_ranges": 10002, "batch_indexes": 1, "redelivery_counts": 1}
    small = CursorSnapshot(P(1, 2), 3, {"a": 1}, {1: bits_of([5, 6, 9])}, [], [(P(1, 4), 2)])
    raw, left_out = codec.encode_znode(small, -1, ranges_max=10)
    assert left_out == {}
    assert_same(codec.decode_znode(raw).snapshot, small)
    for bad in (b"{", b"{}", b'{"format": 2}', b'{"format": 1, "cursor_ledger": 1}'):
        with pytest.raises(codec.CodecError):
            codec.decode_znode(bad, "/x")


def test_snapshot_of_a_state_restores_an_equal_state():
    layout = FakeLayout([(5, 100), (6, 50)])
    s = CursorState(layout, P(5, -1), redelivery_counts_max=10)
    s.ack([P(5, e) for e in range(3, 100, 3)] + [P(6, 1)])
    s.ack_batch_indexes(P(5, 1), [1], 3)
    s.increment_redelivery(P(5, 2))
    s.set_property("p", 7)
    s.last_active = 99
    payload = codec.encode_payload(CursorSnapshot.of(s))
    t = CursorState(layout, P(5, -1), redelivery_counts_max=10)
    assert codec.decode_payload(payload).restore_into(t) == []
    assert list(t.ranges()) == list(s.ranges()) and t.mark_delete == s.mark_delete
    assert list(t.batches()) == list(s.batches()) and list(t.redeliveries()) == list(s.redeliveries())
    assert t.properties == {"p": 7} and t.last_active == 99
    assert zlib.decompress(codec.pack(CursorSnapshot.of(s), 1).compressed) == payload
