"""The shell that runs a sans-I/O ledger writer (or a recovery's write-back writer) against the world.

Owns, for one ledger: the per-bookie outboxes of SendAdd and SendAdds commands (flushed once per event-loop turn, in
batches of at most `add_batch_entries_max` entries, so a stream of appends becomes few AddEntries requests; while
`add_requests_per_bookie_max` requests to a bookie are unanswered its outbox waits and fills, and goes out at the
next answer: batches grow with the load, and a bookie that keeps up sees no wait),
the tasks that wait for the bookies' answers, and the compare-and-set writes of the ledger metadata that
UpdateEnsemble and CloseLedger ask for. Everything it learns goes back into the state machine as an event; the
commands that come out are executed here. The machine decides; this class only carries messages.

Metadata writes (PROTOCOL.md §3, MetadataVersionsIncrease): always a CAS on the version last read (a recovery's
shell, broker/recovery.py, keeps its ensemble changes local and publishes them with its close). A lost CAS
re-reads and re-decides through the machine (on_ensemble_change_rejected) or, for a close, accepts an identical
CLOSED value (idempotent close) and fails on any other. A ConnectionLossError leaves the outcome unknown: the
driver re-reads and checks whether its own write landed before deciding anything.

Subclasses say what the machine is (`_sink_*` methods) and what the application is told (`_on_acknowledge`,
`_on_adds_failed`, `_on_closed`, `_on_failed`).

Every bookie call ends in an event for the machine: an answer, or "no answer" (BookieUnreachable, and also a
call that ended in asyncio.CancelledError although nobody cancelled the task waiting for it: see
`cancelled_underneath`). A call whose end the machine never hears of would leave it waiting forever. Each
BookieUnreachable is also reported to `bookie_failed` (the ledger service's placement quarantine counts them).

Replacements come from `writable_bookies(ensemble)`: the candidates for replacing members of `ensemble`, the
ensemble this driver's writer writes to now (the service leaves quarantined bookies out while enough others
remain).
"""
from __future__ import annotations

import asyncio
from itertools import repeat
from operator import itemgetter
from typing import Awaitable, Callable, Sequence

from bksim.ledger.writer import Acknowledge, AddsFailed, CloseLedger, SendAdd, SendAdds, UpdateEnsemble
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.ledger_manager import read_ledger_metadata, write_ledger_metadata
from bksim.model.errors import (BadVersionError, BookieUnreachable, ConnectionLossError, LedgerStateError,
                                MetadataError)
from bksim.model.status import FLAG_RECOVERY_ADD, LedgerStatus, StatusCode
from bksim.ports.bookie_transport import BookieTransport
from bksim.ports.metadata import MetadataStore

Log = Callable[[str], None]
_ID, _ENTRY, _FLAGS = itemgetter(0), itemgetter(1), itemgetter(2)  # of an outbox item (entry id, entry bytes, flags)
_OK = StatusCode.OK


def cancelled_underneath() -> bool:
    """For an `except asyncio.CancelledError` around a bookie call: True when the current task was NOT asked to
    cancel, i.e. the call itself was cancelled underneath it (gRPC does so to the calls of a channel it closes).
    No answer will come: the shells treat that as BookieUnreachable. False: the task's own cancellation
    (stop(), a timeout), which must propagate."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


class LedgerDriver:
    _ensemble_change_note = ""  # said after "ensemble change at entry ..." in the log

    def __init__(self, *, ledger_id: int, metadata: LedgerMetadata, version: int, store: MetadataStore,
                 transport: BookieTransport, master_key: bytes, batch_entries_max: int, cas_attempts_max: int,
                 requests_per_bookie_max: int = 0,
                 writable_bookies: Callable[[Sequence[str]], Awaitable[list[str]]], log: Log,
                 bookie_failed: Callable[[str], None] = lambda bookie: None,
                 ensemble_changed: Callable[[], None] = lambda: None) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self._store = store
        self._transport = transport
        self._master_key = master_key
        self._batch_max = batch_entries_max
        self._requests_max = requests_per_bookie_max or None  # add requests unanswered per bookie (None: no bound)
        self._requests: dict[str, int] = {}  # bookie -> add requests sent and not yet answered
        self._cas_attempts_max = cas_attempts_max
        self._writable_bookies = writable_bookies
        self._log = log
        self._bookie_failed = bookie_failed
        self._ensemble_changed = ensemble_changed  # told once per ensemble change this driver stored
        self._outboxes: dict[str, list[tuple[int, bytes, int]]] = {}  # bookie -> (entry id, entry, flags)
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self._stopped = False
        self._unanswered_logged: dict[str, str] = {}  # bookie -> the last reason logged for an unanswered add

    # -- what subclasses provide -----------------------------------------------------------------------------
    def _sink_add_results(self, bookie: str, entry_ids: list[int], statuses: list,
                          writable: Sequence[str]) -> list: raise NotImplementedError

    def _sink_ensemble_changed(self, first_entry_id: int, ensemble: Sequence[str]) -> list: raise NotImplementedError

    def _sink_ensemble_rejected(self, state: str, ensemble: Sequence[str], writable: Sequence[str]) -> list:
        raise NotImplementedError

    def _sink_closed(self) -> list: raise NotImplementedError

    def _expected_state(self) -> LedgerState: raise NotImplementedError

    def _on_acknowledge(self, entry_id: int) -> None: pass

    def _on_adds_failed(self, command: AddsFailed) -> None: pass

    def _on_closed(self, metadata: LedgerMetadata) -> None: pass

    def _on_failed(self, code: LedgerStatus, reason: str) -> None: pass

    def _on_other(self, command) -> None:
        raise AssertionError(f"ledger {self.ledger_id}: unexpected command {command!r}")

    # -- executing commands ----------------------------------------------------------------------------------
    def execute(self, commands: list) -> None:
        if self._stopped:
            return
        for command in commands:
            kind = type(command)
            if kind is SendAdds or kind is SendAdd:
                box = self._outboxes.get(command.bookie)
                if box is None:
                    box = self._outboxes[command.bookie] = []
                flags = FLAG_RECOVERY_ADD if command.recovery else 0
                if kind is SendAdds:
                    box.extend(zip(command.entry_ids, command.entries, repeat(flags)))
                else:
                    box.append((command.entry_id, command.entry, flags))
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    asyncio.get_running_loop().call_soon(self._flush)
            elif kind is Acknowledge:
                self._on_acknowledge(command.entry_id)
            elif kind is AddsFailed:
                self._on_adds_failed(command)
            elif kind is UpdateEnsemble:
                self._log(f"ledger {self.ledger_id}: ensemble change at entry {command.first_entry_id}: "
                          f"replacing {', '.join(f'#{i} {b}' for i, b in command.replaced)} -> "
                          f"{list(command.ensemble)}{self._ensemble_change_note}")
                self.spawn(self._update_ensemble(command))
            elif kind is CloseLedger:
                self.spawn(self._close(command))
            else:
                self._on_other(command)

    def spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            self._log(f"ledger {self.ledger_id}: internal error {error!r}")
            self._on_failed(LedgerStatus.INTERNAL, f"internal error: {error!r}")

    def stop(self) -> None:
        """Forget everything in flight (the machine was failed or closed by the caller)."""
        self._stopped = True
        self._outboxes.clear()
        for task in list(self._tasks):
            task.cancel()

    async def drain(self) -> None:
        """Wait for the tasks in flight (bounded by the transport's and the store's own deadlines)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- adds --------------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._stopped:
            return
        outboxes, self._outboxes = self._outboxes, {}
        requests, requests_max, batch_max = self._requests, self._requests_max, self._batch_max
        for bookie, items in outboxes.items():
            sent = requests.get(bookie, 0)
            start = 0
            while start < len(items) and (requests_max is None or sent < requests_max):
                self.spawn(self._send(bookie, items[start:start + batch_max]))
                start += batch_max
                sent += 1
            requests[bookie] = sent
            if start < len(items):  # held until an answer: they go out together, in bigger requests
                self._outboxes[bookie] = items[start:]

    def _answered(self, bookie: str) -> None:
        self._requests[bookie] -= 1
        if bookie in self._outboxes and not self._flush_scheduled and not self._stopped:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send(self, bookie: str, items: list[tuple[int, bytes, int]]) -> None:
        try:
            await self._send_once(bookie, items)
        finally:
            self._answered(bookie)

    async def _send_once(self, bookie: str, items: list[tuple[int, bytes, int]]) -> None:
        key = self._master_key
        try:
            statuses: list = await self._transport.add(bookie, list(zip(map(_ENTRY, items), repeat(key),
                                                                        map(_FLAGS, items))))
            if len(statuses) != len(items):
                raise BookieUnreachable(bookie, f"answered {len(statuses)} statuses for {len(items)} entries")
        except BookieUnreachable as e:
            self._bookie_failed(bookie)
            self._log_unanswered(bookie, len(items), e.why)
            statuses = [None] * len(items)
        except asyncio.CancelledError:
            if not cancelled_underneath():
                raise
            self._log_unanswered(bookie, len(items), "the call was cancelled underneath (not by this broker)")
            statuses = [None] * len(items)
        writable: Sequence[str] = ()
        if statuses.count(_OK) != len(statuses) and any(s is not _OK and s not in (StatusCode.FENCED,
                                                                                 StatusCode.UNAUTHORIZED)
                                                        for s in statuses):
            writable = await self._writable_or_none()
        if self._stopped:
            return
        self.execute(self._sink_add_results(bookie, list(map(_ID, items)), statuses, writable))

    def _log_unanswered(self, bookie: str, count: int, why: str) -> None:
        """One line per bookie and reason: a failed stream hands the same reason to every add that was pending on
        it (hundreds at a few hundred adds/s), which would otherwise be one identical line each."""
        if self._unanswered_logged.get(bookie) == why:
            return
        self._unanswered_logged[bookie] = why
        self._log(f"ledger {self.ledger_id}: {count} add(s) to {bookie} unanswered: {why} (more adds failing "
                  f"the same way are not logged)")

    def _ensemble_in_use(self) -> Sequence[str]:
        """The ensemble this driver's writer writes to now (what a replacement must be outside of)."""
        return self.metadata.ensemble

    async def _writable_or_none(self) -> Sequence[str]:
        try:
            return await self._writable_bookies(self._ensemble_in_use())
        except MetadataError as e:
            self._log(f"ledger {self.ledger_id}: cannot list writable bookies: {e}")
            return ()

    # -- metadata ---------------------------------------------------------------------------------------------
    async def _reread(self) -> None:
        self.metadata, self.version = await read_ledger_metadata(self._store, self.ledger_id)

    async def _cas(self, wanted: LedgerMetadata) -> bool:
        """CAS `wanted` on the version last read. True: stored; False: lost (metadata re-read). A connection
        loss re-reads: our write may have landed (then True)."""
        try:
            self.version = await write_ledger_metadata(self._store, self.ledger_id, wanted, self.version)
            self.metadata = wanted
            return True
        except BadVersionError:
            await self._reread()
            return False
        except ConnectionLossError:
            await self._reread()
            return self.metadata == wanted

    async def _update_ensemble(self, command: UpdateEnsemble) -> None:
        try:
            for _ in range(self._cas_attempts_max):
                if self.metadata.state is not self._expected_state():
                    break
                wanted = self.metadata.with_new_segment(command.first_entry_id, command.ensemble)
                if await self._cas(wanted):
                    self._ensemble_changed()
                    return self.execute(self._sink_ensemble_changed(command.first_entry_id, command.ensemble))
                if self.metadata.last_segment == wanted.last_segment and self.metadata.state is wanted.state:
                    return self.execute(self._sink_ensemble_changed(command.first_entry_id, command.ensemble))
                if self.metadata.state is not self._expected_state():
                    break
            writable = await self._writable_or_none()
            self.execute(self._sink_ensemble_rejected(self.metadata.state.name, self.metadata.ensemble, writable))
        except (MetadataError, LedgerStateError) as e:
            self._on_failed(LedgerStatus.METADATA_ERROR, f"ensemble change failed: {e}")

    def _closed_value(self, command: CloseLedger) -> LedgerMetadata | None:
        """The CLOSED metadata to CAS onto the version last read (`self.metadata`), or None when this client may
        not close over that value (then the close fails as fenced)."""
        return self.metadata.closed(command.last_entry_id, command.length)

    async def _close(self, command: CloseLedger) -> None:
        try:
            for _ in range(self._cas_attempts_max):
                if self.metadata.state is LedgerState.CLOSED or self.metadata.state is not self._expected_state():
                    break
                wanted = self._closed_value(command)
                if wanted is None:
                    return self._on_failed(LedgerStatus.FENCED, f"ledger {self.ledger_id}: its segments changed in the "
                                                                f"metadata while this client was closing it")
                if await self._cas(wanted):
                    break
            md = self.metadata
            if md.state is LedgerState.CLOSED:
                if (md.last_entry_id, md.length) != (command.last_entry_id, command.length):
                    return self._on_failed(LedgerStatus.FENCED,
                                           f"ledger {self.ledger_id} was closed by another client at "
                                           f"last_entry_id {md.last_entry_id} (this client: "
                                           f"{command.last_entry_id})")
                self.execute(self._sink_closed())
                return self._on_closed(md)
            self._on_failed(LedgerStatus.FENCED, f"ledger {self.ledger_id} is {md.state.name} in the metadata: another "
                                                 f"client is recovering it")
        except (MetadataError, LedgerStateError) as e:
            self._on_failed(LedgerStatus.METADATA_ERROR, f"close failed: {e}")
