"""Reading ledgers against the world (PROTOCOL.md §4 "Reads"): the shell around ledger/reader.py.

- `read_lac`: a CLOSED ledger's last_entry_id; for an OPEN (or IN_RECOVERY) ledger, ReadLac to the last
  segment's bookies under quorum coverage (LacRead).
- `read_entries`: entries first..last in order, at most `window` EntryRead machines in flight, each with its
  speculative timer; the caller checks `last` against the LAC first (a reader never returns an entry above
  it: NoDirtyReads). A bookie that did not answer is asked last for the rest of the call. An entry unreadable on every replica raises LedgerError("READ_FAILED") naming each
  replica's answer; it is never reported as "no such entry".
"""
from __future__ import annotations

import asyncio
import collections
from typing import AsyncIterator

from bksim.formats.entry import Entry
from bksim.ledger.reader import EntryRead, LacRead
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.model.errors import BookieUnreachable, LedgerError
from bksim.ports.bookie_transport import BookieTransport


async def read_lac(transport: BookieTransport, ledger_id: int, metadata: LedgerMetadata) -> int:
    if metadata.is_closed:
        return metadata.last_entry_id
    machine = LacRead(metadata.ensemble, metadata.write_quorum_size, metadata.ack_quorum_size)
    done = asyncio.get_running_loop().create_future()

    async def ask(bookie: str) -> None:
        try:
            status, lac = await transport.read_lac(bookie, ledger_id)
        except BookieUnreachable:
            status, lac = None, -1
        if machine.on_reply(bookie, status, lac) and not done.done():
            done.set_result(None)

    tasks = [asyncio.get_running_loop().create_task(ask(c.bookie)) for c in machine.start()]
    try:
        await done
    finally:
        for task in tasks:
            task.cancel()
    if machine.failed:
        raise LedgerError("READ_FAILED", f"ledger {ledger_id}: {machine.failed}")
    return machine.lac


class _OneEntry:
    """One EntryRead machine with its replica tasks and speculative timer."""

    def __init__(self, transport: BookieTransport, metadata: LedgerMetadata, ledger_id: int, entry_id: int,
                 speculative_ms: float, failed: set[str]) -> None:
        self.machine = EntryRead(ledger_id, entry_id, metadata.ensemble_for(entry_id), metadata.write_quorum_size,
                                 metadata.digest_type, avoid=frozenset(failed))
        self._failed = failed
        self._transport = transport
        self._speculative_s = speculative_ms / 1000.0
        self._loop = asyncio.get_running_loop()
        self.done = self._loop.create_future()
        self._tasks: list[asyncio.Task] = []
        self._timer: asyncio.TimerHandle | None = None
        self._issue(self.machine.start())

    def _issue(self, commands) -> None:
        for command in commands:
            self._tasks.append(self._loop.create_task(self._ask(command.bookie)))
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

    async def _ask(self, bookie: str) -> None:
        m = self.machine
        try:
            status, data = await self._transport.read_entry(bookie, m.ledger_id, m.entry_id)
        except BookieUnreachable:
            status, data = None, b""
            self._failed.add(bookie)
        self._issue(m.on_reply(bookie, status, data))

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_result(None)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()


async def read_entries(transport: BookieTransport, ledger_id: int, metadata: LedgerMetadata, first: int,
                       last: int, *, window: int, speculative_ms: float) -> AsyncIterator[Entry]:
    """Entries first..last (inclusive, the caller checked them against the LAC), in order."""
    in_flight: collections.deque[_OneEntry] = collections.deque()
    failed: set[str] = set()  # bookies that did not answer during this read: asked last from then on
    next_id = first
    try:
        while next_id <= last or in_flight:
            while next_id <= last and len(in_flight) < window:
                in_flight.append(_OneEntry(transport, metadata, ledger_id, next_id, speculative_ms, failed))
                next_id += 1
            head = in_flight[0]
            await head.done
            in_flight.popleft()
            head.cancel()  # a speculative read still out is no longer needed
            if head.machine.failed:
                raise LedgerError("READ_FAILED", head.machine.failed)
            yield head.machine.entry
    finally:
        for one in in_flight:
            one.cancel()
