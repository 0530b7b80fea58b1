"""formats/journal.py: file header, every record type, the record-level rules of `scan_records` (version 1
files, and the audit's record search), and the group frames and torn-last-group rules of `scan_journal`
(version 2, PROTOCOL.md §2.2 "Replay on restart"), checked directly at the format level."""
from __future__ import annotations

import random
import re

import pytest

from bksim.formats import entry as entry_fmt
from bksim.formats import journal as fmt
from bksim.model.errors import FormatError, JournalCorruptError
from bksim.model.status import FLAG_RECOVERY_ADD

INSTANCE = "6f1c2a9e-0d4b-4c55-9a77-3b1e2f4d5c6a"
H = fmt.FILE_HEADER_BYTES


def entry(ledger_id: int, entry_id: int, payload: bytes = b"payload") -> bytes:
    return entry_fmt.encode_entry(ledger_id, entry_id, entry_id - 1, 100 * (entry_id + 1), payload)


def records() -> list[bytes]:
    """One of each record type, as a bookie writes them."""
    return [fmt.master_key_record(5, b"k" * 32), fmt.entry_record(entry(5, 0), 0),
            fmt.entry_record(entry(5, 1), FLAG_RECOVERY_ADD), fmt.fence_record(5),
            fmt.explicit_lac_record(5, 1), fmt.encode_record(fmt.RecordType.PADDING, 0, bytes(8))]


def journal(*recs: bytes) -> bytes:
    return fmt.encode_file_header(INSTANCE) + b"".join(recs)


def offsets(recs: list[bytes]) -> list[int]:
    out, pos = [], H
    for r in recs:
        out.append(pos)
        pos += len(r)
    return out


# -- names and header ---------------------------------------------------------------------------------------
def test_file_names():
    assert fmt.journal_file_name(0x1a) == "000000000000001a.txn"
    assert fmt.parse_journal_file_name("000000000000001a.txn") == 0x1a
    for name in ("1a.txn", "000000000000001a.log", "zzzzzzzzzzzzzzzz.txn", "000000000000001a.txn.tmp"):
        assert fmt.parse_journal_file_name(name) is None, name


def test_file_header_round_trip():
    header = fmt.encode_file_header(INSTANCE)
    assert len(header) == H == 32 and header.startswith(b"BKJN")
    assert fmt.decode_file_header(header) == INSTANCE
    assert fmt.decode_file_header(header + b"records follow") == INSTANCE


@pytest.mark.parametrize("data, words", [
    (b"", "journal header is 0 bytes"),
    (b"BKJN\0\0\0\1", "journal header is 8 bytes"),
    (b"XXXX" + bytes(28), "bad journal magic"),
    (bytes(32), "bad journal magic"),
    (b"BKJN\0\0\0\x07" + bytes(24), "unsupported journal format version 7"),
])
def test_file_header_garbage_rejected(data, words):
    with pytest.raises(FormatError, match=words):
        fmt.decode_file_header(data)


# -- records ------------------------------------------------------------------------------------------------
def test_every_record_type_round_trips():
    recs = records()
    data = journal(*recs)
    result = fmt.scan_records(data, H, newest=False)
    assert (result.end, result.torn, result.skipped) == (len(data), None, [])
    got = result.records
    assert [r.type for r in got] == [fmt.RecordType.MASTER_KEY, fmt.RecordType.ENTRY, fmt.RecordType.ENTRY,
                                     fmt.RecordType.FENCE, fmt.RecordType.EXPLICIT_LAC, fmt.RecordType.PADDING]
    assert [r.offset for r in got] == offsets(recs)
    assert [r.end - r.offset for r in got] == [len(r) for r in recs]
    assert [r.flags for r in got] == [0, 0, FLAG_RECOVERY_ADD, 0, 0, 0]
    assert got[0].body == fmt.LEDGER_ID.pack(5) + b"k" * 32
    assert got[1].body == entry(5, 0) and got[2].body == entry(5, 1)
    assert fmt.LEDGER_ID.unpack(got[3].body) == (5,)
    assert fmt.LEDGER_LAC.unpack(got[4].body) == (5, 1)
    assert got[5].body == bytes(8)
    assert [r.type for r in fmt.iter_file(fmt.encode_file(INSTANCE, [recs]))] == [r.type for r in got]


def test_record_layout():
    rec = fmt.fence_record(9)
    length, crc, rtype, flags = fmt.RECORD_PREFIX.unpack_from(rec)
    assert (length, rtype, flags) == (len(rec) - 4, fmt.RecordType.FENCE, 0)
    from bksim.formats.crc import crc32c
    assert crc == crc32c(rec[8:])  # type ‖ flags ‖ body


def test_scan_from_a_mark_in_the_middle():
    recs = records()
    data = journal(*recs)
    start = offsets(recs)[3]
    result = fmt.scan_records(data, start, newest=True)
    assert [r.offset for r in result.records] == offsets(recs)[3:]
    assert fmt.scan_records(data, len(data), newest=True).records == []


def test_header_only_and_empty_scan():
    result = fmt.scan_records(journal(), H, newest=True)
    assert (result.records, result.end, result.torn) == ([], H, None)
    assert list(fmt.iter_file(journal())) == []
    with pytest.raises(FormatError):
        list(fmt.iter_file(b""))


# -- torn tails (newest file): end the scan, reported, not fatal ----------------------------------------------
def _torn_cases():
    recs = records()
    good = journal(*recs)
    last = fmt.entry_record(entry(5, 2, b"x" * 50), 0)
    yield "short header", good + last[:7], "short record header"
    yield "length field only", good + last[:4], "short record header"
    yield "length past EOF", good + last[:-1], "runs past end of file"
    yield "body half written", good + last[:20], "runs past end of file"
    yield "zero tail", good + bytes(40), "invalid record length 0"
    yield "short zero tail", good + bytes(3), "short record header"
    bad_crc = bytearray(last)
    bad_crc[-1] ^= 0x55
    yield "CRC-bad last record", good + bytes(bad_crc), "CRC mismatch"
    zero_body = last[:fmt.RECORD_PREFIX_BYTES] + bytes(len(last) - fmt.RECORD_PREFIX_BYTES)
    yield "length written, body zeros", good + zero_body, "CRC mismatch"
    yield "CRC-bad record then zeros", good + bytes(bad_crc) + bytes(64), "CRC mismatch"


@pytest.mark.parametrize("name, data, why", list(_torn_cases()), ids=[c[0] for c in _torn_cases()])
def test_torn_tail_in_newest_file(name, data, why):
    good_end = len(journal(*records()))
    result = fmt.scan_records(data, H, newest=True)
    assert len(result.records) == len(records())
    assert result.end == good_end
    assert result.torn is not None and result.torn.startswith("torn tail") and why in result.torn
    assert result.skipped == []


@pytest.mark.parametrize("name, data, why", list(_torn_cases()), ids=[c[0] for c in _torn_cases()])
def test_torn_tail_in_older_file_is_corruption(name, data, why):
    with pytest.raises(JournalCorruptError, match="not the newest"):
        fmt.scan_records(data, H, newest=False, name="j1.txn")


# -- corruption: refuse, unless skip_corruption (then loudly skipped) ---------------------------------------
def _crc_bad_middle() -> tuple[bytes, list[bytes], int]:
    recs = records()
    data = bytearray(journal(*recs))
    bad = offsets(recs)[1]  # the first ENTRY record; valid records follow it
    data[bad + fmt.RECORD_PREFIX_BYTES + 3] ^= 0xFF
    return bytes(data), recs, bad


@pytest.mark.parametrize("newest", [True, False])
def test_crc_bad_record_followed_by_a_valid_record_refuses(newest):
    data, recs, bad = _crc_bad_middle()
    with pytest.raises(JournalCorruptError) as info:
        fmt.scan_records(data, H, newest=newest, name="0000000000000001.txn")
    message = str(info.value)
    assert "0000000000000001.txn" in message and f"CRC mismatch at offset {bad}" in message
    assert f"followed by a valid record at offset {offsets(recs)[2]}" in message


def test_skip_corruption_skips_loudly_and_continues():
    data, recs, bad = _crc_bad_middle()
    result = fmt.scan_records(data, H, newest=True, skip_corruption=True)
    assert [r.offset for r in result.records] == [o for o in offsets(recs) if o != bad]
    assert result.end == len(data) and result.torn is None
    assert len(result.skipped) == 1 and f"CRC mismatch at offset {bad}" in result.skipped[0]


def test_skip_corruption_in_older_file_with_a_bad_tail_keeps_the_good_records():
    data = journal(*records()) + b"\xff" * 13
    result = fmt.scan_records(data, H, newest=False, skip_corruption=True)
    assert len(result.records) == len(records())
    assert result.end == len(data) and len(result.skipped) == 1


def test_unknown_record_type_with_valid_crc_is_corruption():
    data = journal(*records(), fmt.encode_record(99, 0, b"??"))
    with pytest.raises(JournalCorruptError, match="unknown record type 99"):
        fmt.scan_records(data, H, newest=True)


def test_non_zero_garbage_tail_with_an_impossible_length_is_corruption():
    data = journal(*records()) + b"\0\0\0\x02" + b"\x01" * 20  # length 2 < the 6-byte minimum, not zeros
    with pytest.raises(JournalCorruptError, match="invalid record length 2"):
        fmt.scan_records(data, H, newest=True)


# -- garbage ------------------------------------------------------------------------------------------------
def test_random_bytes_only_raise_format_error():
    rng = random.Random(7)
    good = journal(*records())
    outcomes = {"ok": 0, "torn": 0, "corrupt": 0}
    for i in range(2000):
        if i % 2:
            data = rng.randbytes(rng.randrange(0, 120))  # pure noise, header included
        else:  # a valid file with a few bytes changed or cut
            data = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[:rng.randrange(H, len(data) + 1)])
        scan = fmt.scan_records if i % 4 < 2 else fmt.scan_journal
        if scan is fmt.scan_journal and not i % 2:
            data = fmt.encode_file(INSTANCE, [records()[:3], records()[3:]])[:len(data)]
            data = data[:H] + bytes(b ^ (rng.randrange(256) if rng.random() < 0.02 else 0) for b in data[H:])
        try:
            fmt.decode_file_header(data)
            result = scan(data, H, newest=bool(rng.randrange(2)), skip_corruption=bool(rng.randrange(2)))
        except FormatError:
            outcomes["corrupt"] += 1
            continue
        outcomes["torn" if result.torn else "ok"] += 1
        assert H <= result.end <= max(len(data), H)
        for r in result.records:
            assert r.offset < r.end <= len(data)
    assert all(outcomes.values()), outcomes  # every outcome was reached


# -- version 2: group frames --------------------------------------------------------------------------------
def test_a_framed_group_is_its_group_record_then_its_records():
    recs = records()
    assert fmt.framed_group(recs) == fmt.group_record(recs) + b"".join(recs)
    assert fmt.framed_group([recs[0]]) == fmt.group_record([recs[0]]) + recs[0]


def test_a_framed_groups_parts_are_its_group_record_and_its_records():
    recs = records()
    assert fmt.framed_group_parts(recs) == (fmt.group_record(recs), b"".join(recs))
    assert b"".join(fmt.framed_group_parts(recs)) == fmt.framed_group(recs)


def test_group_frame_layout_and_round_trip():
    recs = records()
    frame = fmt.group_record(recs)
    length, _crc, rtype, _flags = fmt.RECORD_PREFIX.unpack_from(frame)
    assert (len(frame), length, rtype) == (fmt.GROUP_RECORD_BYTES, fmt.GROUP_RECORD_BYTES - 4, fmt.RecordType.GROUP)
    from bksim.formats.crc import crc32c
    assert fmt.GROUP_BODY.unpack_from(frame, fmt.RECORD_PREFIX_BYTES) == (len(b"".join(recs)), crc32c(b"".join(recs)))
    data = fmt.encode_file(INSTANCE, [recs[:2], recs[2:]])
    assert fmt.file_version(data) == fmt.VERSION == 2
    result = fmt.scan_journal(data, H, newest=False)
    assert (result.end, result.torn, result.skipped) == (len(data), None, [])
    second = H + fmt.GROUP_RECORD_BYTES + len(recs[0]) + len(recs[1])
    assert [r.group for r in result.records] == [H, H] + [second] * 4  # GROUP records themselves are not returned
    assert [r.body for r in result.records] == [r.body for r in fmt.scan_records(journal(*recs), H, False).records]
    assert fmt.scan_journal(data, second, newest=True).records == result.records[2:]  # a mark at a group start


def test_version_1_files_are_still_read_by_their_own_rules():
    recs = records()
    data = fmt.FILE_HEADER.pack(fmt.MAGIC, 1, bytes(16)) + b"".join(recs) + recs[1][:9]
    assert fmt.file_version(data) == 1
    result = fmt.scan_journal(data, H, newest=True)
    assert len(result.records) == len(recs) and "short record header" in result.torn


def test_a_crc_passing_group_with_an_invalid_record_inside_is_corruption_even_last():
    junk = fmt.RECORD_PREFIX.pack(fmt.LENGTH_MIN, 0, fmt.RecordType.FENCE, 0)  # a record whose CRC is wrong
    data = fmt.encode_file(INSTANCE, [records(), [junk]])
    with pytest.raises(JournalCorruptError, match="passes its CRC but holds an invalid record"):
        fmt.scan_journal(data, H, newest=True)


def test_a_group_frame_inside_the_torn_region_counts_as_a_later_group():
    """Where the last group's frame never landed, any valid GROUP record after it means a later group exists, so
    the damage is not the last group's: refused (the safe side), never truncated."""
    recs = records()
    good = fmt.encode_file(INSTANCE, [recs])
    later = fmt.group_record([recs[0]]) + recs[0]
    with pytest.raises(JournalCorruptError, match=f"followed by more of the journal at offset {len(good) + 512}"):
        fmt.scan_journal(good + bytes(512) + later, H, newest=True)
    torn = fmt.scan_journal(good + bytes(512) + recs[0], H, newest=True)  # records alone carry no frame
    assert torn.end == len(good) and "torn last group" in torn.torn


def test_skip_corruption_keeps_the_records_of_a_damaged_group_that_pass_their_own_crc():
    recs = records()
    data = bytearray(fmt.encode_file(INSTANCE, [recs, [recs[0]]]))
    bad = H + fmt.GROUP_RECORD_BYTES + len(recs[0])  # the first ENTRY record of group 1
    data[bad + fmt.RECORD_PREFIX_BYTES + 3] ^= 0xFF
    with pytest.raises(JournalCorruptError, match=f"group at offset {H} fails its CRC, followed by more"):
        fmt.scan_journal(bytes(data), H, newest=True)
    result = fmt.scan_journal(bytes(data), H, newest=True, skip_corruption=True)
    assert [r.type for r in result.records] == [r.type for r in fmt.scan_records(journal(*recs), H, False).records
                                                if r.offset != offsets(recs)[1]] + [fmt.RecordType.MASTER_KEY]
    assert len(result.skipped) == 1 and "kept 5 records" in result.skipped[0] and result.torn is None



@pytest.mark.parametrize("damage, why", [
    ("fence of ledger 0", "no group frame at offset {at} (a FENCE record of 8 bytes)"),  # its body reads (0, crc 0)
    ("length one more", "CRC mismatch at offset {at}"),
    ("stored CRC flipped", "CRC mismatch at offset {at}"),
])
def test_only_a_valid_group_record_frames_a_group(damage, why):
    recs = records()
    good = fmt.encode_file(INSTANCE, [recs])
    frame = bytearray(fmt.group_record([recs[3]]))
    if damage == "fence of ledger 0":
        frame = fmt.fence_record(0)
    elif damage == "length one more":
        frame[3] += 1
    else:
        frame[4] ^= 0x10
    later = len(good) + len(frame) + len(recs[3])
    data = good + bytes(frame) + recs[3] + fmt.group_record([recs[3]]) + recs[3]
    with pytest.raises(JournalCorruptError, match=re.escape(why.format(at=len(good))) +
                       f".*, followed by more of the journal at offset {later}$"):
        fmt.scan_journal(data, H, newest=True)


def damaged_journals(seed: int, count: int):
    """Version 2 files of a few groups with damage of every kind: flipped bits, zeroed runs, cuts, inserted bytes,
    trailing zeros, a later valid group, records that pass for a frame but are none, and groups whose frame is
    valid but whose records are not."""
    rng = random.Random(seed)
    for _ in range(count):
        recs = records()
        groups = [[recs[rng.randrange(len(recs))] for _ in range(rng.randrange(1, 4))]
                  for _ in range(rng.randrange(1, 6))]
        data = bytearray(fmt.encode_file(INSTANCE, groups))
        for _ in range(rng.randrange(0, 3)):
            at, op = rng.randrange(H, len(data)), rng.randrange(9)
            if op == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif op == 1:
                data[at:at + 64] = bytes(len(data[at:at + 64]))
            elif op == 2:
                del data[max(at, H + 1):]
            elif op == 3:
                data[at:at] = rng.randbytes(rng.randrange(1, 20))
            elif op == 4:
                data += bytes(rng.randrange(1, 100))
            elif op == 5:
                data += fmt.group_record([recs[3]]) + recs[3]
            elif op == 6:  # a record of a frame's size where a frame should start (as a frame: an empty group)
                data += fmt.fence_record(0)
            elif op == 7:  # a frame whose length field claims a byte more than its CRC covers
                frame = bytearray(fmt.group_record([recs[3]]))
                frame[3] += 1
                data += frame + recs[3]
            else:  # a group whose frame is valid, after a good record: one that fails its own CRC, a GROUP record,
                # a record cut short or crossing the group's end, or records valid alone that fail the group's CRC
                good, cut = recs[rng.randrange(len(recs))], recs[rng.randrange(len(recs))]
                bad = bytearray(recs[1])
                bad[-1] ^= 1
                framed, written = rng.choice([([good, bytes(bad)], None), ([good, fmt.group_record([good])], None),
                                              ([good, cut[:5]], None), ([good, cut[:-3]], [good, cut]),
                                              ([recs[3]], [fmt.fence_record(6)])])
                data += fmt.group_record(framed) + b"".join(written or framed)
        yield bytes(data), rng.randrange(2) == 1, rng.randrange(2) == 1


def scan_outcome(data, newest: bool, skip: bool):
    try:
        result = fmt.scan_journal(data, H, newest, skip)
    except JournalCorruptError as e:
        return str(e)
    return result.records, result.end, result.torn, result.skipped


def test_complete_groups_read_inline_scan_exactly_as_judged_group_by_group():
    """scan_journal reads runs of complete groups of a bytes object inline; any other buffer (a bytearray) is
    judged group by group with the reasons spelled out. Both must see every damaged file alike."""
    outcomes = set()
    for data, newest, skip in damaged_journals(11, 600):
        inline = scan_outcome(data, newest, skip)
        assert inline == scan_outcome(bytearray(data), newest, skip)
        outcomes.add("raised" if isinstance(inline, str) else "torn" if inline[2] else
                     "skipped" if inline[3] else "whole")
    assert outcomes == {"raised", "torn", "skipped", "whole"}


# -- JournalScan: scan_journal a batch at a time (replay) ------------------------------------------------------
def scan_in_batches(data, newest: bool, skip: bool, batch_bytes: int):
    """(what scan_outcome returns, the batches yielded, before an error too)."""
    scan = fmt.JournalScan(data, H, newest, skip, batch_bytes=batch_bytes)
    batches = []
    try:
        for batch in scan:
            batches.append(batch)
    except JournalCorruptError as e:
        return str(e), batches
    return ([r for b in batches for r in b], scan.end, scan.torn, scan.skipped), batches


def test_journal_scan_yields_what_scan_journal_returns_whatever_the_damage():
    for data, newest, skip in damaged_journals(12, 400):
        expected = scan_outcome(data, newest, skip)
        for batch_bytes in (1, 90, 1 << 20, 0):
            outcome, batches = scan_in_batches(data, newest, skip, batch_bytes)
            assert outcome == expected
            assert all(batches)  # never an empty list


def test_journal_scan_batches_are_whole_groups_of_about_batch_bytes():
    recs = records()
    groups = [[recs[i % len(recs)] for i in range(n % 5 + 1)] for n in range(60)]
    data = fmt.encode_file(INSTANCE, groups)
    largest = max(fmt.GROUP_RECORD_BYTES + sum(map(len, g)) for g in groups)
    for batch_bytes in (1, 200, 1000, 5000):
        (records_, end, torn, skipped), batches = scan_in_batches(data, False, False, batch_bytes)
        assert records_ == fmt.scan_journal(data, H, False).records and (end, torn, skipped) == (len(data), None, [])
        starts = [b[0].group for b in batches]
        for batch, nxt in zip(batches, starts[1:] + [len(data)]):
            assert batch[-1].end == nxt  # a batch ends where the next group begins: no group is split
            assert nxt - batch[0].group < batch_bytes + largest
        assert len(batches) >= min(len(groups), len(data) // (batch_bytes + largest))


def test_journal_scan_raises_at_the_damage_after_yielding_what_precedes_it():
    recs = records()
    data = bytearray(fmt.encode_file(INSTANCE, [recs] * 6))
    group_bytes = fmt.GROUP_RECORD_BYTES + sum(map(len, recs))
    third = H + 3 * group_bytes
    data[third + fmt.GROUP_RECORD_BYTES + 12] ^= 0x01
    outcome, batches = scan_in_batches(bytes(data), False, False, 1)
    assert f"group at offset {third} fails its CRC" in outcome
    assert [b[0].group for b in batches] == [H, H + group_bytes, H + 2 * group_bytes]
    (kept, _end, _torn, skipped), batches = scan_in_batches(bytes(data), False, True, 1)
    assert len(skipped) == 1 and [b[0].group for b in batches] == [H + i * group_bytes for i in range(6)]
    assert len(kept) == 6 * len(recs) - 1
