"""A ledger this broker writes: the LedgerWriter state machine run by a LedgerDriver, with futures for callers.

Owns: the futures of unacknowledged appends (resolved with the entry id, strictly in id order, or failed with a
LedgerError carrying the writer's failure code): one per `append`, one per `append_many` batch (its last entry:
acknowledgements come in id order, so it resolving means the whole batch is acknowledged); the in-flight bound
(`append_inflight_max` entries: `wait_for_room` blocks an Append stream instead of queueing without limit), and the
close.

States as the application sees them: writing -> (close) -> closed; writing -> failed (FENCED, UNAUTHORIZED,
NOT_ENOUGH_BOOKIES, METADATA_ERROR, ABORTED). A failed handle fails every later append with the same error: a
writer that was fenced never writes again (PROTOCOL.md §4, FencedWriterMakesNoProgress).
"""
from __future__ import annotations

import asyncio
from typing import Callable

from bksim.broker.driver import LedgerDriver
from bksim.ledger.writer import AddsFailed, LedgerWriter, WriterState
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus


class LedgerHandle(LedgerDriver):
    def __init__(self, *, writer: LedgerWriter, payload_bytes_max: int, inflight_max: int,
                 on_done: Callable[["LedgerHandle"], None], **driver) -> None:
        super().__init__(**driver)
        self.writer = writer
        self._payload_max = payload_bytes_max
        self._inflight_max = inflight_max
        self._on_done = on_done
        self._futures: dict[int, asyncio.Future] = {}  # entry id -> its caller's future (not every entry has one)
        self._inflight = 0  # entries appended and not yet acknowledged
        self._room = asyncio.Event()
        self._room.set()
        self._closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.error: LedgerError | None = None
        self._closing = False  # close() was called: appends are refused from then on

    @property
    def last_add_confirmed(self) -> int:
        return self.writer.last_add_confirmed

    @property
    def inflight(self) -> int:
        return self._inflight

    # -- the application's calls --------------------------------------------------------------------------
    def append(self, payload: bytes) -> asyncio.Future:
        """Start an append; the future resolves with the entry id once it and every earlier entry reached Qa.
        Raises LedgerError right away when the ledger cannot take it."""
        return self.append_many((payload,))

    def append_many(self, payloads) -> asyncio.Future:
        """Start appending `payloads` (at least one) as consecutive entries: all of them, or none when the ledger
        cannot take them (LedgerError right away). One future, resolved with the last entry's id once every entry
        of the batch and every earlier one reached Qa."""
        if self.error is not None:
            raise self.error
        largest = max(map(len, payloads), default=0)
        if largest > self._payload_max:
            raise LedgerError(LedgerStatus.BAD_REQUEST, f"payload of {largest} bytes exceeds "
                                                        f"payload_bytes_max {self._payload_max}")
        if self._closing or self.writer.state not in (WriterState.WRITING, WriterState.CHANGING_ENSEMBLE):
            raise LedgerError(LedgerStatus.LEDGER_CLOSED, f"ledger {self.ledger_id} is closed or closing")
        if not payloads:
            raise LedgerError(LedgerStatus.BAD_REQUEST, "nothing to append")
        writer = self.writer
        commands = writer.append_many(payloads)  # raises before any entry is taken when the writer cannot append
        self._inflight += len(payloads)
        self.execute(commands)
        if self.error is not None:  # the handle failed meanwhile: so did what this call appended
            raise self.error
        future = asyncio.get_running_loop().create_future()
        self._futures[writer.last_add_pushed] = future
        if self._inflight >= self._inflight_max:
            self._room.clear()
        return future

    async def wait_for_room(self) -> None:
        """Wait until fewer than `append_inflight_max` appends are unacknowledged (or the ledger failed)."""
        await self._room.wait()

    async def close(self) -> LedgerMetadata:
        """Stop taking appends, wait for the pending ones, CAS the metadata to CLOSED at the LAC."""
        if self.error is not None:
            raise self.error
        if not self._closing:
            self._closing = True
            self.execute(self.writer.close())
        return await asyncio.shield(self._closed)

    def abort(self, reason: str) -> None:
        """Give up without closing (broker shutdown, ledger deleted): pending appends fail, ledger stays OPEN."""
        self.execute(self.writer.abort(reason))
        self._fail(LedgerStatus.ABORTED, reason)

    # -- driver hooks ----------------------------------------------------------------------------------------
    def _sink_add_results(self, bookie, entry_ids, statuses, writable):
        return self.writer.on_add_results(bookie, entry_ids, statuses, writable)

    def _sink_ensemble_changed(self, first_entry_id, ensemble):
        return self.writer.on_ensemble_changed(first_entry_id, ensemble)

    def _sink_ensemble_rejected(self, state, ensemble, writable):
        return self.writer.on_ensemble_change_rejected(state, ensemble, writable)

    def _sink_closed(self):
        return self.writer.on_closed()

    def _expected_state(self) -> LedgerState:
        return LedgerState.OPEN

    def _on_acknowledge(self, entry_id: int) -> None:
        self._inflight -= 1
        future = self._futures.pop(entry_id, None)
        if future is not None and not future.done():
            future.set_result(entry_id)
        if not self._room.is_set() and self._inflight < self._inflight_max:
            self._room.set()

    def _on_adds_failed(self, command: AddsFailed) -> None:
        self._fail(command.code, command.reason)

    def _on_closed(self, metadata: LedgerMetadata) -> None:
        if not self._closed.done():
            self._closed.set_result(metadata)
        self.stop()
        self._on_done(self)

    def _on_failed(self, code: LedgerStatus, reason: str) -> None:
        if self.writer.state not in (WriterState.FAILED, WriterState.CLOSED):
            self.writer.abort(reason)
        self._fail(code, reason)

    def _fail(self, code: LedgerStatus, reason: str) -> None:
        if self.error is None:
            self.error = LedgerError(code, f"ledger {self.ledger_id}: {reason}")
        for future in self._futures.values():
            if not future.done():
                future.set_exception(self.error)
                future.exception()  # retrieved: callers that stopped waiting must not log "never retrieved"
        self._futures.clear()
        self._inflight = 0
        self._room.set()
        if not self._closed.done():
            self._closed.set_exception(self.error)
            self._closed.exception()
        self.stop()
        self._on_done(self)

