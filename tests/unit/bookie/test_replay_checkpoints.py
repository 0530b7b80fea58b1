"""Replay's checkpoints (bookie/engine.py, "replay"): when the active write-cache half fills during replay it is
checkpointed in a task while replay fills the other half. Run on the simulator's disk, key-value store and loop
(a crash keeps only what was synced): a crash at any step of such a checkpoint, or at any moment of start-up,
replays to the same content (entries, keys, fences, LACs); the persisted mark never regresses and is always a
group boundary of the journal. Corruption met after replay checkpointed refuses start-up, having moved the mark
no further than the damage.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid

import pytest

from bksim.bookie import replay as replay_module
from bksim.bookie.engine import CHECKPOINT_STEPS, BookieEngine
from bksim.bookie.journal import JournalMark, list_journal_ids
from bksim.bookie.lastmark import read_lastmark
from bksim.formats import journal as jfmt
from bksim.model.config import KiB, BookieConfig
from bksim.model.errors import JournalCorruptError
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S
from bksim.sim.clock import SimClock
from bksim.sim.disk import DiskFaults, SimDisk
from bksim.sim.kv import KvFaults, SimKvRegistry
from bksim.sim.loop import run

from .conftest import KEY, entry

INSTANCE = str(uuid.UUID(int=0x5EED))
JOURNAL_DIR, LEDGER_DIR = "/bookie/journal", "/bookie/ledgers"
NEVER_MS = 86_400_000
# the fill: no checkpoint moves the mark, journals roll every 8 KiB (replay crosses files, collects old ones)
FILL = dataclasses.replace(BookieConfig(), write_cache_bytes_max=4 << 20, flush_interval_ms=NEVER_MS,
                           journal_file_bytes_max=8 * KiB, journal_backups_max=1, write_cache_entry_overhead_bytes=0)
# the replaying engine: halves of 2 KiB (6 entries: entry bytes only), so replay checkpoints every few groups
SMALL = dataclasses.replace(FILL, write_cache_bytes_max=4 * KiB)
LEDGERS = (1, 2, 3)
ROUNDS = 12  # add batches per ledger
BATCH = 4  # entries per add batch (one journal group each)
PAYLOAD = 300
FENCE_ROUND = 1
EXPLICIT_LAC = 1000


class Crash(Exception):
    pass


class World:
    """One bookie's simulated device and stores; engines come and go on them."""

    def __init__(self, seed: int) -> None:
        self.device = SimDisk(DiskFaults(latency_ms_min=0.05, latency_ms_max=0.5, torn_tail_probability=0.5,
                                         torn_zeros_probability=0.3), random.Random(seed))
        self.kv = SimKvRegistry(KvFaults(latency_ms_max=0.3, unsynced_keep_probability=0.5), random.Random(seed + 1))
        self.rng = random.Random(seed + 2)
        self.clock = SimClock()
        self.logs: list[str] = []
        self.expected: dict[tuple[int, int], bytes] = {}

    def engine(self, config: BookieConfig, hook=None) -> BookieEngine:
        return BookieEngine(config, disk=self.device.reopen(), clock=self.clock, open_kv=self.kv.open_kv,
                            instance_id=INSTANCE, journal_dir=JOURNAL_DIR, ledger_dir=LEDGER_DIR,
                            log=self.logs.append, fault_hook=hook)

    def crash(self, engine: BookieEngine) -> None:
        """Power loss: only what was synced stays; the engine's memory is gone."""
        self.device.crash(self.rng)
        self.kv.crash(self.rng)
        engine.abandon()

    def mark(self) -> JournalMark:
        return read_lastmark(self.device.reopen(), LEDGER_DIR)

    def group_boundaries(self) -> set[JournalMark]:
        """Every group start of every journal on the device, and each file's end."""
        disk = self.device.reopen()
        found = {JournalMark(0, 0)}
        for journal_id in list_journal_ids(disk, JOURNAL_DIR):
            data = disk.read_all(f"{JOURNAL_DIR}/{jfmt.journal_file_name(journal_id)}")
            found |= {JournalMark(journal_id, jfmt.FILE_HEADER_BYTES), JournalMark(journal_id, len(data))}
            for batch in jfmt.JournalScan(data, jfmt.FILE_HEADER_BYTES, newest=True):
                found |= {JournalMark(journal_id, r.group) for r in batch}
        return found


def payload(ledger_id: int, entry_id: int) -> bytes:
    return bytes([65 + (ledger_id * 7 + entry_id) % 26]) * PAYLOAD


async def fill(world: World) -> None:
    """Adds to three ledgers (each key journaled with its first add), a fence of ledger 3 early on (its adds go
    on as recovery adds) and an explicit LAC of ledger 2 above its entries' LACs, all journal-synced, none
    checkpointed; then a crash."""
    e = world.engine(FILL)
    await e.start()
    for round_ in range(ROUNDS):
        for ledger_id in LEDGERS:
            ids = range(round_ * BATCH, (round_ + 1) * BATCH)
            entries = [entry(ledger_id, i, payload(ledger_id, i), lac=i - 1) for i in ids]
            flags = FLAG_RECOVERY_ADD if ledger_id == 3 and round_ > FENCE_ROUND else 0
            statuses, why = await e.add_entries([(x, KEY, flags) for x in entries])
            assert statuses == [S.OK] * BATCH, why
            world.expected.update({(ledger_id, i): x for i, x in zip(ids, entries)})
        if round_ == FENCE_ROUND:
            assert (await e.read_entry(3, -1, fence=True, master_key=KEY))[0] == S.OK
        if round_ == ROUNDS // 2:
            assert (await e.write_lac(2, EXPLICIT_LAC, KEY))[0] == S.OK
    assert e.statistics()["checkpoints"] == 1  # its own at start, before any record
    world.crash(e)


async def verify(world: World) -> None:
    """A clean start replays to the filled content: every entry byte for byte, the LACs, the keys, the fence."""
    e = world.engine(SMALL)
    await e.start()
    for (ledger_id, entry_id), expected in sorted(world.expected.items()):
        status, data, _lac, why = await e.read_entry(ledger_id, entry_id)
        assert status == S.OK and data == expected, f"{ledger_id}:{entry_id}: {status.name} {why}"
    last = ROUNDS * BATCH - 1
    last_1 = max(i for lid, i in world.expected if lid == 1)  # each entry's LAC is the entry before it
    assert (await e.read_lac(1))[1:3] == (last_1 - 1, last_1)
    assert (await e.read_lac(2))[1:3] == (EXPLICIT_LAC, last)
    assert (await e.read_lac(3))[1:3] == (last - 1, last)
    for ledger_id in LEDGERS:
        assert (await e.add_entries([(entry(ledger_id, last + 1), b"w" * 32, 0)]))[0] == [S.UNAUTHORIZED]
    assert (await e.add_entries([(entry(3, last + 1), KEY, 0)]))[0] == [S.FENCED]
    added = entry(1, last_1 + 1, lac=last_1)  # the engine takes adds after replay
    assert (await e.add_entries([(added, KEY, 0)]))[0] == [S.OK]
    world.expected[(1, last_1 + 1)] = added
    await e.close()


def test_a_full_half_is_checkpointed_while_replay_fills_the_other(monkeypatch):
    """Replay goes on applying records into the other half while a checkpoint runs (it yields to the checkpoint's
    task after each list of records: lists of about two groups here): the active half grows between the
    checkpoint's first step and its entry-log sync. The marks it persists are group boundaries, in order."""
    monkeypatch.setattr(replay_module, "BATCH_BYTES", 2 * KiB)
    during: list[tuple[str, int]] = []  # (step, active write-cache bytes) of replay's checkpoints
    marks: list[JournalMark] = []

    async def main():
        world = World(1)
        await fill(world)
        boundaries = world.group_boundaries()
        e = None

        def hook(step: str) -> None:
            if e.replay_report is not None:  # start-up's own checkpoint after replay, or close's
                return
            if step in ("mark", "entrylog_sync"):
                during.append((step, e.statistics()["write_cache_bytes"]))
            elif step == "lastmark_write":
                marks.append(world.mark())

        e = world.engine(SMALL, hook)
        await e.start()
        replayed = e.replay_report.records
        await e.close()
        assert replayed == len(LEDGERS) * (ROUNDS * BATCH + 1) + 2  # entries, keys, explicit LAC, fence
        await verify(world)
        assert not asyncio.get_running_loop().uncaught
        assert marks == sorted(marks) and set(marks) <= boundaries

    run(main(), seed=1)
    pairs = [(a, b) for (s, a), (t, b) in zip(during, during[1:]) if (s, t) == ("mark", "entrylog_sync")]
    assert len(pairs) >= 10 and len(marks) >= 10
    # on the simulator's loop replay takes no time, so a checkpoint's I/O ends only once replay waits (both halves
    # full); the checkpoint's first step runs at replay's next yield, after the swap, when the half is not yet full
    assert sum(1 for before, after in pairs if after > before) >= len(pairs) // 3, during


@pytest.mark.parametrize("nth", [1, 2, 7])
@pytest.mark.parametrize("step", CHECKPOINT_STEPS)
def test_a_crash_at_any_step_of_a_replay_checkpoint_replays_to_the_same_content(step, nth):
    async def main():
        world = World(nth)
        await fill(world)
        before = world.mark()
        boundaries = world.group_boundaries()
        count = 0
        e = None

        def hook(at: str) -> None:
            nonlocal count
            if at == step:
                count += 1
                if count == nth:
                    world.crash(e)
                    raise Crash(at)

        e = world.engine(SMALL, hook)
        with pytest.raises((Crash, OSError)):
            await e.start()
        assert count == nth
        after = world.mark()
        assert after >= before and after in boundaries
        await verify(world)
        await verify(world)  # and again: the clean stop's checkpoint left nothing to replay wrongly
        assert not asyncio.get_running_loop().uncaught

    run(main(), seed=nth)


@pytest.mark.parametrize("seed", [3, 4])
def test_a_crash_at_any_moment_of_start_up_replays_to_the_same_content(seed):
    async def duration() -> float:
        world = World(seed)
        await fill(world)
        started = world.clock.monotonic_ms()
        e = world.engine(SMALL)
        await e.start()
        return world.clock.monotonic_ms() - started

    total_ms = run(duration(), seed=seed)
    points = 40

    async def crash_at(at_ms: float) -> None:
        world = World(seed)
        await fill(world)
        before = world.mark()
        boundaries = world.group_boundaries()
        marks = [before]
        for delay_ms in (at_ms, at_ms / 3):  # a crash, then one during the replay after it
            e = world.engine(SMALL)
            task = asyncio.get_running_loop().create_task(e.start())
            try:
                await asyncio.wait_for(asyncio.shield(task), delay_ms / 1000.0)
            except TimeoutError:
                world.crash(e)
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if task.cancelled():
                marks.append(world.mark())
                assert marks[-1] in boundaries
            else:
                world.crash(e)
        assert marks == sorted(marks)
        await verify(world)
        assert not asyncio.get_running_loop().uncaught

    for i in range(1, points):
        run(crash_at(total_ms * i / points), seed=seed)


def test_corruption_met_after_replay_checkpoints_refuses_start_then_is_skipped_when_asked():
    async def main():
        world = World(5)
        await fill(world)
        disk = world.device.reopen()
        ids = list_journal_ids(disk, JOURNAL_DIR)
        assert len(ids) >= 3
        path = f"{JOURNAL_DIR}/{jfmt.journal_file_name(ids[1])}"  # an older journal: damage there is corruption
        data = bytearray(disk.read_all(path))
        groups = sorted({r.group for batch in jfmt.JournalScan(bytes(data), jfmt.FILE_HEADER_BYTES, False)
                         for r in batch})
        damaged = groups[len(groups) // 2]
        data[damaged + jfmt.GROUP_RECORD_BYTES + 20] ^= 0x40  # inside the group's first record
        f = disk.create(path + ".tmp")
        f.write(bytes(data))
        await f.sync()
        disk.rename(path + ".tmp", path)
        await disk.sync_dir(JOURNAL_DIR)

        e = world.engine(SMALL)
        with pytest.raises(JournalCorruptError, match="fails its CRC"):
            await e.start()
        e.abandon()
        assert e.statistics()["checkpoints"] >= 2  # replay checkpointed before it met the damage
        mark = world.mark()
        assert JournalMark(ids[0], 0) < mark <= JournalMark(ids[1], damaged)
        e = world.engine(dataclasses.replace(SMALL, journal_skip_corruption=True))
        await e.start()
        assert e.replay_report.skipped and any("CORRUPTION SKIPPED" in line for line in world.logs)
        lost = {key for key, value in world.expected.items()
                if (await e.read_entry(*key))[1] != value}
        assert 0 < len(lost) <= BATCH  # one group's entries
        await e.close()
        assert not asyncio.get_running_loop().uncaught

    run(main(), seed=5)
