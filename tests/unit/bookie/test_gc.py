"""Garbage collection and compaction (bookie/gc.py, bookie/compaction.py, the engine's primitives): deleted
ledgers free their entries and logs; a ledger touched while the metadata was read survives; a failed or
partial metadata read deletes nothing; compaction keeps every live entry readable with its bytes and frees
the old log; an entry re-added during compaction is not clobbered; a crash at every step, then a restart,
keeps every live entry readable."""
from __future__ import annotations

import asyncio
import os

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.bookie_gc import MetadataLedgerSource
from bksim.bookie.engine import GC_AND_COMPACTION_STEPS
from bksim.bookie.gc import GarbageCollector
from bksim.formats import entry_log as log_fmt
from bksim.metadata.ledger_manager import create_ledger_metadata, delete_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata, Segment
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import INSTANCEID
from bksim.model.errors import ConnectionLossError
from bksim.model.status import StatusCode as S
from helpers import wait_until_async

from .conftest import KEY, entry

SMALL = dict(entry_log_bytes_max=4096, compaction_rate_bytes_per_s=0)


class Source:
    """The metadata port in memory: a set of ledger ids, failures and a hook run inside the listing."""

    def __init__(self, ids=()) -> None:
        self.ids = set(ids)
        self.fail_list = False
        self.fail_exists: set[int] = set()
        self.during_list = None  # async callable run after the listing is taken, before it is returned
        self.lists = self.exists_reads = 0

    async def ledger_ids(self):
        self.lists += 1
        if self.fail_list:
            raise ConnectionLossError("/ledgers", "connection lost")
        listing = set(self.ids)
        if self.during_list is not None:
            await self.during_list()
        return listing

    async def ledger_exists(self, ledger_id: int) -> bool:
        self.exists_reads += 1
        if ledger_id in self.fail_exists:
            raise ConnectionLossError(f"/ledgers/L{ledger_id}", "connection lost")
        return ledger_id in self.ids


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    return (f"{ledger_id}:{entry_id}:".encode() * (size // 4 + 1))[:size]


async def write(e, ledger_id: int, ids, size: int = 100) -> dict[int, bytes]:
    entries = {i: entry(ledger_id, i, payload(ledger_id, i, size)) for i in ids}
    statuses, message = await e.add_entries([(b, KEY, 0) for b in entries.values()])
    assert statuses == [S.OK] * len(entries), message
    return entries


async def readable(e, ledger_id: int, expected: dict[int, bytes]) -> None:
    for entry_id, data in expected.items():
        status, got, _, message = await e.read_entry(ledger_id, entry_id)
        assert (status, got) == (S.OK, data), f"{ledger_id}:{entry_id}: {status.name} {message}"


def files(engines) -> list[str]:
    return sorted(os.listdir(os.path.join(engines.ledger_dir, "entrylogs")))


def log_ids_of(engines) -> list[int]:
    return [i for i in map(log_fmt.parse_entry_log_file_name, files(engines)) if i is not None]


async def mixed_history(e) -> tuple[dict[int, bytes], dict[int, bytes], dict[int, bytes]]:
    """Ledger 1 alone in some logs (dead once it is deleted), then ledgers 1, 2, 3 together in others (sparse
    once ledger 1 is deleted: its entries are large), then journal-only entries of 2 and 3 (no checkpoint)."""
    one = await write(e, 1, range(0, 12), size=600)
    await e.checkpoint()
    two, three = {}, {}
    for round_ in range(8):
        one |= await write(e, 1, range(12 + 2 * round_, 14 + 2 * round_), size=600)
        two |= await write(e, 2, range(round_, round_ + 1))
        three |= await write(e, 3, range(round_, round_ + 1))
        await e.checkpoint()
    two |= await write(e, 2, range(8, 10))
    three |= await write(e, 3, range(8, 10))
    return one, two, three


def test_deleted_ledger_frees_its_entries_and_logs_and_stays_gone_after_restart(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        one = await write(e, 1, range(20), size=500)
        await e.checkpoint()
        two = await write(e, 2, range(20), size=500)
        await e.checkpoint()
        logs_before = log_ids_of(engines)
        await e.refresh_log_meta()
        stats = {s["log_id"]: s for s in e.entry_log_stats()}
        only_one = [i for i, s in stats.items() if not s["current"] and s["ledger_ids"] == [1]]
        assert len(only_one) >= 2 and set(only_one) <= set(logs_before)
        gc = GarbageCollector(e, Source({2}), e.config, SystemClock(), log=engines.logs.append)
        report = await gc.run("gc")
        assert report.error is None and report.ledgers_deleted == [1]
        assert set(report.logs_deleted) == set(only_one) and report.bytes_freed > 0
        assert not set(report.logs_deleted) & set(log_ids_of(engines))
        assert (await e.read_entry(1, 3))[0] == S.NO_LEDGER
        assert (await e.read_lac(1))[0] == S.NO_LEDGER
        assert (await e.list_entries(1))[0] == S.NO_LEDGER
        await readable(e, 2, two)
        assert 1 not in e.gc_ledger_ids()
        assert gc.status()["totals"]["ledgers_deleted"] == 1
        await e.close()
        e = await engines.started(**SMALL)
        assert (await e.read_entry(1, 0))[0] == S.NO_LEDGER
        await readable(e, 2, two)
        await e.refresh_log_meta()  # every log was sealed (rolled, or at close): nothing to scan
        assert not [line for line in engines.logs if "scanned" in line and "(0 scanned)" not in line]
        assert one  # ledger 1 was written and is gone
        await e.close()

    asyncio.run(scenario())


def test_ledger_touched_while_the_metadata_is_read_is_not_deleted(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        old = await write(e, 5, range(3))
        seven = await write(e, 7, range(2))  # a ledger being created: its writer got here first
        await e.checkpoint()
        source = Source(set())  # the listing and the re-reads lag: neither ledger is there yet

        async def writers_touch_them_meanwhile():
            seven.update(await write(e, 7, range(2, 4)))
            assert (await e.read_entry(5, 0, fence=True, master_key=KEY))[0] == S.OK  # a fence touches 5
            await write(e, 8, range(2))  # created during the round: not even a candidate

        source.during_list = writers_touch_them_meanwhile
        report = await GarbageCollector(e, source, e.config, SystemClock()).run("gc")
        assert report.error is None and report.candidates == 2 and report.ledgers_deleted == []
        await readable(e, 7, seven)
        await readable(e, 5, old)
        source.during_list = None  # the next round, started after the touches, may delete them
        report = await GarbageCollector(e, source, e.config, SystemClock()).run("gc")
        assert report.ledgers_deleted == [5, 7, 8]
        await e.close()

    asyncio.run(scenario())


def test_failed_listing_or_verification_deletes_nothing(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        kept = {lid: await write(e, lid, range(4)) for lid in (1, 2, 3)}
        await e.checkpoint()
        source = Source({2})
        source.fail_list = True
        gc = GarbageCollector(e, source, e.config, SystemClock())
        report = await gc.run("major")
        assert "ConnectionLossError" in report.error and report.ledgers_deleted == []
        source.fail_list = False
        source.fail_exists = {3}  # the re-read of one candidate fails: the whole round stops
        report = await gc.run("gc")
        assert "ConnectionLossError" in report.error and report.ledgers_deleted == [] and source.exists_reads >= 1
        source.fail_exists = set()
        source.ids.add(3)  # a lagging listing: 3 is missing from it but a re-read finds it
        source.during_list = None
        listing_without_3 = Source({2})
        listing_without_3.ledger_exists = source.ledger_exists
        report = await GarbageCollector(e, listing_without_3, e.config, SystemClock()).run("gc")
        assert report.ledgers_deleted == [1] and report.kept_by_verify == 1
        for lid in (2, 3):
            await readable(e, lid, kept[lid])
        assert gc.status()["totals"]["rounds_failed"] == 2
        await e.close()

    asyncio.run(scenario())


def test_metadata_source_refuses_another_cluster_and_lists_ledgers(engines):
    async def scenario():
        store = InMemoryMetadataStore()
        source = MetadataLedgerSource(store, "cluster-a")
        with pytest.raises(Exception, match="INSTANCEID"):
            await source.ledger_ids()
        await store.create(INSTANCEID, b"cluster-b", make_parents=True)
        with pytest.raises(Exception, match="another cluster"):
            await source.ledger_ids()
        await store.set(INSTANCEID, b"cluster-a", -1)
        for lid in (3, 12345):
            await create_ledger_metadata(store, lid, LedgerMetadata(
                ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=(Segment(0, ("b1:1",)),)))
        assert list(await source.ledger_ids()) == [3, 12345]
        await delete_ledger_metadata(store, 3)
        assert not await source.ledger_exists(3) and await source.ledger_exists(12345)

    asyncio.run(scenario())


def test_metadata_source_syncs_before_it_lists(engines):
    """The bookie's ZooKeeper session may be on a server behind the leader: the listing must follow a sync, or
    a ledger created and written just before the round could be missing from it (and from the second read)."""
    calls = []

    class Recording(InMemoryMetadataStore):
        async def sync(self, path):
            calls.append(("sync", path))
            await super().sync(path)

        async def children(self, path):
            calls.append(("children", path))
            return await super().children(path)

    async def scenario():
        store = Recording()
        await store.create(INSTANCEID, b"cluster-a", make_parents=True)
        await MetadataLedgerSource(store, "cluster-a").ledger_ids()
        assert calls[0] == ("sync", "/ledgers") and ("children", "/ledgers") in calls[1:]

    asyncio.run(scenario())


def test_compaction_keeps_live_entries_byte_identical_and_frees_the_old_logs(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        one, two, three = await mixed_history(e)
        await e.checkpoint()
        gc = GarbageCollector(e, Source({2, 3}), e.config, SystemClock())
        report = await gc.run("gc")
        assert report.ledgers_deleted == [1] and report.logs_deleted and report.logs_compacted == []
        sparse = e.compaction_candidates(e.config.major_compaction_threshold)
        assert sparse and all(s["live_ratio"] < 0.5 for s in e.entry_log_stats() if s["log_id"] in sparse)
        report = await gc.run("major")
        assert report.error is None and sorted(report.logs_compacted) == sorted(sparse)
        assert report.entries_copied > 0 and report.bytes_freed > report.bytes_copied
        on_disk = log_ids_of(engines)
        assert not set(sparse) & set(on_disk)
        assert not [f for f in files(engines) if not f.endswith(".log")]
        assert e.compaction_candidates(e.config.major_compaction_threshold) == []
        await readable(e, 2, two)
        await readable(e, 3, three)
        await e.close()
        e = await engines.started(**SMALL)
        await readable(e, 2, two)
        await readable(e, 3, three)
        assert (await e.read_entry(1, 0))[0] == S.NO_LEDGER and one
        await e.close()

    asyncio.run(scenario())


def test_entries_changed_during_compaction_are_not_clobbered(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        _one, two, three = await mixed_history(e)
        four = await write(e, 4, range(3))
        await e.checkpoint()
        gc = GarbageCollector(e, Source({2, 3, 4}), e.config, SystemClock())
        assert (await gc.run("gc")).ledgers_deleted == [1]
        sparse = e.compaction_candidates(e.config.major_compaction_threshold)
        assert sparse
        rewritten = entry(2, 0, b"written again while the compaction copied")
        done = {"once": False}

        async def throttle(nbytes):
            if not done["once"]:  # mid-copy: entry 2:0 is re-added and checkpointed, ledger 3 is deleted
                done["once"] = True
                assert (await e.add_entries([(rewritten, KEY, 0)]))[0] == [S.OK]
                await e.checkpoint()
                assert await e.delete_ledgers([3], e.gc_generation) == [3]

        for log_id in sparse:
            await e.compact_log(log_id, throttle)
        assert done["once"]
        assert (await e.read_entry(2, 0))[:2] == (S.OK, rewritten)
        await readable(e, 2, {k: v for k, v in two.items() if k})
        assert (await e.read_entry(3, 0))[0] == S.NO_LEDGER and three
        await readable(e, 4, four)
        await e.close()
        e = await engines.started(**SMALL)
        assert (await e.read_entry(2, 0))[:2] == (S.OK, rewritten)
        assert (await e.read_entry(3, 1))[0] == S.NO_LEDGER
        await e.close()

    asyncio.run(scenario())


class Crash(Exception):
    pass


@pytest.mark.parametrize("crash_step", GC_AND_COMPACTION_STEPS)
def test_crash_at_every_gc_and_compaction_step_keeps_every_live_entry(engines, crash_step):
    armed = {"on": False, "hit": False}

    def hook(step):
        if armed["on"] and step == crash_step:
            armed["hit"] = True
            raise Crash(step)

    async def scenario():
        e = engines.make(fault_hook=hook, **SMALL)
        await e.start()
        _one, two, three = await mixed_history(e)
        source = Source({2, 3})
        armed["on"] = True
        report = await GarbageCollector(e, source, e.config, SystemClock()).run("major")
        assert armed["hit"] and "Crash" in report.error
        await readable(e, 2, two)  # still served by the engine that failed
        await readable(e, 3, three)
        e.abandon()
        e = await engines.started(**SMALL)
        await readable(e, 2, two)
        await readable(e, 3, three)
        report = await GarbageCollector(e, source, e.config, SystemClock()).run("major")
        assert report.error is None
        await readable(e, 2, two)
        await readable(e, 3, three)
        assert (await e.read_entry(1, 0))[0] == S.NO_LEDGER
        assert not [f for f in files(engines) if not f.endswith(".log")]
        assert all(s["live_bytes"] for s in e.entry_log_stats() if not s["current"])
        await e.close()
        e = await engines.started(**SMALL)
        await readable(e, 2, two)
        await readable(e, 3, three)
        await e.close()

    asyncio.run(scenario())


def test_periodic_loop_runs_rounds_and_disk_full_triggers_a_major_round(engines):
    async def scenario():
        e = await engines.started(**SMALL, gc_wait_time_ms=50)
        await mixed_history(e)
        await e.checkpoint()
        gc = GarbageCollector(e, Source({2, 3}), e.config, SystemClock())
        assert gc.due_kind() == "gc"
        gc.start()
        try:
            await wait_until_async(lambda: gc.totals["ledgers_deleted"], 5, message="a periodic round deleting")
            assert gc.totals["ledgers_deleted"] == 1 and gc.totals["logs_compacted"] == 0
            e.set_disk_usage(100, 1)  # 99% used: read-only
            assert e.disk_full and gc.due_kind() == "major"
            gc.note_disk_state()
            await wait_until_async(lambda: gc.totals["logs_compacted"], 5, message="a disk-full round compacting")
            assert gc.totals["logs_compacted"] >= 1
            assert e.set_disk_usage(100, 50) and not e.read_only  # freed: writable again below the low-water mark
        finally:
            await gc.stop()
        await e.close()

    asyncio.run(scenario())


def test_every_live_entry_reads_back_at_every_step_of_a_running_compaction(engines):
    """Between the index batch and the rename the index names the new log while its file still has its
    `.compacted` name: reads in that window (and at every other step) get the entry's bytes."""
    live: dict[tuple[int, int], bytes] = {}
    seen_steps: list[str] = []

    def hook(step):
        if step.startswith("compact_"):
            seen_steps.append(step)
            e._read_cache.drop_ledgers({2, 3})  # force the index + entry-log path
            for (lid, eid), data in live.items():
                assert e._get(lid, eid) == data, (step, lid, eid)

    async def scenario():
        nonlocal e
        e = engines.make(fault_hook=hook, **SMALL)
        await e.start()
        _one, two, three = await mixed_history(e)
        live.update({(2, k): v for k, v in two.items()} | {(3, k): v for k, v in three.items()})
        report = await GarbageCollector(e, Source({2, 3}), e.config, SystemClock()).run("major")
        assert report.error is None and report.logs_compacted
        assert {"compact_index", "compact_rename"} <= set(seen_steps)
        await e.close()

    e = None
    asyncio.run(scenario())


class FlakyStore(InMemoryMetadataStore):
    """The in-memory metadata store whose listing of one directory fails (a connection loss mid-walk)."""

    failing: str | None = None

    async def children(self, path: str) -> list[str]:
        if path == self.failing:
            raise ConnectionLossError(path, "connection lost mid-walk")
        return await super().children(path)


def test_a_listing_that_fails_midway_deletes_nothing(engines):
    async def scenario():
        store = FlakyStore()
        await store.create(INSTANCEID, engines.instance_id.encode(), make_parents=True)
        for lid in (3, 20_000):  # /ledgers/00/0000/L0003 and /ledgers/00/0002/L0000
            await create_ledger_metadata(store, lid, LedgerMetadata(
                ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=(Segment(0, ("b1:1",)),)))
        e = await engines.started(**SMALL)
        kept = {lid: await write(e, lid, range(3)) for lid in (3, 5, 20_000)}  # 5 has no metadata
        gc = GarbageCollector(e, MetadataLedgerSource(store, engines.instance_id), e.config, SystemClock())
        store.failing = "/ledgers/00/0002"  # the walk got through /ledgers/00/0000, then lost the connection
        report = await gc.run("major")
        assert "ConnectionLossError" in report.error and report.ledgers_deleted == []
        for lid, entries in kept.items():
            await readable(e, lid, entries)
        store.failing = None
        report = await gc.run("gc")
        assert report.error is None and report.ledgers_deleted == [5]
        await readable(e, 20_000, kept[20_000])
        await e.close()

    asyncio.run(scenario())


def test_a_compaction_that_runs_out_of_disk_leaves_no_file_and_loses_nothing(engines):
    async def scenario():
        e = await engines.started(**SMALL)
        _one, two, three = await mixed_history(e)
        gc = GarbageCollector(e, Source({2, 3}), e.config, SystemClock())
        assert (await gc.run("gc")).ledgers_deleted == [1]
        real_create = e._disk.create

        def create_on_a_full_disk(path):
            f = real_create(path)
            if path.endswith(".compacting"):
                async def no_space(chunks):
                    raise OSError(28, "No space left on device")
                f.write_chunks = no_space
            return f

        e._disk.create = create_on_a_full_disk
        report = await gc.run("major")
        assert "No space left" in report.error and report.logs_compacted == []
        assert [f for f in files(engines) if not f.endswith(".log")] == []
        await readable(e, 2, two)
        await readable(e, 3, three)
        e._disk.create = real_create
        report = await gc.run("major")
        assert report.error is None and report.logs_compacted
        await readable(e, 2, two)
        await e.close()

    asyncio.run(scenario())


def test_a_log_whose_scan_stops_on_damage_is_kept_while_the_index_points_into_it(engines):
    """A log a crash left without its map is scanned; a damaged length field in its middle hides the records
    after it (here every record of ledger 2). Ledger 1 deleted, the log looks dead by what the scan saw, but
    the index still points into it for ledger 2: it must stay, and ledger 2 stays readable."""
    async def scenario():
        e = await engines.started(entry_log_bytes_max=1 << 20, compaction_rate_bytes_per_s=0)
        one = await write(e, 1, range(5))
        two = await write(e, 2, range(5))
        await e.checkpoint()  # one run per ledger, 1 before 2, in the log being written
        log_id = e._entry_logger.current_log_id
        last_of_one = e._locations.get(1, 4)
        e.abandon()  # no map
        path = os.path.join(engines.ledger_dir, "entrylogs", log_fmt.entry_log_file_name(log_id))
        with open(path, "r+b") as f:
            f.seek(last_of_one.offset)
            f.write(b"\xff\xff\xff\xff")  # the length field of entry 1:4
        e = await engines.started(entry_log_bytes_max=1 << 20, compaction_rate_bytes_per_s=0)
        gc = GarbageCollector(e, Source({2}), e.config, SystemClock())
        report = await gc.run("major")
        assert report.error is None and report.ledgers_deleted == [1] and log_id not in report.logs_deleted
        [stats] = [s for s in e.entry_log_stats() if s["log_id"] == log_id]
        assert stats["ledger_ids"] == [-1, 1] and stats["live_bytes"] == 0  # ledger 2 unseen by the scan
        assert os.path.exists(path)
        await readable(e, 2, two)
        assert one
        await e.close()

    asyncio.run(scenario())
