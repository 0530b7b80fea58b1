"""A journal write or fsync error: the group being written fails too (its callers get an error, never hang),
later adds and fences are refused with IO_ERROR, and the bookie turns read-only while it keeps serving reads of
what it acknowledged (PROTOCOL.md §2.2 "Journal I/O errors")."""
from __future__ import annotations

import asyncio
import dataclasses
import errno

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.bookie.journal import Journal
from bksim.formats import journal as jfmt
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieError
from bksim.model.status import StatusCode

from .conftest import KEY, entry

DEADLINE_S = 10.0


class FailingDisk(LocalDisk):
    """Real files whose journal group writes fail once `fail` is set: "write" fails before any byte is written,
    "fsync" writes the bytes and then fails the fdatasync (what an EIO from the device looks like)."""

    def __init__(self) -> None:
        self.fail: str | None = None
        self.failures = 0

    def create(self, path: str):
        return _FailingFile(self, super().create(path))


class _FailingFile:
    def __init__(self, disk: FailingDisk, inner) -> None:
        self._disk, self._inner, self.path = disk, inner, inner.path

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def size(self) -> int:
        return self._inner.size

    def _maybe_fail(self, data: bytes) -> None:
        if self._disk.fail is None:
            return
        self._disk.failures += 1
        if self._disk.fail == "fsync":
            self._inner.write(data)
        raise OSError(errno.EIO, f"injected {self._disk.fail} error", self.path)

    def write_synced_now(self, *parts: bytes) -> None:
        self._maybe_fail(b"".join(parts))
        self._inner.write_synced_now(*parts)

    async def write_synced(self, *parts: bytes) -> None:
        self._maybe_fail(b"".join(parts))
        await self._inner.write_synced(*parts)


def engine_on(disk: FailingDisk, base, **overrides) -> BookieEngine:
    config = dataclasses.replace(BookieConfig(), **overrides)
    logs: list[str] = []
    engine = BookieEngine(config, disk=disk, clock=SystemClock(), open_kv=open_rocks,
                          instance_id="6f1c2a9e-0d4b-4c55-9a77-3b1e2f4d5c6a", journal_dir=str(base / "journal"),
                          ledger_dir=str(base / "ledgers"), log=logs.append)
    engine.logs = logs
    return engine


@pytest.mark.parametrize("sync_on_loop", [True, False], ids=["sync-on-loop", "sync-on-thread"])
@pytest.mark.parametrize("fail", ["write", "fsync"])
def test_a_failed_group_write_fails_its_adds_and_the_bookie_turns_read_only(tmp_path, fail, sync_on_loop):
    async def scenario():
        disk = FailingDisk()
        engine = engine_on(disk, tmp_path, journal_sync_on_loop=sync_on_loop)
        await engine.start()
        statuses, _ = await engine.add_entries([(entry(1, i), KEY, 0) for i in range(3)])
        assert statuses == [StatusCode.OK] * 3 and not engine.read_only
        disk.fail = fail
        batch = engine.start_adds([(entry(1, 3), KEY, 0), (entry(1, 4), KEY, 0)])
        fence = asyncio.ensure_future(engine.read_entry(2, -1, fence=True, master_key=KEY))
        statuses, message = await asyncio.wait_for(batch.result(), DEADLINE_S)  # hung before: never completed
        assert statuses == [StatusCode.IO_ERROR] * 2 and "journal failed" in message and "injected" in message
        status, _, _, why = await asyncio.wait_for(fence, DEADLINE_S)
        assert status is StatusCode.IO_ERROR and "journal failed" in why
        assert disk.failures >= 1
        # later adds are refused at once, with the reason; the bookie reports read-only
        statuses, message = await asyncio.wait_for(engine.add_entries([(entry(1, 5), KEY, 0)]), DEADLINE_S)
        assert statuses == [StatusCode.IO_ERROR] and "journal failed" in message
        assert engine.read_only and engine.info()["state"] == "read-only"
        assert engine.set_disk_usage(100, 90) is False and engine.read_only  # free disk does not make it writable
        assert any("read-only" in line and "journal failed" in line for line in engine.logs)
        # what it acknowledged is still served
        for i in range(3):
            status, data, _, _ = await engine.read_entry(1, i)
            assert status is StatusCode.OK and data == entry(1, i)
        await asyncio.wait_for(engine.close(), DEADLINE_S)
    asyncio.run(scenario())


def test_the_journal_fails_the_group_in_flight_and_everything_queued_behind_it(tmp_path):
    async def scenario():
        disk = FailingDisk()
        journal = Journal(disk, SystemClock(), str(tmp_path), "6f1c2a9e-0d4b-4c55-9a77-3b1e2f4d5c6a",
                          group_wait_ms_max=0, group_bytes_max=1 << 20, flush_when_idle=True, file_bytes_max=1 << 30,
                          queue_records_max=100, sync_on_loop=True, log=lambda line: None)
        disk.makedirs(str(tmp_path))
        await journal.open(after_id=0)
        journal.start()
        disk.fail = "fsync"
        futures = [journal.append_many([jfmt.fence_record(i)], 1) for i in range(3)]
        done, pending = await asyncio.wait(futures, timeout=DEADLINE_S)
        assert not pending, "a journal caller was left waiting"
        for future in futures:
            assert isinstance(future.exception(), BookieError) and future.exception().status is StatusCode.IO_ERROR
        assert journal.failed is not None and "injected fsync error" in journal.failed
        with pytest.raises(BookieError, match="journal failed"):
            journal.append_many([jfmt.fence_record(9)], 1)
        await asyncio.wait_for(journal.stop(), DEADLINE_S)
    asyncio.run(scenario())
