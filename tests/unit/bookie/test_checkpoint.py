"""Checkpoints: a crash between any two steps replays to the same content; the mark never regresses;
journals below the mark are deleted (keeping N) or archived."""
from __future__ import annotations

import asyncio

import pytest

from bksim.bookie.engine import CHECKPOINT_STEPS
from bksim.bookie.lastmark import decode_lastmark, encode_lastmark, read_lastmark
from bksim.bookie.journal import JournalMark, list_journal_ids
from bksim.adapters.localdisk import LocalDisk
from bksim.model.errors import FormatError
from bksim.model.status import StatusCode as S

from .conftest import KEY, entry


class Crash(Exception):
    pass


async def content(e, ledger_id: int, n: int) -> list[bytes | None]:
    out = []
    for i in range(n):
        status, data, _, _ = await e.read_entry(ledger_id, i)
        out.append(data if status == S.OK else status.name)
    return out


@pytest.mark.parametrize("crash_step", CHECKPOINT_STEPS)
def test_crash_between_checkpoint_steps_replays_to_the_same_content(engines, crash_step):
    armed = {"on": False}

    def hook(step):
        if armed["on"] and step == crash_step:
            raise Crash(step)

    async def scenario():
        e = engines.make(fault_hook=hook)
        await e.start()
        await e.add_entries([(entry(1, i, lac=i - 1), KEY, 0) for i in range(50)])
        await e.checkpoint()
        await e.add_entries([(entry(1, i, lac=i - 1), KEY, 0) for i in range(50, 120)])
        await e.add_entries([(entry(2, 0), KEY, 0)])
        assert (await e.read_entry(2, -1, fence=True, master_key=KEY))[0] == S.OK
        assert (await e.write_lac(1, 118, KEY))[0] == S.OK
        mark_before = read_lastmark(LocalDisk(), engines.ledger_dir)
        expected = await content(e, 1, 121)
        armed["on"] = True
        with pytest.raises(Crash):
            await e.checkpoint()
        e.abandon()
        e = await engines.started()
        assert read_lastmark(LocalDisk(), engines.ledger_dir) >= mark_before
        assert await content(e, 1, 121) == expected
        assert expected[-1] == "NO_ENTRY" and expected[119] == entry(1, 119, lac=118)
        assert (await e.add_entries([(entry(2, 1), KEY, 0)]))[0] == [S.FENCED]
        assert (await e.read_lac(1))[1] == 118
        await e.close()

    asyncio.run(scenario())


def test_lastmark_round_trip_and_damage_detected():
    mark = JournalMark(0x1234, 98765)
    assert decode_lastmark(encode_lastmark(mark)) == mark
    damaged = bytearray(encode_lastmark(mark))
    damaged[3] ^= 1
    with pytest.raises(FormatError, match="checksum"):
        decode_lastmark(bytes(damaged))
    with pytest.raises(FormatError):
        decode_lastmark(b"short")


def test_mark_only_moves_forward_and_old_journals_are_collected(engines):
    async def scenario():
        e = await engines.started(journal_file_bytes_max=8 * 1024, journal_backups_max=2)
        marks = []
        for round_ in range(6):
            await e.add_entries([(entry(1, round_ * 20 + i, b"x" * 500), KEY, 0) for i in range(20)])
            await e.checkpoint()
            marks.append(read_lastmark(LocalDisk(), engines.ledger_dir))
        assert marks == sorted(marks) and marks[-1] > marks[0]
        below = [i for i in list_journal_ids(LocalDisk(), engines.journal_dir) if i < marks[-1].journal_id]
        assert len(below) == 2  # journal_backups_max
        await e.close()
        e = await engines.started()
        assert await content(e, 1, 120) == [entry(1, i, b"x" * 500) for i in range(120)]
        await e.close()

    asyncio.run(scenario())


def test_journals_below_the_mark_are_archived_when_configured(engines, tmp_path):
    archive = str(tmp_path / "archive")

    async def scenario():
        e = await engines.started(journal_file_bytes_max=8 * 1024, journal_backups_max=0,
                                  journal_archive_dir=archive)
        for round_ in range(4):
            await e.add_entries([(entry(1, round_ * 20 + i, b"x" * 500), KEY, 0) for i in range(20)])
            await e.checkpoint()
        mark = read_lastmark(LocalDisk(), engines.ledger_dir)
        kept = list_journal_ids(LocalDisk(), engines.journal_dir)
        archived = list_journal_ids(LocalDisk(), archive)
        assert archived and max(archived) < mark.journal_id <= min(kept)
        assert not set(kept) & set(archived)
        assert sorted(kept + archived) == list(range(1, max(kept) + 1))  # nothing lost, nothing deleted
        await e.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("fail_step", ["swap", "entrylog_write", "entrylog_sync", "index_write"])
def test_a_failed_checkpoint_is_finished_by_the_next_one(engines, fail_step):
    armed = {"on": False}

    def hook(step):
        if armed["on"] and step == fail_step:
            armed["on"] = False
            raise Crash(step)

    async def scenario():
        e = engines.make(fault_hook=hook)
        await e.start()
        await e.add_entries([(entry(1, i), KEY, 0) for i in range(30)])
        armed["on"] = True
        with pytest.raises(Crash):
            await e.checkpoint()
        await e.add_entries([(entry(1, i), KEY, 0) for i in range(30, 60)])  # lands in the new active half
        await e.checkpoint()  # flushes the stranded half, then the active one, then moves the mark
        assert e.statistics()["flushing_bytes"] == 0
        mark = read_lastmark(LocalDisk(), engines.ledger_dir)
        assert mark == e._journal.synced_mark
        e.abandon()
        e = await engines.started()
        assert e.replay_report.records == 0  # everything was checkpointed: nothing to replay
        assert await content(e, 1, 60) == [entry(1, i) for i in range(60)]
        await e.close()

    asyncio.run(scenario())
