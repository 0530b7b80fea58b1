"""Request handling of a real bookie process: keys, sizes, frame limit, overload, explicit negatives, health.

One bookie (module scope) with small limits set through the environment:
entry_bytes_max = 64 KiB, frame_bytes_max = 256 KiB, add_inflight_per_stream_max = 1000,
list_entries_ids_max = 3.
"""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bksim.adapters.bookie_client import BookieClient, SyncBookieClient
from bksim.formats.entry import encode_entry, master_key
from bksim.gen import bookie_pb2
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode
from integration.bookie_harness import KEY, BookieProcess, kazoo_client

ENTRY_BYTES_MAX = 64 * 1024
FRAME_BYTES_MAX = 256 * 1024
PER_STREAM_MAX = 1000
LIST_IDS_MAX = 3


@pytest.fixture(scope="module")
def bookie(zookeeper, tmp_path_factory):
    zk = kazoo_client(zookeeper)
    b = BookieProcess(zookeeper, tmp_path_factory.mktemp("requests"), env={
        "BKSIM_BOOKIE_ENTRY_BYTES_MAX": str(ENTRY_BYTES_MAX),
        "BKSIM_BOOKIE_FRAME_BYTES_MAX": str(FRAME_BYTES_MAX),
        "BKSIM_BOOKIE_ADD_INFLIGHT_PER_STREAM_MAX": str(PER_STREAM_MAX),
        "BKSIM_BOOKIE_ADD_INFLIGHT_TOTAL_MAX": str(4 * PER_STREAM_MAX),
        "BKSIM_BOOKIE_LIST_ENTRIES_IDS_MAX": str(LIST_IDS_MAX),
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


def test_wrong_master_key_is_unauthorized(bookie):
    ledger = 101
    other = master_key(b"not the password")

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            first = await stream.add(0, [(entry(ledger, 0), KEY, 0)])
            wrong = await stream.add(1, [(entry(ledger, 1), other, 0), (entry(ledger, 2), KEY, 0)])
            await stream.close()
            fence = await client.read_entry(ledger, -1, fence=True, master_key=other)
            lac = await client.write_lac(ledger, 0, other)
            still_open = await client.read_entry(ledger, 2)
            return first, wrong, fence, lac, still_open

    first, wrong, fence, lac, still_open = run(scenario())
    assert first.statuses == [StatusCode.OK]
    assert wrong.statuses == [StatusCode.UNAUTHORIZED, StatusCode.OK], wrong
    assert "master key" in wrong.message
    assert fence.status == StatusCode.UNAUTHORIZED
    assert lac[0] == StatusCode.UNAUTHORIZED
    assert still_open.status == StatusCode.OK  # the bad fence did not fence the ledger


def test_the_compact_form_adds_with_its_one_key_and_both_forms_at_once_are_refused_whole(bookie):
    """`data` + one master key and flags: stored, the key still checked per ledger; `entries` and `data` in one
    request: every entry of it BAD_REQUEST and none stored; the stream goes on."""
    ledger, other = 110, 111
    recovery = 1  # FLAG_RECOVERY_ADD

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            compact = await (await stream.send_request(bookie_pb2.AddRequest(
                batch_id=0, data=[entry(ledger, i) for i in range(3)], master_key=KEY, flags=recovery)))
            wrong_key = await (await stream.send_request(bookie_pb2.AddRequest(
                batch_id=1, data=[entry(ledger, 3)], master_key=master_key(b"not the password"))))
            both = await (await stream.send_request(bookie_pb2.AddRequest(
                batch_id=2, entries=[bookie_pb2.AddEntry(entry=entry(other, 0), master_key=KEY)],
                data=[entry(other, 1)], master_key=KEY)))
            after = await stream.add(3, [(entry(ledger, 3), KEY, 0)])
            await stream.close()
            reads = [await client.read_entry(ledger, i) for i in range(4)]
            return compact, wrong_key, both, after, reads, await client.read_entry(other, 0)

    compact, wrong_key, both, after, reads, other_read = run(scenario())
    assert compact.statuses == [StatusCode.OK] * 3, compact
    assert wrong_key.statuses == [StatusCode.UNAUTHORIZED] and "master key" in wrong_key.message, wrong_key
    assert both.statuses == [StatusCode.BAD_REQUEST] * 2 and "not both" in both.message, both
    assert after.statuses == [StatusCode.OK], after
    assert [(r.status, r.entry) for r in reads] == [(StatusCode.OK, entry(ledger, i)) for i in range(4)]
    assert other_read.status == StatusCode.NO_LEDGER  # nothing of the refused request was stored


def test_oversized_entry_is_bad_request_and_stream_keeps_working(bookie):
    ledger = 102
    big = entry(ledger, 1, b"x" * (ENTRY_BYTES_MAX + 1))  # > entry_bytes_max, < frame_bytes_max

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            mixed = await stream.add(0, [(entry(ledger, 0), KEY, 0), (big, KEY, 0), (entry(ledger, 2), KEY, 0)])
            after = await stream.add(1, [(entry(ledger, 3), KEY, 0)])
            await stream.close()
            return mixed, after, await client.read_entry(ledger, 1)

    mixed, after, read = run(scenario())
    assert mixed.statuses == [StatusCode.OK, StatusCode.BAD_REQUEST, StatusCode.OK], mixed
    assert str(len(big)) in mixed.message and str(ENTRY_BYTES_MAX) in mixed.message, mixed.message
    assert after.statuses == [StatusCode.OK]
    assert read.status == StatusCode.NO_ENTRY  # the refused entry was not stored


def test_frame_over_limit_fails_only_that_stream(bookie):
    ledger = 103
    chunk = b"y" * (ENTRY_BYTES_MAX - 100)
    too_big_frame = [(entry(ledger, 100 + i, chunk), KEY, 0) for i in range(5)]  # ~320 KiB > 256 KiB

    async def scenario():
        async with BookieClient(bookie.address) as client:
            bystander = client.add_stream()
            assert (await bystander.add(0, [(entry(ledger, 0), KEY, 0)])).ok
            victim = client.add_stream()
            with pytest.raises(BookieUnreachable) as failure:
                await victim.add(0, too_big_frame)
            await victim.close()
            survived = await bystander.add(1, [(entry(ledger, 1), KEY, 0)])
            await bystander.close()
            fresh = client.add_stream()
            fresh_result = await fresh.add(0, [(entry(ledger, 2), KEY, 0)])
            await fresh.close()
            return failure.value, survived, fresh_result, await client.health(), await client.read_entry(ledger, 100)

    error, survived, fresh_result, health, read = run(scenario())
    assert error.code == "RESOURCE_EXHAUSTED", error
    assert survived.ok and fresh_result.ok
    assert health == "SERVING"
    assert bookie.alive()
    assert read.status == StatusCode.NO_ENTRY  # nothing of the refused frame was stored


def test_batch_over_stream_window_is_too_many_requests_immediately(bookie):
    ledger = 104
    over = [(entry(ledger, i), KEY, 0) for i in range(PER_STREAM_MAX + 1)]

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            rejected = await stream.add(0, over, timeout_s=5.0)
            accepted = await stream.add(1, over[:10])
            await stream.close()
            return rejected, accepted, await client.read_entry(ledger, PER_STREAM_MAX)

    rejected, accepted, read = run(scenario())
    assert rejected.statuses == [StatusCode.TOO_MANY_REQUESTS] * (PER_STREAM_MAX + 1)
    assert "add_inflight_per_stream_max=1000" in rejected.message
    assert accepted.ok
    assert read.status == StatusCode.NO_ENTRY


def test_pipelined_overload_is_answered_not_hung(bookie):
    """Flood one stream with far more than its window; every batch gets an answer, OK or TOO_MANY_REQUESTS."""
    ledger = 105
    batch = 200
    batches = 40  # 8000 entries offered against a 1000-entry window

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream(window_max=batches)
            futures = [await stream.send(b, [(entry(ledger, b * batch + i), KEY, 0) for i in range(batch)])
                       for b in range(batches)]
            results = [await stream.result(f, timeout_s=10.0) for f in futures]
            await stream.close()
            return results

    results = run(scenario())
    assert [r.batch_id for r in results] == list(range(batches))  # answered in request order
    for r in results:
        assert set(r.statuses) <= {StatusCode.OK, StatusCode.TOO_MANY_REQUESTS}, r
        assert len(set(r.statuses)) == 1  # a batch is accepted or refused as a whole
    assert results[0].ok


def test_unknown_ledger_is_no_ledger_and_missing_entry_is_no_entry(bookie):
    ledger = 106

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            assert (await stream.add(0, [(entry(ledger, i), KEY, 0) for i in range(3)])).ok
            await stream.close()
            return (await client.read_entry(999_999, 0), await client.read_entry(999_999, -1),
                    await client.read_lac(999_999), await client.read_entry(ledger, 7),
                    await client.read_entry(ledger, -1), await client.read_lac(ledger))

    no_ledger, no_ledger_last, no_ledger_lac, no_entry, last, lac = run(scenario())
    assert no_ledger.status == StatusCode.NO_LEDGER and no_ledger_last.status == StatusCode.NO_LEDGER
    assert no_ledger_lac.status == StatusCode.NO_LEDGER
    assert no_entry.status == StatusCode.NO_ENTRY
    assert last.status == StatusCode.OK and last.entry == entry(ledger, 2)
    assert (lac.status, lac.last_entry_id, lac.last_add_confirmed) == (StatusCode.OK, 2, 1)


def test_write_lac_then_read_lac(bookie):
    ledger = 107

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            assert (await stream.add(0, [(entry(ledger, 0), KEY, 0)])).ok
            await stream.close()
            written = await client.write_lac(ledger, 5, KEY)
            return written, await client.read_lac(ledger)

    written, lac = run(scenario())
    assert written[0] == StatusCode.OK
    assert lac.last_add_confirmed == 5 and lac.last_entry_id == 0


def test_list_entries_answers_in_pages(bookie):
    ledger = 109

    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            assert (await stream.add(0, [(entry(ledger, i), KEY, 0) for i in (0, 1, 2, 3, 5, 8, 9)])).ok
            await stream.close()
            pages, first = [], 0
            while first != -1:
                page = await client.list_entries(ledger, first)
                pages.append((page.status, page.ranges, page.next_entry))
                first = page.next_entry
            return pages, await client.list_entries(999_999), await client.list_entries(ledger, -1)

    pages, unknown, bad = run(scenario())
    assert pages == [(StatusCode.OK, [(0, 2)], 3), (StatusCode.OK, [(3, 3), (5, 5), (8, 8)], 9),
                     (StatusCode.OK, [(9, 9)], -1)]
    assert (unknown.status, unknown.ranges, unknown.next_entry) == (StatusCode.NO_LEDGER, [], -1)
    assert bad.status == StatusCode.BAD_REQUEST and "ids are >= 0" in bad.message


def test_info_health_and_reflection(bookie):
    sync_client = SyncBookieClient(bookie.address)
    try:
        info = sync_client.info()
        added = sync_client.add([(entry(108, 0), KEY, 0)])
        read = sync_client.read_entry(108, 0)
        listed = sync_client.list_entries(108)
    finally:
        sync_client.close()
    assert added.ok and read.status == StatusCode.OK and read.entry == entry(108, 0)
    assert (listed.status, listed.ranges, listed.next_entry) == (StatusCode.OK, [(0, 0)], -1)

    async def scenario():
        async with grpc.aio.insecure_channel(bookie.address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="bksim.bookie.v1.Bookie"), timeout=2.0)
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def ask():
                yield reflection_pb2.ServerReflectionRequest(list_services="")
            services = []
            async for response in stub.ServerReflectionInfo(ask(), timeout=2.0):
                services = [s.name for s in response.list_services_response.service]
        return health, services

    health, services = run(scenario())
    assert info["bookie_id"] == bookie.bookie_id
    assert info["state"] == "writable"
    assert 0 < info["free_bytes"] <= info["total_bytes"]
    assert len(info["instance_id"]) == 36  # a UUID
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert {"bksim.bookie.v1.Bookie", "bksim.bookie.v1.BookieAdmin", "grpc.health.v1.Health"} <= set(services)
