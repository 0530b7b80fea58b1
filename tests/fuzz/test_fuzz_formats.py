"""Fuzzing of the bookie's byte formats (formats/entry.py, journal.py, entry_log.py, index.py), lastmark, and
their readers: journal replay (bookie/replay.py), the bookie's entry-log reader (bookie/entry_log.py) and the
audit's (audit/parse.py: damage is a finding, never an exception).

For each parser: arbitrary bytes, valid encodings mutated (tests/fuzz/mutations.py) and round trips of valid
values. Property: the parser returns a value (equal to what was encoded, for a round trip) or raises
FormatError (JournalCorruptError for journal corruption); any other exception fails the test.
"""
from __future__ import annotations

import asyncio
import os
import struct
import tempfile

from hypothesis import example, given
from hypothesis import strategies as st

from bksim.adapters.localdisk import LocalDisk
from bksim.audit.parse import ENTRYLOG, JOURNAL, FileTask, block_rows, other_rows, parse_file, record_rows
from bksim.bookie.entry_log import EntryLogger
from bksim.bookie.journal import JournalMark
from bksim.bookie.lastmark import decode_lastmark, encode_lastmark
from bksim.bookie.replay import replay
from bksim.formats import entry as entry_fmt
from bksim.formats import entry_log as log_fmt
from bksim.formats import index as index_fmt
from bksim.formats import journal as jfmt
from bksim.model.digest import DIGEST_CRC32C, DIGEST_NONE
from bksim.model.errors import FormatError
from fuzz.mutations import mutated, raw_bytes

INSTANCE = "6f1c2a9e-0d4b-4c55-9a77-3b1e2f4d5c6a"
i64 = st.integers(-(2**63), 2**63 - 1)
ids = st.integers(0, 2**63 - 1)
small_ids = st.integers(0, 1_000)
payloads = st.binary(max_size=64)


def parses(parse, *args, **kwargs):
    """parse(...)'s value, or None when it raised FormatError (the only error a parser may raise)."""
    try:
        return parse(*args, **kwargs)
    except FormatError:
        return None


# ---------------------------------------------------------------------------------------------- entry
entries = st.builds(entry_fmt.encode_entry, small_ids, small_ids, st.integers(-1, 1_000), st.integers(0, 10**6),
                    payloads)


@given(st.one_of(raw_bytes(), mutated(entries)), st.sampled_from([DIGEST_CRC32C, DIGEST_NONE]))
def test_entry_decode_or_format_error(data, digest_type):
    parses(entry_fmt.parse_ids, data)
    parses(entry_fmt.decode_entry, data, digest_type)
    parses(entry_fmt.decode_entry, data, digest_type, ledger_id=1, entry_id=1)


@given(ids, ids, i64, i64, payloads, st.sampled_from([DIGEST_CRC32C, DIGEST_NONE]))
def test_entry_round_trip(ledger_id, entry_id, lac, length, payload, digest_type):
    data = entry_fmt.encode_entry(ledger_id, entry_id, lac, length, payload, digest_type)
    assert entry_fmt.decode_entry(data, digest_type, ledger_id, entry_id) == entry_fmt.Entry(
        ledger_id, entry_id, lac, length, payload)
    assert entry_fmt.parse_ids(data) == (ledger_id, entry_id, lac)


# ---------------------------------------------------------------------------------------------- journal
def _record_of(kind: str, ledger_id: int, entry_id: int, value: int, payload: bytes) -> bytes:
    if kind == "entry":
        return jfmt.entry_record(entry_fmt.encode_entry(ledger_id, entry_id, entry_id - 1, value, payload), value & 1)
    if kind == "master_key":
        return jfmt.master_key_record(ledger_id, payload)
    if kind == "fence":
        return jfmt.fence_record(ledger_id)
    if kind == "lac":
        return jfmt.explicit_lac_record(ledger_id, value)
    return jfmt.encode_record(jfmt.RecordType.PADDING, 0, bytes(len(payload)))


journal_records = st.builds(_record_of, st.sampled_from(["entry", "master_key", "fence", "lac", "padding"]),
                            small_ids, small_ids, st.integers(0, 1_000), payloads)
journal_groups = st.lists(st.lists(journal_records, min_size=1, max_size=4), max_size=4)
journal_files = journal_groups.map(lambda groups: jfmt.encode_file(INSTANCE, groups))
v1_files = st.lists(journal_records, max_size=8).map(
    lambda recs: jfmt.FILE_HEADER.pack(jfmt.MAGIC, 1, bytes(16)) + b"".join(recs))


def _replay_view(data: bytes, newest: bool, skip_corruption: bool) -> None:
    """What replay does with a journal file: header, records, and every record's body by its type."""
    try:
        jfmt.decode_file_header(data)
        records = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest, skip_corruption).records
    except FormatError:
        return
    for record in records:
        assert record.type is not jfmt.RecordType.GROUP
        parses(jfmt.check_body, record)


@given(st.one_of(raw_bytes(), mutated(journal_files), mutated(v1_files)), st.booleans(), st.booleans())
def test_journal_scan_or_format_error(data, newest, skip_corruption):
    _replay_view(data, newest, skip_corruption)
    parses(jfmt.scan_records, data, min(len(data), jfmt.FILE_HEADER_BYTES), newest, skip_corruption)


def _engine_apply(record: jfmt.JournalRecord) -> None:
    """The unpacking the engine's replay does with each record's body (bookie/engine.py _apply_records,
    _apply_ledger_record)."""
    if record.type is jfmt.RecordType.ENTRY:
        entry_fmt.IDS.unpack_from(record.body)
    elif record.type in (jfmt.RecordType.MASTER_KEY, jfmt.RecordType.FENCE):
        jfmt.LEDGER_ID.unpack_from(record.body)
    elif record.type is jfmt.RecordType.EXPLICIT_LAC:
        jfmt.LEDGER_LAC.unpack_from(record.body)


# records whose CRC holds but whose body is too short for their type: replay handed them on, and the engine's
# unpacking raised struct.error
SHORT_BODIES = [jfmt.encode_file(INSTANCE, [[jfmt.encode_record(jfmt.RecordType.FENCE, 0, b"\0\0\0\x07")]]),
                jfmt.encode_file(INSTANCE, [[jfmt.entry_record(b"\0" * 20, 0)]]),
                jfmt.encode_file(INSTANCE, [[jfmt.fence_record(1), jfmt.encode_record(jfmt.RecordType.EXPLICIT_LAC,
                                                                                      0, bytes(12))]])]


@given(st.one_of(mutated(journal_files), st.sampled_from(SHORT_BODIES)), st.booleans())
@example(SHORT_BODIES[0], False)
@example(SHORT_BODIES[0], True)
@example(SHORT_BODIES[1], False)
def test_journal_replay_applies_or_refuses(data, skip_corruption):
    """Replay of a (damaged) newest journal hands `apply` only records it can unpack, or refuses with
    JournalCorruptError (a FormatError)."""
    applied = []

    async def apply(record, mark_after):
        _engine_apply(record)
        applied.append(record)

    with tempfile.TemporaryDirectory(prefix="bksim-fuzz-") as journal_dir:
        with open(os.path.join(journal_dir, jfmt.journal_file_name(1)), "wb") as f:
            f.write(data)
        try:
            report = asyncio.run(replay(LocalDisk(), journal_dir, JournalMark(0, 0), INSTANCE, apply, skip_corruption,
                                        lambda line: None))
        except FormatError:
            return
    assert report.records == len(applied)
    if data in SHORT_BODIES:
        assert skip_corruption and report.skipped and "body of" in report.skipped[0]


@given(journal_groups)
def test_journal_round_trip(groups):
    data = jfmt.encode_file(INSTANCE, groups)
    assert jfmt.same_instance(jfmt.decode_file_header(data), INSTANCE)
    scan = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=False)
    assert (scan.end, scan.torn, scan.skipped) == (len(data), None, [])
    assert [jfmt.encode_record(r.type, r.flags, r.body) for r in scan.records] == [r for g in groups for r in g]
    for record in scan.records:
        jfmt.check_body(record)


# ---------------------------------------------------------------------------------------------- entry logs
ledger_maps = st.dictionaries(i64, i64, max_size=8)
log_entries = st.lists(entries, max_size=6)


@st.composite
def entry_logs(draw) -> bytes:
    body = b"".join(log_fmt.encode_record(e) for e in draw(log_entries))
    if not draw(st.booleans()):
        return log_fmt.encode_header() + body
    live = draw(ledger_maps)
    return log_fmt.encode_header(log_fmt.HEADER_BYTES + len(body), len(live)) + body + log_fmt.encode_ledger_map(live)


@given(st.one_of(raw_bytes(), mutated(entry_logs())))
def test_entry_log_scan_or_format_error(data):
    parses(log_fmt.decode_header, data)
    parses(log_fmt.scan, data)
    parses(log_fmt.decode_ledger_map, data[4:])
    parses(log_fmt.check_record, data, 1, 1, len(data) - 4)


# a sealed log whose header puts the ledger map past the end of the file: the map's length field read short
MAP_PAST_END = log_fmt.encode_header(10**6, 1) + log_fmt.encode_record(entry_fmt.encode_entry(1, 0, -1, 1, b"x"))


@given(st.one_of(raw_bytes(), mutated(entry_logs())))
@example(MAP_PAST_END)
def test_entry_logger_reads_any_log(data):
    """The bookie's own reader of sealed logs (bookie/entry_log.py): a map or None, records up to the damage."""
    with tempfile.TemporaryDirectory(prefix="bksim-fuzz-") as directory:
        logger = EntryLogger(LocalDisk(), directory, 1 << 20)
        with open(logger.path(1), "wb") as f:
            f.write(data)
        found = logger.ledger_map(1)
        assert found is None or isinstance(found, dict)
        records = list(logger.records(logger.path(1)))
        assert all(offset + 4 + length <= len(data) for offset, _, _, length, _ in records)
        logger.scan_ledger_bytes(1)


@given(log_entries, ledger_maps)
def test_entry_log_round_trip(records, live):
    body = b"".join(log_fmt.encode_record(e) for e in records)
    data = log_fmt.encode_header(log_fmt.HEADER_BYTES + len(body), len(live)) + body + log_fmt.encode_ledger_map(live)
    header, scanned, why = log_fmt.scan(data)
    assert (header.ledger_map_offset, header.ledger_count, why) == (log_fmt.HEADER_BYTES + len(body), len(live), None)
    assert [r.entry for r in scanned[:-1]] == records and scanned[-1].ledger_map == live
    for r in scanned[:-1]:
        record = data[r.offset:r.offset + 4 + len(r.entry)]
        assert log_fmt.check_record(record, r.ledger_id, r.entry_id, len(r.entry)) == r.entry


# ---------------------------------------------------------------------------------------------- index
locations = st.builds(index_fmt.Location, st.integers(0, 2**32 - 1), i64, st.integers(0, 2**32 - 1))
ledger_records = st.builds(index_fmt.LedgerRecord, st.binary(max_size=255), st.booleans(), st.none() | i64)
index_values = st.one_of(locations.map(index_fmt.encode_location), ledger_records.map(index_fmt.encode_ledger),
                         ledger_maps.map(index_fmt.encode_log_meta), st.builds(index_fmt.location_key, i64, i64))


@given(st.one_of(raw_bytes(64), mutated(index_values)))
def test_index_decode_or_format_error(data):
    for decode in (index_fmt.decode_location_key, index_fmt.decode_location, index_fmt.decode_ledger_key,
                   index_fmt.decode_ledger, index_fmt.decode_log_meta_key, index_fmt.decode_log_meta):
        parses(decode, data)


@given(locations, ledger_records, ledger_maps, i64, i64)
def test_index_round_trip(location, record, live, ledger_id, entry_id):
    assert index_fmt.decode_location(index_fmt.encode_location(location)) == location
    assert index_fmt.decode_ledger(index_fmt.encode_ledger(record)) == record
    assert index_fmt.decode_log_meta(index_fmt.encode_log_meta(live)) == live
    assert index_fmt.decode_location_key(index_fmt.location_key(ledger_id, entry_id)) == (ledger_id, entry_id)
    assert index_fmt.decode_ledger_key(index_fmt.ledger_key(ledger_id)) == ledger_id


# ---------------------------------------------------------------------------------------------- lastmark
marks = st.builds(JournalMark, i64, i64)


@given(st.one_of(raw_bytes(32), mutated(marks.map(encode_lastmark))))
def test_lastmark_decode_or_format_error(data):
    parses(decode_lastmark, data)


@given(marks)
def test_lastmark_round_trip(mark):
    assert decode_lastmark(encode_lastmark(mark)) == mark


# ---------------------------------------------------------------------------------------------- the audit's reader
@given(st.one_of(raw_bytes(), mutated(journal_files), mutated(v1_files), st.sampled_from(SHORT_BODIES)),
       st.booleans(), st.booleans())
def test_audit_parses_any_journal(data, newest, below_mark):
    """The audit (audit/parse.py) reports damage as findings: it never raises on a file's bytes."""
    task = FileTask(path="/fuzz/1.txn", uri="/fuzz/1.txn", bookie="b1", kind=JOURNAL, file_id=1, size=len(data),
                    newest=newest, below_mark=below_mark, instance_id=INSTANCE)
    result = parse_file(task, data)
    list(record_rows(result)), list(other_rows(result)), list(block_rows(result))


@given(st.one_of(raw_bytes(), mutated(entry_logs()), st.just(MAP_PAST_END)))
def test_audit_parses_any_entry_log(data):
    task = FileTask(path="/fuzz/1.log", uri="/fuzz/1.log", bookie="b1", kind=ENTRYLOG, file_id=1, size=len(data))
    result = parse_file(task, data)
    list(record_rows(result)), list(other_rows(result)), list(block_rows(result))
