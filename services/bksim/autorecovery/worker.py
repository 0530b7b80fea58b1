"""The replication worker (PROTOCOL.md §6; BookKeeper's ReplicationWorker and LedgerFragmentReplicator): it
claims an under-replication mark, copies the entries the missing bookies held to replacement bookies and
replaces them in the ledger's metadata.

One claim (`run_once`), under the mark's ephemeral lock, released on every path:

1. Read the ledger's metadata (gone: the ledger was deleted, the mark is removed). Find the segments that
   name a bookie of the mark, earliest first.
2. Only closed ranges are copied: any segment of a CLOSED ledger, any segment but the last of an OPEN one.
   When the last segment of an OPEN ledger names a missing bookie, or the ledger is IN_RECOVERY, the worker
   leaves it alone for `open_ledger_rereplication_grace_ms` after the mark's ctime (its writer replaces the
   bookie itself, or closes the ledger); past that it recovers the ledger through the broker's ledger client
   (open with recovery: fence, close) and goes on with the CLOSED metadata. A closed range whose bookie
   answers (list_entries) that it holds every entry it must, and whose copies of those entries all pass the
   auditor's judgement (auditor.verify_copies: read from the bookie and the rest of each write set, digest and
   ids verified, no copy differing from the majority's bytes), is kept as it is (a bookie back after it was
   marked: BookKeeper checks a fragment before it replicates it). A bookie with one damaged or unanswered
   copy is not kept: it is replaced in that segment like a lost one (BookKeeper's worker replicates the
   fragments its LedgerChecker finds bad to a new bookie, whatever made them bad), so a damaged copy is never
   left in the metadata and never counted as a replica. A closed range in which the bookie's ensemble index is
   in no entry's write set (a segment shorter than the ensemble, an empty one) asks it nothing: it is kept
   while it is registered (writable or read-only) and replaced, in the metadata only (nothing to copy), while
   it is not (BookKeeper's LedgerChecker on a fragment that stores no entry on a bookie: good unless the
   bookie is unavailable). A registered bookie lacks nothing there, whatever it would answer (NO_LEDGER from
   one that never held the ledger): replacing it could only swap it with another marked bookie, back and forth.
3. A replacement: a writable registered bookie outside the segment's ensemble, not quarantined
   (LedgerService.choose_bookies); a bookie the mark names qualifies once it is registered again.
4. Copy: every entry of the segment whose write set holds the missing bookie's ensemble index, read from the
   other replicas of its write set (ReadEntries in batches of `read_batch_entries`; every copy's digest and ids
   are verified before it is written: the next replica after an error, a negative or a digest mismatch, so a
   damaged copy is never the source) and added verbatim to the replacement with RECOVERY_ADD and
   the ledger's master key (as recovery's write-back adds), at most `rereplication_bytes_per_s_max` bytes
   a second (a token bucket that sleeps on the Clock). Batches overlap: later batches are read while earlier
   ones are added, with at most `rereplication_entry_batch_size` entries in flight (read, held, or not yet
   acknowledged by the replacement; BookKeeper's rereplicationEntryBatchSize); the first error stops the
   others.
5. Then, and only then, a CAS of the metadata replaces the bookie in that segment (update_ledger_metadata's
   read-modify-CAS loop; the change is re-decided on every conflict and never overwrites: if the segment
   no longer starts there, no longer names the bookie, names the replacement, covers other entries, or the
   ledger went IN_RECOVERY, nothing is written and the claim starts again from the metadata now stored).
   The metadata names a replacement only once it holds every entry the replaced bookie held: a worker never
   lowers a ledger's replica count. Entries copied for a step that is then abandoned are harmless extra
   copies outside the metadata.
6. When no segment names a bookie of the mark any more but those kept in step 2, and each bookie kept is
   still registered, the mark is removed (`replicated`, a CAS on the mark read); a mark that changed meanwhile
   (another bookie went) stays for the next round. A bookie kept earlier in the claim that is no longer
   registered is decided again (BookKeeper's worker checks the ledger's fragments again before it marks it
   replicated): it may have been lost for good during the claim, and the auditor's mark naming it, already in
   the mark, changed nothing the CAS could see.

An entry of a segment that no surviving replica holds (each answered NO_ENTRY / NO_LEDGER, or is itself named
by the mark, gave no copy and is not registered: the auditor's lost bookie) makes the ledger lost: the mark is
kept with the count, a note and the bookies whose silence counted as "no copy" (`set_lost`: the lost verdict),
nothing is replaced, and this worker tries the ledger again only after `lost_ledger_retry_ms`, or at once when
the mark no longer carries the verdict. The verdict holds only while those bookies stay unregistered: once one
is registered again (it was down for now, not lost: its copies may be back) the verdict is void, and whoever
lists the mark first, any worker or the auditor, withdraws it from the mark (`withdraw_void_lost`), so the
ledger is neither reported lost nor left waiting meanwhile (the worker that found it may be busy in another
claim or backing off; another worker's claim that began before the bookie was back fails without deciding
anything). A marked bookie that is registered (writable or read-only) but does not answer is not a lost
replica: its silence is a failure, like any replica's (a message lost, a read sent before it came back). Any
other failure (a replica or the replacement unreachable, no replacement bookie, a metadata error) ends the
claim; `run` waits `worker_backoff_ms` before the next.

Pure over ports: the MetadataStore, the BookieTransport, the Clock, and the broker's LedgerService for
recovery and placement.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

from bksim.autorecovery.auditor import missing_entries, required_entries, verify_copies
from bksim.autorecovery.marks import Mark, UnderReplicationMarks
from bksim.broker.driver import cancelled_underneath
from bksim.broker.ledgers import LedgerService
from bksim.formats.entry import decode_entry, master_key
from bksim.ledger.quorum import write_set_indexes
from bksim.metadata.ledger_manager import read_ledger_metadata, update_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from bksim.model.config import AutoRecoveryConfig
from bksim.model.errors import (BadVersionError, BksimError, BookieError, BookieUnreachable, FormatError,
                                LedgerError, NoNodeError)
from bksim.model.status import EXPLICIT_NEGATIVES, FLAG_RECOVERY_ADD, LedgerStatus, StatusCode
from bksim.ports.bookie_transport import READ_BATCH_ENTRIES_MAX, BookieTransport
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore
from bksim.ports.ratelimit import TokenBucket

# what a claim ended with: the second word of run_once's answer ("ledger 7: replicated: ...")
REPLICATED = "replicated"  # no segment names a bookie of the mark; the mark is removed
REMARKED = "re-marked"  # replicated as marked, but the mark changed meanwhile: it stays for the next round
DEFERRED = "deferred"  # the last segment of an OPEN (or IN_RECOVERY) ledger, within the grace period
LOST = "lost"  # entries no surviving replica holds: the mark is kept, with the count
DELETED = "deleted"  # the ledger is gone; so is its mark
FAILED = "failed"  # an error; the worker backs off

# copy-and-replace steps within one claim: one per (segment, missing bookie), plus a re-decision per conflict
# and a recovery; a ledger needing more is taken up again in the next claim
REPAIR_STEPS_MAX = 64
LOST_IDS_SHOWN_MAX = 8  # lost entry ids named in a mark's note


class Rng(Protocol):
    def sample(self, population: Sequence, k: int) -> list: ...


class _Redecide(Exception):
    """The metadata changed under a step in a way that needs a new decision (not an error)."""


@dataclass(frozen=True, slots=True)
class _Step:
    """One bookie of one segment to restore: entries first_entry_id..last_entry_id (last < first: none)."""
    first_entry_id: int
    last_entry_id: int | None  # None: the open end of an OPEN ledger's last segment
    index: int
    bookie: str



def segment_last_entry_id(metadata: LedgerMetadata, position: int) -> int | None:
    """The last entry id of segment `position`: the next segment's first - 1, a CLOSED ledger's last_entry_id
    for its last segment, None for the last segment of a ledger that is not CLOSED (its end is open)."""
    segments = metadata.segments
    if position + 1 < len(segments):
        return segments[position + 1].first_entry_id - 1
    return metadata.last_entry_id if metadata.is_closed else None


def steps_of(metadata: LedgerMetadata, missing: Sequence[str]) -> list[_Step]:
    """Every (segment, bookie of `missing` it names), earliest segment first."""
    steps = []
    for position, segment in enumerate(metadata.segments):
        for index, bookie in enumerate(segment.ensemble):
            if bookie in missing:
                steps.append(_Step(segment.first_entry_id, segment_last_entry_id(metadata, position), index, bookie))
    return steps


class ReplicationWorker:
    def __init__(self, *, store: MetadataStore, transport: BookieTransport, ledgers: LedgerService,
                 marks: UnderReplicationMarks, clock: Clock, rng: Rng, config: AutoRecoveryConfig,
                 owner_id: str, log: Callable[[str], None] = lambda line: None) -> None:
        assert owner_id, "a worker names itself in the locks it takes"
        self._store = store
        self._transport = transport
        self._ledgers = ledgers
        self._marks = marks
        self._clock = clock
        self._rng = rng
        self.config = config
        self.owner_id = owner_id
        self._log = log
        # a batch: at most read_batch_entries ids, and no more than may be in flight at once
        self._inflight_max = config.rereplication_entry_batch_size
        self._batch = min(config.read_batch_entries, READ_BATCH_ENTRIES_MAX, self._inflight_max)
        self._bucket = TokenBucket(clock, config.rereplication_bytes_per_s_max, config.rereplication_bytes_per_s_max)
        # ledger id -> the monotonic time before which this worker leaves it (lost, or within its grace)
        self._not_before: dict[int, float] = {}
        # ledger id -> the monotonic time of this worker's last failed claim of it (tried after the others)
        self._failed_at: dict[int, float] = {}
        # ledgers whose `_not_before` is this worker's lost verdict on them: the wait ends with the verdict
        self._lost_waits: set[int] = set()
        # the marked, unregistered bookies whose silence the claim under way counted as "no copy"
        self._claim_gone: set[str] = set()
        self._stats = {name: 0 for name in ("claims", "replicated", "remarked", "deferred", "lost", "deleted",
                                            "failed", "recovered", "segments_replaced", "entries_copied",
                                            "bytes_copied", "copies_verified", "damaged_bookies_replaced",
                                            "unverified_bookies_replaced", "batches_inflight_max")}

    def statistics(self) -> dict[str, float]:
        return {**self._stats, "throttled_ms": self._bucket.slept_ms}

    # -- the loop ----------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Claim and repair marks until `stop` is set: the next claim at once after a repair, after
        `worker_backoff_ms` when a claim failed or none was claimable (marks are polled: the port has no
        watches). Every wait is a Clock sleep that `stop` cuts short."""
        while not stop.is_set():
            try:
                outcome = await self.run_once()
            except BksimError as e:  # listing or claiming marks failed (the metadata store)
                self._log(f"autorecovery worker {self.owner_id}: {e}")
                outcome = None
            if outcome is None or outcome.split(": ", 2)[1] == FAILED:
                await self._sleep_unless_stopped(self.config.worker_backoff_ms, stop)

    async def _sleep_unless_stopped(self, ms: float, stop: asyncio.Event) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep_ms(ms))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    async def run_once(self) -> str | None:
        """Claim one mark and repair its ledger; "ledger <id>: <outcome>: <detail>" (outcome: REPLICATED,
        REMARKED, DEFERRED, LOST, DELETED or FAILED), or None when replication is disabled or no mark was
        claimable. Raises the metadata store's errors from listing and claiming."""
        if await self._marks.is_disabled():
            return None
        now = self._clock.monotonic_ms()
        listed = await self._marks.list()
        marked = {m.ledger_id for m in listed}
        for table in (self._not_before, self._failed_at):  # forget ledgers whose marks are gone
            for ledger_id in [i for i in table if i not in marked]:
                del table[ledger_id]
        self._lost_waits &= marked
        listed = await self._withdraw_void_verdicts(listed)
        marks = [m for m in listed if m.missing and self._not_before.get(m.ledger_id, now) <= now]
        # a random order spreads the workers over the marks; ledgers whose claim failed here come last
        marks = self._rng.sample(marks, len(marks))
        marks.sort(key=lambda m: self._failed_at.get(m.ledger_id, float("-inf")))
        for mark in marks:
            if not await self._marks.claim(mark.ledger_id, self.owner_id):
                continue  # another worker has it
            self._stats["claims"] += 1
            self._claim_gone = set()
            try:
                outcome, detail = await self._repair(mark)
            except BksimError as e:
                outcome, detail = FAILED, str(e)
            finally:
                await self._marks.release(mark.ledger_id)
            if outcome == FAILED:
                self._failed_at[mark.ledger_id] = self._clock.monotonic_ms()
            else:
                self._failed_at.pop(mark.ledger_id, None)
            if outcome != LOST:
                self._lost_waits.discard(mark.ledger_id)
            self._stats[{REMARKED: "remarked"}.get(outcome, outcome)] += 1
            line = f"ledger {mark.ledger_id}: {outcome}: {detail}"
            self._log(f"autorecovery worker {self.owner_id}: {line}")
            return line
        return None

    async def _registered(self) -> set[str]:
        """The bookies registered now, writable or read-only (a read-only bookie still serves its copies): what
        the auditor counts as not lost."""
        return set(await self._ledgers.writable_bookies()) | set(await self._ledgers.readonly_bookies())

    async def _withdraw_void_verdicts(self, listed: list[Mark]) -> list[Mark]:
        """`listed` as it stands once every void lost verdict in it is withdrawn: a verdict (whichever worker
        found it) that counted the silence of a bookie registered now as "no copy" no longer holds, and the
        ledger is claimable again at once. A ledger this worker left because it found it lost is claimable at
        once, too, when its mark no longer carries a verdict (withdrawn by the auditor or another worker)."""
        if any(m.lost_entries and m.lost_on for m in listed):
            listed, withdrawn = await self._marks.withdraw_void_verdicts(listed, await self._registered())
            for ledger_id, back in withdrawn.items():
                self._log(f"autorecovery worker {self.owner_id}: ledger {ledger_id}: {back} registered again since "
                          f"it was found lost: the verdict is withdrawn, tried again now")
        for mark in listed:
            if mark.ledger_id in self._lost_waits and not mark.lost_entries:
                self._lost_waits.discard(mark.ledger_id)
                self._not_before.pop(mark.ledger_id, None)
        return listed

    # -- one claim ------------------------------------------------------------------------------------------
    async def _repair(self, mark: Mark) -> tuple[str, str]:
        ledger_id = mark.ledger_id
        recovered = False
        intact: set[_Step] = set()  # closed steps whose bookie was found holding every entry it must hold
        for _ in range(REPAIR_STEPS_MAX):
            try:
                metadata, _ = await read_ledger_metadata(self._store, ledger_id)
            except NoNodeError:
                return await self._deleted(mark)
            steps = [s for s in steps_of(metadata, mark.missing) if s not in intact]
            if not steps:
                # kept earlier in this claim: still so only while registered (a bookie lost for good since, whose
                # loss the auditor marked on this very mark, leaving it unchanged, would stay named and unmarked)
                kept = [s for s in steps_of(metadata, mark.missing) if s in intact]
                registered = await self._registered() if kept else set()
                gone = [s for s in kept if s.bookie not in registered]
                if gone:
                    intact.difference_update(gone)
                    for s in gone:
                        self._log(f"autorecovery worker {self.owner_id}: ledger {ledger_id}: segment at entry "
                                  f"{s.first_entry_id}: {s.bookie}, kept earlier in this claim, is no longer "
                                  f"registered: decided again")
                    continue
                if await self._marks.replicated(mark):
                    return REPLICATED, f"no segment names {list(mark.missing)}"
                return REMARKED, "its mark changed during the copy; left for the next round"
            step = steps[0]
            last_segment = metadata.last_segment.first_entry_id
            if metadata.state is LedgerState.IN_RECOVERY or (
                    metadata.state is LedgerState.OPEN and step.first_entry_id == last_segment):
                if recovered:
                    return FAILED, f"still {metadata.state.name} after its recovery"
                age_ms = self._clock.wall_ms() - mark.ctime_ms
                grace_ms = self.config.open_ledger_rereplication_grace_ms
                if age_ms <= grace_ms:
                    # looked at again after a back-off, not only when the grace ends: a writer that closes the
                    # ledger meanwhile makes it copyable at once
                    wait_ms = min(grace_ms - age_ms + 1, self.config.worker_backoff_ms)
                    self._not_before[ledger_id] = self._clock.monotonic_ms() + wait_ms
                    return DEFERRED, (f"{metadata.state.name} and naming {step.bookie} in a segment it may still "
                                      f"write: left to its writer (or recovery) for {grace_ms - age_ms} ms more")
                try:
                    await self._ledgers.recover_ledger(ledger_id, password=metadata.password)
                except LedgerError as e:
                    if e.status is LedgerStatus.NO_SUCH_LEDGER:
                        return await self._deleted(mark)
                    raise
                recovered = True
                self._stats["recovered"] += 1
                self._log(f"autorecovery worker {self.owner_id}: ledger {ledger_id}: {metadata.state.name} "
                          f"{age_ms} ms after its mark: recovered (fenced and closed) before the copy")
                continue
            if await self._holds_all(ledger_id, metadata, step, metadata.segment_for(step.first_entry_id)):
                intact.add(step)
                self._log(f"autorecovery worker {self.owner_id}: ledger {ledger_id}: segment at entry "
                          f"{step.first_entry_id}: {step.bookie} holds every entry it must: kept")
                continue
            try:
                lost = await self._restore(ledger_id, metadata, step, mark.missing)
            except NoNodeError:
                return await self._deleted(mark)
            if lost:
                return await self._lost(mark, step, lost)
        return FAILED, f"not done after {REPAIR_STEPS_MAX} steps (the metadata kept changing)"

    async def _holds_all(self, ledger_id: int, metadata: LedgerMetadata, step: _Step, segment: Segment) -> bool:
        """Whether the step's bookie answers that it holds every entry of the step's closed range its ensemble
        index must hold (a bookie back after it was marked, or a replacement placed by an earlier step) and
        every one of those copies passes verify_copies against the rest of its write set: BookKeeper's check
        of a fragment before it is replicated. No answer, a damaged or an unjudged copy: False. A range in which
        the bookie must hold no entry: whether the bookie is registered (it is not asked)."""
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        if required_entries(step.first_entry_id, step.last_entry_id, step.index, e, qw) == 0:
            return step.bookie in await self._registered()
        try:
            status, ranges = await self._transport.list_entries(step.bookie, ledger_id)
        except BookieUnreachable:
            return False
        if status is not StatusCode.OK or missing_entries(step.first_entry_id, step.last_entry_id, ranges,
                                                          step.index, e, qw) != 0:
            return False
        holders = ((entry_id, [segment.ensemble[i] for i in write_set_indexes(entry_id, e, qw)])
                   for entry_id in self._entries_of(metadata, step))
        check = await verify_copies(self._transport, ledger_id, metadata.digest_type, holders, self._batch)
        damaged, unjudged = check.damaged.get(step.bookie, []), check.unjudged.get(step.bookie, [])
        self._stats["copies_verified"] += check.verified
        if damaged or unjudged:
            self._stats["damaged_bookies_replaced" if damaged else "unverified_bookies_replaced"] += 1
            self._log(f"autorecovery worker {self.owner_id}: ledger {ledger_id}: segment at entry "
                      f"{step.first_entry_id}: {step.bookie} lists every entry it must but "
                      + (f"{len(damaged)} of its copies are damaged (entries {damaged[:LOST_IDS_SHOWN_MAX]}"
                         f"{' ...' if len(damaged) > LOST_IDS_SHOWN_MAX else ''}): "
                         if damaged else f"{len(unjudged)} of its copies could not be read: ")
                      + "not kept; it is replaced" + (f" ({check.notes[0]})" if check.notes else ""))
            return False
        return True

    async def _restore(self, ledger_id: int, metadata: LedgerMetadata, step: _Step,
                       missing: Sequence[str]) -> list[int]:
        """Copy `step`'s entries to a replacement and CAS it into the segment. Returns the entry ids no
        surviving replica holds (then nothing was replaced); [] when done or when the metadata changed
        under the step (the caller re-reads and re-decides either way)."""
        segment = metadata.segment_for(step.first_entry_id)
        # choose_bookies offers only writable registered bookies: one the mark names that came back (a restart
        # within the auditor's delay) may hold this segment's copies, and may be the only spare left
        [replacement] = await self._ledgers.choose_bookies(1, exclude=segment.ensemble)
        lost = await self._copy(ledger_id, metadata, segment, step, replacement, missing)
        if lost:
            return lost

        def change(current: LedgerMetadata) -> LedgerMetadata:
            positions = [p for p, s in enumerate(current.segments) if s.first_entry_id == step.first_entry_id]
            if (not positions or current.state is LedgerState.IN_RECOVERY
                    or current.segments[positions[0]].ensemble[step.index] != step.bookie
                    or replacement in current.segments[positions[0]].ensemble
                    or segment_last_entry_id(current, positions[0]) != step.last_entry_id):
                raise _Redecide()
            return current.with_replaced_bookie(step.first_entry_id, step.bookie, replacement)

        where = f"autorecovery worker {self.owner_id}: ledger {ledger_id}: segment at entry {step.first_entry_id}"
        try:
            await update_ledger_metadata(self._store, ledger_id, change,
                                         attempts_max=self._ledgers.config.metadata_cas_attempts_max)
        except _Redecide:
            self._log(f"{where} changed while {step.bookie}'s entries were copied to {replacement}: re-deciding "
                      f"from the metadata now stored")
            return []
        self._stats["segments_replaced"] += 1
        self._log(f"{where}: {step.bookie} (#{step.index}) replaced by {replacement}")
        return []

    # -- copying ----------------------------------------------------------------------------------------------
    async def _copy(self, ledger_id: int, metadata: LedgerMetadata, segment: Segment, step: _Step,
                    replacement: str, missing: Sequence[str]) -> list[int]:
        """Add every entry of `step` to `replacement`, batch by batch, several batches at once: each batch is read
        (and verified), then added, while the next batches are read; at most `rereplication_entry_batch_size`
        entries are in flight (read, held or being added) at any time. The ids no surviving replica holds,
        ascending. The first error stops every batch still in flight and is raised."""
        assert step.last_entry_id is not None, "only closed ranges are copied"
        key = master_key(metadata.password)
        lost: list[int] = []
        inflight: dict[asyncio.Future, int] = {}  # batch -> its entry count

        async def settle_one() -> None:
            done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            for batch in done:
                del inflight[batch]
                batch.result()  # its error, if any: the finally below stops the others

        try:
            for ids in _batches(self._entries_of(metadata, step), self._batch):
                while inflight and sum(inflight.values()) + len(ids) > self._inflight_max:
                    await settle_one()
                batch = asyncio.ensure_future(self._copy_batch(ledger_id, metadata, segment, step, ids, replacement,
                                                               key, missing, lost))
                inflight[batch] = len(ids)
                self._stats["batches_inflight_max"] = max(self._stats["batches_inflight_max"], len(inflight))
            while inflight:
                await settle_one()
        finally:
            for batch in inflight:  # an error elsewhere: stop them, and take their own errors (if any) out of them
                batch.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
        lost.sort()
        return lost

    async def _copy_batch(self, ledger_id: int, metadata: LedgerMetadata, segment: Segment, step: _Step,
                          ids: list[int], replacement: str, key: bytes, missing: Sequence[str],
                          lost: list[int]) -> None:
        found = await self._read(ledger_id, metadata, segment, step, ids, missing, lost)
        if not found:
            return
        entries = [found[entry_id] for entry_id in ids if entry_id in found]  # ids ascend: entry order
        await self._bucket.take(sum(map(len, entries)))
        await self._add(ledger_id, replacement, entries, key)

    async def _add(self, ledger_id: int, replacement: str, entries: list[bytes], key: bytes) -> None:
        try:
            statuses = await self._transport.add(replacement, [(entry, key, FLAG_RECOVERY_ADD) for entry in entries])
        except BookieUnreachable:
            self._ledgers.note_bookie_failure(replacement)
            raise
        refused = [s for s in statuses if s is not StatusCode.OK]
        if refused or len(statuses) != len(entries):
            raise BookieError(refused[0] if refused else StatusCode.BAD_REQUEST,
                              f"replacement {replacement} refused {len(refused)} of {len(entries)} entries of "
                              f"ledger {ledger_id}")
        self._stats["entries_copied"] += len(entries)
        self._stats["bytes_copied"] += sum(len(entry) for entry in entries)

    @staticmethod
    def _entries_of(metadata: LedgerMetadata, step: _Step) -> Iterator[int]:
        """The entries of the step's segment whose write set holds its ensemble index: entry e's write set is
        e, e+1, .. e+Qw-1 (mod E), so it holds index i when (i - e) mod E < Qw."""
        e, qw, index = metadata.ensemble_size, metadata.write_quorum_size, step.index
        for entry_id in range(step.first_entry_id, step.last_entry_id + 1):
            if (index - entry_id) % e < qw:
                yield entry_id

    async def _read(self, ledger_id: int, metadata: LedgerMetadata, segment: Segment, step: _Step,
                    entry_ids: list[int], missing: Sequence[str], lost: list[int]) -> dict[int, bytes]:
        """The verified bytes of `entry_ids`, each from a replica of its write set other than the step's
        bookie: bookies the mark does not name first, one ReadEntries call per replica and round. Ids no
        replica holds go to `lost`; an id some replica could not answer for raises LedgerError(READ_FAILED). A
        bookie the mark names that does not answer holds no copy only if it is not registered (judged after the
        reads: one that registered meanwhile may have been asked before it was back); the bookies whose silence
        made an id lost are added to `_claim_gone`."""
        named = set(missing)
        e = metadata.ensemble_size
        orders: dict[int, list[str]] = {}  # entry id mod E (its write set) -> the replicas to ask, in order
        sources: dict[int, list[str]] = {}
        for entry_id in entry_ids:
            order = orders.get(entry_id % e)
            if order is None:
                # the step's own bookie last of all: a bookie back after it was marked still holds its copy
                replicas = [segment.ensemble[i] for i in write_set_indexes(entry_id, e, metadata.write_quorum_size)
                            if i != step.index] + [step.bookie]
                order = orders[entry_id % e] = ([b for b in replicas if b not in named]
                                                + [b for b in replicas if b in named])
            sources[entry_id] = order.copy()
        answers: dict[int, list[str]] = {entry_id: [] for entry_id in entry_ids}
        unsure: set[int] = set()  # ids a replica that may hold them (not named, or named but registered) did not answer
        silent: dict[int, set[str]] = {}  # id -> bookies named by the mark that answered neither yes nor no
        found: dict[int, bytes] = {}
        while sources:
            by_bookie: dict[str, list[int]] = {}
            for entry_id, left in sources.items():
                by_bookie.setdefault(left.pop(0), []).append(entry_id)
            rounds = await asyncio.gather(*[self._read_from(bookie, ledger_id, ids)
                                            for bookie, ids in by_bookie.items()])
            for bookie, results in zip(by_bookie, rounds):
                for entry_id, status, entry in results:
                    if status is StatusCode.OK:
                        try:
                            decode_entry(entry, metadata.digest_type, ledger_id=ledger_id, entry_id=entry_id)
                            found[entry_id] = entry
                            continue
                        except FormatError as e:
                            answer = f"{bookie}: {e}"
                    else:
                        answer = f"{bookie}: {status.name if status is not None else 'no answer'}"
                    answers[entry_id].append(answer)
                    if status not in EXPLICIT_NEGATIVES:
                        if bookie in named:
                            silent.setdefault(entry_id, set()).add(bookie)
                        else:
                            unsure.add(entry_id)
            sources = {e: left for e, left in sources.items() if e not in found and left}
        absent = [e for e in entry_ids if e not in found]
        if any(e in silent for e in absent if e not in unsure):
            registered = await self._registered()
            for e in absent:
                if silent.get(e, set()) & registered:
                    unsure.add(e)  # a marked bookie back (registered): its silence is not "no copy"
        unreadable = [e for e in absent if e in unsure]
        if unreadable:
            e = unreadable[0]
            raise LedgerError(LedgerStatus.READ_FAILED, f"ledger {ledger_id} entry {e} (and {len(unreadable) - 1} "
                                                        f"more) unreadable: {'; '.join(answers[e])}")
        lost.extend(absent)
        for e in absent:
            self._claim_gone |= silent.get(e, set())
        return found

    async def _read_from(self, bookie: str, ledger_id: int, ids: list[int]):
        try:
            results = await self._transport.read_entries(bookie, ledger_id, ids)
            if len(results) != len(ids):
                raise BookieUnreachable(bookie, f"answered {len(results)} results for {len(ids)} entry ids")
        except BookieUnreachable:
            self._ledgers.note_bookie_failure(bookie)
            results = [(None, b"")] * len(ids)
        except asyncio.CancelledError:
            if not cancelled_underneath():
                raise
            results = [(None, b"")] * len(ids)  # the call was cancelled underneath us: no answer
        return [(entry_id, status, entry) for entry_id, (status, entry) in zip(ids, results)]

    # -- endings ------------------------------------------------------------------------------------------------
    async def _deleted(self, mark: Mark) -> tuple[str, str]:
        if await self._marks.replicated(mark):
            return DELETED, "the ledger no longer exists; its mark is removed"
        return REMARKED, "the ledger no longer exists; its mark changed meanwhile and is left for the next round"

    async def _lost(self, mark: Mark, step: _Step, lost: list[int]) -> tuple[str, str]:
        shown = ", ".join(str(e) for e in lost[:LOST_IDS_SHOWN_MAX]) + (" ..." if len(lost) > LOST_IDS_SHOWN_MAX
                                                                         else "")
        note = (f"{len(lost)} entries of the segment at entry {step.first_entry_id} have no copy on any surviving "
                f"replica ({step.bookie} was one): {shown}"
                + (f"; unregistered and silent: {sorted(self._claim_gone)}" if self._claim_gone else ""))
        try:
            await self._marks.set_lost(mark, len(lost), note, lost_on=self._claim_gone)
        except BadVersionError:
            return REMARKED, f"{note}; its mark changed meanwhile and is left for the next round"
        self._not_before[mark.ledger_id] = self._clock.monotonic_ms() + self.config.lost_ledger_retry_ms
        self._lost_waits.add(mark.ledger_id)
        return LOST, f"{note}; tried again in {self.config.lost_ledger_retry_ms} ms"


def _batches(ids: Iterator[int], size: int) -> Iterator[list[int]]:
    batch: list[int] = []
    for entry_id in ids:
        batch.append(entry_id)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
