"""Journal replay: clean, torn tails of every kind (truncated, reported), and corruption (refused)."""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from bksim.adapters.localdisk import LocalDisk
from bksim.bookie.journal import JournalMark
from bksim.bookie.replay import replay
from bksim.formats import journal as jfmt
from bksim.model.errors import JournalCorruptError

from .conftest import KEY, entry

INSTANCE = str(uuid.uuid4())


def records(n: int, ledger_id: int = 1) -> list[bytes]:
    """n entry records, each in its own group write (as a bookie flushing every add alone writes them)."""
    return [framed(jfmt.entry_record(entry(ledger_id, i), 0)) for i in range(n)]


def framed(record: bytes) -> bytes:
    return jfmt.group_record([record]) + record


def write_journal(directory, journal_id: int, body: bytes, header: bytes | None = None) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, jfmt.journal_file_name(journal_id))
    with open(path, "wb") as f:
        f.write(jfmt.encode_file_header(INSTANCE) if header is None else header)
        f.write(body)
    return path


def run_replay(directory, mark=JournalMark(0, 0), skip=False):
    applied: list[jfmt.JournalRecord] = []
    logs: list[str] = []

    async def apply(record, mark_after):
        applied.append(record)

    report = asyncio.run(replay(LocalDisk(), str(directory), mark, INSTANCE, apply, skip, logs.append))
    return report, applied, logs


def test_clean_journal_replays_every_record(tmp_path):
    write_journal(tmp_path, 1, b"".join(records(5)))
    report, applied, _ = run_replay(tmp_path)
    assert [r.body for r in applied] == [entry(1, i) for i in range(5)]
    assert report.torn == [] and report.records == 5
    assert report.end == JournalMark(1, os.path.getsize(tmp_path / jfmt.journal_file_name(1)))


@pytest.mark.parametrize("tail, why", [
    (lambda r: r[:6], "short record header"),  # torn group frame
    (lambda r: r[:len(r) - 7], "runs past the end of the file"),  # torn group
    (lambda r: b"\0" * 4096, "4096 zero bytes after the last group"),  # zero-filled tail
    (lambda r: r[:-1] + bytes([r[-1] ^ 0xFF]), "fails its CRC"),  # a page of the last group did not land
    (lambda r: b"\0" * 512 + r[jfmt.GROUP_RECORD_BYTES:], "invalid record length 0"),  # its first page did not
])
def test_torn_tail_of_newest_journal_is_truncated(tmp_path, tail, why):
    good = b"".join(records(4))
    last = framed(jfmt.entry_record(entry(1, 4), 0))
    path = write_journal(tmp_path, 1, good + tail(last))
    report, applied, logs = run_replay(tmp_path)
    assert [r.body for r in applied] == [entry(1, i) for i in range(4)]
    assert len(report.torn) == 1 and why in report.torn[0]
    assert os.path.getsize(path) == jfmt.FILE_HEADER_BYTES + len(good)  # truncated away
    assert any("truncating" in line for line in logs)
    again, applied_again, _ = run_replay(tmp_path)  # the second replay is clean
    assert again.torn == [] and len(applied_again) == 4


def test_crc_bad_record_in_the_middle_refuses_start(tmp_path):
    recs = records(5)
    recs[2] = recs[2][:-1] + bytes([recs[2][-1] ^ 0x01])
    write_journal(tmp_path, 1, b"".join(recs))
    with pytest.raises(JournalCorruptError, match="fails its CRC, followed by more of the journal"):
        run_replay(tmp_path)


def test_skip_corruption_is_explicit_and_loud(tmp_path):
    recs = records(5)
    recs[2] = recs[2][:-1] + bytes([recs[2][-1] ^ 0x01])
    write_journal(tmp_path, 1, b"".join(recs))
    report, applied, logs = run_replay(tmp_path, skip=True)
    assert [r.body for r in applied] == [entry(1, i) for i in (0, 1, 3, 4)]
    assert len(report.skipped) == 1
    assert any("JOURNAL CORRUPTION SKIPPED" in line for line in logs)


def test_header_only_journal_replays_nothing(tmp_path):
    write_journal(tmp_path, 1, b"")
    report, applied, _ = run_replay(tmp_path)
    assert applied == [] and report.torn == [] and report.end == JournalMark(1, jfmt.FILE_HEADER_BYTES)


def test_empty_newest_journal_is_a_torn_header_and_is_removed(tmp_path):
    write_journal(tmp_path, 1, b"".join(records(2)))
    path = write_journal(tmp_path, 2, b"", header=b"")
    report, applied, _ = run_replay(tmp_path)
    assert len(applied) == 2 and "torn header" in report.torn[0]
    assert not os.path.exists(path)


def test_damage_in_an_older_journal_refuses_start(tmp_path):
    write_journal(tmp_path, 1, b"".join(records(3)) + b"\x00\x00")
    write_journal(tmp_path, 2, b"".join(records(3, ledger_id=2)))
    with pytest.raises(JournalCorruptError, match="not the newest"):
        run_replay(tmp_path)


def test_journal_of_another_cluster_refuses_start(tmp_path):
    header = jfmt.encode_file_header(str(uuid.uuid4()))
    write_journal(tmp_path, 1, b"".join(records(1)), header=header)
    with pytest.raises(JournalCorruptError, match="belongs to cluster instance"):
        run_replay(tmp_path)


def test_replay_starts_at_the_mark_and_spans_later_journals(tmp_path):
    first = records(4)
    write_journal(tmp_path, 1, b"".join(first))
    write_journal(tmp_path, 2, b"".join(records(2, ledger_id=2)))
    mark = JournalMark(1, jfmt.FILE_HEADER_BYTES + len(first[0]) + len(first[1]))
    report, applied, _ = run_replay(tmp_path, mark)
    assert [r.body for r in applied] == [entry(1, 2), entry(1, 3), entry(2, 0), entry(2, 1)]
    assert report.journals == [1, 2]


def test_missing_journal_named_by_the_mark_refuses_start(tmp_path):
    write_journal(tmp_path, 2, b"".join(records(1)))
    with pytest.raises(JournalCorruptError, match="named by the checkpoint mark is missing"):
        run_replay(tmp_path, JournalMark(1, 100))


def test_engine_restarts_cleanly_after_a_torn_tail(engines):
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, i), KEY, 0) for i in range(3)])
        e.abandon()
        path = os.path.join(engines.journal_dir, jfmt.journal_file_name(1))
        with open(path, "ab") as f:
            f.write(jfmt.entry_record(entry(1, 3), 0)[:-5])  # a torn, never-acknowledged add
        e = await engines.started()
        assert len(e.replay_report.torn) == 1
        assert [(await e.read_entry(1, i))[0].name for i in range(4)] == ["OK", "OK", "OK", "NO_ENTRY"]
        await e.add_entries([(entry(1, 3), KEY, 0)])
        e.abandon()
        e = await engines.started()  # journal 1 is now an older, clean journal
        assert e.replay_report.torn == [] and (await e.read_entry(1, 3))[1] == entry(1, 3)
        await e.close()
    asyncio.run(scenario())


def test_replay_refuses_clearly_when_an_entry_no_longer_fits_the_write_cache(engines):
    from bksim.model.errors import BksimError

    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, 0, b"x" * 3000), KEY, 0)])
        e.abandon()
        with pytest.raises(BksimError, match="raise write_cache_bytes_max"):
            small = engines.make(write_cache_bytes_max=4096, entry_bytes_max=1024)
            try:
                await small.start()
            finally:
                small.abandon()
    asyncio.run(scenario())
