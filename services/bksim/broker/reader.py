"""Reading ledgers against the world (PROTOCOL.md §4 "Reads"): the shell around ledger/reader.py.

- `read_lac`: a CLOSED ledger's last_entry_id; for an OPEN (or IN_RECOVERY) ledger, ReadLac to the last
  segment's bookies under quorum coverage (LacRead).
- `read_entries`: entries first..last in order, at most `window` EntryRead machines in flight, each with its
  speculative timer; the caller checks `last` against the LAC first (a reader never returns an entry above
  it: NoDirtyReads). A bookie that did not answer is asked last for the rest of the call. An entry unreadable on every replica raises LedgerError(READ_FAILED) naming each
  replica's answer; it is never reported as "no such entry".
- `ReadOutbox`: the ReadEntry requests a state machine issues in one event-loop turn, collected per (bookie,
  fence) and sent as `read_entries` calls (one per bookie and at most READ_BATCH_ENTRIES_MAX ids) when the
  turn ends; each entry's answer goes back to the caller on its own, in id order, exactly as one ReadEntry
  reply would (status None for every entry of a call that got no answer). Recovery's read-forward and
  `read_entries` use it: a window of W entries costs one call per bookie instead of W * Qw calls. A
  speculative read issued later joins the next flush. A call that ends without an answer (BookieUnreachable,
  or cancelled underneath the outbox: driver.cancelled_underneath) delivers None for each of its entries, so
  the caller's machine always hears of every read it asked for. A BookieUnreachable is also reported to
  `bookie_failed` (the ledger service's placement quarantine counts them); so are `read_lac`'s and
  `read_entries`'.
"""
from __future__ import annotations

import asyncio
import collections
from typing import AsyncIterator, Callable

from bksim.broker.driver import cancelled_underneath
from bksim.formats.entry import Entry
from bksim.ledger.reader import EntryRead, LacRead
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.model.errors import BookieUnreachable, LedgerError
from bksim.model.status import LedgerStatus, StatusCode
from bksim.ports.bookie_transport import READ_BATCH_ENTRIES_MAX, BookieTransport

# deliver(bookie, entry id, status or None when unanswered, entry bytes)
Deliver = Callable[[str, int, "StatusCode | None", bytes], None]


class ReadOutbox:
    """Batches ReadEntry requests per (bookie, fence) within one event-loop turn; see the module docstring.

    `spawn(coroutine)` runs a call (the owner's task set, so that its stop cancels calls in flight); after
    `close()` nothing more is sent or delivered. Pending ids are bounded by what the owner's window issues."""

    def __init__(self, transport: BookieTransport, ledger_id: int, deliver: Deliver, *, master_key: bytes = b"",
                 spawn: Callable | None = None, batch_max: int = READ_BATCH_ENTRIES_MAX,
                 bookie_failed: Callable[[str], None] = lambda bookie: None) -> None:
        assert batch_max > 0
        self._transport = transport
        self._ledger_id = ledger_id
        self._deliver = deliver
        self._master_key = master_key
        self._batch_max = batch_max
        self._bookie_failed = bookie_failed
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._spawn = spawn or self._own_task
        self._pending: dict[tuple[str, bool], list[int]] = {}
        self._flush_scheduled = False
        self._closed = False
        self.calls = 0  # read_entries calls made (tests and diagnostics)

    def read(self, bookie: str, entry_id: int, fence: bool = False) -> None:
        """Ask `bookie` for `entry_id` in the next flush (the end of this event-loop turn)."""
        if self._closed:
            return
        ids = self._pending.get((bookie, fence))
        if ids is None:
            ids = self._pending[(bookie, fence)] = []
        ids.append(entry_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        """Send nothing more, deliver nothing more; calls in flight of our own are cancelled."""
        self._closed = True
        self._pending.clear()
        for task in list(self._tasks):
            task.cancel()

    def _own_task(self, coroutine) -> asyncio.Task:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        pending, self._pending = self._pending, {}
        for (bookie, fence), ids in pending.items():
            for start in range(0, len(ids), self._batch_max):
                self.calls += 1
                self._spawn(self._send(bookie, fence, ids[start:start + self._batch_max]))

    async def _send(self, bookie: str, fence: bool, ids: list[int]) -> None:
        try:
            results = await self._transport.read_entries(bookie, self._ledger_id, ids, fence=fence,
                                                         master_key=self._master_key)
            if len(results) != len(ids):
                raise BookieUnreachable(bookie, f"answered {len(results)} results for {len(ids)} entry ids")
        except BookieUnreachable:
            self._bookie_failed(bookie)
            results = [(None, b"")] * len(ids)
        except asyncio.CancelledError:
            if self._closed or not cancelled_underneath():
                raise
            results = [(None, b"")] * len(ids)  # the call was cancelled underneath us: no answer
        deliver = self._deliver
        for entry_id, (status, entry) in zip(ids, results):
            if self._closed:
                return
            deliver(bookie, entry_id, status, entry)


async def read_lac(transport: BookieTransport, ledger_id: int, metadata: LedgerMetadata, *,
                   bookie_failed: Callable[[str], None] = lambda bookie: None) -> int:
    if metadata.is_closed:
        return metadata.last_entry_id
    machine = LacRead(metadata.ensemble, metadata.write_quorum_size, metadata.ack_quorum_size)
    done = asyncio.get_running_loop().create_future()

    async def ask(bookie: str) -> None:
        try:
            status, lac = await transport.read_lac(bookie, ledger_id)
        except BookieUnreachable:
            bookie_failed(bookie)
            status, lac = None, -1
        except asyncio.CancelledError:
            if not cancelled_underneath():
                raise
            status, lac = None, -1  # the call was cancelled underneath us: no answer
        if machine.on_reply(bookie, status, lac) and not done.done():
            done.set_result(None)

    tasks = [asyncio.get_running_loop().create_task(ask(c.bookie)) for c in machine.start()]
    try:
        await done
    finally:
        for task in tasks:
            task.cancel()
    if machine.failed:
        raise LedgerError(LedgerStatus.READ_FAILED, f"ledger {ledger_id}: {machine.failed}")
    return machine.lac


class _OneEntry:
    """One EntryRead machine with its replica tasks and speculative timer."""

    def __init__(self, outbox: ReadOutbox, metadata: LedgerMetadata, ledger_id: int, entry_id: int,
                 speculative_ms: float, failed: set[str]) -> None:
        self.machine = EntryRead(ledger_id, entry_id, metadata.ensemble_for(entry_id), metadata.write_quorum_size,
                                 metadata.digest_type, avoid=frozenset(failed))
        self._failed = failed
        self._outbox = outbox
        self._speculative_s = speculative_ms / 1000.0
        self._loop = asyncio.get_running_loop()
        self.done = self._loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._issue(self.machine.start())

    def _issue(self, commands) -> None:
        m = self.machine
        for command in commands:
            self._outbox.read(command.bookie, m.entry_id)
        if self.machine.done:
            self._finish()
        elif commands:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_later(self._speculative_s, self._speculate)

    def _speculate(self) -> None:
        self._timer = None
        if not self.machine.done:
            self._issue(self.machine.on_speculative_timeout())

    def on_reply(self, bookie: str, status: StatusCode | None, data: bytes) -> None:
        if status is None:
            self._failed.add(bookie)
        self._issue(self.machine.on_reply(bookie, status, data))

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_result(None)

    def cancel(self) -> None:
        """Stop the speculative timer (replies still due for this entry are dropped by the caller)."""
        if self._timer is not None:
            self._timer.cancel()


async def read_entries(transport: BookieTransport, ledger_id: int, metadata: LedgerMetadata, first: int,
                       last: int, *, window: int, speculative_ms: float,
                       bookie_failed: Callable[[str], None] = lambda bookie: None) -> AsyncIterator[Entry]:
    """Entries first..last (inclusive, the caller checked them against the LAC), in order."""
    in_flight: collections.deque[_OneEntry] = collections.deque()
    by_id: dict[int, _OneEntry] = {}  # the entries of the window, for the outbox's replies
    failed: set[str] = set()  # bookies that did not answer during this read: asked last from then on

    def deliver(bookie: str, entry_id: int, status: StatusCode | None, data: bytes) -> None:
        one = by_id.get(entry_id)
        if one is not None:  # else: already returned; a late (e.g. speculative) reply changes nothing
            one.on_reply(bookie, status, data)

    outbox = ReadOutbox(transport, ledger_id, deliver, bookie_failed=bookie_failed)
    next_id = first
    try:
        while next_id <= last or in_flight:
            while next_id <= last and len(in_flight) < window:
                by_id[next_id] = _OneEntry(outbox, metadata, ledger_id, next_id, speculative_ms, failed)
                in_flight.append(by_id[next_id])
                next_id += 1
            head = in_flight[0]
            await head.done
            in_flight.popleft()
            del by_id[head.machine.entry_id]
            head.cancel()
            if head.machine.failed:
                raise LedgerError(LedgerStatus.READ_FAILED, head.machine.failed)
            yield head.machine.entry
    finally:
        outbox.close()
        for one in in_flight:
            one.cancel()
