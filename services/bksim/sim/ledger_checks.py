"""What the simulated clients know about the ledgers, and the invariants of PROTOCOL.md §7 the ledger world
must keep (checked as things happen and, for the end state, by the scenario's final audit).

Owns the history of a ledger simulation:
- per ledger, every payload a writer appended (an entry id belongs to one payload forever: one writer per
  ledger, recovery writes back verbatim), every acknowledgement (by which writer, in which order), the
  end (last_entry_id, length) of the first CLOSED metadata seen, and, per writer, the last entry it had
  pushed when a recovery's fencing reached quorum coverage over that writer's ensemble;
- the latest ledger metadata and its version, from every metadata write (all brokers' stores are wrapped
  in CheckedStore, so every write is seen);
- per bookie incarnation and ledger, the last known LAC the bookie answered.

Invariants (each raised as InvariantViolation(name, detail)):
- NoDivergenceBetweenClientAndMetaData: once CLOSED, no writer ever acknowledged an entry id > last_entry_id
  (checked at the close, at every later acknowledgement, and at the end).
- FencedWriterMakesNoProgress: a writer never gets an acknowledgement for an entry it appended after a
  recovery's fencing reached quorum coverage over its ensemble (fences are observed where the bookie answers
  them: durable by then).
- LacMonotonic: a writer acknowledges entries one at a time in id order (its LAC never decreases, never
  jumps); a bookie's known LAC of a ledger never decreases within one incarnation, and is never above the
  highest LAC any writer of the ledger had (LacNeverInvented).
- MetadataVersionsIncrease: every write of existing ledger metadata is a CAS on the version the writer read
  (never version -1), and the version grows by exactly one; a ledger's znode is created once.
- ClosedLedgerIsImmutable: once CLOSED, the metadata keeps state, last_entry_id, length, every other field
  and its segments' first entry ids (PROTOCOL.md §6: only the bookies of a segment may be replaced, by
  autorecovery); no state goes back to OPEN.
- ReplacementHoldsItsEntries / ReplicatorOnlyReplacesBookies: a replication worker's metadata write (a
  CheckedStore with `replicator`) only replaces bookies in closed ranges of segments, and a replacement has
  already acknowledged an add of every entry of the segment its ensemble index must hold: a worker never
  lowers a replica count.
- NoOutOfOrderEntries: an entry a reader gets at id i carries the payload appended at id i.
- NoDirtyReads: a reader never gets an entry (or a LAC) above what was confirmed: the highest entry a
  writer had acknowledged, or the last_entry_id of the CLOSED ledger.
- AllCommittedEntriesReachAckQuorum, at the moment of the close: every entry up to last_entry_id is held by
  at least Qa bookies of its write set in the CLOSED metadata, where "held" means the bookie acknowledged an
  add of it (bookies acknowledge after the journal sync, so it is durable there). A close that names bookies
  which never got the entries is caught here even if a later write-back would have hidden it by the end.
The end-state invariants (AllAckedEntriesAreReadable, AllCommittedEntriesReachAckQuorum, NoLogDivergence)
use `final_*` helpers here and the engines' answers gathered by the scenario.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bksim.formats.entry import parse_ids
from bksim.ledger.quorum import covered, write_set_indexes
from bksim.metadata import ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.paths import ledger_id_from_path
from bksim.model.errors import BadVersionError, MetadataFormatError
from bksim.model.status import StatusCode as S
from bksim.ports.metadata import ANY_VERSION, MetadataStore
from bksim.sim.bookie_checks import InvariantViolation

DECISIVE_FENCE = (S.OK, S.NO_ENTRY, S.NO_LEDGER)  # a fence answer that counts for coverage (durable fence)


@dataclass(slots=True)
class WriterRecord:
    """One writer (a LedgerHandle of one broker incarnation) of one ledger."""
    writer_no: int
    ledger_id: int
    broker: str
    last_acked: int = -1
    lap_at_fence_coverage: int | None = None
    ensemble: Callable[[], Sequence[str]] = lambda: ()  # the writer's current ensemble
    lap: Callable[[], int] = lambda: -1  # the writer's last add pushed now
    lac: Callable[[], int] = lambda: -1  # the writer's LAC now
    live: Callable[[], bool] = lambda: False


@dataclass(slots=True)
class LedgerRecord:
    ledger_id: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    password: bytes
    appended: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload
    acked: dict[int, int] = field(default_factory=dict)  # entry id -> writer number that acknowledged it
    writers: list[WriterRecord] = field(default_factory=list)
    closed: tuple[int, int] | None = None  # (last_entry_id, length) of the first CLOSED metadata
    fenced_on: set[str] = field(default_factory=set)  # bookies that acknowledged a fence of the ledger
    held: dict[int, set[str]] = field(default_factory=dict)  # entry id -> bookies that acknowledged an add of it

    @property
    def highest_acked(self) -> int:
        return max(self.acked, default=-1)


class LedgerChecks:
    def __init__(self, log: Callable[[str], None], on_violation: Callable[[InvariantViolation], None]) -> None:
        self._log = log
        self._on_violation = on_violation
        self.violation: InvariantViolation | None = None  # the first one
        self.ledgers: dict[int, LedgerRecord] = {}
        self.metadata: dict[int, tuple[LedgerMetadata, int]] = {}  # latest (metadata, version) per ledger
        self._bookie_lac: dict[tuple[str, int, int], int] = {}  # (bookie, incarnation, ledger) -> known LAC
        self._writers = 0
        self.stats = {"acked": 0, "appended": 0, "metadata_writes": 0, "entries_read": 0, "fence_coverages": 0,
                      "cas_conflicts": 0, "replacements": 0}

    def violate(self, invariant: str, detail: str) -> None:
        """Record (the first) and raise. Code that runs inside the system under test (the store wrapper, the
        bookies' answers) swallows the exception: the scenario stops at its next check."""
        violation = InvariantViolation(invariant, detail)
        if self.violation is None:
            self.violation = violation
            self._on_violation(violation)
        raise violation

    # -- writers -------------------------------------------------------------------------------------------
    def new_ledger(self, metadata: LedgerMetadata, ledger_id: int, password: bytes) -> LedgerRecord:
        record = LedgerRecord(ledger_id, metadata.ensemble_size, metadata.write_quorum_size,
                              metadata.ack_quorum_size, password)
        self.ledgers[ledger_id] = record
        return record

    def new_writer(self, ledger_id: int, broker: str, **views) -> WriterRecord:
        self._writers += 1
        writer = WriterRecord(self._writers, ledger_id, broker, **views)
        self.ledgers[ledger_id].writers.append(writer)
        return writer

    def appended(self, writer: WriterRecord, entry_id: int, payload: bytes) -> None:
        record = self.ledgers[writer.ledger_id]
        if entry_id in record.appended:
            self.violate("NoOutOfOrderEntries", f"ledger {writer.ledger_id}: writer #{writer.writer_no} appended "
                         f"entry {entry_id} a second time")
        record.appended[entry_id] = payload
        self.stats["appended"] += 1

    def acknowledged(self, writer: WriterRecord, entry_id: int) -> None:
        lid = writer.ledger_id
        record = self.ledgers[lid]
        self.stats["acked"] += 1
        if entry_id != writer.last_acked + 1:
            self.violate("LacMonotonic", f"ledger {lid}: writer #{writer.writer_no} ({writer.broker}) acknowledged "
                         f"entry {entry_id} after {writer.last_acked} (acknowledgements must be in id order, one "
                         f"at a time)")
        writer.last_acked = entry_id
        record.acked[entry_id] = writer.writer_no
        if record.closed is not None and entry_id > record.closed[0]:
            self.violate("NoDivergenceBetweenClientAndMetaData", f"ledger {lid}: writer #{writer.writer_no} "
                         f"({writer.broker}) acknowledged entry {entry_id}, but the ledger was CLOSED at "
                         f"last_entry_id {record.closed[0]}")
        if writer.lap_at_fence_coverage is not None and entry_id > writer.lap_at_fence_coverage:
            self.violate("FencedWriterMakesNoProgress", f"ledger {lid}: writer #{writer.writer_no} "
                         f"({writer.broker}) acknowledged entry {entry_id}, appended after fencing reached quorum "
                         f"coverage (its last pushed entry then was {writer.lap_at_fence_coverage})")

    def _confirmed(self, ledger_id: int) -> int:
        """The highest entry id a reader may see now: acknowledged by a writer, or inside the CLOSED end."""
        record = self.ledgers[ledger_id]
        bound = record.highest_acked
        for writer in record.writers:
            bound = max(bound, writer.lac())
        if record.closed is not None:
            bound = max(bound, record.closed[0])
        return bound

    # -- readers --------------------------------------------------------------------------------------------
    def lac_read(self, ledger_id: int, lac: int, who: str) -> None:
        bound = self._confirmed(ledger_id)
        if lac > bound:
            self.violate("NoDirtyReads", f"{who}: ledger {ledger_id} LAC read as {lac}, but nothing above {bound} "
                         f"was confirmed")

    def entry_read(self, ledger_id: int, entry_id: int, payload: bytes, who: str) -> None:
        record = self.ledgers[ledger_id]
        self.stats["entries_read"] += 1
        expected = record.appended.get(entry_id)
        if expected is None or payload != expected:
            self.violate("NoOutOfOrderEntries", f"{who}: ledger {ledger_id} entry {entry_id} read back "
                         f"{len(payload)} bytes that are not the payload appended at that id" +
                         (" (nothing was appended there)" if expected is None else f" ({len(expected)} bytes)"))
        bound = self._confirmed(ledger_id)
        if entry_id > bound:
            self.violate("NoDirtyReads", f"{who}: ledger {ledger_id} entry {entry_id} was returned to a reader, "
                         f"but nothing above {bound} was confirmed")

    # -- metadata -------------------------------------------------------------------------------------------
    def metadata_created(self, ledger_id: int, data: bytes, who: str) -> None:
        if ledger_id in self.metadata:
            self.violate("MetadataVersionsIncrease", f"{who}: created ledger {ledger_id}'s znode a second time")
        metadata = self._decode(ledger_id, data, who)
        self.metadata[ledger_id] = (metadata, 0)
        self.stats["metadata_writes"] += 1

    def metadata_set(self, ledger_id: int, data: bytes, expected_version: int, new_version: int, who: str,
                     replicator: bool = False) -> None:
        self.stats["metadata_writes"] += 1
        if expected_version == ANY_VERSION:
            self.violate("MetadataVersionsIncrease", f"{who}: wrote ledger {ledger_id}'s metadata without a "
                         f"compare-and-set (version -1)")
        old, old_version = self.metadata[ledger_id]
        if new_version != old_version + 1 or expected_version != old_version:
            self.violate("MetadataVersionsIncrease", f"{who}: ledger {ledger_id} metadata went from version "
                         f"{old_version} to {new_version} (CAS on {expected_version})")
        new = self._decode(ledger_id, data, who)
        self.metadata[ledger_id] = (new, new_version)
        if old.state is not LedgerState.OPEN and new.state is LedgerState.OPEN:
            self.violate("ClosedLedgerIsImmutable", f"{who}: ledger {ledger_id} went from {old.state.name} back "
                         f"to OPEN")
        if old.state is LedgerState.CLOSED and not _same_but_bookies(old, new):
            self.violate("ClosedLedgerIsImmutable", f"{who}: CLOSED ledger {ledger_id} (last_entry_id "
                         f"{old.last_entry_id}, length {old.length}, segments at "
                         f"{[s.first_entry_id for s in old.segments]}) rewritten as {new.state.name} last_entry_id "
                         f"{new.last_entry_id} length {new.length} segments at "
                         f"{[s.first_entry_id for s in new.segments]} (only a segment's bookies may change)")
        if replicator:
            self._replaced(ledger_id, old, new, who)
        if new.state is LedgerState.CLOSED and old.state is not LedgerState.CLOSED:
            self._closed(ledger_id, new, who)

    def _replaced(self, ledger_id: int, old: LedgerMetadata, new: LedgerMetadata, who: str) -> None:
        """A replication worker's write: it only replaces bookies in closed ranges of segments, and each
        replacement already acknowledged every entry of the segment its ensemble index must hold."""
        if not _same_but_bookies(old, new):
            self.violate("ReplicatorOnlyReplacesBookies", f"{who}: ledger {ledger_id} rewritten beyond its "
                         f"segments' bookies ({old.state.name} -> {new.state.name}, last_entry_id "
                         f"{old.last_entry_id} -> {new.last_entry_id})")
        record = self.ledgers.get(ledger_id)
        held = record.held if record is not None else {}
        for position, (before, after) in enumerate(zip(old.segments, new.segments)):
            for index, (was, now) in enumerate(zip(before.ensemble, after.ensemble)):
                if was == now:
                    continue
                self.stats["replacements"] += 1
                last = _segment_last(new, position)
                if last is None:
                    self.violate("ReplicatorOnlyReplacesBookies", f"{who}: ledger {ledger_id}: replaced {was} by "
                                 f"{now} in the open last segment (at entry {before.first_entry_id})")
                for entry_id in range(before.first_entry_id, last + 1):
                    if index in write_set_indexes(entry_id, new.ensemble_size, new.write_quorum_size) and \
                            now not in held.get(entry_id, ()):
                        self.violate("ReplacementHoldsItsEntries", f"{who}: ledger {ledger_id}: {was} replaced by "
                                     f"{now} in the segment at entry {before.first_entry_id}, but {now} never "
                                     f"acknowledged entry {entry_id} it must hold (the write drops a replica)")

    def _closed(self, ledger_id: int, metadata: LedgerMetadata, who: str) -> None:
        record = self.ledgers.get(ledger_id)
        if record is None:
            return
        record.closed = (metadata.last_entry_id, metadata.length)
        self._log(f"ledger {ledger_id} CLOSED by {who} at last_entry_id {metadata.last_entry_id} length "
                  f"{metadata.length} (highest acknowledged {record.highest_acked})")
        if record.highest_acked > metadata.last_entry_id:
            self.violate("NoDivergenceBetweenClientAndMetaData", f"{who}: ledger {ledger_id} CLOSED at "
                         f"last_entry_id {metadata.last_entry_id}, but entry {record.highest_acked} was "
                         f"acknowledged (by writer #{record.acked[record.highest_acked]})")
        for entry_id in range(metadata.last_entry_id + 1):
            write_set = metadata.write_set(entry_id)
            holders = [b for b in write_set if b in record.held.get(entry_id, ())]
            if len(holders) < metadata.ack_quorum_size:
                self.violate("AllCommittedEntriesReachAckQuorum", f"{who}: ledger {ledger_id} CLOSED at "
                             f"last_entry_id {metadata.last_entry_id}, but entry {entry_id} is held by {holders} of "
                             f"its write set {write_set} in the closed metadata, fewer than "
                             f"Qa={metadata.ack_quorum_size} (bookies that acknowledged it: "
                             f"{sorted(record.held.get(entry_id, ()))})")

    def _decode(self, ledger_id: int, data: bytes, who: str) -> LedgerMetadata:
        try:
            return ledger_metadata.decode(data, source=f"ledger {ledger_id}")
        except MetadataFormatError as e:
            self.violate("MetadataVersionsIncrease", f"{who}: wrote unreadable metadata for ledger {ledger_id}: {e}")
            raise

    # -- the bookies' side (sim.network observer) -------------------------------------------------------------
    def bookie_answered(self, bookie: str, incarnation: int, kind: str, request: tuple, result) -> None:
        """sim.network observer: an answer as the bookie computed it. Never raises (violations are recorded)."""
        try:
            self._bookie_answered(bookie, incarnation, kind, request, result)
        except InvariantViolation:
            pass

    def _bookie_answered(self, bookie: str, incarnation: int, kind: str, request: tuple, result) -> None:
        if kind == "add":
            return self._adds_answered(bookie, request, result)
        if kind == "read_lac":
            ledger_id, = request
            status, lac = result[0], result[1]
        elif kind == "read_entry":
            ledger_id, _entry_id, fence = request
            status, lac = result[0], result[2]
            if fence and status in DECISIVE_FENCE:
                self._fence_acknowledged(ledger_id, bookie)
        else:
            return
        if status not in (S.OK, S.NO_ENTRY) or ledger_id not in self.ledgers:
            return
        key = (bookie, incarnation, ledger_id)
        seen = self._bookie_lac.get(key, -1)
        if lac < seen:
            self.violate("LacMonotonic", f"{bookie}#{incarnation}: known LAC of ledger {ledger_id} went from {seen} "
                         f"to {lac}")
        self._bookie_lac[key] = lac
        record = self.ledgers[ledger_id]
        highest = max([record.highest_acked] + [w.lac() for w in record.writers])
        if lac > highest:
            self.violate("LacMonotonic", f"{bookie}#{incarnation}: known LAC of ledger {ledger_id} is {lac}, above "
                         f"every writer's LAC ({highest}) (LacNeverInvented)")

    def _adds_answered(self, bookie: str, items: tuple, statuses) -> None:
        """An add the bookie acknowledged (OK) is durable there: it counts as a held copy from now on."""
        for (entry, _key, _flags), status in zip(items, statuses):
            if status is not S.OK:
                continue
            ledger_id, entry_id, _ = parse_ids(entry)
            record = self.ledgers.get(ledger_id)
            if record is not None:
                record.held.setdefault(entry_id, set()).add(bookie)

    def _fence_acknowledged(self, ledger_id: int, bookie: str) -> None:
        record = self.ledgers.get(ledger_id)
        if record is None or bookie in record.fenced_on:
            return
        record.fenced_on.add(bookie)
        for writer in record.writers:
            if writer.lap_at_fence_coverage is not None or not writer.live():
                continue
            ensemble = tuple(writer.ensemble())
            unknown = {i for i, b in enumerate(ensemble) if b not in record.fenced_on}
            if covered(len(ensemble), record.write_quorum_size, record.ack_quorum_size, unknown):
                writer.lap_at_fence_coverage = writer.lap()
                self.stats["fence_coverages"] += 1
                self._log(f"ledger {ledger_id}: fencing reached quorum coverage over writer #{writer.writer_no}'s "
                          f"ensemble {list(ensemble)} (its last pushed entry: {writer.lap_at_fence_coverage})")


class CheckedStore:
    """A MetadataStore (one broker's session) whose ledger-metadata writes are reported to LedgerChecks. A
    violation found there is recorded in the checks, never raised into the broker's code."""

    def __init__(self, inner: MetadataStore, checks: LedgerChecks, who: str, *, replicator: bool = False) -> None:
        self._inner, self._checks, self.who = inner, checks, who
        self.replicator = replicator  # a replication worker's store: its writes only replace bookies

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        created = await self._inner.create(path, data, ephemeral=ephemeral, sequential=sequential,
                                           make_parents=make_parents)
        ledger_id = _ledger_id(created)
        if ledger_id is not None:
            try:
                self._checks.metadata_created(ledger_id, data, self.who)
            except (InvariantViolation, MetadataFormatError):
                pass  # recorded
        return created

    async def get(self, path: str) -> tuple[bytes, int]:
        return await self._inner.get(path)

    async def set(self, path: str, data: bytes, version: int) -> int:
        try:
            new_version = await self._inner.set(path, data, version)
        except BadVersionError:
            self._checks.stats["cas_conflicts"] += 1
            raise
        ledger_id = _ledger_id(path)
        if ledger_id is not None:
            try:
                self._checks.metadata_set(ledger_id, data, version, new_version, self.who, self.replicator)
            except (InvariantViolation, MetadataFormatError):
                pass  # recorded
        return new_version

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        await self._inner.delete(path, version)

    async def children(self, path: str) -> list[str]:
        return await self._inner.children(path)

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        return await self._inner.children_with_cversion(path)

    async def exists(self, path: str) -> int | None:
        return await self._inner.exists(path)

    async def sync(self, path: str) -> None:
        await self._inner.sync(path)


def _segment_last(metadata: LedgerMetadata, position: int) -> int | None:
    """The last entry id of segment `position`; None for the open end of a ledger that is not CLOSED."""
    if position + 1 < len(metadata.segments):
        return metadata.segments[position + 1].first_entry_id - 1
    return metadata.last_entry_id if metadata.state is LedgerState.CLOSED else None


def _same_but_bookies(old: LedgerMetadata, new: LedgerMetadata) -> bool:
    """`new` is `old` with at most some bookies of its segments replaced (PROTOCOL.md §6: state, last_entry_id,
    length, every other field and the segments' first entry ids and sizes stay)."""
    if [(s.first_entry_id, len(s.ensemble)) for s in old.segments] != \
            [(s.first_entry_id, len(s.ensemble)) for s in new.segments]:
        return False
    return dataclasses.replace(new, segments=old.segments) == old


def _ledger_id(path: str) -> int | None:
    try:
        return ledger_id_from_path(path)
    except ValueError:
        return None
