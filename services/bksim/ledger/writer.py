"""The ledger writer as a sans-I/O state machine (PROTOCOL.md §4: add, ordered LAC, ensemble change, close).

Events in (method calls) -> commands out (returned lists). No clock, no network, no metadata store: a shell
(the broker, or the simulator) turns SendAdd into bookie requests, UpdateEnsemble / CloseLedger into
compare-and-set writes of the ledger metadata, timeouts into `on_add_result(..., status=None)`, and
Acknowledge / AddsFailed into answers to the application. Randomness (placement) comes from the `rng` the
shell passes in, so a simulator seed decides it.

Ordering contracts (written on the commands):
- Acknowledge(entry_id) is emitted strictly in entry-id order, once the entry and every earlier one reached
  Qa acks from their write sets; it means "LAC = entry_id". Never emitted while an ensemble change is
  pending (the new segment must start at LAC + 1).
- FENCED or UNAUTHORIZED from any bookie is fatal: every pending add fails (outcome unknown), nothing more
  is sent or acknowledged.
- Any other error or a timeout from a bookie of the current ensemble triggers an ensemble change: replace
  the failed bookies (never with one already in the ensemble), CAS a new segment starting at LAC + 1, and
  resend each pending entry whose write set contains a replaced index to its replacement. So does one that
  comes back for an entry already acknowledged at Qa (that entry stays under-replicated; later ones do not
  go to the failed bookie), except while closing.

State table (illegal transitions raise WriterError naming the state):

    WRITING         --bookie error-->      CHANGING_ENSEMBLE --on_ensemble_changed--> WRITING
    WRITING / CHANGING --FENCED, UNAUTHORIZED, metadata not OPEN--> FAILED
    WRITING         --close, once nothing is pending--> CLOSING --on_closed--> CLOSED

Invariants (check_invariants() raises InvariantError naming the one broken; true after every event):
- LacBelowLap: -1 <= LAC <= LAP; confirmed_length <= length.
- LacOnlyAdvances: LAC and confirmed_length never decrease (against the previous check).
- PendingInOrder: unless FAILED (every pending add failed), the pending adds are exactly LAC+1 .. LAP, their
  ledger lengths in order, between confirmed_length and length (equal to length at LAP).
- AcksFromWriteSet: a pending entry's acks come from its write set (at most Qw of them).
- AcknowledgeAtQuorum: while WRITING, the head LAC+1 has fewer than Qa acks (a complete head is popped and
  acknowledged at once: an entry leaves the queue, and LAC reaches it, only at Qa acks from its write set).
- SentUnlessChanging: while WRITING or CLOSING every pending add was sent (appends during a change wait).
- StateMatchesFields: FAILED <=> a failure reason; CLOSING / CLOSED: close requested, nothing pending,
  LAC = LAP; CHANGING_ENSEMBLE: failed bookies await replacement; WRITING: none do (failures reported during
  a change start the next one; only a close that completes at the change's end may leave them behind).
- EnsembleShape: E distinct bookies (E and Qw fixed for the ledger, E >= Qw >= Qa >= 1); a failed index is
  an ensemble index; a writer's segment starts at or below LAC + 1 (a new segment starts at LAC + 1).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from bksim.formats.entry import encode_entry
from bksim.ledger.quorum import check_quorum_sizes, write_set_indexes
from bksim.model.digest import DIGEST_CRC32C
from bksim.model.errors import BksimError
from bksim.model.invariants import InvariantError
from bksim.model.status import LedgerStatus, StatusCode


class WriterError(BksimError):
    """An event the writer cannot take in its current state (a bug in the shell, or a use after close)."""


class WriterState(enum.Enum):
    WRITING = "writing"
    CHANGING_ENSEMBLE = "changing-ensemble"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


class Rng(Protocol):
    def choice(self, seq: Sequence[str]) -> str: ...


# -- commands ------------------------------------------------------------------------------------------------
@dataclass(slots=True)  # not frozen: created three times per entry, and a frozen __init__ costs twice as much
class SendAdd:
    """Send `entry` (PROTOCOL.md §1 bytes, LAC piggybacked) to `bookie`; report with on_add_result.
    `recovery`: send with the RECOVERY_ADD flag (a recovery write-back, accepted by fenced bookies)."""
    bookie: str
    entry_id: int
    entry: bytes
    recovery: bool = False


@dataclass(slots=True)
class SendAdds:
    """SendAdd of several entries to one bookie, in entry-id order: `entries[i]` is entry `entry_ids[i]` (what
    append_many emits, one per bookie, instead of a SendAdd per entry and bookie). Several commands may share the
    same lists: read them, never change them."""
    bookie: str
    entry_ids: list[int]
    entries: list[bytes]
    recovery: bool = False


@dataclass(slots=True)
class Acknowledge:
    """The application's add of `entry_id` succeeded; LAC is now `entry_id` (emitted in id order)."""
    entry_id: int


@dataclass(frozen=True, slots=True)
class AddsFailed:
    """These adds will never be acknowledged by this writer (their outcome is unknown: a later reader or
    recovery may still find them)."""
    entry_ids: tuple[int, ...]
    reason: str
    code: LedgerStatus = LedgerStatus.FENCED  # FENCED | NOT_ENOUGH_BOOKIES | ABORTED: what the application is told


@dataclass(frozen=True, slots=True)
class UpdateEnsemble:
    """CAS the ledger metadata: new last segment {first_entry_id, ensemble} (replacing the last segment if it
    starts at the same id), allowed only while the ledger is OPEN. Report with on_ensemble_changed or
    on_ensemble_change_rejected. A recovery's write-back writer asks the same, and its shell keeps the new
    segment local: the recovery's close publishes its segments (PROTOCOL.md §4 step 5)."""
    first_entry_id: int
    ensemble: tuple[str, ...]
    replaced: tuple[tuple[int, str], ...]  # (ensemble index, failed bookie) pairs, for logs and checks


@dataclass(frozen=True, slots=True)
class CloseLedger:
    """CAS the ledger metadata to CLOSED with this last entry id and length. Report with on_closed."""
    last_entry_id: int
    length: int


Command = SendAdd | SendAdds | Acknowledge | AddsFailed | UpdateEnsemble | CloseLedger


@dataclass(slots=True)
class _Pending:
    entry_id: int
    entry: bytes
    length: int  # ledger length including this entry
    acked: set[int] = field(default_factory=set)  # ensemble indexes that acknowledged
    sent: bool = False


class LedgerWriter:
    def __init__(self, ledger_id: int, *, ensemble: Sequence[str], segment_first_entry_id: int,
                 write_quorum_size: int, ack_quorum_size: int, rng: Rng, digest_type: str = DIGEST_CRC32C,
                 last_add_confirmed: int = -1, length: int = 0, recovery: bool = False) -> None:
        """`recovery`: this writer writes back entries found by recovery (RECOVERY_ADD; the ledger is
        IN_RECOVERY in the metadata, which is then the state its ensemble changes expect)."""
        check_quorum_sizes(len(ensemble), write_quorum_size, ack_quorum_size)
        self.ledger_id = ledger_id
        self.ensemble = tuple(ensemble)
        self.segment_first_entry_id = segment_first_entry_id
        self.write_quorum_size = write_quorum_size
        self.ack_quorum_size = ack_quorum_size
        self._rng = rng
        self._digest_type = digest_type
        self.last_add_confirmed = last_add_confirmed
        self.last_add_pushed = last_add_confirmed
        self.length = length  # of everything pushed
        self.confirmed_length = length  # of everything up to the LAC
        self.state = WriterState.WRITING
        self.failure: str | None = None
        self.failure_code: LedgerStatus | None = None
        self._pending: dict[int, _Pending] = {}  # entry id -> pending add, ids > LAC, in id order
        self._failed: dict[int, str] = {}  # ensemble index -> failed bookie, awaiting replacement
        self._close_requested = False
        self._writable: tuple[str, ...] = ()  # the latest writable bookies a shell reported, for replacements
        self.recovery = recovery
        self._expected_state = "IN_RECOVERY" if recovery else "OPEN"
        # write set of entry e = _write_sets[e % E] (ensemble indexes); E and Qw never change for a ledger
        e = len(self.ensemble)
        self._write_sets = [tuple(write_set_indexes(i, e, write_quorum_size)) for i in range(e)]
        self._write_set_members = [frozenset(ws) for ws in self._write_sets]
        self._index_tables: dict[str, list[int | None]] = {}  # bookie -> its index in the write set of e % E
        self._tables_of: tuple[str, ...] = self.ensemble  # the ensemble the tables were made for
        self.events = 0  # events taken so far: a checker re-checks the invariants only after a new one
        self._seen = (last_add_confirmed, length)  # (LAC, confirmed_length) at the last check_invariants()

    # -- events ------------------------------------------------------------------------------------------
    def append(self, payload: bytes) -> list[Command]:
        """Assign the next entry id (LAP + 1) and send it to its write set (held while the ensemble changes)."""
        self.events += 1
        self._check_appendable()
        entry_id = self.last_add_pushed + 1
        self.last_add_pushed = entry_id
        self.length += len(payload)
        entry = encode_entry(self.ledger_id, entry_id, self.last_add_confirmed, self.length, payload,
                             self._digest_type)
        pending = _Pending(entry_id, entry, self.length)
        self._pending[entry_id] = pending
        if self.state is WriterState.CHANGING_ENSEMBLE:
            return []
        return self._send(pending)

    def append_many(self, payloads: Sequence[bytes]) -> list[Command]:
        """append() of each payload in turn, as one event: consecutive entry ids, and one SendAdds per bookie of
        the write sets (none while the ensemble changes: the entries wait, as append()'s do)."""
        self.events += 1
        self._check_appendable()
        sending = self.state is WriterState.WRITING
        ledger_id, digest_type, lac, pending = self.ledger_id, self._digest_type, self.last_add_confirmed, self._pending
        entry_id, length = self.last_add_pushed, self.length
        ids: list[int] = []
        entries: list[bytes] = []
        for payload in payloads:
            entry_id += 1
            length += len(payload)
            entry = encode_entry(ledger_id, entry_id, lac, length, payload, digest_type)
            p = pending[entry_id] = _Pending(entry_id, entry, length)
            p.sent = sending
            ids.append(entry_id)
            entries.append(entry)
        self.last_add_pushed, self.length = entry_id, length
        if not sending:
            return []
        ensemble, recovery, e = self.ensemble, self.recovery, len(self.ensemble)
        if self.write_quorum_size == e:  # every entry to every bookie: the lists are shared
            return [SendAdds(bookie, ids, entries, recovery) for bookie in ensemble]
        by_index: list[tuple[list[int], list[bytes]]] = [([], []) for _ in range(e)]
        write_sets = self._write_sets
        for entry_id, entry in zip(ids, entries):
            for i in write_sets[entry_id % e]:
                to = by_index[i]
                to[0].append(entry_id)
                to[1].append(entry)
        return [SendAdds(ensemble[i], to[0], to[1], recovery) for i, to in enumerate(by_index) if to[0]]

    def append_existing(self, entry: bytes, ledger_length: int) -> list[Command]:
        """Recovery write-back: send an entry exactly as a bookie returned it (same bytes on every replica:
        NoLogDivergence). It must be the next entry id (LAP + 1)."""
        self.events += 1
        if not self.recovery:
            raise WriterError(f"ledger {self.ledger_id}: append_existing is for recovery write-back only")
        if self.state is not WriterState.WRITING or self._close_requested:
            raise WriterError(f"ledger {self.ledger_id}: cannot append in state {self.state.value}")
        entry_id = self.last_add_pushed + 1
        self.last_add_pushed = entry_id
        self.length = ledger_length
        pending = _Pending(entry_id, entry, ledger_length)
        self._pending[entry_id] = pending
        return self._send(pending)

    def on_add_result(self, entry_id: int, bookie: str, status: StatusCode | None,
                      writable_bookies: Sequence[str] = ()) -> list[Command]:
        """A bookie answered an add (status None = timeout). `writable_bookies`: current candidates for
        replacing a failed bookie (needed only when status is an error)."""
        self.events += 1
        if self.state in (WriterState.FAILED, WriterState.CLOSED):
            return []  # late answers after the end change nothing
        pending = self._pending.get(entry_id)
        index = self._index_of(bookie, entry_id)
        if status is StatusCode.OK:
            if pending is None or index is None:
                return []  # already acknowledged, or from a bookie no longer in this entry's write set
            pending.acked.add(index)
            return self._acknowledge_ready()
        if status in (StatusCode.FENCED, StatusCode.UNAUTHORIZED):
            return self._fail(f"bookie {bookie} answered {status.name}: the ledger was fenced or the "
                              f"password is wrong; this writer can make no further progress", status.name)
        if index is None:
            return []  # an old segment's bookie, or one already replaced: nothing left to protect
        if pending is None and (entry_id > self.last_add_confirmed or self.state is WriterState.CLOSING):
            return []  # not an entry of this writer's; or closing: no later entry will be written to it
        # pending, or acknowledged at Qa before this failure came back (BookKeeper's ADD_ENTRY_UR: that entry
        # stays under-replicated): either way the bookie leaves the ensemble, or each later entry is written to
        # a bookie that does not answer and holds one copy fewer than Qw
        self._writable = tuple(writable_bookies) or self._writable
        self._failed[self.ensemble.index(bookie)] = bookie
        if self.state is WriterState.CHANGING_ENSEMBLE:
            return []  # the next change picks it up
        return self._start_ensemble_change(self._writable)

    def on_add_results(self, bookie: str, entry_ids: Sequence[int], statuses: Sequence[StatusCode | None],
                       writable_bookies: Sequence[str] = ()) -> list[Command]:
        """The answers of one batch from `bookie`: the same commands as on_add_result for each in turn, with a
        fast path when every answer is OK (the common case at thousands of entries per second)."""
        self.events += 1
        if self.state in (WriterState.FAILED, WriterState.CLOSED):
            return []
        if statuses.count(StatusCode.OK) == len(statuses):
            pending, first, e = self._pending, self.segment_first_entry_id, len(self.ensemble)
            table = self._index_table(bookie)
            for entry_id in entry_ids:
                p = pending.get(entry_id)
                if p is not None and entry_id >= first:
                    index = table[entry_id % e]
                    if index is not None:
                        p.acked.add(index)
            return self._acknowledge_ready()
        commands: list[Command] = []
        for entry_id, status in zip(entry_ids, statuses):
            commands += self.on_add_result(entry_id, bookie, status, writable_bookies)
        return commands

    def on_ensemble_changed(self, first_entry_id: int, ensemble: Sequence[str]) -> list[Command]:
        """The UpdateEnsemble CAS succeeded with this last segment."""
        self.events += 1
        self._require(WriterState.CHANGING_ENSEMBLE, "on_ensemble_changed")
        old = self.ensemble
        self.ensemble, self.segment_first_entry_id = tuple(ensemble), first_entry_id
        replaced = {i for i in range(len(old)) if old[i] != self.ensemble[i]}
        for i in replaced:
            self._failed.pop(i, None)
        self.state = WriterState.WRITING
        commands: list[Command] = []
        for pending in self._pending.values():
            if not pending.sent:
                commands += self._send(pending)
                continue
            for i in write_set_indexes(pending.entry_id, len(self.ensemble), self.write_quorum_size):
                if i in replaced:
                    pending.acked.discard(i)  # an ack from the replaced bookie no longer counts
                    commands.append(SendAdd(self.ensemble[i], pending.entry_id, pending.entry, self.recovery))
        commands += self._acknowledge_ready()
        if self._failed and self.state is WriterState.WRITING:
            commands += self._start_ensemble_change(self._writable)  # failures reported during the change
        return commands

    def on_ensemble_change_rejected(self, ledger_state: str, ensemble: Sequence[str],
                                    writable_bookies: Sequence[str]) -> list[Command]:
        """The CAS met another version. `ledger_state`/`ensemble`: the metadata as re-read. Not OPEN (for a
        recovery writer: not IN_RECOVERY) means another client recovered or closed the ledger: this writer
        is fenced. Otherwise: re-decide."""
        self.events += 1
        self._require(WriterState.CHANGING_ENSEMBLE, "on_ensemble_change_rejected")
        if ledger_state != self._expected_state:
            return self._fail(f"ledger {self.ledger_id} is {ledger_state} in the metadata: another client "
                              f"is recovering or closed it")
        self.ensemble = tuple(ensemble)
        self.state = WriterState.WRITING
        self._writable = tuple(writable_bookies) or self._writable
        return self._start_ensemble_change(self._writable)

    def close(self) -> list[Command]:
        """Stop taking appends; CLOSE once every pending add is acknowledged (or right away if none)."""
        self.events += 1
        if self.state in (WriterState.FAILED, WriterState.CLOSED):
            raise WriterError(f"ledger {self.ledger_id}: cannot close in state {self.state.value}")
        self._close_requested = True
        return self._maybe_close()

    def on_closed(self) -> list[Command]:
        self.events += 1
        self._require(WriterState.CLOSING, "on_closed")
        self.state = WriterState.CLOSED
        return []

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks an invariant of the module docstring. Costs O(pending)."""
        lac, lap, state, pending = self.last_add_confirmed, self.last_add_pushed, self.state, self._pending
        e, qw, qa = len(self.ensemble), self.write_quorum_size, self.ack_quorum_size
        if not -1 <= lac <= lap or self.confirmed_length > self.length:
            self._broken("LacBelowLap", f"LAC {lac}, LAP {lap}, confirmed length {self.confirmed_length}, "
                                        f"length {self.length}")
        seen_lac, seen_length = self._seen
        if lac < seen_lac or self.confirmed_length < seen_length:
            self._broken("LacOnlyAdvances", f"LAC {seen_lac} -> {lac}, confirmed length {seen_length} -> "
                                            f"{self.confirmed_length}")
        self._seen = (lac, self.confirmed_length)
        if state is WriterState.FAILED:
            if self.failure is None or pending:
                self._broken("StateMatchesFields", f"FAILED with failure {self.failure!r} and "
                                                   f"{len(pending)} adds still pending")
        else:
            if self.failure is not None:
                self._broken("StateMatchesFields", f"{state.value} with failure {self.failure!r}")
            if len(pending) != lap - lac:
                self._broken("PendingInOrder", f"{len(pending)} adds pending, LAC {lac}, LAP {lap}: expected "
                                               f"exactly {lac + 1}..{lap}")
            length, expected = self.confirmed_length, lac + 1
            must_be_sent = state is not WriterState.CHANGING_ENSEMBLE
            members = self._write_set_members
            for p in pending.values():  # in insertion (= id) order
                if p.entry_id != expected or p.length < length:
                    self._broken("PendingInOrder", f"pending add {p.entry_id} (ledger length {p.length}) where "
                                                   f"{expected} (length >= {length}) belongs: expected exactly "
                                                   f"{lac + 1}..{lap}")
                if p.acked and not p.acked <= members[expected % e]:
                    self._broken("AcksFromWriteSet", f"entry {expected} acked by ensemble indexes "
                                                     f"{sorted(p.acked)}, its write set is "
                                                     f"{list(self._write_sets[expected % e])}")
                if must_be_sent and not p.sent:
                    self._broken("SentUnlessChanging", f"entry {expected} pending unsent while {state.value}")
                length = p.length
                expected += 1
            if length != self.length:
                self._broken("PendingInOrder", f"the last pending add (LAP {lap}) has ledger length {length}, "
                                               f"the writer's length is {self.length}")
            head = pending.get(lac + 1)
            if state is WriterState.WRITING and head is not None and len(head.acked) >= qa:
                self._broken("AcknowledgeAtQuorum", f"entry {lac + 1} has {len(head.acked)} acks (Qa={qa}) but "
                                                    f"was not acknowledged: LAC is still {lac}")
            if (state is WriterState.CHANGING_ENSEMBLE and not self._failed) or \
                    (state is WriterState.WRITING and self._failed):
                self._broken("StateMatchesFields", f"{state.value} with failed bookies {self._failed}")
            if state in (WriterState.CLOSING, WriterState.CLOSED) and (not self._close_requested or lac != lap):
                self._broken("StateMatchesFields", f"{state.value}, close requested {self._close_requested}, "
                                                   f"LAC {lac}, LAP {lap}")
        if len(set(self.ensemble)) != e or e != len(self._write_sets) or not e >= qw >= qa >= 1 \
                or (self._failed and any(not 0 <= i < e for i in self._failed)):
            self._broken("EnsembleShape", f"ensemble {list(self.ensemble)} (E fixed at {len(self._write_sets)}), "
                                          f"Qw={qw} Qa={qa}, failed indexes {sorted(self._failed)}")
        if not self.recovery and self.segment_first_entry_id > lac + 1:
            self._broken("EnsembleShape", f"the current segment starts at {self.segment_first_entry_id}, above "
                                          f"LAC + 1 = {lac + 1}")

    def _broken(self, invariant: str, detail: str):
        raise InvariantError(f"ledger {self.ledger_id} writer ({self.state.value})", invariant, detail)

    # -- internals ---------------------------------------------------------------------------------------
    def _require(self, state: WriterState, event: str) -> None:
        if self.state is not state:
            raise WriterError(f"ledger {self.ledger_id}: {event} in state {self.state.value}")

    def _index_of(self, bookie: str, entry_id: int) -> int | None:
        """The ensemble index of `bookie` if it is in the current write set of `entry_id`."""
        if entry_id < self.segment_first_entry_id:
            return None
        ensemble = self.ensemble
        for i in self._write_sets[entry_id % len(ensemble)]:
            if ensemble[i] == bookie:
                return i
        return None

    def _check_appendable(self) -> None:
        if self.state not in (WriterState.WRITING, WriterState.CHANGING_ENSEMBLE) or self._close_requested:
            raise WriterError(f"ledger {self.ledger_id}: cannot append in state {self.state.value}"
                              + (f" ({self.failure})" if self.failure else "")
                              + (" (closing)" if self._close_requested else ""))

    def _index_table(self, bookie: str) -> list[int | None]:
        """For each e % E, the index of `bookie` in the write set of entry e in the current ensemble, or None:
        _index_of as a table (for entries of the current segment)."""
        if self._tables_of is not self.ensemble:
            self._index_tables.clear()
            self._tables_of = self.ensemble
        table = self._index_tables.get(bookie)
        if table is None:
            ensemble = self.ensemble
            table = self._index_tables[bookie] = [next((i for i in ws if ensemble[i] == bookie), None)
                                                  for ws in self._write_sets]
        return table

    def _send(self, pending: _Pending) -> list[Command]:
        pending.sent = True
        ensemble, entry_id, entry, recovery = self.ensemble, pending.entry_id, pending.entry, self.recovery
        return [SendAdd(ensemble[i], entry_id, entry, recovery) for i in self._write_sets[entry_id % len(ensemble)]]

    def _acknowledge_ready(self) -> list[Command]:
        """Pop complete entries from the head, in order; LAC follows. Paused during an ensemble change."""
        commands: list[Command] = []
        if self.state is not WriterState.WRITING:
            return commands
        pending = self._pending
        while True:
            # the head is always LAC + 1 (pending holds LAC+1 .. LAP); a lookup, not iter(): iterating a dict
            # whose front was deleted walks the dead slots (quadratic over a long stream)
            head = pending.get(self.last_add_confirmed + 1)
            if head is None or len(head.acked) < self.ack_quorum_size:
                break
            del pending[head.entry_id]
            self.last_add_confirmed, self.confirmed_length = head.entry_id, head.length
            commands.append(Acknowledge(head.entry_id))
        return commands + self._maybe_close()

    def _maybe_close(self) -> list[Command]:
        if self._close_requested and not self._pending and self.state is WriterState.WRITING:
            self.state = WriterState.CLOSING
            return [CloseLedger(self.last_add_confirmed, self.confirmed_length)]
        return []

    def _start_ensemble_change(self, writable_bookies: Sequence[str]) -> list[Command]:
        candidates = [b for b in writable_bookies if b not in self.ensemble and b not in self._failed.values()]
        ensemble = list(self.ensemble)
        replaced = []
        for i, bookie in sorted(self._failed.items()):
            if not candidates:
                return self._fail(f"no writable bookie outside the ensemble to replace {bookie}",
                                  LedgerStatus.NOT_ENOUGH_BOOKIES)
            replacement = self._rng.choice(candidates)
            candidates.remove(replacement)
            ensemble[i] = replacement
            replaced.append((i, bookie))
        self.state = WriterState.CHANGING_ENSEMBLE
        return [UpdateEnsemble(self.last_add_confirmed + 1, tuple(ensemble), tuple(replaced))]

    def abort(self, reason: str) -> list[Command]:
        """The shell gives up (metadata unreachable, broker shutting down): fail every pending add (outcome
        unknown), take no more events. The ledger stays as the metadata says (OPEN: a later recovery closes it)."""
        self.events += 1
        if self.state in (WriterState.FAILED, WriterState.CLOSED):
            return []
        return self._fail(reason, LedgerStatus.ABORTED)

    def _fail(self, reason: str, code: LedgerStatus = LedgerStatus.FENCED) -> list[Command]:
        self.state = WriterState.FAILED
        self.failure = reason
        self.failure_code = code
        failed = tuple(self._pending)
        self._pending.clear()
        return [AddsFailed(failed, reason, code)]  # also with nothing pending: the shell must learn it failed
