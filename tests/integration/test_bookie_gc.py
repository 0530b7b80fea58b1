"""Garbage collection in a real bookie process: a ledger whose metadata is deleted from ZooKeeper loses its
entries and its entry-log files on that bookie within a few GC periods; a ledger whose metadata exists keeps
every entry. The bookie runs with small entry logs, a short checkpoint period and gc_wait_time_ms = 300."""
from __future__ import annotations

import asyncio
import os

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.formats import entry_log as log_fmt
from bksim.formats.entry import encode_entry
from bksim.metadata.ledger_manager import delete_ledger_metadata
from bksim.model.status import StatusCode
from integration.bookie_harness import KEY, BookieProcess, kazoo_client, registration_path
from integration.test_bookie_readonly import ledgers_with_metadata, small_fs, used_fraction  # noqa: F401 - fixture
from helpers import wait_until_async

ENTRIES = 120
PAYLOAD = 1000


def run(zookeeper, bookie: BookieProcess, scenario, expected_log_line: str) -> None:
    """Start the bookie, run `scenario(zk, store)`, check its log names the GC round, stop it cleanly."""
    zk = kazoo_client(zookeeper)
    store = ZkMetadataStore(zk)
    try:
        bookie.start(zk)
        asyncio.run(scenario(zk, store))
        assert expected_log_line in bookie.log_text()
        assert bookie.terminate() == 0
    finally:
        bookie.cleanup()
        store.close()
        zk.stop()
        zk.close()


def logs_by_ledgers(entrylogs: str) -> dict[int, set[int]]:
    """Entry-log id -> the ledgers its records hold (a direct read of the files)."""
    out = {}
    for name in os.listdir(entrylogs):
        log_id = log_fmt.parse_entry_log_file_name(name)
        if log_id is None:
            continue
        try:
            with open(os.path.join(entrylogs, name), "rb") as f:
                _header, records, _stopped = log_fmt.scan(f.read())
        except FileNotFoundError:
            continue  # deleted by the bookie between the listing and the open
        out[log_id] = {r.ledger_id for r in records if r.entry is not None}
    return out


def test_deleting_ledger_metadata_frees_its_entry_logs(zookeeper, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path, env={
        "BKSIM_BOOKIE_GC_WAIT_TIME_MS": "300", "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "200",
        "BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(32 * 1024)})
    entrylogs = os.path.join(bookie.ledger_dir, "entrylogs")

    async def scenario(zk, store):
        doomed, kept = await ledgers_with_metadata(zk, bookie.bookie_id, 2)
        written = {}
        async with BookieClient(bookie.address) as client:
            for ledger_id in (doomed, kept):
                stream = client.add_stream()
                entries = [encode_entry(ledger_id, i, i - 1, 0, bytes([i % 251]) * PAYLOAD) for i in range(ENTRIES)]
                for i in range(0, ENTRIES, 20):
                    result = await stream.add(i, [(e, KEY, 0) for e in entries[i:i + 20]])
                    assert result.ok, result
                await stream.close()
                written[ledger_id] = entries
                # the next ledger's entries go to later logs once these are checkpointed
                await wait_until_async(lambda: any(ledger_id in held for held in logs_by_ledgers(entrylogs).values()),
                                       10.0, message=f"ledger {ledger_id} checkpointed into an entry log")
        only_doomed = [log_id for log_id, held in logs_by_ledgers(entrylogs).items() if held == {doomed}]
        assert len(only_doomed) >= 2, logs_by_ledgers(entrylogs)
        await delete_ledger_metadata(store, doomed)
        await wait_until_async(lambda: not set(only_doomed) & set(logs_by_ledgers(entrylogs)), 20.0,
                               message=f"entry logs {only_doomed} of the deleted ledger removed")
        # what is left of it shares a log with the live ledger (compaction's work, not this test's)
        assert all(kept in held for held in logs_by_ledgers(entrylogs).values() if doomed in held)
        async with BookieClient(bookie.address) as client:
            assert (await client.read_entry(doomed, 5)).status == StatusCode.NO_LEDGER
            assert (await client.read_lac(doomed)).status == StatusCode.NO_LEDGER
            got = await client.read_entries(kept, list(range(ENTRIES)))
            assert [r.status for r in got] == [StatusCode.OK] * ENTRIES
            assert [r.entry for r in got] == written[kept]
        await delete_ledger_metadata(store, kept)

    run(zookeeper, bookie, scenario, "garbage collection (gc): 1 ledger(s) deleted")


def test_a_bookie_read_only_for_disk_usage_is_writable_again_once_deleted_ledgers_are_collected(
        zookeeper, tmp_path, small_fs):
    """On a 16 MiB tmpfs (threshold 0.5, low-water mark 0.3): a ledger fills the disk past the threshold, the
    bookie goes read-only; its metadata is deleted; garbage collection (run at once when the disk fills, then
    every round) removes its entry logs, and the bookie registers as writable again."""
    bookie = BookieProcess(zookeeper, tmp_path, journal_dir=os.path.join(small_fs, "journal"),
                           ledger_dir=os.path.join(small_fs, "ledgers"), env={
                               "BKSIM_BOOKIE_DISK_USAGE_THRESHOLD": "0.5",
                               "BKSIM_BOOKIE_DISK_USAGE_LWM_THRESHOLD": "0.3",
                               "BKSIM_BOOKIE_RECOVERY_ADD_RESERVE_BYTES": str(1024 * 1024),
                               "BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX": str(2 * 1024 * 1024),
                               "BKSIM_BOOKIE_JOURNAL_FILE_BYTES_MAX": str(1024 * 1024),
                               "BKSIM_BOOKIE_JOURNAL_BACKUPS_MAX": "0",
                               "BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(512 * 1024),
                               "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "200",
                               "BKSIM_BOOKIE_GC_WAIT_TIME_MS": "2000"})

    async def scenario(zk, store):
        [ledger_id] = await ledgers_with_metadata(zk, bookie.bookie_id, 1)
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            entry_id = 0
            while True:  # until the bookie's own disk check (every 100 ms) turns it read-only
                used = used_fraction(small_fs)
                assert used < 0.9, f"still writable at {used:.2f} used"
                if used >= 0.55:
                    # over the threshold here; the bookie's next check may see less (a checkpoint drops a journal
                    # file): give it a moment, and write on if it still takes adds
                    try:
                        await wait_until_async(lambda: zk.exists(registration_path(bookie.bookie_id, True)), 1.0)
                        break
                    except AssertionError:
                        pass
                batch = [(encode_entry(ledger_id, entry_id + i, entry_id + i - 1, 0, b"x" * 16_000), KEY, 0)
                         for i in range(16)]
                result = await stream.add(entry_id, batch)
                if not result.ok:
                    assert set(result.statuses) == {StatusCode.READ_ONLY}, result
                    break
                entry_id += 16
            await stream.close()
        await wait_until_async(lambda: zk.exists(registration_path(bookie.bookie_id, True)) is not None, 10.0,
                               message="the bookie registered read-only")
        await delete_ledger_metadata(store, ledger_id)
        await wait_until_async(lambda: zk.exists(registration_path(bookie.bookie_id, False)) is not None, 20.0,
                               message="the bookie registered writable again")
        assert used_fraction(small_fs) < 0.3, bookie.log_tail(15)
        async with BookieClient(bookie.address) as client:
            assert (await client.read_entry(ledger_id, 0)).status == StatusCode.NO_LEDGER

    run(zookeeper, bookie, scenario, "garbage collection (major): 1 ledger(s) deleted")
