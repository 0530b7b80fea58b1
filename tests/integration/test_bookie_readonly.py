"""Read-only mode with a real, small file system: a 16 MiB tmpfs the test mounts (we run as root).

The bookie's journal and ledger directories live on the tmpfs; a filler file pushes usage over
disk_usage_threshold, deleting it brings usage under disk_usage_lwm_threshold again.
"""
from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.formats.entry import encode_entry
from bksim.metadata.ledger_manager import allocate_ledger_id, create_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata, Segment
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode
from integration.bookie_harness import KEY, BookieProcess, kazoo_client, registration_path
from helpers import wait_until

TMPFS_BYTES = 16 * 1024 * 1024
THRESHOLD = 0.5
LWM = 0.3


@pytest.fixture
def small_fs(tmp_path):
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)], check=True,
                   capture_output=True)
    try:
        yield str(mount_point)
    finally:
        result = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
        if result.returncode != 0:  # something still holds a file: detach now, freed when released
            subprocess.run(["umount", "-l", str(mount_point)], check=True, capture_output=True)


def used_fraction(path: str) -> float:
    st = os.statvfs(path)
    return 1.0 - st.f_bavail / st.f_blocks


def fill_to(path: str, filler: str, fraction: float) -> None:
    st = os.statvfs(path)
    need = int(fraction * st.f_blocks * st.f_frsize) - (st.f_blocks - st.f_bavail) * st.f_frsize
    assert need > 0
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        while need > 0:
            f.write(chunk[:min(need, len(chunk))])
            need -= len(chunk)


async def ledgers_with_metadata(zk, bookie_id: str, n: int) -> list[int]:
    store = ZkMetadataStore(zk)
    try:
        ids = [await allocate_ledger_id(store) for _ in range(n)]
        for ledger_id in ids:
            await create_ledger_metadata(store, ledger_id, LedgerMetadata(
                ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, segments=(Segment(0, (bookie_id,)),)))
        return ids
    finally:
        store.close()


def test_read_only_at_threshold_and_back_below_low_water_mark(zookeeper, tmp_path, small_fs):
    zk = kazoo_client(zookeeper)
    bookie = BookieProcess(zookeeper, tmp_path, journal_dir=os.path.join(small_fs, "journal"),
                           ledger_dir=os.path.join(small_fs, "ledgers"), env={
                               "BKSIM_BOOKIE_DISK_USAGE_THRESHOLD": str(THRESHOLD),
                               "BKSIM_BOOKIE_DISK_USAGE_LWM_THRESHOLD": str(LWM),
                               "BKSIM_BOOKIE_RECOVERY_ADD_RESERVE_BYTES": str(1024 * 1024),
                               "BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX": str(4 * 1024 * 1024),
                               "BKSIM_BOOKIE_JOURNAL_FILE_BYTES_MAX": str(2 * 1024 * 1024)})
    writable_path = registration_path(bookie.bookie_id, False)
    readonly_path = registration_path(bookie.bookie_id, True)
    # ledgers with metadata: a bookie that turns read-only collects garbage at once (bookie/gc.py), and a
    # ledger without metadata is garbage
    ledger, other = asyncio.run(ledgers_with_metadata(zk, bookie.bookie_id, 2))
    filler = os.path.join(small_fs, "filler")
    try:
        bookie.start(zk)
        assert used_fraction(small_fs) < LWM, "the empty bookie must fit under the low-water mark"

        async def add(batch_id, ledger_id, entry_id, flags=0):
            async with BookieClient(bookie.address) as client:
                stream = client.add_stream()
                result = await stream.add(batch_id, [(encode_entry(ledger_id, entry_id, entry_id - 1, 0,
                                                                   b"z" * 100), KEY, flags)])
                await stream.close()
                return result

        assert asyncio.run(add(0, ledger, 0)).ok

        fill_to(small_fs, filler, 0.75)
        bookie.wait_registered(zk, read_only=True, timeout_s=10.0)
        wait_until(lambda: zk.exists(writable_path) is None, 5.0, message="the writable registration to go")

        async def while_read_only():
            async with BookieClient(bookie.address) as client:
                info = await client.info()
                read = await client.read_entry(ledger, 0)
                fence = await client.read_entry(other, -1, fence=True, master_key=KEY)
            normal = await add(1, ledger, 1)
            recovery = await add(2, ledger, 1, FLAG_RECOVERY_ADD)
            return info, read, fence, normal, recovery

        info, read, fence, normal, recovery = asyncio.run(while_read_only())
        assert info["state"] == "read-only"
        assert (info["total_bytes"] - info["free_bytes"]) / info["total_bytes"] >= THRESHOLD
        assert read.status == StatusCode.OK
        assert fence.status == StatusCode.NO_ENTRY  # fenced (ledger record created), nothing stored
        assert normal.statuses == [StatusCode.READ_ONLY], normal
        assert "read-only" in normal.message
        assert recovery.statuses == [StatusCode.OK], recovery  # free space still above the recovery reserve

        os.remove(filler)
        bookie.wait_registered(zk, read_only=False, timeout_s=10.0)
        wait_until(lambda: zk.exists(readonly_path) is None, 5.0, message="the read-only registration to go")
        assert asyncio.run(add(3, ledger, 2)).ok

        async def final_state():
            async with BookieClient(bookie.address) as client:
                return await client.info(), await client.read_lac(ledger)

        info, lac = asyncio.run(final_state())
        assert info["state"] == "writable"
        assert lac.last_entry_id == 2
        assert bookie.terminate() == 0
    finally:
        bookie.cleanup()
        zk.stop()
        zk.close()
