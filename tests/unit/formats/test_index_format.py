"""formats/index.py: location and ledger keys/values, their sort order, and garbage rejection."""
from __future__ import annotations

import random

import pytest

from bksim.formats import index as fmt
from bksim.model.errors import FormatError


def test_location_key_and_value_round_trip():
    key = fmt.location_key(12, 34)
    assert len(key) == 16 and fmt.decode_location_key(key) == (12, 34)
    loc = fmt.Location(log_id=3, offset=1 << 40, length=5 * 1024 * 1024)
    value = fmt.encode_location(loc)
    assert len(value) == 16 and fmt.decode_location(value) == loc
    assert fmt.decode_location_key(fmt.location_key(7, fmt.ENTRY_ID_MAX)) == (7, fmt.ENTRY_ID_MAX)


def test_ledger_key_round_trip():
    assert fmt.decode_ledger_key(fmt.ledger_key(0)) == 0
    assert fmt.decode_ledger_key(fmt.ledger_key((1 << 63) - 1)) == (1 << 63) - 1


def test_location_keys_sort_by_ledger_then_entry_as_unsigned_bytes():
    rng = random.Random(3)
    top = (1 << 63) - 1
    for _ in range(200):
        ids = [(rng.choice([rng.randrange(0, 300), rng.randrange(0, top + 1), 0, top]),
                rng.choice([rng.randrange(0, 300), rng.randrange(0, top + 1), 0, top])) for _ in range(20)]
        by_bytes = sorted(ids, key=lambda p: fmt.location_key(*p))  # bytes compare as unsigned, like RocksDB
        assert by_bytes == sorted(ids)


def test_reverse_seek_key_is_above_every_entry_of_the_ledger_and_below_the_next():
    rng = random.Random(5)
    for _ in range(500):
        ledger = rng.randrange(0, (1 << 63) - 1)
        entry = rng.randrange(0, (1 << 63))
        assert fmt.location_key(ledger, entry) <= fmt.location_key(ledger, fmt.ENTRY_ID_MAX)
        assert fmt.location_key(ledger, fmt.ENTRY_ID_MAX) < fmt.location_key(ledger + 1, 0)


@pytest.mark.parametrize("record", [
    fmt.LedgerRecord(),
    fmt.LedgerRecord(master_key=b"\x01" * 32),
    fmt.LedgerRecord(master_key=b"k", fenced=True),
    fmt.LedgerRecord(master_key=b"k" * 255, explicit_lac=0),
    fmt.LedgerRecord(fenced=True, explicit_lac=-1),
    fmt.LedgerRecord(master_key=b"k", fenced=True, explicit_lac=(1 << 63) - 1),
])
def test_ledger_record_round_trip(record):
    assert fmt.decode_ledger(fmt.encode_ledger(record)) == record


def test_master_key_too_long():
    with pytest.raises(FormatError, match="longer than 255"):
        fmt.encode_ledger(fmt.LedgerRecord(master_key=b"k" * 256))


@pytest.mark.parametrize("decode, value, words", [
    (fmt.decode_location_key, b"\0" * 15, "location key of 15 bytes"),
    (fmt.decode_location_key, b"\0" * 17, "location key of 17 bytes"),
    (fmt.decode_location, b"", "location value of 0 bytes"),
    (fmt.decode_ledger_key, b"\0" * 9, "ledger key of 9 bytes"),
    (fmt.decode_ledger, b"\x01\x01", "ledger value of 2 bytes"),
    (fmt.decode_ledger, b"\x02\x01" + bytes(9), "bad ledger value \\(version 2"),
    (fmt.decode_ledger, b"\x01\x00" + bytes(9), "flags 0x0"),
    (fmt.decode_ledger, fmt.encode_ledger(fmt.LedgerRecord(master_key=b"abc"))[:-1], "master key is 2 bytes, header says 3"),
    (fmt.decode_ledger, fmt.encode_ledger(fmt.LedgerRecord(master_key=b"abc")) + b"!", "master key is 4 bytes"),
])
def test_garbage_rejected(decode, value, words):
    with pytest.raises(FormatError, match=words):
        decode(value)


def test_random_bytes_only_raise_format_error():
    rng = random.Random(13)
    decoders = (fmt.decode_location_key, fmt.decode_location, fmt.decode_ledger_key, fmt.decode_ledger)
    accepted = 0
    for _ in range(4000):
        data = rng.randbytes(rng.choice([0, 1, 8, 11, 12, 16, rng.randrange(0, 40)]))
        for decode in decoders:
            try:
                decode(data)
                accepted += 1
            except FormatError:
                pass
    assert accepted  # right-sized keys/values decode: the loop exercised both paths
