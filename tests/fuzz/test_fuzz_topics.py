"""Fuzzing of the topic layer's byte formats: message entries (formats/message.py, BKM1) and cursor snapshots
(topics/cursor_codec.py: cursor-ledger entries, the compressed payload, the cursor znode's JSON).

Property: decodes (round trips equal) or raises FormatError (CodecError for the cursor codec); nothing else,
no hang, and no allocation beyond the codec's stated bounds (the targeted tests at the end measure the peak
with tracemalloc for length and id fields set to huge values).
"""
from __future__ import annotations

import json
import struct
import tracemalloc
import zlib

from hypothesis import example, given
from hypothesis import strategies as st

from bksim.formats import message as msg_fmt
from bksim.model.errors import FormatError
from bksim.topics import cursor_codec as codec
from bksim.topics.positions import Position
from fuzz.mutations import mutated, raw_bytes

i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)


def parses(parse, *args, **kwargs):
    """parse(...)'s value, or None when it raised FormatError (the only error a parser may raise)."""
    try:
        return parse(*args, **kwargs)
    except FormatError:
        return None


def peak_bytes(call) -> int:
    """Peak bytes traced while `call()` runs (its FormatError, if any, swallowed)."""
    tracemalloc.start()
    try:
        parses(call)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------------------------------------- messages
messages = st.builds(msg_fmt.Message, st.binary(max_size=32), st.none() | text,
                     st.dictionaries(text, text, max_size=3), i64, i64)


@st.composite
def message_entries(draw) -> tuple[list[msg_fmt.Message], str, int, bool]:
    batch = draw(st.booleans())
    msgs = draw(st.lists(messages, min_size=1, max_size=4 if batch else 1))
    return msgs, draw(text), draw(i64), batch


def _encode(args) -> bytes:
    msgs, producer, publish, batch = args
    return msg_fmt.encode_entry(msgs, producer_name=producer, publish_time_ms=publish, batch=batch)


@given(st.one_of(raw_bytes(), mutated(message_entries().map(_encode))))
def test_message_entry_decode_or_format_error(data):
    parses(msg_fmt.read_header, data)
    parses(msg_fmt.decode_entry, data)


@given(message_entries())
def test_message_entry_round_trip(args):
    msgs, producer, publish, batch = args
    header, decoded = msg_fmt.decode_entry(_encode(args))
    assert decoded == msgs
    assert (header.producer_name, header.publish_time_ms, header.is_batch, header.num_messages) == (
        producer, publish, batch, len(msgs))
    assert header.sticky_key == msgs[0].key


# ---------------------------------------------------------------------------------------------- cursor snapshots
def _bitmap(entries: set[int]) -> bytearray:
    bits = bytearray((max(entries) >> 3) + 1 if entries else 0)
    for e in entries:
        bits[e >> 3] |= 1 << (e & 7)
    return bits


positions = st.builds(Position, st.integers(-1, 10**6), st.integers(-1, 10**6))
snapshots = st.builds(
    codec.CursorSnapshot, positions, st.integers(0, 2**62),
    st.dictionaries(text, i64, max_size=3),
    st.dictionaries(st.integers(0, 10**6), st.sets(st.integers(0, 3_000), min_size=1, max_size=40).map(_bitmap),
                    max_size=3),
    st.lists(st.tuples(positions, st.integers(1, 64)).flatmap(
        lambda p: st.tuples(st.just(p[0]), st.just(p[1]), st.integers(0, 2 ** p[1] - 1))), max_size=3),
    st.lists(st.tuples(positions, st.integers(0, 2**32 - 1)), max_size=3))


def _same(a: codec.CursorSnapshot, b: codec.CursorSnapshot) -> bool:
    strip = lambda acked: {lg: bytes(bits).rstrip(b"\0") for lg, bits in acked.items() if any(bits)}
    return (a.mark_delete, a.last_active, a.properties, strip(a.acked), a.batches, a.redeliveries) == (
        b.mark_delete, b.last_active, b.properties, strip(b.acked), b.batches, b.redeliveries)


@st.composite
def cursor_entries(draw) -> bytes:
    packed = codec.pack(draw(snapshots), draw(st.integers(0, 2**64 - 1)))
    entries = codec.entries_for(packed, draw(st.sampled_from([16, 64, 1 << 20])))
    if len(entries) > 1 and draw(st.booleans()):
        return codec.marker_entry(packed, [(i, len(e)) for i, e in enumerate(entries)])
    return draw(st.sampled_from(entries))


def _cursor_entry_view(data: bytes) -> None:
    """What recovery does with one cursor-ledger entry (a marker's chunks: the entry itself, as a hostile one)."""
    parsed = parses(codec.parse_entry, data)
    if parsed is not None and parsed.kind == codec.SNAPSHOT:
        parses(codec.unpack_single, parsed)
    elif parsed is not None and parsed.kind == codec.MARKER:
        parses(codec.assemble, parsed, [data] * len(parsed.chunks))


@given(st.one_of(raw_bytes(), mutated(cursor_entries())))
def test_cursor_entry_decode_or_codec_error(data):
    _cursor_entry_view(data)


def _snapshot_entry(payload: bytes) -> bytes:
    """A SNAPSHOT entry holding `payload` with a correct checksum: damage the checksum would not catch."""
    compressed = zlib.compress(payload)
    return (codec._HEAD.pack(codec.MAGIC, codec.SNAPSHOT, codec.FORMAT_VERSION)
            + codec._SNAP.pack(1, zlib.crc32(compressed), len(payload)) + compressed)


def _payload(*ledgers: bytes) -> bytes:
    """A snapshot payload with these encoded ledger bitmaps and nothing else."""
    return (codec._TOP.pack(1, 1, 0) + codec._I.pack(0) + codec._I.pack(len(ledgers)) + b"".join(ledgers)
            + codec._I.pack(0) + codec._I.pack(0))


def _bitmap_at(first: int, raw: bytes = b"\x01") -> bytes:
    return codec._LEDGER.pack(7, codec.BITMAP, first, len(raw)) + raw


def _runs(*pairs: tuple[int, int], ledger: int = 7) -> bytes:
    return codec._LEDGER.pack(ledger, codec.RUNS, 0, len(pairs)) + b"".join(struct.pack("<qq", *p) for p in pairs)


HUGE_PAYLOADS = [_payload(_bitmap_at(2**59)),  # a bitmap starting at entry 2^59: a 64 PiB bytearray
                 _payload(_bitmap_at(2**34)),  # 2 GiB
                 _payload(_bitmap_at(-8)),  # a negative entry id
                 _payload(_runs((2**31, 1))),  # one run at entry 2^31: a 256 MiB bitmap
                 _payload(_runs((2**62, 1))),
                 _payload(_runs((0, 2**40)))]  # one run of 2^40 entries


@given(st.one_of(raw_bytes(), mutated(snapshots.map(codec.encode_payload))))
@example(HUGE_PAYLOADS[0])
@example(HUGE_PAYLOADS[3])
def test_cursor_payload_decode_or_codec_error(payload):
    parses(codec.decode_payload, payload)
    _cursor_entry_view(_snapshot_entry(payload))


@given(snapshots, st.integers(0, 2**64 - 1), st.sampled_from([16, 64, 1 << 20]))
def test_cursor_snapshot_round_trip(snap, seq, chunk_bytes):
    assert _same(codec.decode_payload(codec.encode_payload(snap)), snap)
    packed = codec.pack(snap, seq)
    entries = codec.entries_for(packed, chunk_bytes)
    if len(entries) == 1:
        parsed = codec.parse_entry(entries[0])
        assert (parsed.kind, parsed.seq) == (codec.SNAPSHOT, seq)
        assert _same(codec.unpack_single(parsed), snap)
    else:
        marker = codec.parse_entry(codec.marker_entry(packed, [(10 + i, len(e)) for i, e in enumerate(entries)]))
        assert (marker.kind, marker.seq) == (codec.MARKER, seq)
        assert _same(codec.assemble(marker, entries), snap)


def _znode(args) -> bytes:
    snap, ledger, ranges_max = args
    return codec.encode_znode(snap, ledger, ranges_max)[0]


znodes = st.tuples(snapshots, st.integers(-1, 2**63 - 1), st.integers(1, 50)).map(_znode)


HUGE_ZNODES = [b'{"format":1,"cursor_ledger":3,"mark_delete":[1,1],"acked_ranges":[[1,0,1099511627776]]}',
               b'{"format":1,"cursor_ledger":3,"mark_delete":[1,1],"acked_ranges":[[1,-5,3]]}',
               b'{"format":1,"cursor_ledger":3,"mark_delete":[1,1],"batch_indexes":[[1,2,10,[1099511627776]]]}',
               b'{"format":1,"cursor_ledger":3,"mark_delete":[1,1],"batch_indexes":[[1,2,1099511627776,[]]]}']


@given(st.one_of(raw_bytes(), mutated(znodes)))
@example(HUGE_ZNODES[0])  # a 128 GiB bitmap
@example(HUGE_ZNODES[2])  # a 2^40-bit batch mask
@example(b'{"format":1,"cursor_ledger":1e999,"mark_delete":[1,1]}')  # int(inf): OverflowError
@example(b"[" * 100_000)  # json nesting: RecursionError
def test_cursor_znode_decode_or_codec_error(data):
    parses(codec.decode_znode, data, "/fuzz")


@given(snapshots, st.integers(-1, 2**63 - 1))
def test_cursor_znode_round_trip(snap, ledger):
    znode = codec.decode_znode(codec.encode_znode(snap, ledger, 10**6)[0])
    assert znode.cursor_ledger == ledger and znode.left_out == {}
    assert _same(znode.snapshot, snap)


# ---------------------------------------------------------------------------------------------- bounds
PEAK_BYTES_MAX = 1 << 20  # a rejected input costs at most this much memory (the huge inputs ask for GiBs)


def test_cursor_payload_huge_ids_are_rejected_before_allocating():
    for payload in HUGE_PAYLOADS:
        assert parses(codec.decode_payload, payload) is None, payload[:64]
        assert peak_bytes(lambda: codec.decode_payload(payload)) < PEAK_BYTES_MAX


def test_cursor_payload_bitmaps_stay_within_their_bound_in_all():
    # eight ledgers acked at entry 2^28: 32 MiB each, each within the bound, 256 MiB together
    payload = _payload(*[_runs((2**28, 1), ledger=ledger) for ledger in range(8)])
    assert parses(codec.decode_payload, payload) is None
    assert peak_bytes(lambda: codec.decode_payload(payload)) < codec.BITMAP_BYTES_MAX + PEAK_BYTES_MAX
    one = codec.decode_payload(_payload(_runs((2**28, 1))))  # one of them alone decodes
    assert codec.positions_of(one).__next__() == Position(7, 2**28)


def test_cursor_znode_huge_ids_are_rejected_before_allocating():
    for data in HUGE_ZNODES:
        assert parses(codec.decode_znode, data) is None, data
        assert peak_bytes(lambda: codec.decode_znode(data)) < PEAK_BYTES_MAX


def _bomb(size: int) -> bytes:
    """A zlib stream of `size` zero bytes (about size / 1000 bytes long), compressed in slices."""
    deflate = zlib.compressobj(1)
    chunk = bytes(1 << 20)
    return b"".join([deflate.compress(chunk) for _ in range(size >> 20)] + [deflate.flush()])


def test_cursor_snapshot_decompression_stops_at_the_header_size():
    bomb = _bomb(64 << 20)
    head = codec._HEAD.pack(codec.MAGIC, codec.SNAPSHOT, codec.FORMAT_VERSION)
    for claimed in (100, 1 << 30, 2**32 - 1):  # 1 GiB and 4 GiB: over PAYLOAD_BYTES_MAX
        entry = head + codec._SNAP.pack(1, zlib.crc32(bomb), claimed) + bomb
        parsed = codec.parse_entry(entry)
        assert parses(codec.unpack_single, parsed) is None
        assert peak_bytes(lambda: codec.unpack_single(parsed)) < PEAK_BYTES_MAX


def test_message_entry_huge_counts_fail_fast():
    header = msg_fmt._FIXED.pack(msg_fmt.MAGIC, 1, 0, 0, 0, 2**32 - 1) + msg_fmt._U16.pack(0) * 2
    record = msg_fmt._RECORD.pack(2**32 - 1, 0, 0, 1) + msg_fmt._U16.pack(0xFFFF)
    for data in (header, header + record, header + record + bytes(100)):
        assert parses(msg_fmt.decode_entry, data) is None
        assert peak_bytes(lambda: msg_fmt.decode_entry(data)) < PEAK_BYTES_MAX
