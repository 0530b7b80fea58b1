"""The torn last group of the newest journal (PROTOCOL.md §2.2 "Replay on restart").

Journals are written by the bookie's own Journal writer (one group per awaited append), then the last group is
damaged the way a power cut inside its write leaves it: its pages reach the disk in any order, so any subset of
them may hold zeros, and the file may end after any of them. Replay must truncate exactly that group and report
it, and must refuse to start when the damage lies before the last group (even one byte before it).
"""
from __future__ import annotations

import asyncio
import itertools
import os
import uuid

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.bookie.journal import Journal, JournalMark
from bksim.bookie.replay import replay
from bksim.formats import journal as jfmt
from bksim.model.errors import JournalCorruptError

from .conftest import KEY, entry

INSTANCE = str(uuid.uuid4())
PAGE = 4096


def group_records(group: int, n: int, size: int) -> list[bytes]:
    return [jfmt.entry_record(entry(1, group * 100 + i, bytes([65 + group]) * size), 0) for i in range(n)]


def write_groups(directory, groups: list[list[bytes]]) -> tuple[str, list[int]]:
    """Write each list of records as one journal group; returns the file and the offset where each group starts
    (the journal's synced mark before it) plus the file's end."""
    async def run() -> list[int]:
        journal = Journal(LocalDisk(), SystemClock(), str(directory), INSTANCE, group_wait_ms_max=0,
                          group_bytes_max=1 << 20, flush_when_idle=True, file_bytes_max=1 << 30,
                          queue_records_max=10_000, sync_on_loop=True, log=lambda line: None)
        await journal.open(after_id=0)
        journal.start()
        starts = []
        for records in groups:
            starts.append(journal.synced_mark.offset)
            await journal.append_many(records, len(records))
        starts.append(journal.synced_mark.offset)
        await journal.stop()
        return starts
    os.makedirs(directory, exist_ok=True)
    starts = asyncio.run(run())
    return os.path.join(str(directory), jfmt.journal_file_name(1)), starts


def run_replay(directory, mark=JournalMark(0, 0), skip=False):
    applied, logs = [], []

    async def apply(record, mark_after):
        applied.append(record.body)

    report = asyncio.run(replay(LocalDisk(), str(directory), mark, INSTANCE, apply, skip, logs.append))
    return report, applied, logs


def bodies(groups: list[list[bytes]]) -> list[bytes]:
    """The entry bytes inside encoded ENTRY records."""
    return [r[jfmt.RECORD_PREFIX_BYTES:] for g in groups for r in g]


def rewrite(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


GROUPS = [group_records(0, 3, 200), group_records(1, 2, 300), group_records(2, 12, 1000)]  # the last: ~12 KiB


def _pages(start: int, end: int) -> list[tuple[int, int]]:
    """The device pages [a, b) a group write [start, end) touches, clipped to the group's bytes."""
    first = start // PAGE * PAGE
    return [(max(a, start), min(a + PAGE, end)) for a in range(first, end, PAGE)]


def _torn_shapes():
    """(name, landed pages, pages the file keeps): every subset of the last group's pages reaching the disk, with
    the file ending after its last page, or after any earlier page (what is past the end never landed)."""
    shapes = []
    n = 4  # the last group of GROUPS spans 4 pages (checked in the test)
    for kept in range(1, n + 1):
        for landed in itertools.product((True, False), repeat=kept):
            if kept == n and all(landed):
                continue  # the whole group landed: not torn
            shapes.append((f"kept{kept}-" + "".join("L" if x else "0" for x in landed), landed, kept))
    return shapes


@pytest.mark.parametrize("name, landed, kept", _torn_shapes(), ids=[s[0] for s in _torn_shapes()])
def test_every_torn_shape_of_the_last_group_is_truncated_and_reported(tmp_path, name, landed, kept):
    path, starts = write_groups(tmp_path, GROUPS)
    data = bytearray(open(path, "rb").read())
    last, end = starts[-2], starts[-1]
    pages = _pages(last, end)
    assert len(pages) == 4, pages
    for (a, b), ok in zip(pages, landed):
        if not ok:
            data[a:b] = bytes(b - a)
    rewrite(path, bytes(data[:pages[kept - 1][1]]))
    report, applied, logs = run_replay(tmp_path)
    assert applied == bodies(GROUPS[:-1])
    assert len(report.torn) == 1 and report.end == JournalMark(1, last)
    assert os.path.getsize(path) == last  # truncated to the end of the last complete group
    assert any("truncating" in line for line in logs)


def test_a_zero_page_then_a_valid_record_after_the_last_group_is_a_torn_group(tmp_path):
    """What a power cut inside one group write can leave: the group's first page never landed, a later one did."""
    path, starts = write_groups(tmp_path, GROUPS[:2])
    with open(path, "ab") as f:
        f.write(bytes(PAGE) + jfmt.entry_record(entry(1, 999), 0))
    report, applied, _ = run_replay(tmp_path)
    assert applied == bodies(GROUPS[:2])
    assert len(report.torn) == 1 and os.path.getsize(path) == starts[-1]


def test_zeros_after_a_complete_last_group_are_truncated(tmp_path):
    path, starts = write_groups(tmp_path, GROUPS)
    with open(path, "ab") as f:
        f.write(bytes(2 * PAGE))  # blocks allocated past the end, never written
    report, applied, _ = run_replay(tmp_path)
    assert applied == bodies(GROUPS)
    assert len(report.torn) == 1 and os.path.getsize(path) == starts[-1]


@pytest.mark.parametrize("last_group", ["intact", "torn"])
@pytest.mark.parametrize("where", ["last byte before the last group", "first byte of the group before"])
def test_damage_before_the_last_group_refuses_start(tmp_path, where, last_group):
    path, starts = write_groups(tmp_path, GROUPS)
    data = bytearray(open(path, "rb").read())
    at = starts[-2] - 1 if where.startswith("last byte") else starts[-3]
    data[at] ^= 0x01
    if last_group == "torn":
        a, b = _pages(starts[-2], starts[-1])[1]
        data[a:b] = bytes(b - a)  # the last group lost its second page as well
    rewrite(path, bytes(data))
    with pytest.raises(JournalCorruptError, match="corruption"):
        run_replay(tmp_path)
    assert os.path.getsize(path) == len(data)  # nothing truncated


def test_skip_corruption_skips_damage_before_the_last_group_loudly(tmp_path):
    path, starts = write_groups(tmp_path, GROUPS)
    data = bytearray(open(path, "rb").read())
    data[starts[-2] - 1] ^= 0x01  # the last record of group 1
    rewrite(path, bytes(data))
    report, applied, logs = run_replay(tmp_path, skip=True)
    assert applied == bodies(GROUPS)[:4] + bodies(GROUPS[2:])  # group 1's last record is the one skipped
    assert len(report.skipped) == 1 and report.torn == []
    assert any("JOURNAL CORRUPTION SKIPPED" in line for line in logs)


def test_replay_from_a_mark_at_a_group_start(tmp_path):
    path, starts = write_groups(tmp_path, GROUPS)
    report, applied, _ = run_replay(tmp_path, JournalMark(1, starts[1]))
    assert applied == bodies(GROUPS[1:]) and report.torn == []


def test_a_replay_checkpoint_inside_a_group_resumes_at_the_group_start(engines):
    """Replay that must checkpoint mid-way (the write cache filled) persists a mark at the start of the group it
    is in, never inside it: a start that crashes right after that checkpoint must be able to resume there."""
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, 0), KEY, 0)])  # group 1
        await e.add_entries([(entry(1, i, b"x" * 3000), KEY, 0) for i in range(1, 21)])  # group 2: one batch
        e.abandon()

        class Crash(Exception):
            pass

        def crash_after_first_mark(step):
            if step == "lastmark_write":
                raise Crash()
        small = engines.make(fault_hook=crash_after_first_mark, write_cache_bytes_max=16384, entry_bytes_max=4096)
        with pytest.raises(Crash):
            await small.start()  # replay checkpointed inside group 2, then the process died
        small.abandon()
        mark = open(os.path.join(engines.ledger_dir, "lastmark"), "rb").read()
        e = await engines.started()
        assert e.replay_report.torn == [] and e.replay_report.skipped == [], (mark, e.replay_report)
        for i in range(21):
            status, data, _, _ = await e.read_entry(1, i)
            assert status.name == "OK" and data == entry(1, i, b"x" * 3000 if i else b"")
        await e.close()
    asyncio.run(scenario())
