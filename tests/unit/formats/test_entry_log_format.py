"""formats/entry_log.py: header, records, the ledger map, check_record (index vs log) and scan()."""
from __future__ import annotations

import random

import pytest

from bksim.formats import entry as entry_fmt
from bksim.formats import entry_log as fmt
from bksim.model.errors import FormatError


def entry(ledger_id: int, entry_id: int, payload: bytes = b"data") -> bytes:
    return entry_fmt.encode_entry(ledger_id, entry_id, entry_id - 1, 0, payload)


def test_file_names():
    assert fmt.entry_log_file_name(0x2f) == "2f.log"
    assert fmt.parse_entry_log_file_name("2f.log") == 0x2f
    for name in ("2f.txn", "zz.log", "lastmark", ".log"):
        assert fmt.parse_entry_log_file_name(name) is None, name


def test_header_round_trip():
    header = fmt.encode_header()
    assert len(header) == fmt.HEADER_BYTES == 64 and header.startswith(b"BKEL")
    assert fmt.decode_header(header) == fmt.LogHeader(fmt.VERSION, 0, 0)
    assert fmt.decode_header(fmt.encode_header(123456, 7)) == fmt.LogHeader(fmt.VERSION, 123456, 7)


@pytest.mark.parametrize("data, words", [
    (b"", "0 bytes, need 64"),
    (fmt.encode_header()[:63], "63 bytes, need 64"),
    (b"BKJN" + fmt.encode_header()[4:], "bad entry log magic"),
    (bytes(64), "bad entry log magic"),
    (b"BKEL\0\0\0\x02" + bytes(56), "unsupported entry log version 2"),
])
def test_header_garbage_rejected(data, words):
    with pytest.raises(FormatError, match=words):
        fmt.decode_header(data)


def test_record_and_check_record_round_trip():
    e = entry(3, 9, b"x" * 100)
    record = fmt.encode_record(e)
    assert record[:4] == len(e).to_bytes(4, "big")
    assert fmt.check_record(record, 3, 9, len(e)) == e


@pytest.mark.parametrize("cut, ledger_id, entry_id, length, words", [
    (0, 3, 9, None, "is short"),        # missing record (read past end of log)
    (19, 3, 9, None, "is short"),       # shorter than length + ids
    (-1, 3, 9, None, "index says"),    # truncated body
    (None, 3, 9, 99, "length 136, index says 99"),
    (None, 4, 9, None, "holds 3:9, index says 4:9"),
    (None, 3, 8, None, "holds 3:9, index says 3:8"),
])
def test_check_record_rejects_short_or_mismatched(cut, ledger_id, entry_id, length, words):
    e = entry(3, 9, b"x" * 100)
    record = fmt.encode_record(e)
    if cut is not None:
        record = record[:cut]
    with pytest.raises(FormatError, match=words):
        fmt.check_record(record, ledger_id, entry_id, len(e) if length is None else length)


def test_ledger_map_round_trip():
    live = {9: 1000, 2: 40, (1 << 62): 7}
    framed = fmt.encode_ledger_map(live)
    body = framed[4:]
    assert int.from_bytes(framed[:4], "big") == len(body)
    assert fmt.decode_ledger_map(body) == live
    assert fmt.decode_ledger_map(fmt.encode_ledger_map({})[4:]) == {}


@pytest.mark.parametrize("body, words", [
    (b"\xff" * 10, "too short"),
    (fmt.encode_ledger_map({1: 2})[4:-1], "malformed"),
    (fmt.encode_ledger_map({1: 2})[4:] + b"\0", "malformed"),
    (fmt.MAP_IDS.pack(5, 6, 0), "malformed"),  # not the -1/-2 marker
])
def test_ledger_map_garbage_rejected(body, words):
    with pytest.raises(FormatError, match=words):
        fmt.decode_ledger_map(body)


def _log(entries: list[bytes], live: dict[int, int] | None) -> tuple[bytes, list[int], int]:
    data = bytearray(fmt.encode_header())
    offsets = []
    for e in entries:
        offsets.append(len(data))
        data += fmt.encode_record(e)
    map_offset = 0
    if live is not None:
        map_offset = len(data)
        data += fmt.encode_ledger_map(live)
        data[:fmt.HEADER_BYTES] = fmt.encode_header(map_offset, len(live))
    return bytes(data), offsets, map_offset


def test_scan_rolled_log():
    entries = [entry(1, 0), entry(1, 1, b"yy"), entry(4, 0, b"")]
    data, offsets, map_offset = _log(entries, {1: 84, 4: 40})
    header, recs, stopped = fmt.scan(data)
    assert header == fmt.LogHeader(fmt.VERSION, map_offset, 2) and stopped is None
    assert [(r.offset, r.ledger_id, r.entry_id, r.entry) for r in recs[:-1]] == [
        (o, *entry_fmt.parse_ids(e)[:2], e) for o, e in zip(offsets, entries)]
    last = recs[-1]
    assert (last.offset, last.entry, last.ledger_map) == (map_offset, None, {1: 84, 4: 40})
    assert [r.entry for r in fmt.iter_entries(data)] == entries


def test_scan_open_log_and_a_torn_end():
    entries = [entry(1, 0), entry(1, 1)]
    data, offsets, _ = _log(entries, None)
    header, recs, stopped = fmt.scan(data)
    assert header.ledger_map_offset == 0 and len(recs) == 2 and stopped is None
    _, recs, stopped = fmt.scan(data[:-3])
    assert len(recs) == 1 and stopped == f"bad record length {len(entries[1])} at offset {offsets[1]}"
    _, recs, stopped = fmt.scan(data + b"\0\0")
    assert len(recs) == 2 and stopped == f"short length field at offset {len(data)}"
    _, recs, stopped = fmt.scan(fmt.encode_header())
    assert (recs, stopped) == ([], None)


def test_random_bytes_only_raise_format_error():
    rng = random.Random(11)
    good, _, _ = _log([entry(1, i) for i in range(4)], {1: 4 * 44})
    stopped = parsed = 0
    for i in range(2000):
        if i % 2:
            data = fmt.encode_header() + rng.randbytes(rng.randrange(0, 100))
        else:
            data = bytearray(good)
            data[rng.randrange(fmt.HEADER_BYTES, len(data))] = rng.randrange(256)
            data = bytes(data[:rng.randrange(0, len(data) + 1)])
        try:
            _, recs, why = fmt.scan(data)
        except FormatError:
            continue
        parsed += 1
        stopped += why is not None
        for r in recs:
            assert fmt.HEADER_BYTES <= r.offset < len(data)
    assert parsed and stopped
