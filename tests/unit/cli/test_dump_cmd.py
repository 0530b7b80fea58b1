"""`bksim journal dump`, `bksim entrylog dump`, `bksim lastmark` over files written by the real engine
(LocalDisk, SystemClock, RocksDB in a tmp dir) or built with the format functions, through cli.main.main."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import uuid

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.cli.main import main
from bksim.formats import entry as entry_fmt
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt
from bksim.model.config import BookieConfig
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode

KEY = b"secret-master-key-do-not-print!!"
INSTANCE = str(uuid.UUID(int=0x1234))


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return entry_fmt.encode_entry(ledger_id, entry_id, entry_id - 1, 0, payload)


async def _write_bookie(base: str, **overrides) -> None:
    """Ledger 5: entries 0..2, a RECOVERY_ADD of 3, explicit LAC 2; ledger 6: fenced (never written)."""
    config = dataclasses.replace(BookieConfig(), **overrides)
    engine = BookieEngine(config, disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks, instance_id=INSTANCE,
                          journal_dir=os.path.join(base, "journal"), ledger_dir=os.path.join(base, "ledgers"),
                          log=lambda line: None)
    await engine.start()
    try:
        statuses, why = await engine.add_entries([(entry(5, i, b"p" * (10 + i)), KEY, 0) for i in range(3)])
        assert statuses == [StatusCode.OK] * 3, why
        statuses, why = await engine.add_entries([(entry(5, 3, b"r"), KEY, FLAG_RECOVERY_ADD)])
        assert statuses == [StatusCode.OK], why
        assert (await engine.write_lac(5, 2, KEY))[0] is StatusCode.OK
        assert (await engine.read_entry(6, -1, fence=True, master_key=KEY))[0] is StatusCode.NO_ENTRY
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    base = str(tmp_path_factory.mktemp("bookie"))
    asyncio.run(_write_bookie(base))
    return base


@pytest.fixture
def bookie(written, tmp_path) -> str:
    """A private copy of the engine-written directories that a test may damage."""
    return shutil.copytree(written, str(tmp_path / "bookie"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def journal_path(base: str) -> str:
    names = sorted(os.listdir(os.path.join(base, "journal")))
    assert names == ["0000000000000001.txn"], names
    return os.path.join(base, "journal", names[0])


EXPECTED_RECORDS = [
    "type=MASTER_KEY flags=0 ledger=5 key_bytes=32",
    "type=ENTRY flags=0 ledger=5 entry=0 lac=-1 payload_bytes=10",
    "type=ENTRY flags=0 ledger=5 entry=1 lac=0 payload_bytes=11",
    "type=ENTRY flags=0 ledger=5 entry=2 lac=1 payload_bytes=12",
    "type=ENTRY flags=RECOVERY_ADD ledger=5 entry=3 lac=2 payload_bytes=1",
    "type=EXPLICIT_LAC flags=0 ledger=5 lac=2",
    "type=MASTER_KEY flags=0 ledger=6 key_bytes=32",
    "type=FENCE flags=0 ledger=6",
]


def record_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("offset=")]


# -- journal dump ---------------------------------------------------------------------------------------------
def test_journal_dump_lists_every_record_the_engine_wrote(written, capsys):
    for path in (os.path.join(written, "journal"), journal_path(written)):  # a directory, and one file
        code, out, err = run(capsys, "journal", "dump", path)
        assert (code, err) == (0, "")
        assert out.splitlines()[0] == (f"journal {journal_path(written)}: instance {INSTANCE}, "
                                       f"{os.path.getsize(journal_path(written))} bytes")
        lines = record_lines(out)
        assert [line.split(" ", 1)[1] for line in lines] == EXPECTED_RECORDS
        assert lines[0].startswith(f"offset={jfmt.FILE_HEADER_BYTES + jfmt.GROUP_RECORD_BYTES} ")  # after a frame
        assert "8 records (4 ENTRY, 1 EXPLICIT_LAC, 1 FENCE, 2 MASTER_KEY)" in out
        assert KEY.decode() not in out and KEY.hex() not in out  # keys are never printed


def test_journal_dump_offsets_are_the_record_offsets(written, capsys):
    code, out, _ = run(capsys, "journal", "dump", os.path.join(written, "journal"))
    data = open(journal_path(written), "rb").read()
    expected = [r.offset for r in jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=True).records]
    assert [int(line.split()[0].removeprefix("offset=")) for line in record_lines(out)] == expected


def test_journal_dump_json(written, capsys):
    code, out, _ = run(capsys, "journal", "dump", "--json", os.path.join(written, "journal"))
    objects = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and objects[0]["kind"] == "header" and objects[0]["instance_id"] == INSTANCE
    assert objects[0]["journal_id"] == 1
    records = [o for o in objects if o["kind"] == "record"]
    assert [r["type"] for r in records] == ["MASTER_KEY", "ENTRY", "ENTRY", "ENTRY", "ENTRY", "EXPLICIT_LAC",
                                           "MASTER_KEY", "FENCE"]
    assert records[0]["master_key_bytes"] == 32 and "master_key" not in records[0]
    recovery = records[4]
    assert (recovery["ledger_id"], recovery["entry_id"], recovery["last_add_confirmed"], recovery["payload_bytes"],
            recovery["flags"], recovery["recovery_add"]) == (5, 3, 2, 1, FLAG_RECOVERY_ADD, True)
    assert (records[5]["ledger_id"], records[5]["lac"]) == (5, 2)
    assert records[7]["ledger_id"] == 6
    assert objects[-1]["kind"] == "summary" and objects[-1]["records"] == 8
    assert KEY.decode() not in out


def test_journal_dump_reports_a_torn_tail(bookie, capsys):
    path = journal_path(bookie)
    good_size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(jfmt.entry_record(entry(5, 4, b"torn"), 0)[:-2])
    code, out, _ = run(capsys, "journal", "dump", path)
    assert code == 0  # replay would truncate it: a normal state after a crash
    assert len(record_lines(out)) == 8
    assert f"torn last group: record at offset {good_size} runs past end of file" in out
    assert f"truncates the file to {good_size} bytes" in out


def test_journal_dump_reports_corruption_and_keeps_going(bookie, capsys):
    path = journal_path(bookie)
    data = bytearray(open(path, "rb").read())
    records = jfmt.scan_journal(bytes(data), jfmt.FILE_HEADER_BYTES, newest=True).records
    bad = records[2]  # ENTRY 5:1, valid records follow it
    data[bad.end - 1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    code, out, _ = run(capsys, "journal", "dump", path)
    assert code == 1
    assert "CORRUPTION (replay refuses to start)" in out and f"group at offset {bad.group} fails its CRC" in out
    lines = [line.split(" ", 1)[1] for line in record_lines(out)]
    assert lines == EXPECTED_RECORDS[:2] + EXPECTED_RECORDS[3:]
    code, out, _ = run(capsys, "journal", "dump", "--json", path)
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert code == 1 and kinds.count("record") == 7 and kinds.count("corruption") == 1


def _journal_file(directory: str, journal_id: int, *records: bytes, tail: bytes = b"") -> str:
    """A journal with each record in its own group write, then `tail` (bytes of a group never completed)."""
    path = os.path.join(directory, jfmt.journal_file_name(journal_id))
    with open(path, "wb") as f:
        f.write(jfmt.encode_file(INSTANCE, [[r] for r in records]) + tail)
    return path


def test_journal_dump_a_torn_tail_in_an_older_journal_is_corruption(tmp_path, capsys):
    older = _journal_file(str(tmp_path), 1, jfmt.fence_record(1), tail=jfmt.fence_record(2)[:-3])
    _journal_file(str(tmp_path), 2, jfmt.explicit_lac_record(3, 9))
    code, out, _ = run(capsys, "journal", "dump", str(tmp_path))
    assert code == 1
    assert f"journal {older}: instance {INSTANCE}" in out and "(older journal)" in out
    assert "in a journal that is not the newest" in out
    assert [line.split(" ", 1)[1] for line in record_lines(out)] == [
        "type=FENCE flags=0 ledger=1", "type=EXPLICIT_LAC flags=0 ledger=3 lac=9"]
    code, out, _ = run(capsys, "journal", "dump", older)  # the file alone is still judged against its siblings
    assert code == 1 and "not the newest" in out


def test_journal_dump_bad_headers(tmp_path, capsys):
    _journal_file(str(tmp_path), 1, jfmt.fence_record(1))
    with open(os.path.join(tmp_path, jfmt.journal_file_name(2)), "wb") as f:
        f.write(b"BKJN\0\0")  # the newest file, torn while its header was written
    code, out, _ = run(capsys, "journal", "dump", str(tmp_path))
    assert code == 0 and "torn header (6 bytes)" in out and "type=FENCE flags=0 ledger=1" in out
    with open(os.path.join(tmp_path, jfmt.journal_file_name(1)), "r+b") as f:
        f.write(b"XXXX")
    code, out, _ = run(capsys, "journal", "dump", str(tmp_path))
    assert code == 1 and "CORRUPTION: bad journal magic b'XXXX'" in out


def test_journal_dump_missing_or_empty(tmp_path, capsys):
    code, out, err = run(capsys, "journal", "dump", str(tmp_path / "nope"))
    assert code == 2 and "no such file or directory" in err and out == ""
    code, out, _ = run(capsys, "journal", "dump", str(tmp_path))
    assert code == 1 and "no journal files" in out


def test_journal_dump_does_not_change_the_file(bookie, capsys):
    path = journal_path(bookie)
    with open(path, "ab") as f:
        f.write(b"\0" * 30)
    before = open(path, "rb").read()
    assert run(capsys, "journal", "dump", path)[0] == 0
    assert open(path, "rb").read() == before


# -- entrylog dump --------------------------------------------------------------------------------------------
def test_entrylog_dump_lists_the_checkpointed_entries(written, capsys):
    log = os.path.join(written, "ledgers", "entrylogs", "1.log")
    map_at = log_fmt.HEADER_BYTES + sum(4 + entry_fmt.HEADER_BYTES + n for n in (10, 11, 12, 1))  # sealed at close
    for path in (os.path.join(written, "ledgers"), os.path.join(written, "ledgers", "entrylogs"), log):
        code, out, err = run(capsys, "entrylog", "dump", path)
        assert (code, err) == (0, "")
        assert out.splitlines()[0].startswith(f"entry log {log}: version 1, {os.path.getsize(log)} bytes, "
                                              f"ledger map at offset {map_at} (1 ledgers)")
        assert [line.split(" ", 1)[1] for line in record_lines(out) if "LEDGER MAP" not in line] == [
            f"ledger=5 entry={i} length={entry_fmt.HEADER_BYTES + n}" for i, n in ((0, 10), (1, 11), (2, 12), (3, 1))]
        assert record_lines(out)[0].startswith(f"offset={log_fmt.HEADER_BYTES} ")
    code, out, _ = run(capsys, "entrylog", "dump", "--json", log)
    objects = [json.loads(line) for line in out.splitlines()]
    assert objects[0] == {"kind": "header", "file": log, "log_id": 1, "version": 1, "bytes": os.path.getsize(log),
                          "ledger_map_offset": map_at, "ledger_count": 1}
    assert [(o["ledger_id"], o["entry_id"]) for o in objects if o["kind"] == "record"] == [(5, i) for i in range(4)]


def test_entrylog_dump_rolled_logs_show_their_ledger_map(tmp_path, capsys):
    entries = [entry(5, 0, b"p" * 10), entry(5, 1, b"p" * 11), entry(9, 0, b"")]
    _entry_log(str(tmp_path / "1.log"), entries[:2], {5: 101})  # sealed: map at 165, header patched
    _entry_log(str(tmp_path / "2.log"), entries[2:], None)  # the log that was open
    code, out, _ = run(capsys, "entrylog", "dump", str(tmp_path))
    assert code == 0
    headers = [line for line in out.splitlines() if line.startswith("entry log ")]
    assert len(headers) == 2 and "ledger map at offset 165 (1 ledgers)" in headers[0] and "no ledger map" in headers[1]
    assert "offset=165 LEDGER MAP 1 ledgers (ledger=bytes): 5=101" in out
    assert [line.split(" ", 1)[1] for line in record_lines(out) if "LEDGER MAP" not in line] == [
        "ledger=5 entry=0 length=46", "ledger=5 entry=1 length=47", "ledger=9 entry=0 length=36"]
    code, out, _ = run(capsys, "entrylog", "dump", "--json", str(tmp_path / "1.log"))
    objects = [json.loads(line) for line in out.splitlines()]
    assert objects[0]["ledger_map_offset"] == 165 and objects[0]["ledger_count"] == 1
    assert [o["ledgers"] for o in objects if o["kind"] == "ledger_map"] == [[{"ledger_id": 5, "bytes": 101}]]


def _entry_log(path: str, entries: list[bytes], live: dict[int, int] | None, header_map=None) -> bytes:
    data = bytearray(log_fmt.encode_header())
    for e in entries:
        data += log_fmt.encode_record(e)
    if live is not None:
        offset = len(data)
        data += log_fmt.encode_ledger_map(live)
        data[:log_fmt.HEADER_BYTES] = log_fmt.encode_header(*(header_map or (offset, len(live))))
    open(path, "wb").write(bytes(data))
    return bytes(data)


def test_entrylog_dump_problems(tmp_path, capsys):
    path = str(tmp_path / "7.log")
    entries = [entry(1, 0, b"a"), entry(1, 1, b"b")]
    data = _entry_log(path, entries, None)
    open(path, "wb").write(data[:-5])  # the open log was cut: a warning
    code, out, _ = run(capsys, "entrylog", "dump", path)
    assert code == 0 and "scan stopped early, warning" in out and len(record_lines(out)) == 1

    data = _entry_log(path, entries, {1: 82})
    open(path, "wb").write(data[:log_fmt.HEADER_BYTES] + data[log_fmt.HEADER_BYTES:-3])  # sealed log cut: damage
    code, out, _ = run(capsys, "entrylog", "dump", path)
    assert code == 1 and "scan stopped early, DAMAGE" in out and "header names a ledger map at offset" in out

    _entry_log(path, entries, {1: 82}, header_map=(64, 1))
    code, out, _ = run(capsys, "entrylog", "dump", path)
    assert code == 1 and "PROBLEM: header names a ledger map at offset 64 with 1 ledgers" in out

    open(path, "wb").write(b"BKJN" + bytes(60))
    code, out, _ = run(capsys, "entrylog", "dump", path)
    assert code == 1 and "UNREADABLE: bad entry log magic" in out

    code, out, err = run(capsys, "entrylog", "dump", str(tmp_path / "missing.log"))
    assert code == 2 and "no such file" in err
    os.remove(path)
    code, out, _ = run(capsys, "entrylog", "dump", str(tmp_path))
    assert code == 1 and "no entry logs" in out


# -- lastmark -------------------------------------------------------------------------------------------------
def test_lastmark_prints_the_checkpoint_mark(written, capsys):
    code, out, err = run(capsys, "lastmark", os.path.join(written, "ledgers"))
    size = os.path.getsize(journal_path(written))  # closed cleanly: the mark is the end of the journal
    assert (code, err) == (0, "")
    assert out.strip() == (f"lastmark {os.path.join(written, 'ledgers', 'lastmark')}: journal "
                           f"0000000000000001.txn (id 1) offset {size}")
    code, out, _ = run(capsys, "lastmark", "--json", os.path.join(written, "ledgers"))
    obj = json.loads(out)
    assert (obj["journal_id"], obj["journal_file"], obj["offset"]) == (1, "0000000000000001.txn", size)


def test_lastmark_absent_damaged_missing(bookie, tmp_path, capsys):
    code, out, _ = run(capsys, "lastmark", str(tmp_path))
    assert code == 1 and f"no lastmark in {tmp_path}" in out and "never checkpointed" in out
    path = os.path.join(bookie, "ledgers", "lastmark")
    data = bytearray(open(path, "rb").read())
    data[3] ^= 1
    open(path, "wb").write(bytes(data))
    code, out, _ = run(capsys, "lastmark", os.path.join(bookie, "ledgers"))
    assert code == 1 and "unreadable: lastmark file has a bad checksum" in out
    code, out, err = run(capsys, "lastmark", str(tmp_path / "nope"))
    assert code == 2 and "no such file or directory" in err
