"""The storage engine's operations and status codes (PROTOCOL.md §2.1), over real files and RocksDB."""
from __future__ import annotations

import asyncio
import os

import pytest

from bksim.formats import entry_log
from bksim.formats.entry import decode_entry
from bksim.model.errors import FormatError
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S
from fakes.clock import ManualClock
from helpers import wait_until_async

from .conftest import KEY, entry


def run(coro):
    return asyncio.run(coro)


def test_add_read_and_last_entry(engines):
    async def scenario():
        e = await engines.started()
        statuses, msg = await e.add_entries([(entry(1, i, lac=i - 1), KEY, 0) for i in range(10)])
        assert statuses == [S.OK] * 10 and msg == ""
        status, data, lac, _ = await e.read_entry(1, 3)
        assert (status, data) == (S.OK, entry(1, 3, lac=2))
        assert lac == 8  # the highest piggybacked LAC seen
        status, data, _, _ = await e.read_entry(1, -1)
        assert (status, data) == (S.OK, entry(1, 9, lac=8))
        assert await e.read_lac(1) == (S.OK, 8, 9, "")
        await e.close()
    run(scenario())


def test_negatives_are_explicit(engines):
    async def scenario():
        e = await engines.started()
        assert (await e.read_entry(5, 0))[0] == S.NO_LEDGER
        assert (await e.read_lac(5))[0] == S.NO_LEDGER
        await e.add_entries([(entry(5, 0), KEY, 0)])
        assert (await e.read_entry(5, 1))[0] == S.NO_ENTRY
        await e.close()
    run(scenario())


def test_master_key_mismatch_is_unauthorized(engines):
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, 0), KEY, 0)])
        statuses, msg = await e.add_entries([(entry(1, 1), b"x" * 32, 0)])
        assert statuses == [S.UNAUTHORIZED] and "master key" in msg
        assert (await e.read_entry(1, -1, fence=True, master_key=b"x" * 32))[0] == S.UNAUTHORIZED
        assert (await e.write_lac(1, 0, b"x" * 32))[0] == S.UNAUTHORIZED
        assert (await e.read_entry(1, 1))[0] == S.NO_ENTRY  # the rejected add left nothing behind
        await e.close()
    run(scenario())


def test_fence_blocks_normal_adds_but_not_recovery_adds_and_survives_restart(engines):
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, 0), KEY, 0)])
        status, data, _, _ = await e.read_entry(1, -1, fence=True, master_key=KEY)
        assert (status, data) == (S.OK, entry(1, 0))
        assert (await e.add_entries([(entry(1, 1), KEY, 0)]))[0] == [S.FENCED]
        assert (await e.add_entries([(entry(1, 1), KEY, FLAG_RECOVERY_ADD)]))[0] == [S.OK]
        e.abandon()  # crash: no checkpoint, the fence lives only in the journal
        e = await engines.started()
        assert (await e.add_entries([(entry(1, 2), KEY, 0)]))[0] == [S.FENCED]
        assert (await e.read_entry(1, 1))[1] == entry(1, 1)
        await e.close()
    run(scenario())


def test_fencing_an_unknown_ledger_creates_its_record(engines):
    async def scenario():
        e = await engines.started()
        assert (await e.read_entry(9, -1, fence=True, master_key=KEY))[0] == S.NO_ENTRY
        assert (await e.add_entries([(entry(9, 0), KEY, 0)]))[0] == [S.FENCED]
        e.abandon()
        e = await engines.started()
        assert (await e.read_entry(9, 0))[0] == S.NO_ENTRY  # known ledger now: an explicit "no entry"
        assert (await e.add_entries([(entry(9, 0), KEY, 0)]))[0] == [S.FENCED]
        await e.close()
    run(scenario())


def test_bad_requests_are_rejected_and_the_batch_rest_succeeds(engines):
    async def scenario():
        e = await engines.started(entry_bytes_max=4096, write_cache_bytes_max=1 << 20)
        items = [(b"short", KEY, 0), (entry(1, 0, b"x" * 8000), KEY, 0), (entry(1, 1), KEY, 0), (entry(1, 2), b"", 0),
                 (entry(2, 0), b"", 0)]
        statuses, msg = await e.add_entries(items)
        # an empty key for a known ledger is a key mismatch; for an unknown ledger it is a bad request
        assert statuses == [S.BAD_REQUEST, S.BAD_REQUEST, S.OK, S.UNAUTHORIZED, S.BAD_REQUEST]
        assert "entry of 5 bytes" in msg
        assert (await e.read_entry(1, 1))[0] == S.OK
        await e.close()
    run(scenario())


def test_readd_is_idempotent(engines):
    async def scenario():
        e = await engines.started()
        for _ in range(2):
            assert (await e.add_entries([(entry(1, 0), KEY, 0)]))[0] == [S.OK]
            await e.checkpoint()
        assert (await e.read_entry(1, 0))[1] == entry(1, 0)
        await e.close()
    run(scenario())



def test_a_readd_replaces_the_copy_a_read_cached(engines):
    """A copy read from an entry log is cached; a recovery add of other bytes for the same entry (an entry log
    byte flipped under the bookie, then the copy restored by autorecovery) must be what reads return once it
    is checkpointed, not the cached old copy."""
    async def scenario():
        e = await engines.started()
        old, new = entry(1, 0, b"flipped payload"), entry(1, 0, b"restored payload")
        assert (await e.add_entries([(old, KEY, 0)]))[0] == [S.OK]
        await e.checkpoint()
        assert (await e.read_entry(1, 0))[1] == old  # from the entry log: now in the read cache
        assert (await e.add_entries([(new, KEY, FLAG_RECOVERY_ADD)]))[0] == [S.OK]
        assert (await e.read_entry(1, 0))[1] == new  # from the write cache
        await e.checkpoint()
        assert (await e.read_entry(1, 0))[1] == new  # from the index: the cached old copy is gone
        await e.close()
        e = await engines.started()
        assert (await e.read_entry(1, 0))[1] == new
        await e.close()
    run(scenario())

def test_corrupt_entry_log_record_is_io_error_never_no_entry(engines):
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(3, i), KEY, 0) for i in range(3)])
        await e.close()  # checkpoint: the entries now live in an entry log
        log_dir = os.path.join(engines.ledger_dir, "entrylogs")
        path = next(os.path.join(log_dir, n) for n in sorted(os.listdir(log_dir)) if os.path.getsize(os.path.join(log_dir, n)) > entry_log.HEADER_BYTES)
        with open(path, "r+b") as f:  # overwrite the entry id of the first record
            f.seek(entry_log.HEADER_BYTES + 4 + 8)
            f.write((77).to_bytes(8, "big"))
        e = await engines.started()
        status, _, _, msg = await e.read_entry(3, 0)
        assert status == S.IO_ERROR and "index says 3:0" in msg
        assert (await e.read_entry(3, 1))[0] == S.OK
        await e.close()
        os.truncate(path, entry_log.HEADER_BYTES + 10)  # every record is now missing or short
        e = await engines.started()
        assert (await e.read_entry(3, 2))[0] == S.IO_ERROR
        assert (await e.read_lac(3))[0] == S.IO_ERROR  # the LAC comes from the unreadable last entry
        # conservative: the answer would carry a LAC this bookie cannot read, so it is unknown, not "no"
        assert (await e.read_entry(3, 5))[0] == S.IO_ERROR
        await e.close()
    run(scenario())


def test_a_damaged_last_entry_makes_the_lac_unknown_but_every_entry_is_still_served(engines):
    """The known LAC comes from the ledger's last entry in the entry log; when that entry is damaged the LAC is
    unknown (ReadLac: IO_ERROR), but every entry is still served: its answer's LAC is then only a lower
    bound (piggybacked and explicit LACs seen since the start), never a reason to refuse the entry."""
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(3, i), KEY, 0) for i in range(3)])
        await e.close()  # checkpoint: the entries now live in an entry log
        log_dir = os.path.join(engines.ledger_dir, "entrylogs")
        path = next(os.path.join(log_dir, n) for n in sorted(os.listdir(log_dir))
                    if os.path.getsize(os.path.join(log_dir, n)) > entry_log.HEADER_BYTES)
        with open(path, "r+b") as f:
            data = f.read()
            at = data.rindex(entry(3, 2)) + len(entry(3, 2)) - 1  # the last payload byte of the last entry
            f.seek(at)
            f.write(bytes([data[at] ^ 0xFF]))
        e = await engines.started()
        for wanted in (2, -1):  # the damaged entry itself is served as stored, as any other: readers verify digests
            status, data, _, _ = await e.read_entry(3, wanted)
            assert status == S.OK and data != entry(3, 2)
            with pytest.raises(FormatError, match="digest mismatch"):
                decode_entry(data, ledger_id=3, entry_id=2)
        assert (await e.read_lac(3))[0] == S.IO_ERROR
        for i in (0, 1):
            status, data, lac, msg = await e.read_entry(3, i)
            assert (status, data) == (S.OK, entry(3, i)), msg
            assert lac == -1  # nothing piggybacked or explicit since the start: the lower bound is -1
        await e.close()
    run(scenario())


def test_read_only_mode_rejects_normal_adds_keeps_reads_fences_and_recovery_adds(engines):
    async def scenario():
        e = await engines.started(disk_usage_threshold=0.9, disk_usage_lwm_threshold=0.8,
                                  recovery_add_reserve_bytes=100)
        await e.add_entries([(entry(1, 0), KEY, 0)])
        assert e.set_disk_usage(1000, 50) is True and e.read_only
        statuses, msg = await e.add_entries([(entry(1, 1), KEY, 0)])
        assert statuses == [S.READ_ONLY] and "read-only" in msg
        assert (await e.add_entries([(entry(1, 1), KEY, FLAG_RECOVERY_ADD)]))[0] == [S.READ_ONLY]  # below reserve
        assert e.set_disk_usage(1000, 150) is False and e.read_only  # 85% used: above the low-water mark
        assert (await e.add_entries([(entry(1, 1), KEY, FLAG_RECOVERY_ADD)]))[0] == [S.OK]
        assert (await e.read_entry(1, 0))[0] == S.OK
        assert (await e.read_entry(1, -1, fence=True, master_key=KEY))[0] == S.OK
        assert e.info()["state"] == "read-only"
        assert e.set_disk_usage(1000, 300) is True and not e.read_only
        assert (await e.add_entries([(entry(2, 0), KEY, 0)]))[0] == [S.OK]
        await e.close()
    run(scenario())


def test_full_write_cache_checkpoints_then_throttles_to_too_many_requests(engines):
    async def scenario():
        e = await engines.started(write_cache_bytes_max=64 * 1024, entry_bytes_max=16 * 1024,
                                  write_cache_throttle_ms_max=200)
        # more than a half cache: a checkpoint frees room and every add succeeds
        statuses, _ = await e.add_entries([(entry(1, i, b"x" * 4000), KEY, 0) for i in range(40)])
        assert statuses == [S.OK] * 40
        assert e.statistics()["checkpoints"] >= 2
        # a checkpoint that cannot finish leaves adds waiting, then TOO_MANY_REQUESTS
        await e.checkpoint()
        async with e._checkpoint_lock:  # hold the flush: nothing can make room
            statuses, msg = await e.add_entries([(entry(2, i, b"y" * 4000), KEY, 0) for i in range(20)])
        assert S.TOO_MANY_REQUESTS in statuses and "write_cache_throttle_ms_max" in msg
        assert statuses[0] == S.OK
        for i in range(40):
            assert (await e.read_entry(1, i))[1] == entry(1, i, b"x" * 4000)
        await e.close()
    run(scenario())


def test_an_add_waiting_for_room_while_the_checkpoint_lock_is_held_gets_a_checkpoint_when_it_is_released(engines):
    """The write cache is full while something else holds the checkpoint lock (a checkpoint finishing its journal
    clean-up, a garbage-collection step): the add waiting for room must not wait for the periodic checkpoint,
    nor time out with TOO_MANY_REQUESTS: the checkpoint it asked for runs as soon as the lock is free."""
    async def scenario():
        e = await engines.started(write_cache_bytes_max=64 * 1024, entry_bytes_max=16 * 1024,
                                  write_cache_throttle_ms_max=2_000, flush_interval_ms=600_000)
        statuses, _ = await e.add_entries([(entry(1, i, b"x" * 4000), KEY, 0) for i in range(8)])
        assert statuses == [S.OK] * 8 and not e._write_cache.has_room(4000)  # the active half is full
        async with e._checkpoint_lock:
            waiting = asyncio.ensure_future(e.add_entries([(entry(1, 8, b"x" * 4000), KEY, 0)]))
            # the add finds no room and asks for a checkpoint
            await wait_until_async(lambda: e.statistics()["throttled"], 5, interval_s=0,
                                   message="the add to wait for room")
            assert not waiting.done() and e.statistics()["throttled"] == 1
        statuses, msg = await waiting
        assert statuses == [S.OK], msg
        assert (await e.read_entry(1, 8))[1] == entry(1, 8, b"x" * 4000)
        await e.close()
    run(scenario())


def test_explicit_lac_is_journaled(engines):
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, i, lac=i - 1), KEY, 0) for i in range(5)])
        assert (await e.write_lac(1, 4, KEY)) == (S.OK, "")
        assert (await e.read_lac(1))[1] == 4
        e.abandon()
        e = await engines.started()
        assert await e.read_lac(1) == (S.OK, 4, 4, "")
        await e.close()
    run(scenario())


def test_rolled_entry_logs_carry_their_ledger_map_and_reads_span_logs(engines):
    async def scenario():
        e = await engines.started(entry_log_bytes_max=2048)
        await e.add_entries([(entry(1 + i % 2, i // 2, b"x" * 300), KEY, 0) for i in range(20)])
        await e.checkpoint()
        log_dir = os.path.join(engines.ledger_dir, "entrylogs")
        sealed = 0
        for name in sorted(os.listdir(log_dir)):
            data = open(os.path.join(log_dir, name), "rb").read()
            header, records, problem = entry_log.scan(data)
            assert problem is None
            if header.ledger_map_offset:  # a rolled log: the patched header names its ledger map
                sealed += 1
                maps = [r for r in records if r.ledger_map is not None]
                assert len(maps) == 1 and maps[0].offset == header.ledger_map_offset
                assert set(maps[0].ledger_map) <= {1, 2} and header.ledger_count == len(maps[0].ledger_map)
        assert sealed >= 3
        for i in range(20):
            assert (await e.read_entry(1 + i % 2, i // 2))[1] == entry(1 + i % 2, i // 2, b"x" * 300)
        await e.close()
    run(scenario())


def test_instance_id_with_or_without_dashes_is_the_same_cluster(engines):
    async def scenario():
        engines.instance_id = engines.instance_id.replace("-", "")
        e = await engines.started()
        await e.add_entries([(entry(1, 0), KEY, 0)])
        e.abandon()
        e = await engines.started()
        assert e.replay_report.records >= 1 and (await e.read_entry(1, 0))[0] == S.OK
        await e.close()
    run(scenario())


def test_a_fence_is_journaled_once_and_concurrent_fences_share_its_sync(engines):
    """Recovery reads forward with FENCE on every read: only the first journals a fence record; reads that
    arrive while its sync is in flight wait for that sync; later ones answer at once (and after a restart,
    the replayed fence counts as durable)."""
    async def scenario():
        e = await engines.started()
        await e.add_entries([(entry(1, i), KEY, 0) for i in range(5)])
        results = await asyncio.gather(*[e.read_entry(1, i, fence=True, master_key=KEY) for i in range(5)])
        assert [r[0] for r in results] == [S.OK] * 5
        assert e.stats["fences"] == 1
        assert (await e.read_entry(1, 2, fence=True, master_key=KEY))[0] == S.OK
        assert e.stats["fences"] == 1
        assert (await e.read_entry(1, 2, fence=True, master_key=b"x" * 32))[0] == S.UNAUTHORIZED
        e.abandon()
        e = await engines.started()
        assert (await e.read_entry(1, 3, fence=True, master_key=KEY))[0] == S.OK
        assert e.stats["fences"] == 0  # fenced by the replayed journal: nothing journaled again
        assert (await e.add_entries([(entry(1, 5), KEY, 0)]))[0] == [S.FENCED]
        await e.close()
    run(scenario())


def test_the_first_periodic_checkpoint_comes_at_its_own_time_then_every_flush_interval(engines):
    async def scenario():
        clock = ManualClock()
        e = engines.make(clock=clock, first_checkpoint_ms=3_000, flush_interval_ms=10_000)
        await e.start()  # start-up checkpoints once
        assert e.stats["checkpoints"] == 1

        def wakes():
            return sorted(at for at, _ in clock._sleepers)
        await wait_until_async(lambda: 3_000 in wakes(), 5)
        assert 10_000 not in wakes()  # the first period is its own, not a flush interval
        clock.advance(3_000)
        await wait_until_async(lambda: e.stats["checkpoints"] == 2, 5)
        await wait_until_async(lambda: 13_000 in wakes(), 5)  # then every flush interval
        await e.close()
    run(scenario())


def test_a_shortened_first_half_asks_for_the_first_checkpoint_sooner(engines):
    async def scenario():
        e = await engines.started(first_half_fraction=0.5, write_cache_bytes_max=40_000, flush_interval_ms=3_600_000)
        cache = e._write_cache
        payload = b"x" * 1_000
        swapped_at = None
        for entry_id in range(30):
            before = cache.active_bytes
            statuses, _ = await e.add_entries([(entry(5, entry_id, payload), KEY, 0)])
            assert statuses == [S.OK]
            if cache.active_bytes < before:  # this add found the first half full and got it swapped
                swapped_at = entry_id
                break
        # a half is 20,000 bytes; the first may hold 10,000: nine entries of ~1,040 bytes, not nineteen
        assert swapped_at == 9
        await wait_until_async(lambda: e.stats["checkpoints"] == 2, 5)
        await e.close()
    run(scenario())


def test_the_write_cache_bounds_small_entries_by_their_count_too(engines):
    async def scenario():
        e = await engines.started(write_cache_bytes_max=40_000, write_cache_entry_overhead_bytes=1_000,
                                  flush_interval_ms=3_600_000)
        cache = e._write_cache
        # a half is 20,000 bytes; each ~48-byte entry counts ~1,048, so 19 fit where 400 would by length alone
        for entry_id in range(19):
            statuses, _ = await e.add_entries([(entry(5, entry_id, b"s"), KEY, 0)])
            assert statuses == [S.OK]
        assert e.stats["checkpoints"] == 1 and not cache.has_room(48)
        statuses, _ = await e.add_entries([(entry(5, 19, b"s"), KEY, 0)])  # the half is full: it is swapped
        assert statuses == [S.OK] and cache.flushing_bytes + cache.active_bytes <= 40_000
        await wait_until_async(lambda: e.stats["checkpoints"] == 2, 5)
        too_big = entry(5, 20, b"x" * (20_000 - 1_000))  # longer than a half less one entry's overhead
        statuses, why = await e.add_entries([(too_big, KEY, 0)])
        assert statuses == [S.BAD_REQUEST] and "half the write cache" in why
        await e.close()
    run(scenario())
