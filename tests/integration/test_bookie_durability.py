"""A real bookie process loses no acknowledged entry: kill -9 mid-stream, fences, SIGTERM, corrupt entry logs.

Every test runs `bksim bookie run` as a child process against the session's real ZooKeeper, talks to it
over gRPC with the project's client, and restarts it on the same directories.
"""
from __future__ import annotations

import asyncio
import os
import re

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.formats.entry import encode_entry
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode
from bksim.adapters import processes, registration
from integration.bookie_harness import (KEY, MARKER, BookieProcess, Workload, read_back,
                                        stream_until)


@pytest.mark.parametrize("kill_after, flush_interval_ms, batch_size", [
    (100, 10_000, 10),     # before any checkpoint: everything comes back from the journal
    (2_000, 10_000, 50),
    (5_000, 50, 100),      # checkpoints every 50 ms: entries come back from entry logs + index + journal tail
])
def test_kill9_mid_stream_loses_no_acknowledged_entry(zookeeper, zk, bookies, tmp_path, kill_after,
                                                      flush_interval_ms, batch_size):
    bookie = BookieProcess(zookeeper, tmp_path, env={"BKSIM_BOOKIE_FLUSH_INTERVAL_MS": str(flush_interval_ms)})
    bookies.append(bookie)
    owner = bookie.start(zk)
    workload = Workload(ledgers=(11, 12, 13), seed=kill_after)

    async def before_kill() -> int:
        async with BookieClient(bookie.address) as client:
            return await stream_until(client, workload, kill_after, batch_size, window_max=16, on_target=bookie.kill9)

    acked = asyncio.run(before_kill())
    assert acked >= kill_after
    assert not bookie.alive()

    bookie.start(zk, previous_owner=owner)
    assert "replayed" in bookie.last_start_log()

    async def after_restart() -> tuple[list[str], dict]:
        async with BookieClient(bookie.address) as client:
            problems = await read_back(client, workload.acked)
            lacs = {ledger: await client.read_lac(ledger) for ledger in workload.ledgers}
            return problems, lacs

    problems, lacs = asyncio.run(after_restart())
    assert problems == [], f"{len(problems)} acknowledged entries not read back, e.g. {problems[:5]}"
    for ledger in workload.ledgers:
        acked_ids = [e for (l, e) in workload.acked if l == ledger]
        if acked_ids:
            assert lacs[ledger].status == StatusCode.OK
            assert lacs[ledger].last_entry_id >= max(acked_ids)
    if flush_interval_ms < 1000:
        assert os.listdir(os.path.join(bookie.ledger_dir, "entrylogs")), "checkpoints should have written entry logs"


def test_fence_survives_kill9_and_restart(zookeeper, zk, bookies, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    owner = bookie.start(zk)
    ledger, unknown_ledger = 21, 22
    entries = [(encode_entry(ledger, i, i - 1, 0, b"e%d" % i), KEY, 0) for i in range(5)]

    async def write_and_fence():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            assert (await stream.add(0, entries)).ok
            await stream.close()
            fenced = await client.read_entry(ledger, -1, fence=True, master_key=KEY)
            fenced_unknown = await client.read_entry(unknown_ledger, -1, fence=True, master_key=KEY)
            return fenced, fenced_unknown

    fenced, fenced_unknown = asyncio.run(write_and_fence())
    assert fenced.status == StatusCode.OK and fenced.entry == entries[-1][0]
    assert fenced.last_add_confirmed == 3  # piggybacked in the last entry
    assert fenced_unknown.status == StatusCode.NO_ENTRY  # the fence created the ledger record: not NO_LEDGER
    bookie.kill9()  # immediately after the fence replies: the fence must already be durable

    bookie.start(zk, previous_owner=owner)

    async def after_restart():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            normal = await stream.add(1, [(encode_entry(ledger, 5, 4, 0, b"late"), KEY, 0)])
            normal_unknown = await stream.add(2, [(encode_entry(unknown_ledger, 0, -1, 0, b"x"), KEY, 0)])
            recovery = await stream.add(3, [(encode_entry(ledger, 5, 4, 0, b"recovered"), KEY, FLAG_RECOVERY_ADD)])
            await stream.close()
            last = await client.read_entry(ledger, -1)
            return normal, normal_unknown, recovery, last

    normal, normal_unknown, recovery, last = asyncio.run(after_restart())
    assert normal.statuses == [StatusCode.FENCED], normal
    assert "fenced" in normal.message
    assert normal_unknown.statuses == [StatusCode.FENCED], normal_unknown
    assert recovery.statuses == [StatusCode.OK], recovery
    assert last.status == StatusCode.OK and last.entry.endswith(b"recovered")


def test_sigterm_exits_zero_deregisters_and_loses_nothing(zookeeper, zk, bookies, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    workload = Workload(ledgers=(31, 32), seed=31)
    sigterm = lambda: processes.terminate(bookie.pid, MARKER)  # noqa: E731 - mid-stream, adds in flight

    async def write():
        async with BookieClient(bookie.address) as client:
            await stream_until(client, workload, 1_500, batch_size=50, on_target=sigterm)

    asyncio.run(write())
    assert len(workload.acked) >= 1_500
    assert bookie.wait_exit(15.0) == 0, bookie.log_tail()
    assert zk.exists(registration.registration_path(bookie.bookie_id, False)) is None
    assert zk.exists(registration.registration_path(bookie.bookie_id, True)) is None
    log = bookie.last_start_log()
    assert "storage closed (journal drained, checkpoint written)" in log
    assert log.index("gRPC server stopped") < log.index("storage closed") < log.index("deregistered")

    bookie.start(zk)
    # the shutdown checkpoint covered every record: nothing left to replay
    assert re.search(r"replayed 0 journal records", bookie.last_start_log()), bookie.last_start_log()

    async def read():
        async with BookieClient(bookie.address) as client:
            return await read_back(client, workload.acked)

    assert asyncio.run(read()) == []


@pytest.mark.parametrize("damage", ["flip-ids", "truncate"])
def test_corrupt_entry_log_record_is_io_error_never_no_entry(zookeeper, zk, bookies, tmp_path, damage):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    ledger = 41
    entries = [(encode_entry(ledger, i, i - 1, 0, bytes([i]) * 500), KEY, 0) for i in range(20)]

    async def write():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            assert (await stream.add(0, entries)).ok
            await stream.close()

    asyncio.run(write())
    assert bookie.terminate() == 0  # graceful: entries are checkpointed into entrylogs/
    logs = sorted(os.listdir(os.path.join(bookie.ledger_dir, "entrylogs")))
    victim_id = 12
    victim = entries[victim_id][0]
    path = offset = None
    for name in logs:
        p = os.path.join(bookie.ledger_dir, "entrylogs", name)
        with open(p, "rb") as f:
            data = f.read()
        if victim in data:
            path, offset = p, data.index(victim)
    assert path is not None, f"entry {ledger}:{victim_id} not found in entry logs {logs}"
    with open(path, "r+b") as f:
        if damage == "flip-ids":
            f.seek(offset + 15)  # last byte of the record's entry id
            f.write(bytes([victim[15] ^ 0xFF]))
        else:
            f.truncate(offset + 100)  # cut inside the victim's record: it and everything after are gone

    bookie.start(zk)

    async def read():
        async with BookieClient(bookie.address) as client:
            return ({i: await client.read_entry(ledger, i) for i in range(20)}, await client.read_entry(ledger, -1))

    results, last = asyncio.run(read())
    assert results[victim_id].status == StatusCode.IO_ERROR, results[victim_id]
    assert str(ledger) in results[victim_id].message
    damaged = [victim_id] if damage == "flip-ids" else list(range(victim_id, 20))
    for i, r in results.items():
        if i in damaged:
            assert r.status == StatusCode.IO_ERROR, (i, r)  # unknown is never "no"
        elif damage == "flip-ids":
            assert r.status == StatusCode.OK and r.entry == entries[i][0], (i, r)
        else:
            # intact record, but the ledger's last entry (where the known LAC comes from) is behind the cut:
            # the engine may answer IO_ERROR; it must never deny the entry, nor return other bytes
            assert r.status in (StatusCode.OK, StatusCode.IO_ERROR), (i, r)
            assert r.status != StatusCode.OK or r.entry == entries[i][0], (i, r)
    if damage == "truncate":
        assert last.status == StatusCode.IO_ERROR, last  # the last entry is behind the cut
