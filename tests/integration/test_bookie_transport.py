"""GrpcBookieTransport (adapters/bookie_transport.py) against real bookie processes and a real ZooKeeper.

One bookie for the module registers under a custom id ("transport-<hex>", not host:port), so every call
there goes through the registration resolver. Tests that kill a bookie start their own. SIGSTOP freezes a
bookie to make an answer late on purpose (a frozen process answers nothing; SIGCONT resumes it).

Checked: the add/read round trip and stream reuse; NO_LEDGER / NO_ENTRY / FENCED / UNAUTHORIZED come back as
values on a healthy stream; the journal holds concurrent callers' batches in the order they called `add`; a
batch larger than the bookie's frame limit (1 MiB here) is split into requests that fit;
a late answer raises BookieUnreachable at the deadline and breaks only that stream; a killed bookie fails
in-flight and new calls fast (far below the deadline) and the same transport works again after a restart;
the resolver's lookups (writable, read-only, cache, forget, host:port fallback, unknown ids, bad data);
close().
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid

import pytest

from bksim.adapters.bookie_transport import GrpcBookieTransport, address_of_id, registration_resolver
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry, master_key
from bksim.model.errors import BookieUnreachable
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode
from helpers import free_port, wait_until_async
from integration.bookie_harness import KEY, BookieProcess, kazoo_client, registration_path

CUSTOM_ID = f"transport-{uuid.uuid4().hex[:8]}"
FRAME_BYTES_MAX = 1024 * 1024  # the module bookie's limits, small so that a few entries exceed one frame
ENTRY_BYTES_MAX = 512 * 1024
TIMEOUT_MS = 5_000
FAST_S = 1.5  # a refused or reset connection must fail well within this (the deadline is far longer)
DEAD_WAIT_S = 10.0  # a killed bookie's registration lingers until its session expires (~2 s expected)
DEAD_CALL_INTERVAL_S = 0.02  # one call to the dead bookie per poll of that wait


@pytest.fixture(scope="module")
def bookie(zookeeper, tmp_path_factory):
    zk = kazoo_client(zookeeper)
    b = BookieProcess(zookeeper, tmp_path_factory.mktemp("transport"), env={
        "BKSIM_BOOKIE_BOOKIE_ID": CUSTOM_ID,
        "BKSIM_BOOKIE_FRAME_BYTES_MAX": str(FRAME_BYTES_MAX),
        "BKSIM_BOOKIE_ENTRY_BYTES_MAX": str(ENTRY_BYTES_MAX),
    })
    b.bookie_id = CUSTOM_ID  # the harness waits for the registration under this id
    try:
        b.start(zk)
        yield b
    finally:
        b.cleanup()
        zk.stop()
        zk.close()


@contextlib.asynccontextmanager
async def transport_on(zk, timeout_ms: float = TIMEOUT_MS, add_window_max: int = 64, **options):
    store = ZkMetadataStore(zk)
    resolver = registration_resolver(store)
    transport = GrpcBookieTransport(resolver, timeout_ms=timeout_ms, add_window_max=add_window_max, **options)
    try:
        yield transport, resolver
    finally:
        await transport.close()
        store.close()


@contextlib.contextmanager
def frozen(b: BookieProcess):
    """SIGSTOP the bookie for the block (it answers nothing), SIGCONT afterwards."""
    os.kill(b.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(b.pid, signal.SIGCONT)


def run(coroutine):
    return asyncio.run(coroutine)


def entry(ledger: int, entry_id: int, payload: bytes = b"payload") -> bytes:
    return encode_entry(ledger, entry_id, entry_id - 1, 0, payload)


def adds(ledger: int, first: int, n: int, payload: bytes = b"payload") -> list[tuple[bytes, bytes, int]]:
    return [(entry(ledger, i, payload), KEY, 0) for i in range(first, first + n)]


def journal_entries(journal_dir: str, ledgers: set[int]) -> list[tuple[int, int]]:
    """(ledger, entry id) of every ENTRY record of `ledgers`, in journal order (files by id, records by offset)."""
    files = sorted((jid, name) for name in os.listdir(journal_dir)
                   if (jid := jfmt.parse_journal_file_name(name)) is not None)
    out = []
    for i, (_, name) in enumerate(files):
        with open(os.path.join(journal_dir, name), "rb") as f:
            data = f.read()
        for record in jfmt.iter_file(data, newest=i == len(files) - 1):
            if record.type == jfmt.RecordType.ENTRY:
                ledger = int.from_bytes(record.body[:8], "big", signed=True)
                if ledger in ledgers:
                    out.append((ledger, int.from_bytes(record.body[8:16], "big", signed=True)))
    return out


def test_add_and_read_round_trip_on_one_reused_stream(bookie, zk):
    ledger = 301
    big = b"k" * 1024

    async def scenario():
        async with transport_on(zk) as (t, resolver):
            first = await t.add(CUSTOM_ID, adds(ledger, 0, 3))
            second = await t.add(CUSTOM_ID, adds(ledger, 3, 1, big))
            reads = [await t.read_entry(CUSTOM_ID, ledger, i) for i in range(4)]
            last = await t.read_entry(CUSTOM_ID, ledger, -1)
            lac = await t.read_lac(CUSTOM_ID, ledger)
            return first, second, reads, last, lac, dict(t.stats), resolver.lookups, await t.add(CUSTOM_ID, [])

    first, second, reads, last, lac, stats, lookups, empty = run(scenario())
    assert first == [StatusCode.OK] * 3 and all(type(s) is StatusCode for s in first)
    assert second == [StatusCode.OK]
    assert reads == [(StatusCode.OK, entry(ledger, i)) for i in range(3)] + [(StatusCode.OK, entry(ledger, 3, big))]
    assert last == (StatusCode.OK, entry(ledger, 3, big))
    assert lac == (StatusCode.OK, 2)  # piggybacked by entry 3
    assert empty == []
    assert stats["streams_opened"] == 1 and stats["channels_opened"] == 1 and stats["adds"] == 2, stats
    assert lookups == 1  # the address was read once from /ledgers/available/<id>, then cached


def test_bookie_answers_come_back_as_status_values(bookie, zk):
    ledger = 302
    wrong_key = master_key(b"not the password")

    async def scenario():
        async with transport_on(zk) as (t, _):
            out = {
                "no_ledger_read": await t.read_entry(CUSTOM_ID, 999_302, 0),
                "no_ledger_last": await t.read_entry(CUSTOM_ID, 999_302, -1),
                "no_ledger_lac": await t.read_lac(CUSTOM_ID, 999_302),
                "written": await t.add(CUSTOM_ID, adds(ledger, 0, 2)),
                "no_entry": await t.read_entry(CUSTOM_ID, ledger, 5),
                "unauthorized": await t.add(CUSTOM_ID, [(entry(ledger, 2), wrong_key, 0), (entry(ledger, 3), KEY, 0)]),
                "fence": await t.read_entry(CUSTOM_ID, ledger, -1, fence=True, master_key=KEY),
                "fenced": await t.add(CUSTOM_ID, adds(ledger, 4, 2)),
                "recovery_add": await t.add(CUSTOM_ID, [(entry(ledger, 4), KEY, FLAG_RECOVERY_ADD)]),
            }
            return out, dict(t.stats)

    out, stats = run(scenario())
    assert out["no_ledger_read"] == (StatusCode.NO_LEDGER, b"")
    assert out["no_ledger_last"][0] == StatusCode.NO_LEDGER
    assert out["no_ledger_lac"][0] == StatusCode.NO_LEDGER
    assert out["written"] == [StatusCode.OK, StatusCode.OK]
    assert out["no_entry"][0] == StatusCode.NO_ENTRY
    assert out["unauthorized"] == [StatusCode.UNAUTHORIZED, StatusCode.OK]
    assert out["fence"] == (StatusCode.OK, entry(ledger, 3))
    assert out["fenced"] == [StatusCode.FENCED, StatusCode.FENCED]
    assert out["recovery_add"] == [StatusCode.OK]
    # answers, not failures: the one stream stayed up throughout
    assert stats["streams_opened"] == 1 and stats["streams_broken"] == 0 and stats["channels_retired"] == 0, stats


def test_concurrent_adds_are_journaled_in_call_order(bookie, zk):
    """Tasks for 8 ledgers call add concurrently through a window of 4: more callers than room, so most
    wait for it. The bookie's journal must hold their batches exactly in the order `add` was called."""
    ledgers = list(range(310, 318))
    adds_per_ledger, batch = 25, 3
    order: list[tuple[int, int]] = []  # (ledger, first entry id) in the order add() was called

    async def writer(t: GrpcBookieTransport, ledger: int) -> list[StatusCode]:
        statuses = []
        for k in range(adds_per_ledger):
            first = 1 + k * batch
            order.append((ledger, first))
            statuses += await t.add(CUSTOM_ID, adds(ledger, first, batch, os.urandom(200)))
        return statuses

    async def scenario():
        async with transport_on(zk, add_window_max=4) as (t, _):
            warm = [await t.add(CUSTOM_ID, adds(ledger, 0, 1)) for ledger in ledgers]  # opens the stream
            results = await asyncio.gather(*(writer(t, ledger) for ledger in ledgers))
            reads = await asyncio.gather(*(t.read_entry(CUSTOM_ID, ledger, adds_per_ledger * batch)
                                           for ledger in ledgers))
            return warm, results, reads, dict(t.stats)

    warm, results, reads, stats = run(scenario())
    assert warm == [[StatusCode.OK]] * len(ledgers)
    assert all(r == [StatusCode.OK] * adds_per_ledger * batch for r in results)
    assert all(r[0] == StatusCode.OK for r in reads)
    assert stats["streams_opened"] == 1 and stats["adds"] == len(ledgers) * (adds_per_ledger + 1), stats
    expected = [(ledger, 0) for ledger in ledgers]
    expected += [(ledger, first + i) for ledger, first in order for i in range(batch)]
    interleaved = sum(1 for a, b in zip(order, order[1:]) if a[0] != b[0])
    assert interleaved > len(ledgers), "the callers did not interleave: the test would prove nothing"
    assert journal_entries(bookie.journal_dir, set(ledgers)) == expected


def test_batch_larger_than_a_frame_is_sent_as_consecutive_requests(bookie, zk):
    """5 entries of 300 KiB (1.5 MiB) against a bookie whose frame limit is 1 MiB: split, they are all stored.
    Sent whole (a transport told the frame limit is larger), the bookie refuses the message, which ends the
    stream (RESOURCE_EXHAUSTED) but not the connection."""
    ledger = 325
    payload = b"p" * (300 * 1024)

    async def scenario():
        async with transport_on(zk, frame_bytes_max=FRAME_BYTES_MAX) as (t, _):
            split = await t.add(CUSTOM_ID, adds(ledger, 0, 5, payload))
            reads = [await t.read_entry(CUSTOM_ID, ledger, i) for i in range(5)]
            split_stats = dict(t.stats)
        async with transport_on(zk, frame_bytes_max=8 * FRAME_BYTES_MAX) as (t, _):
            with pytest.raises(BookieUnreachable) as whole:
                await t.add(CUSTOM_ID, adds(ledger, 5, 5, payload))
            after = await t.add(CUSTOM_ID, adds(ledger, 5, 1))
            whole_stats = dict(t.stats)
        return split, reads, split_stats, whole.value, after, whole_stats

    split, reads, split_stats, whole, after, whole_stats = run(scenario())
    assert split == [StatusCode.OK] * 5
    assert reads == [(StatusCode.OK, entry(ledger, i, payload)) for i in range(5)]
    assert split_stats["adds"] == 1 and split_stats["requests"] == 2 and split_stats["streams_broken"] == 0, split_stats
    assert "RESOURCE_EXHAUSTED" in str(whole), whole
    assert after == [StatusCode.OK]
    assert whole_stats["streams_opened"] == 2 and whole_stats["channels_retired"] == 0, whole_stats


def test_equal_batches_for_several_bookies_are_serialized_once_and_stored_by_each(bookie, zk, zookeeper, bookies,
                                                                                  tmp_path):
    """A writer sends the same entries to every bookie of its write set, one add per bookie: the second add
    sends the first one's requests again (same batch ids, same bytes, here split in two by the frame limit), and
    each bookie stores every entry. A caller that refills its list for the next batch gets new requests."""
    other = BookieProcess(zookeeper, tmp_path)
    bookies.append(other)
    other.start(zk)
    ledger = 340
    payload = b"w" * (300 * 1024)

    async def scenario():
        async with transport_on(zk, frame_bytes_max=FRAME_BYTES_MAX) as (t, _):
            batch = adds(ledger, 0, 5, payload)  # 1.5 MiB: two requests
            first = await t.add(CUSTOM_ID, batch)
            copy = await t.add(other.bookie_id, list(batch))  # equal entries, another list
            after_copy = dict(t.stats)
            batch[:] = adds(ledger, 5, 2)  # the same list, refilled
            refilled = [await t.add(b, batch) for b in (CUSTOM_ID, other.bookie_id)]
            reads = {b: [await t.read_entry(b, ledger, i) for i in range(7)] for b in (CUSTOM_ID, other.bookie_id)}
            return first, copy, after_copy, refilled, reads, dict(t.stats)

    first, copy, after_copy, refilled, reads, stats = run(scenario())
    assert first == copy == [StatusCode.OK] * 5
    assert after_copy["requests"] == 4 and after_copy["requests_reused"] == 2, after_copy
    assert refilled == [[StatusCode.OK] * 2] * 2
    assert stats["requests"] == 6 and stats["requests_reused"] == 3, stats
    expected = [(StatusCode.OK, entry(ledger, i, payload)) for i in range(5)]
    expected += [(StatusCode.OK, entry(ledger, i)) for i in (5, 6)]
    assert reads == {CUSTOM_ID: expected, other.bookie_id: expected}


def test_late_answer_raises_at_the_deadline_and_breaks_only_that_stream(bookie, zk):
    ledger = 320
    timeout_ms = 800

    async def scenario():
        loop = asyncio.get_running_loop()
        async with transport_on(zk, timeout_ms=timeout_ms) as (t, _):
            before = await t.add(CUSTOM_ID, adds(ledger, 0, 1))
            with frozen(bookie):
                started = loop.time()
                late = await asyncio.gather(t.add(CUSTOM_ID, adds(ledger, 1, 1)), t.add(CUSTOM_ID, adds(ledger, 2, 1)),
                                            return_exceptions=True)
                elapsed = loop.time() - started
            after = await t.add(CUSTOM_ID, adds(ledger, 3, 1))
            return before, late, elapsed, after, dict(t.stats)

    before, late, elapsed, after, stats = run(scenario())
    assert before == [StatusCode.OK]
    assert all(isinstance(e, BookieUnreachable) and e.bookie == CUSTOM_ID for e in late), late
    assert "within 800 ms" in str(late[0]), late[0]
    assert timeout_ms / 1000 * 0.9 <= elapsed < timeout_ms / 1000 + 1.0, elapsed  # both at the deadline
    assert after == [StatusCode.OK]  # a new stream on the same channel
    assert stats["streams_broken"] == 1 and stats["streams_opened"] == 2 and stats["channels_retired"] == 0, stats


def test_killed_bookie_fails_fast_and_works_again_after_restart(zookeeper, zk, bookies, tmp_path):
    b = BookieProcess(zookeeper, tmp_path)  # default id: host:port
    bookies.append(b)
    owner = b.start(zk)
    ledger = 330
    timeout_ms = 10_000
    path = registration_path(b.bookie_id)

    async def scenario():
        loop = asyncio.get_running_loop()
        async with transport_on(zk, timeout_ms=timeout_ms) as (t, _):
            before = await t.add(b.bookie_id, adds(ledger, 0, 2))
            os.kill(b.pid, signal.SIGSTOP)  # no answers from here on; SIGKILL ends it stopped
            in_flight = asyncio.create_task(t.add(b.bookie_id, adds(ledger, 2, 1)))
            await wait_until_async(lambda: t.unanswered(b.bookie_id) == 1, 5.0, message="the add to be sent")
            started = loop.time()
            await asyncio.to_thread(b.kill9)
            with pytest.raises(BookieUnreachable) as in_flight_error:
                await in_flight
            in_flight_s = loop.time() - started
            # dead until ZooKeeper expires its registration (~2 s): every call fails fast, resolved through the
            # lingering node first and through the host:port fallback after. Calls that keep failing like this
            # grow gRPC's reconnect back-off on any channel kept across the failures.
            calls = (lambda: t.add(b.bookie_id, adds(ledger, 3, 1)), lambda: t.read_entry(b.bookie_id, ledger, 0),
                     lambda: t.read_lac(b.bookie_id, ledger))
            dead = []

            async def dead_call_then_gone() -> bool:  # one call to the dead bookie per poll, until its node is gone
                gone = zk.exists(path) is None
                started = loop.time()
                with pytest.raises(BookieUnreachable) as error:
                    await calls[len(dead) % len(calls)]()
                dead.append((loop.time() - started, str(error.value)))
                return gone
            gone = await wait_until_async(dead_call_then_gone, DEAD_WAIT_S, interval_s=DEAD_CALL_INTERVAL_S,
                                          message=f"{path} to expire while calls to the dead bookie fail fast")
            await asyncio.to_thread(b.start, zk, owner)
            first = await t.read_lac(b.bookie_id, ledger)  # the very next call after the restart
            after = await t.add(b.bookie_id, adds(ledger, 3, 1))
            read = await t.read_entry(b.bookie_id, ledger, 1)
            return before, in_flight_error.value, in_flight_s, gone, dead, first, after, read, dict(t.stats)

    before, in_flight_error, in_flight_s, gone, dead, first, after, read, stats = run(scenario())
    assert before == [StatusCode.OK, StatusCode.OK]
    assert in_flight_error.bookie == b.bookie_id
    assert in_flight_s < FAST_S, (in_flight_s, in_flight_error)
    assert gone, f"{path} still registered after {len(dead)} calls"
    assert len(dead) >= 10, dead
    for elapsed, message in dead:
        assert elapsed < FAST_S and b.bookie_id in message, (elapsed, message)
    assert first == (StatusCode.OK, 0)  # the same transport reaches the new process at once (entry 1 piggybacks 0)
    assert after == [StatusCode.OK]
    assert read == (StatusCode.OK, entry(ledger, 1))  # acknowledged before the kill
    assert stats["channels_retired"] >= 2, stats  # the broken connection, then each refused attempt


def test_resolver_reads_registrations_and_falls_back_to_host_port(bookie, zk, zookeeper):
    read_only_id = f"ro-{uuid.uuid4().hex[:8]}"
    garbage_id = f"bad-{uuid.uuid4().hex[:8]}"
    unknown_id = f"gone-{uuid.uuid4().hex[:8]}"
    nobody = f"127.0.0.1:{free_port()}"
    host, port = bookie.address.rsplit(":", 1)
    zk.create(f"/ledgers/available/readonly/{read_only_id}", ephemeral=True, value=json.dumps(
        {"bookie_id": read_only_id, "host": host, "port": int(port), "state": "read-only", "pid": 0}).encode())
    zk.create(f"/ledgers/available/{garbage_id}", b"not json", ephemeral=True)
    stopped = kazoo_client(zookeeper)
    dead_store = ZkMetadataStore(stopped)  # its session ends below: every read raises SessionExpiredError
    stopped.stop()
    stopped.close()

    async def scenario():
        loop = asyncio.get_running_loop()
        out = {}
        async with transport_on(zk, timeout_ms=10_000) as (t, resolver):
            out["custom"] = await resolver(CUSTOM_ID)
            lookups = resolver.lookups
            out["cached"] = (await resolver(CUSTOM_ID), resolver.lookups - lookups)
            resolver.forget(CUSTOM_ID)
            out["forgotten"] = (await resolver(CUSTOM_ID), resolver.lookups - lookups)
            out["read_only"] = await resolver(read_only_id)
            out["read_only_call"] = await t.read_lac(read_only_id, 999_340)
            out["host_port"] = await resolver(nobody)
            no_store = registration_resolver(dead_store)
            out["no_store_host_port"] = await no_store(nobody)
            with pytest.raises(BookieUnreachable) as error:
                await no_store(CUSTOM_ID)
            out["no_store_custom"] = error.value
            for name, bookie_id in (("unknown", unknown_id), ("garbage", garbage_id), ("nobody", nobody),
                                    ("invalid", "a/b")):
                started = loop.time()
                with pytest.raises(BookieUnreachable) as error:
                    await t.read_lac(bookie_id, 1)
                out[name] = (loop.time() - started, error.value)
        return out

    out = run(scenario())
    assert out["custom"] == bookie.address
    assert out["cached"] == (bookie.address, 0)
    assert out["forgotten"] == (bookie.address, 1)
    assert out["read_only"] == bookie.address
    assert out["read_only_call"][0] == StatusCode.NO_LEDGER  # reached the real bookie through the read-only node
    assert out["host_port"] == nobody
    assert out["no_store_host_port"] == nobody  # ZooKeeper unreadable: a host:port id is still tried
    assert "cannot read its registration" in str(out["no_store_custom"]), out["no_store_custom"]
    for name, fragment in (("unknown", "not registered"), ("garbage", "no usable host and port"),
                           ("nobody", "UNAVAILABLE"), ("invalid", "not a valid bookie id")):
        elapsed, error = out[name]
        assert elapsed < FAST_S and fragment in str(error), (name, elapsed, error)
    assert address_of_id("[::1]:3181") == "[::1]:3181" and address_of_id("::1:3181") is None
    assert address_of_id("bookie-1") is None and address_of_id("h:0") is None and address_of_id("h:70000") is None


def test_close_fails_waiting_and_later_calls_and_is_bounded(bookie, zk):
    ledger = 350

    async def scenario():
        loop = asyncio.get_running_loop()
        store = ZkMetadataStore(zk)
        t = GrpcBookieTransport(registration_resolver(store), timeout_ms=10_000, add_window_max=8)
        try:
            assert await t.add(CUSTOM_ID, adds(ledger, 0, 1)) == [StatusCode.OK]
            with frozen(bookie):
                waiting = asyncio.create_task(t.add(CUSTOM_ID, adds(ledger, 1, 1)))
                await wait_until_async(lambda: t.unanswered(CUSTOM_ID) == 1, 5.0, message="the add to be sent")
                started = loop.time()
                await t.close()
                close_s = loop.time() - started
                waiting_result = await asyncio.gather(waiting, return_exceptions=True)
            later = await asyncio.gather(t.add(CUSTOM_ID, adds(ledger, 2, 1)), t.read_entry(CUSTOM_ID, ledger, 0),
                                         t.read_lac(CUSTOM_ID, ledger), return_exceptions=True)
            await t.close()  # twice is fine
            return close_s, waiting_result[0], later
        finally:
            store.close()

    close_s, waiting_error, later = run(scenario())
    assert close_s < FAST_S, close_s
    assert isinstance(waiting_error, BookieUnreachable), waiting_error
    assert all(isinstance(e, BookieUnreachable) and "closed" in str(e) for e in later), later
