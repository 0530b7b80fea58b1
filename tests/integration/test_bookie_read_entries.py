"""The ReadEntries RPC of a real bookie process, through BookieClient and GrpcBookieTransport.

One bookie (module scope) with small limits: entry_bytes_max = 64 KiB, frame_bytes_max = 256 KiB,
read_batch_entries_max = 8. Checked: a status per id (OK, NO_ENTRY, -1 = last entry, NO_LEDGER); FENCE
fences the ledger once (one FENCE record in the journal) and a fence with the wrong key answers UNAUTHORIZED
for every id and fences nothing; BAD_REQUEST for no ids, too many ids, an id below -1; an answer that would
pass frame_bytes_max ends in TOO_MANY_REQUESTS, and the transport asks again for those; no bookie ->
BookieUnreachable.
"""
from __future__ import annotations

import asyncio
import os

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.bookie_transport import GrpcBookieTransport
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry, master_key
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode
from helpers import free_port
from integration.bookie_harness import KEY, BookieProcess, kazoo_client

ENTRY_BYTES_MAX = 64 * 1024
FRAME_BYTES_MAX = 256 * 1024
BATCH_MAX = 8
S = StatusCode


@pytest.fixture(scope="module")
def bookie(zookeeper, tmp_path_factory):
    zk = kazoo_client(zookeeper)
    b = BookieProcess(zookeeper, tmp_path_factory.mktemp("read_entries"), env={
        "BKSIM_BOOKIE_ENTRY_BYTES_MAX": str(ENTRY_BYTES_MAX),
        "BKSIM_BOOKIE_FRAME_BYTES_MAX": str(FRAME_BYTES_MAX),
        "BKSIM_BOOKIE_READ_BATCH_ENTRIES_MAX": str(BATCH_MAX),
    })
    try:
        b.start(zk)
        yield b
    finally:
        b.cleanup()
        zk.stop()
        zk.close()


def run(coroutine):
    return asyncio.run(coroutine)


def entry(ledger: int, entry_id: int, payload: bytes = b"payload") -> bytes:
    return encode_entry(ledger, entry_id, entry_id - 1, 0, payload)


async def write(client: BookieClient, ledger: int, n: int, payload: bytes = b"payload") -> None:
    stream = client.add_stream()
    try:  # one request per entry: large entries would not fit in one frame together
        results = [await stream.add(i, [(entry(ledger, i, payload), KEY, 0)]) for i in range(n)]
    finally:
        await stream.close()
    assert all(r.ok for r in results), results


def fence_records(journal_dir: str, ledger: int) -> int:
    count = 0
    for name in os.listdir(journal_dir):
        if jfmt.parse_journal_file_name(name) is None:
            continue
        with open(os.path.join(journal_dir, name), "rb") as f:
            data = f.read()
        for record in jfmt.iter_file(data, newest=True, skip_corruption=True):
            if record.type == jfmt.RecordType.FENCE and int.from_bytes(record.body[:8], "big", signed=True) == ledger:
                count += 1
    return count


def test_a_status_per_id(bookie):
    ledger = 501

    async def scenario():
        async with BookieClient(bookie.address) as client:
            await write(client, ledger, 5)
            found = await client.read_entries(ledger, [0, 3, 7, -1, 4, 3])
            unknown = await client.read_entries(99_501, [0, -1])
            return found, unknown

    found, unknown = run(scenario())
    assert [r.status for r in found] == [S.OK, S.OK, S.NO_ENTRY, S.OK, S.OK, S.OK]
    assert [r.entry for r in found] == [entry(ledger, 0), entry(ledger, 3), b"", entry(ledger, 4),
                                        entry(ledger, 4), entry(ledger, 3)]
    assert found[0].last_add_confirmed == 3  # the LAC piggybacked by entry 4
    assert [r.status for r in unknown] == [S.NO_LEDGER, S.NO_LEDGER]


def test_fence_is_applied_once_and_a_failed_fence_answers_every_id(bookie):
    ledger, other = 502, 503
    wrong_key = master_key(b"not the password")

    async def scenario():
        async with BookieClient(bookie.address) as client:
            await write(client, ledger, 3)
            await write(client, other, 2)
            fenced = await client.read_entries(ledger, [-1, 0, 1, 2, 3, 4], fence=True, master_key=KEY)
            again = await client.read_entries(ledger, [0, 1], fence=True, master_key=KEY)
            refused = await client.read_entries(other, [0, 1, 5], fence=True, master_key=wrong_key)
            stream = client.add_stream()
            late = await stream.add(1, [(entry(ledger, 3), KEY, 0)])
            still_open = await stream.add(2, [(entry(other, 2), KEY, 0)])
            await stream.close()
            return fenced, again, refused, late, still_open

    fenced, again, refused, late, still_open = run(scenario())
    assert [r.status for r in fenced] == [S.OK, S.OK, S.OK, S.OK, S.NO_ENTRY, S.NO_ENTRY]
    assert fenced[0].entry == entry(ledger, 2)
    assert [r.status for r in again] == [S.OK, S.OK]
    assert [r.status for r in refused] == [S.UNAUTHORIZED] * 3 and all(r.entry == b"" for r in refused)
    assert late.statuses == [S.FENCED]  # the batch fenced the ledger
    assert still_open.statuses == [S.OK]  # the refused fence fenced nothing
    assert fence_records(bookie.journal_dir, ledger) == 1
    assert fence_records(bookie.journal_dir, other) == 0


def test_bad_requests(bookie):
    ledger = 504

    async def scenario():
        async with BookieClient(bookie.address) as client:
            await write(client, ledger, 2)
            return (await client.read_entries(ledger, []), await client.read_entries(ledger, list(range(BATCH_MAX + 1))),
                    await client.read_entries(ledger, [0, -2]), await client.read_entries(ledger, list(range(BATCH_MAX))))

    empty, too_many, invalid, at_max = run(scenario())
    assert [r.status for r in empty] == [S.BAD_REQUEST]
    assert [r.status for r in too_many] == [S.BAD_REQUEST] * (BATCH_MAX + 1)
    assert "read_batch_entries_max=8" in too_many[0].message
    assert [r.status for r in invalid] == [S.BAD_REQUEST] * 2
    assert [r.status for r in at_max] == [S.OK, S.OK] + [S.NO_ENTRY] * (BATCH_MAX - 2)


def test_an_answer_over_the_frame_limit_is_cut_and_the_transport_asks_again(bookie):
    ledger = 505
    big = b"x" * (60 * 1024)  # 4 fit in 256 KiB, 5 do not

    async def resolve(bookie_id: str) -> str:
        return bookie_id

    async def scenario():
        async with BookieClient(bookie.address) as client:
            await write(client, ledger, 6, big)
            cut = await client.read_entries(ledger, list(range(6)))
        transport = GrpcBookieTransport(resolve, timeout_ms=5_000, add_window_max=4, frame_bytes_max=FRAME_BYTES_MAX)
        try:
            whole = await transport.read_entries(bookie.address, ledger, list(range(7)), fence=True, master_key=KEY)
            stats = dict(transport.stats)
        finally:
            await transport.close()
        return cut, whole, stats

    cut, whole, stats = run(scenario())
    assert [r.status for r in cut] == [S.OK] * 4 + [S.TOO_MANY_REQUESTS] * 2
    assert "frame_bytes_max" in cut[4].message
    assert whole == [(S.OK, entry(ledger, i, big)) for i in range(6)] + [(S.NO_ENTRY, b"")]
    assert stats["read_batches"] == 1 and stats["read_batch_continuations"] == 1, stats


def test_no_bookie_is_unreachable():
    async def resolve(bookie_id: str) -> str:
        return bookie_id

    async def scenario():
        transport = GrpcBookieTransport(resolve, timeout_ms=2_000, add_window_max=4)
        try:
            await transport.read_entries(f"127.0.0.1:{free_port()}", 1, [0, 1])
        finally:
            await transport.close()

    with pytest.raises(BookieUnreachable) as info:
        run(scenario())
    assert "ReadEntries" in str(info.value) or "UNAVAILABLE" in str(info.value)
