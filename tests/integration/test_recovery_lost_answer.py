"""A bookie call cancelled with its channel is "no answer", never a lost answer (chaos bookie-kill seed 616843657).

Root cause of that run's hang: GrpcBookieTransport retires a bookie's channel when a call on it fails with
UNAVAILABLE, and closing a gRPC channel cancels the calls still in flight on it; gRPC reports such a call to
its awaiter as asyncio.CancelledError, not as an AioRpcError. The transport let that through, so the
ReadOutbox task of a ledger recovery ended "cancelled" and the recovery machine never heard of the reads of
that call: it waited forever for a verdict on the entry they were for.

Here the bookies are in-process fake gRPC Bookie services on loopback (FakeBookieService: in-memory entries,
and a `behavior` hook that holds a call at a gate, or answers it UNAVAILABLE); a third bookie id names a port
nobody listens on (connection refused). Checked: each unary call (ReadEntry, ReadEntries, ReadLac) in flight on
a channel that a concurrent call's UNAVAILABLE retires ends at once in BookieUnreachable, the next call works
on a fresh channel, and the caller's own cancellation still propagates; and the chaos run's sequence through
LedgerService.recover_ledger: the first attempt ends RECOVERY_FAILED at once instead of hanging, and the next
one, with the bookie answering, closes the ledger at the right end.
"""
from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Callable

import grpc
import pytest

from bksim.adapters.bookie_transport import GrpcBookieTransport
from bksim.broker.ledgers import LedgerService
from bksim.formats.entry import decode_entry, encode_entry
from bksim.gen import bookie_pb2, bookie_pb2_grpc
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.metadata.ledger_manager import create_ledger_metadata
from bksim.model.config import BrokerConfig
from bksim.model.errors import BookieUnreachable, LedgerError
from bksim.model.status import FLAG_FENCE, StatusCode
from helpers import free_port, wait_until_async
from fakes.clock import ManualClock

TIMEOUT_MS = 3_000
FAST_S = 1.0  # "at once": a cancelled call must end far below the deadline it had
WAIT_S = 10.0  # bound of every wait for a state the test sets up
PW = b"pw"

# behaviours a test's hook gives a call
SERVE, HOLD, UNAVAILABLE_WHEN_RELEASED = "serve", "hold", "unavailable-when-released"


class FakeBookieService(bookie_pb2_grpc.BookieServicer):
    """Bookie RPCs over in-memory entries (fencing as PROTOCOL.md §2.1, no master-key checks). `behavior(rpc,
    request)` says what to do with a call: SERVE it; HOLD it until `release(HOLD)` (then serve it); or wait
    until `release(UNAVAILABLE_WHEN_RELEASED)` and then abort it UNAVAILABLE. `held` counts the calls waiting
    now (tests wait on it, never sleep); `added` lists (ledger, entry id) of every add, in order."""

    def __init__(self) -> None:
        self.entries: dict[int, dict[int, bytes]] = {}
        self.fenced: set[int] = set()
        self.added: list[tuple[int, int]] = []
        self.behavior: Callable[[str, object], str] = lambda rpc, request: SERVE
        self._gates = {HOLD: asyncio.Event(), UNAVAILABLE_WHEN_RELEASED: asyncio.Event()}
        self.held = 0

    def release(self, what: str) -> None:
        """Let the calls waiting as `what` go on (and every later call given that behaviour)."""
        self._gates[what].set()

    async def _enter(self, rpc: str, request, context) -> None:
        what = self.behavior(rpc, request)
        if what == SERVE:
            return
        self.held += 1
        try:
            await self._gates[what].wait()
        finally:
            self.held -= 1
        if what == UNAVAILABLE_WHEN_RELEASED:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection trouble (fake)")

    def _read(self, ledger_id: int, entry_id: int, fence: bool) -> tuple[int, bytes]:
        if fence:
            self.fenced.add(ledger_id)
        entries = self.entries.get(ledger_id)
        if not entries:
            return int(StatusCode.NO_ENTRY if ledger_id in self.fenced else StatusCode.NO_LEDGER), b""
        if entry_id == -1:
            entry_id = max(entries)
        data = entries.get(entry_id)
        return (int(StatusCode.OK), data) if data is not None else (int(StatusCode.NO_ENTRY), b"")

    async def ReadEntry(self, request, context):
        await self._enter("ReadEntry", request, context)
        status, data = self._read(request.ledger_id, request.entry_id, bool(request.flags & FLAG_FENCE))
        return bookie_pb2.ReadEntryResponse(status=status, entry=data)

    async def ReadEntries(self, request, context):
        await self._enter("ReadEntries", request, context)
        fence = bool(request.flags & FLAG_FENCE)
        results = []
        for i, entry_id in enumerate(request.entry_ids):
            status, data = self._read(request.ledger_id, entry_id, fence and i == 0)
            results.append(bookie_pb2.ReadEntryResult(status=status, entry=data))
        return bookie_pb2.ReadEntriesResponse(results=results)

    async def ReadLac(self, request, context):
        await self._enter("ReadLac", request, context)
        entries = self.entries.get(request.ledger_id)
        if not entries:
            return bookie_pb2.ReadLacResponse(status=int(StatusCode.NO_LEDGER), last_add_confirmed=-1)
        lac = decode_entry(entries[max(entries)]).last_add_confirmed
        return bookie_pb2.ReadLacResponse(status=int(StatusCode.OK), last_add_confirmed=lac)

    async def AddEntries(self, request_iterator, context):
        async for request in request_iterator:
            data = list(request.data) or [add.entry for add in request.entries]  # the compact form or AddEntry's
            for entry in data:
                e = decode_entry(entry)
                self.entries.setdefault(e.ledger_id, {})[e.entry_id] = bytes(entry)
                self.added.append((e.ledger_id, e.entry_id))
            yield bookie_pb2.AddResponse(batch_id=request.batch_id, statuses=[0] * len(data))


@contextlib.asynccontextmanager
async def fake_bookies(n: int):
    """n FakeBookieService servers on loopback: yields [(bookie id "127.0.0.1:port", service)]."""
    servers, out = [], []
    try:
        for _ in range(n):
            service = FakeBookieService()
            server = grpc.aio.server()
            bookie_pb2_grpc.add_BookieServicer_to_server(service, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append((server, service))
            out.append((f"127.0.0.1:{port}", service))
        yield out
    finally:
        for server, service in servers:
            for what in (HOLD, UNAVAILABLE_WHEN_RELEASED):
                service.release(what)  # let held handlers finish
            await server.stop(0)


async def resolve(bookie_id: str) -> str:
    return bookie_id  # the ids here are host:port


def transport() -> GrpcBookieTransport:
    return GrpcBookieTransport(resolve, timeout_ms=TIMEOUT_MS, add_window_max=8)


def run(coroutine):
    return asyncio.run(coroutine)


CALLS = {
    "read_entry": lambda t, b, ledger: t.read_entry(b, ledger, 0, fence=True),
    "read_entries": lambda t, b, ledger: t.read_entries(b, ledger, [0, 1], fence=True),
    "read_lac": lambda t, b, ledger: t.read_lac(b, ledger),
}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_a_call_cancelled_with_its_retired_channel_is_bookie_unreachable_at_once(method):
    async def main():
        async with fake_bookies(1) as [(bookie, service)]:
            # ledger 1: held at the bookie; ledger 2: answered UNAVAILABLE, which retires the channel
            service.behavior = lambda rpc, r: UNAVAILABLE_WHEN_RELEASED if r.ledger_id == 2 else HOLD
            t = transport()
            try:
                held = asyncio.create_task(CALLS[method](t, bookie, 1))
                await wait_until_async(lambda: service.held == 1, WAIT_S, message="the first call is not held")
                failing = asyncio.create_task(t.read_entries(bookie, 2, [0]))
                await wait_until_async(lambda: service.held == 2, WAIT_S, message="the second call is not held")
                service.release(UNAVAILABLE_WHEN_RELEASED)  # ledger 2's call fails; ledger 1's stays held
                with pytest.raises(BookieUnreachable, match="UNAVAILABLE"):
                    await failing
                retired_at = asyncio.get_running_loop().time()
                done, _ = await asyncio.wait([held], timeout=WAIT_S)
                assert done == {held}, "the call left on the retired channel never ended"
                assert not held.cancelled(), "the caller got CancelledError although nobody cancelled it"
                with pytest.raises(BookieUnreachable, match="cancelled with its channel") as info:
                    held.result()
                assert info.value.bookie == bookie
                assert asyncio.get_running_loop().time() - retired_at < FAST_S
                assert t.stats["channels_retired"] == 1
                # the next call goes out on a fresh channel and is answered
                service.behavior = lambda rpc, r: SERVE
                assert await t.read_lac(bookie, 1) == (StatusCode.NO_LEDGER, -1)
                assert t.stats["channels_opened"] == 2
            finally:
                await t.close()
    run(main())


def test_the_callers_own_cancellation_still_propagates():
    async def main():
        async with fake_bookies(1) as [(bookie, service)]:
            service.behavior = lambda rpc, r: HOLD
            t = transport()
            try:
                for method in sorted(CALLS):
                    task = asyncio.create_task(CALLS[method](t, bookie, 1))
                    await wait_until_async(lambda: service.held == 1, WAIT_S, message=f"{method} is not held")
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    assert task.cancelled(), method
                    await wait_until_async(lambda: service.held == 0, WAIT_S, message="the server call lingers")
                assert t.stats["channels_retired"] == 0
            finally:
                await t.close()
    run(main())


def test_recovery_ends_when_a_read_forward_call_is_cancelled_with_its_channel():
    """The chaos run's ledger 8, in miniature: E=Qw=Qa=2, segments (0, [C, B]) and (5, [A, B]); C is down
    (refused), B is coming back. A holds entries 5..7, B holds 0..7 (entries 5..7 carry LAC 4: the writer's
    last confirmed entry was 4). A's fence answer is enough for coverage, so the read-forward (entries 4.. ;
    entry 4 from C and B) goes out while B's fencing call is still in flight on the same channel; that call
    then fails UNAVAILABLE, the channel is retired, and the read-forward call to B is cancelled with it."""
    ledger = 8

    def entry(i: int) -> bytes:
        return encode_entry(ledger, i, min(i - 1, 4), 10 * (i + 1), b"x" * 10)

    async def main():
        async with fake_bookies(2) as [(a, bookie_a), (b, bookie_b)]:
            c = f"127.0.0.1:{free_port()}"  # nobody listens: connection refused
            bookie_b.entries[ledger] = {i: entry(i) for i in range(0, 8)}
            bookie_a.entries[ledger] = {i: entry(i) for i in range(5, 8)}
            store = InMemoryMetadataStore()
            session = store.session("bookies")
            for bookie in (a, b):
                await session.create(bookie_path(bookie), b"{}", ephemeral=True, make_parents=True)
            metadata = LedgerMetadata.new([c, b], 2, 2, password=PW, ctime_ms=0).with_new_segment(5, [a, b])
            await create_ledger_metadata(store, ledger, metadata)
            t = transport()
            service = LedgerService(store=store.session("broker"), transport=t, rng=random.Random(1),
                                    clock=ManualClock(sleeps_advance=True), config=BrokerConfig(bookie_timeout_ms=TIMEOUT_MS))
            try:
                # B: the fencing call (ids [-1]) waits, then fails UNAVAILABLE; any other call waits
                bookie_b.behavior = lambda rpc, r: (UNAVAILABLE_WHEN_RELEASED if list(r.entry_ids) == [-1]
                                                    else HOLD)
                attempt = asyncio.create_task(service.recover_ledger(ledger, password=PW))
                await wait_until_async(lambda: bookie_b.held == 2, WAIT_S,
                                       message="the fencing and the read-forward call to B are not both held")
                bookie_b.release(UNAVAILABLE_WHEN_RELEASED)
                failed_at = asyncio.get_running_loop().time()
                done, _ = await asyncio.wait([attempt], timeout=WAIT_S)
                assert done == {attempt}, "the recovery attempt hangs: the read-forward call's answer was lost"
                with pytest.raises(LedgerError) as info:
                    attempt.result()
                assert info.value.status == "RECOVERY_FAILED"
                assert "entry 4: no verified copy" in str(info.value), str(info.value)
                assert asyncio.get_running_loop().time() - failed_at < FAST_S
                assert ledger not in bookie_b.fenced  # B served no call of this attempt
                md, _ = await service.metadata(ledger)
                assert md.state is LedgerState.IN_RECOVERY

                # B answers now: the next attempt finds entry 4 on B and 5..7 on A and B, writes 5..7 back to
                # both and closes at 7
                bookie_b.behavior = lambda rpc, r: SERVE
                closed = await asyncio.wait_for(service.recover_ledger(ledger, password=PW), WAIT_S)
                assert closed.state is LedgerState.CLOSED and (closed.last_entry_id, closed.length) == (7, 80)
                assert bookie_a.added == bookie_b.added == [(ledger, i) for i in (5, 6, 7)]
                assert ledger in bookie_a.fenced and ledger in bookie_b.fenced
            finally:
                await service.close(close_ledgers=False)
                await t.close()
    run(main())
