"""Ledger recovery run against the world (PROTOCOL.md §4 "Recovery"): the shell around ledger/recovery.py.

Step 1 is the caller's (LedgerService): CAS OPEN -> IN_RECOVERY (a CLOSED ledger needs nothing; an IN_RECOVERY
one is recovered again, since a recovery that died leaves it so). Steps 2-6 are LedgerRecovery's decisions;
this shell sends its fencing and read-forward ReadEntry commands (all with the FENCE flag) through a ReadOutbox
(broker/reader.py: the reads issued in one event-loop turn go to each bookie as one read_entries call), runs
its write-back writer through the LedgerDriver (RECOVERY_ADD adds) and CASes IN_RECOVERY -> CLOSED.

Ensemble changes during the write-back stay local (PROTOCOL.md §4 step 5, as BookKeeper's recovery does): a
bookie that fails is replaced in this run's own view of the segments only, and the segments reach the metadata
in the closing write, which is a CAS on the IN_RECOVERY value this run started from. So a CLOSED ledger names
only segments whose entries the closing recovery wrote back to Qa bookies of each write set. Two recoveries at
once (a topic takeover: the old owner's failed add path and the new owner's open) cannot publish each other's
half-written segments: the first close wins; the loser finds the ledger CLOSED and returns that metadata (whose
segments its winner wrote in full); a run that finds the segments changed under it (never by bksim itself)
fails with RECOVERY_FAILED instead of closing over them.

A recovery that cannot decide (no quorum coverage, an entry neither found nor provably absent, the write-back
fenced by yet another recovery's ensemble change) raises LedgerError(RECOVERY_FAILED), leaving the ledger
IN_RECOVERY for a later retry: it never guesses.
"""
from __future__ import annotations

import asyncio

from bksim.broker.driver import LedgerDriver
from bksim.broker.reader import ReadOutbox
from bksim.ledger.recovery import LedgerRecovery, ReadEntry, RecoveryFailed, RecoveryPhase
from bksim.ledger.writer import CloseLedger, UpdateEnsemble
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus


class RecoveryRun(LedgerDriver):
    _ensemble_change_note = " (local to this recovery until its close publishes it)"

    def __init__(self, *, recovery: LedgerRecovery, **driver) -> None:
        super().__init__(**driver)
        self.recovery = recovery
        self._done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reads = ReadOutbox(self._transport, self.ledger_id, self._on_read_result, master_key=self._master_key,
                                 spawn=self.spawn, bookie_failed=self._bookie_failed)
        self._base_segments = self.metadata.segments  # the IN_RECOVERY value this run's segments build on
        self._local_segments: list[tuple[int, tuple[str, ...]]] = []  # the write-back's ensemble changes, in order

    async def run(self) -> LedgerMetadata:
        self.execute(self.recovery.start_recovery())
        try:
            return await self._done
        finally:
            self.stop()

    # -- reads -------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._reads.close()
        super().stop()

    def _on_other(self, command) -> None:
        if isinstance(command, ReadEntry):
            self._reads.read(command.bookie, command.entry_id, command.fence)
        elif isinstance(command, RecoveryFailed):
            self._finish_failed(LedgerStatus.RECOVERY_FAILED, command.reason)
        else:
            super()._on_other(command)

    def _on_read_result(self, bookie: str, entry_id: int, status, entry: bytes) -> None:
        self.execute(self.recovery.on_read_result(bookie, entry_id, status, entry))

    # -- driver hooks (the write-back writer) ----------------------------------------------------------------
    def _ensemble_in_use(self):
        writer = self.recovery.writer
        return writer.ensemble if writer is not None else self.metadata.ensemble

    def _sink_add_results(self, bookie, entry_ids, statuses, writable):
        if self.recovery.writer is None or self.recovery.phase is not RecoveryPhase.WRITING_BACK:
            return []
        return self.recovery.forward(self.recovery.writer.on_add_results(bookie, entry_ids, statuses, writable))

    def _sink_ensemble_changed(self, first_entry_id, ensemble):
        return self.recovery.forward(self.recovery.writer.on_ensemble_changed(first_entry_id, ensemble))

    def _sink_ensemble_rejected(self, state, ensemble, writable):
        return self.recovery.forward(self.recovery.writer.on_ensemble_change_rejected(state, ensemble, writable))

    def _sink_closed(self):
        return self.recovery.on_closed()

    def _expected_state(self) -> LedgerState:
        return LedgerState.IN_RECOVERY

    # -- segments: local until the close ---------------------------------------------------------------------
    async def _update_ensemble(self, command: UpdateEnsemble) -> None:
        """Replace the failed bookies in this run's view only; nothing is written until the close."""
        self._local_segments.append((command.first_entry_id, command.ensemble))
        self.execute(self._sink_ensemble_changed(command.first_entry_id, command.ensemble))

    def _closed_value(self, command: CloseLedger) -> LedgerMetadata | None:
        """The stored IN_RECOVERY value with this run's segments on top, CLOSED. None when the stored segments
        are no longer the ones this run started from: its write-back went to ensembles computed from those."""
        if self.metadata.segments != self._base_segments:
            return None
        wanted = self.metadata
        for first_entry_id, ensemble in self._local_segments:
            wanted = wanted.with_new_segment(first_entry_id, ensemble)
        return wanted.closed(command.last_entry_id, command.length)

    def _on_closed(self, metadata: LedgerMetadata) -> None:
        if not self._done.done():
            self._done.set_result(metadata)

    def _on_failed(self, code: LedgerStatus, reason: str) -> None:
        if code is LedgerStatus.FENCED and self.metadata.state is LedgerState.CLOSED:
            # another recovery closed the ledger first; its end is the ledger's end
            if not self._done.done():
                self._done.set_result(self.metadata)
            return
        self._finish_failed(LedgerStatus.RECOVERY_FAILED if code is LedgerStatus.FENCED else code, reason)

    def _finish_failed(self, code: LedgerStatus, reason: str) -> None:
        if not self._done.done():
            self._done.set_exception(LedgerError(code, f"ledger {self.ledger_id}: recovery failed: {reason}"))
