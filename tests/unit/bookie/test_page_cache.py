"""Synced journal and entry-log bytes leave the OS page cache (bookie/page_cache.py; the journal's is BookKeeper's
journalRemoveFromPageCache, on by default). Real files; which pages are resident is read with util-linux's `fincore`
(mincore(2))."""
from __future__ import annotations

import asyncio
import os
import subprocess
import uuid

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.bookie.entry_log import EntryLogger
from bksim.bookie.journal import CACHE_DROP_LAG_BYTES, Journal
from bksim.bookie.page_cache import STEP_BYTES
from bksim.formats import journal as jfmt

from .conftest import entry

MiB = 1 << 20
INSTANCE = str(uuid.uuid4())


def resident_bytes(path: str) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", path],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.split()[0])


def write_journal(directory: str, groups: int, *, remove_from_page_cache: bool, file_bytes_max: int = 1 << 30):
    """`groups` groups of 64 records of 4 KiB (~256 KiB each), each awaited (synced) before the next."""
    async def run() -> None:
        journal = Journal(LocalDisk(), SystemClock(), directory, INSTANCE, group_wait_ms_max=0,
                          group_bytes_max=1 << 20, flush_when_idle=True, file_bytes_max=file_bytes_max,
                          queue_records_max=10_000, sync_on_loop=True, log=lambda line: None,
                          remove_from_page_cache=remove_from_page_cache)
        await journal.open(after_id=0)
        journal.start()
        for g in range(groups):
            records = [jfmt.entry_record(entry(1, g * 64 + i, b"x" * 4096), 0) for i in range(64)]
            await journal.append_many(records, len(records))
        await journal.stop()
    asyncio.run(run())


@pytest.mark.parametrize("remove", [True, False])
def test_synced_journal_pages_leave_the_page_cache_unless_told_to_stay(tmp_path, remove):
    write_journal(str(tmp_path), 32, remove_from_page_cache=remove)  # ~8 MiB
    path = os.path.join(str(tmp_path), jfmt.journal_file_name(1))
    size = os.path.getsize(path)
    assert size > 8 * MiB
    resident = resident_bytes(path)
    if remove:  # at most the lag behind the synced end stays (plus the partial pages at its edges)
        assert resident <= CACHE_DROP_LAG_BYTES + 2 * MiB, (resident, size)
    else:
        assert resident > size - MiB, (resident, size)


def test_a_rolled_journal_leaves_the_page_cache_whole(tmp_path):
    write_journal(str(tmp_path), 24, remove_from_page_cache=True, file_bytes_max=4 * MiB)
    names = sorted(os.listdir(str(tmp_path)))
    assert len(names) >= 2  # rolled at least once
    for name in names[:-1]:
        assert resident_bytes(os.path.join(str(tmp_path), name)) == 0, name


def write_entry_logs(directory: str, mib: int, *, page_cache_bytes: int, bytes_max: int = 1 << 30,
                     flush: bool = True) -> None:
    """`mib` MiB of 4 KiB entries appended as one checkpoint's sorted runs, then flushed (checkpoint step 4)."""
    async def run() -> None:
        logger = EntryLogger(LocalDisk(), directory, bytes_max, page_cache_bytes=page_cache_bytes)
        await logger.open()
        runs = [(7, [(i, entry(7, i, b"y" * 4096)) for i in range(mib * 250)])]
        await logger.append_sorted(runs)
        if flush:
            await logger.flush()
        logger.close()
    asyncio.run(run())


@pytest.mark.parametrize("page_cache_bytes", [0, 2 * MiB, -1])
def test_flushed_entry_log_pages_older_than_the_newest_page_cache_bytes_leave_the_page_cache(tmp_path,
                                                                                              page_cache_bytes):
    write_entry_logs(str(tmp_path), 6, page_cache_bytes=page_cache_bytes)
    [name] = os.listdir(str(tmp_path))
    path = os.path.join(str(tmp_path), name)
    size = os.path.getsize(path)
    resident = resident_bytes(path)
    if page_cache_bytes < 0:  # all stay
        assert resident > size - MiB, (resident, size)
    else:  # the newest page_cache_bytes, up to one step more (dropped ranges end on whole steps)
        assert page_cache_bytes <= resident <= page_cache_bytes + STEP_BYTES, (resident, size)


def test_rolled_entry_logs_leave_the_page_cache_whole_at_the_flush(tmp_path):
    write_entry_logs(str(tmp_path), 6, page_cache_bytes=MiB, bytes_max=2 * MiB)
    names = sorted(os.listdir(str(tmp_path)))
    assert len(names) >= 3
    for name in names[:-1]:
        assert resident_bytes(os.path.join(str(tmp_path), name)) == 0, name


def test_each_synced_step_of_a_checkpoint_leaves_the_page_cache_before_the_flush(tmp_path):
    """The checkpoint's 1 MiB steps are synced as they are written: their pages go then, a step at a time, not
    in one call at the flush."""
    write_entry_logs(str(tmp_path), 8, page_cache_bytes=0, flush=False)
    [name] = os.listdir(str(tmp_path))
    path = os.path.join(str(tmp_path), name)
    assert os.path.getsize(path) > 7 * MiB
    assert resident_bytes(path) <= 2 * STEP_BYTES  # the last step, and the tail the flush has yet to sync
