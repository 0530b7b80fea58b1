"""Ledger recovery as a sans-I/O state machine (PROTOCOL.md §4 "Recovery", steps 2-6).

The shell has already CASed the metadata OPEN -> IN_RECOVERY (step 1) and hands this machine the segments.
Commands out: ReadEntry (fencing reads and read-forward reads, every one with the FENCE flag), the write-back
writer's SendAdd (RECOVERY_ADD) / UpdateEnsemble / CloseLedger, and RecoveryFailed. Events in:
on_read_result, and the writer's events (on_add_result, on_ensemble_changed, on_ensemble_change_rejected,
on_closed) forwarded as is.

Decisions (never a guess):
- fencing is done when quorum coverage holds over the last segment's ensemble; UNAUTHORIZED aborts; every
  reply in without coverage fails recovery (retry later);
- recovered LAC = max of the LACs piggybacked inside the returned last entries; start = max(recovered LAC,
  first entry of the last segment - 1);
- read forward: entry `start` is read too (its header gives the ledger length there), then start+1, start+2,
  ... from their write sets, up to `read_window` = W entries at a time (the reads of the first W entries go
  out together; each time the lowest undecided entry is decided "exists" the window slides and the next
  entry's reads go out). Each entry is judged on its own replies, in the order they arrive: it exists on the
  first reply that verifies (digest, ledger id, entry id); it is absent after Qw - Qa + 1 explicit negatives
  (NO_ENTRY / NO_LEDGER); once every reply is in without either, it is unknown. UNKNOWN_STATE (a re-initialised
  bookie's ledger in limbo), IO_ERROR and every other error are never negatives, in fencing and here alike. The first verdict of an entry
  is final (later replies for it are ignored), so an entry gets the verdict it would get with read_window=1;
- verdicts are applied strictly in entry order: the lowest undecided entry must have its verdict before any
  later one counts. The first absent entry k ends the read phase at k-1, even if copies of entries above k
  were found (they were never acknowledged: acks are given in order); the first unknown entry (with every
  entry below it found) fails recovery (no truncation on unknowns). No read goes out beyond an entry already
  known to be absent or unknown, and replies for entries outside the window, duplicates and late replies
  are ignored;
- found entries are written back in order with RECOVERY_ADD through a LedgerWriter once the end is known,
  then the ledger closes at the last one (the shell CASes IN_RECOVERY -> CLOSED; a concurrent recovery that
  closed first is fine).

Bounds: recovery waits on the reads of at most `read_window` undecided entries (<= read_window * Qw
ReadEntry commands); reads of an entry already decided may still be in flight in the shell (recovery ignores
their replies; the shell's per-call deadline ends them). Memory: the window's replies plus the found entries,
which the write-back needs anyway. read_window=1 is the one-entry-at-a-time read-forward of the protocol
text, command for command.

Invariants (check_invariants() raises InvariantError naming the one broken; true after every event):
- PhaseOrder: FENCING -> READING -> WRITING_BACK -> DONE, each phase entered once, FAILED from any phase;
  DONE and FAILED are final. FAILED <=> a failure reason; a FAILED recovery waits on no read.
- SegmentsInOrder: the segments' first entry ids strictly increase; E >= Qw >= Qa >= 1 over the last one.
- FencingFirst: while FENCING nothing is read forward, found or written back (start -1, no writer).
- StartRule: once fencing is done, start >= the recovered LAC (and, with the start rule, start =
  max(recovered LAC, first entry of the last segment - 1)): the recovered end is never below the read LAC.
- WindowBounded: while READING, the reads out are exactly next_to_decide .. next_to_read - 1, at least one and
  at most read_window of them, next_to_decide >= max(start, 0); the lowest undecided entry has no verdict yet
  (verdicts are applied in entry order as they come), and reads are blocked exactly when an entry of the
  window is known absent or unknown.
- FoundInOrder: the found entries are start+1 .. next_to_decide-1, with ledger lengths in order from the
  length at `start`.
- WriteBackMatchesFound: from WRITING_BACK on, the write-back writer pushed exactly start + len(found) (so the
  ledger closes at or above the recovered LAC), nothing is read any more, and its own invariants hold; DONE:
  it is CLOSED.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

from bksim.formats.entry import decode_entry
from bksim.ledger.quorum import check_quorum_sizes, covered, negatives_needed_for_absence, write_set_indexes
from bksim.ledger.writer import AddsFailed, Command, LedgerWriter, Rng, WriterState
from bksim.model.digest import DIGEST_CRC32C
from bksim.model.errors import BksimError, FormatError
from bksim.model.invariants import InvariantError
from bksim.model.status import EXPLICIT_NEGATIVES as NEGATIVE
from bksim.model.status import StatusCode


class RecoveryPhase(enum.Enum):
    FENCING = "fencing"
    READING = "reading"
    WRITING_BACK = "writing-back"
    DONE = "done"
    FAILED = "failed"


_ORDER = {RecoveryPhase.FENCING: 0, RecoveryPhase.READING: 1, RecoveryPhase.WRITING_BACK: 2, RecoveryPhase.DONE: 3,
          RecoveryPhase.FAILED: 4}
_FINAL = (RecoveryPhase.DONE, RecoveryPhase.FAILED)


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """Read `entry_id` (-1 = the bookie's last entry) from `bookie`, with the FENCE flag when `fence`.
    Recovery reads always fence: a bookie unreachable during the fencing phase must not accept the old
    writer's adds after it has told recovery it lacks an entry. Readers (ledger/reader.py) never fence.
    Report with on_read_result (recovery) or EntryRead.on_reply (readers)."""
    bookie: str
    entry_id: int
    fence: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """Recovery cannot decide safely (or is not allowed); the ledger stays IN_RECOVERY for a later retry."""
    reason: str


class _Verdict(enum.Enum):
    EXISTS = "exists"
    ABSENT = "absent"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class _Read:
    """Replies so far for one entry of the read window, and its verdict once it has one."""
    entry_id: int
    bookies: tuple[str, ...]
    replied: set[str] = field(default_factory=set)
    negatives: int = 0
    verdict: _Verdict | None = None
    found: tuple[bytes, int] | None = None  # (entry bytes as read, ledger length) when EXISTS


class LedgerRecovery:
    def __init__(self, ledger_id: int, *, segments: Sequence[tuple[int, Sequence[str]]], write_quorum_size: int,
                 ack_quorum_size: int, rng: Rng, digest_type: str = DIGEST_CRC32C, fence_reads: bool = True,
                 start_rule: bool = True, read_window: int = 64) -> None:
        """`segments`: [(first_entry_id, ensemble)] in order, from the IN_RECOVERY metadata.
        `read_window`: entries of the read-forward read in parallel (>= 1; the broker's read_window_max).

        `fence_reads=False` and `start_rule=False` switch off the two rules the TLA+ specification of the
        protocol found necessary; they exist only so that regression tests can show each rule matters."""
        assert segments, "a ledger has at least one segment"
        if read_window < 1:
            raise BksimError(f"ledger {ledger_id}: recovery read_window must be >= 1, got {read_window}")
        self.read_window = read_window
        self.ledger_id = ledger_id
        self.segments = [(first, tuple(ensemble)) for first, ensemble in segments]
        self.write_quorum_size = write_quorum_size
        self.ack_quorum_size = ack_quorum_size
        check_quorum_sizes(len(self.segments[-1][1]), write_quorum_size, ack_quorum_size)
        self._rng = rng
        self._digest_type = digest_type
        self._fence_reads = fence_reads
        self._start_rule = start_rule
        self.phase = RecoveryPhase.FENCING
        self.failure: str | None = None
        self.recovered_lac = -1
        self.start = -1
        self.found: list[tuple[bytes, int]] = []  # (entry bytes as read, ledger length) of start+1, ...
        self._start_length = 0  # ledger length at entry `start` (0 when start is -1)
        self._fence_replies: dict[str, bool] = {}  # bookie -> answered with a decisive reply (OK/negative)
        self.next_to_decide = -1  # read forward: the lowest entry without an applied verdict
        self._next_to_read = -1  # read forward: the next entry whose reads go out
        self._reads: dict[int, _Read] = {}  # entry id -> replies, for next_to_decide .. _next_to_read - 1
        self._blocked = False  # some entry of the window is absent or unknown: no read beyond it is useful
        self.writer: LedgerWriter | None = None
        self._phase_seen = self.phase  # at the last check_invariants()
        self.events = 0  # events taken so far (the write-back writer counts its own): a checker re-checks after one

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks an invariant of the module docstring. Costs O(read_window),
        plus the write-back writer's own check."""
        phase, seen = self.phase, self._phase_seen
        if phase is not seen and (seen in _FINAL or (phase is not RecoveryPhase.FAILED
                                                     and _ORDER[phase] < _ORDER[seen])):
            self._broken("PhaseOrder", f"{seen.value} -> {phase.value}")
        self._phase_seen = phase
        if (phase is RecoveryPhase.FAILED) != (self.failure is not None) or \
                (phase is RecoveryPhase.FAILED and self._reads):
            self._broken("PhaseOrder", f"{phase.value} with failure {self.failure!r} and reads of entries "
                                       f"{sorted(self._reads)} out")
        firsts = [first for first, _ in self.segments]
        if any(a >= b for a, b in zip(firsts, firsts[1:])) or firsts[0] < 0 or \
                not len(self.segments[-1][1]) >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            self._broken("SegmentsInOrder", f"segments start at {firsts}, E={len(self.segments[-1][1])} "
                                            f"Qw={self.write_quorum_size} Qa={self.ack_quorum_size}")
        if phase is RecoveryPhase.FENCING:
            if self.start != -1 or self.writer is not None or self._reads or self.found or self.next_to_decide != -1:
                self._broken("FencingFirst", f"start {self.start}, next to decide {self.next_to_decide}, reads "
                                             f"{sorted(self._reads)}, {len(self.found)} found, writer "
                                             f"{self.writer is not None}")
            return
        if phase is RecoveryPhase.FAILED and self.next_to_decide == -1:
            return  # failed while fencing
        start = self.start
        expected = max(self.recovered_lac, self.segments[-1][0] - 1) if self._start_rule else self.recovered_lac
        if start != expected or start < self.recovered_lac:
            self._broken("StartRule", f"start {start}, recovered LAC {self.recovered_lac}, last segment starts "
                                      f"at {self.segments[-1][0]}")
        if phase is RecoveryPhase.READING:
            lo, hi = self.next_to_decide, self._next_to_read
            if not max(start, 0) <= lo < hi <= lo + self.read_window or len(self._reads) != hi - lo \
                    or any(e not in self._reads for e in range(lo, hi)):
                self._broken("WindowBounded", f"next to decide {lo}, next to read {hi}, window "
                                              f"{self.read_window}, start {start}, reads out {sorted(self._reads)}")
            if self._reads[lo].verdict is not None:
                self._broken("WindowBounded", f"entry {lo} has the verdict {self._reads[lo].verdict.value} but "
                                              f"was not applied")
            blocked = any(r.verdict not in (None, _Verdict.EXISTS) for r in self._reads.values())
            if blocked != self._blocked:
                self._broken("WindowBounded", f"reads blocked: {self._blocked}, an entry known absent or unknown "
                                              f"in the window: {blocked}")
            if len(self.found) != max(0, lo - start - 1):
                self._broken("FoundInOrder", f"{len(self.found)} entries found, start {start}, next to decide {lo}")
        length = self._start_length
        for i, (_, ledger_length) in enumerate(self.found):
            if ledger_length < length:
                self._broken("FoundInOrder", f"found entry {start + 1 + i} has ledger length {ledger_length}, below "
                                             f"{length} before it")
            length = ledger_length
        if phase in (RecoveryPhase.WRITING_BACK, RecoveryPhase.DONE):
            writer = self.writer
            if writer is None or not writer.recovery or writer.last_add_pushed != start + len(self.found) \
                    or self._reads:
                self._broken("WriteBackMatchesFound", f"writer {writer and writer.state.value} pushed "
                                                      f"{writer and writer.last_add_pushed}, start {start}, "
                                                      f"{len(self.found)} found, reads {sorted(self._reads)}")
            if phase is RecoveryPhase.DONE and writer.state is not WriterState.CLOSED:
                self._broken("WriteBackMatchesFound", f"DONE with the write-back writer {writer.state.value}")
        if self.writer is not None:
            self.writer.check_invariants()

    def _broken(self, invariant: str, detail: str):
        raise InvariantError(f"ledger {self.ledger_id} recovery ({self.phase.value})", invariant, detail)

    # -- events ------------------------------------------------------------------------------------------
    def start_recovery(self) -> list[Command | ReadEntry | RecoveryFailed]:
        """Step 2: fence every bookie of the last segment."""
        self.events += 1
        return [ReadEntry(b, -1, fence=True) for b in self.segments[-1][1]]

    def on_read_result(self, bookie: str, entry_id: int, status: StatusCode | None,
                       entry: bytes = b"") -> list[Command | ReadEntry | RecoveryFailed]:
        """A bookie answered a ReadEntry (status None = timeout)."""
        self.events += 1
        if self.phase is RecoveryPhase.FENCING and entry_id == -1:
            return self._on_fence_reply(bookie, status, entry)
        if self.phase is RecoveryPhase.READING and entry_id in self._reads:
            return self._on_forward_reply(self._reads[entry_id], bookie, status, entry)
        return []  # late or duplicate replies change nothing

    # -- fencing (steps 2, 3) ------------------------------------------------------------------------------
    def _on_fence_reply(self, bookie: str, status: StatusCode | None, entry: bytes):
        ensemble = self.segments[-1][1]
        if bookie not in ensemble or bookie in self._fence_replies:
            return []
        if status is StatusCode.UNAUTHORIZED:
            return self._fail(f"bookie {bookie} answered UNAUTHORIZED to the fencing read: wrong password")
        decisive = False
        if status is StatusCode.OK:
            last = self._verify(entry, None)
            if last is not None:
                self.recovered_lac = max(self.recovered_lac, last.last_add_confirmed)
                decisive = True
        elif status in NEGATIVE:
            decisive = True
        self._fence_replies[bookie] = decisive
        unknown = {i for i, b in enumerate(ensemble) if not self._fence_replies.get(b, False)}
        if covered(len(ensemble), self.write_quorum_size, self.ack_quorum_size, unknown):
            return self._start_reading()
        if len(self._fence_replies) == len(ensemble):
            return self._fail(f"fencing did not reach quorum coverage: no usable reply from "
                              f"{sorted(ensemble[i] for i in unknown)}")
        return []

    def _start_reading(self):
        self.phase = RecoveryPhase.READING
        # start rule: never below the last segment (its first entry - 1 was confirmed by the ensemble change);
        # read-forward reads use the last segment's ensemble, which holds nothing below its first entry
        self.start = max(self.recovered_lac, self.segments[-1][0] - 1) if self._start_rule else self.recovered_lac
        self.next_to_decide = self._next_to_read = max(self.start, 0)
        return self._fill_window()

    # -- read forward (step 4) -----------------------------------------------------------------------------
    def _segment_of(self, entry_id: int) -> tuple[int, tuple[str, ...]]:
        return max((s for s in self.segments if s[0] <= entry_id), key=lambda s: s[0])

    def _fill_window(self) -> list[ReadEntry]:
        commands: list[ReadEntry] = []
        while not self._blocked and self._next_to_read < self.next_to_decide + self.read_window:
            commands += self._read_entry(self._next_to_read)
            self._next_to_read += 1
        return commands

    def _read_entry(self, entry_id: int) -> list[ReadEntry]:
        """Ask the write set of `entry_id` for the entry: entry `start` in the segment that holds it (for the
        ledger length there), every later entry in the last segment (upstream does the same)."""
        _, ensemble = self._segment_of(entry_id) if entry_id <= self.start else self.segments[-1]
        bookies = tuple(ensemble[i] for i in write_set_indexes(entry_id, len(ensemble), self.write_quorum_size))
        self._reads[entry_id] = _Read(entry_id, bookies)
        return [ReadEntry(b, entry_id, self._fence_reads) for b in bookies]

    def _on_forward_reply(self, read: _Read, bookie: str, status: StatusCode | None, entry: bytes):
        if read.verdict is not None or bookie not in read.bookies or bookie in read.replied:
            return []  # the first verdict of an entry is final; duplicates change nothing
        read.replied.add(bookie)
        if status is StatusCode.OK:
            decoded = self._verify(entry, read.entry_id)
            if decoded is not None:  # exists: the first reply that verifies decides
                read.verdict = _Verdict.EXISTS
                read.found = (bytes(entry), decoded.ledger_length)
        elif status in NEGATIVE:
            read.negatives += 1
            if read.negatives >= negatives_needed_for_absence(self.write_quorum_size, self.ack_quorum_size):
                read.verdict = _Verdict.ABSENT
        if read.verdict is None and len(read.replied) == len(read.bookies):
            read.verdict = _Verdict.UNKNOWN
        if read.verdict is None:
            return []
        if read.verdict is not _Verdict.EXISTS:
            self._blocked = True  # the read phase ends (or fails) here at the latest
        return self._apply_verdicts() if read.entry_id == self.next_to_decide else []

    def _apply_verdicts(self):
        """Apply verdicts in entry order from next_to_decide while they are in; slide the window."""
        commands: list = []
        while True:
            if self.next_to_decide == self._next_to_read:  # read_window=1: the next entry is not asked yet
                commands += self._fill_window()
            read = self._reads[self.next_to_decide]
            if read.verdict is None:
                return commands + self._fill_window()
            if read.verdict is _Verdict.ABSENT:
                if read.entry_id <= self.start:
                    return self._fail(f"entry {read.entry_id} is at or below the recovered LAC {self.start} "
                                      f"but {read.negatives} bookies say they never had it")
                return self._start_write_back(read.entry_id - 1)
            if read.verdict is _Verdict.UNKNOWN:
                needed = negatives_needed_for_absence(self.write_quorum_size, self.ack_quorum_size)
                return self._fail(f"entry {read.entry_id}: no verified copy and only {read.negatives} explicit "
                                  f"negatives (need {needed}): cannot tell whether it was acknowledged")
            del self._reads[self.next_to_decide]
            if read.entry_id == self.start:
                self._start_length = read.found[1]
            else:
                self.found.append(read.found)
            self.next_to_decide += 1

    def _verify(self, entry: bytes, entry_id: int | None):
        try:
            return decode_entry(entry, self._digest_type, ledger_id=self.ledger_id, entry_id=entry_id)
        except FormatError:
            return None  # a bad replica: not a reply that decides anything

    # -- write back and close (steps 5, 6) -----------------------------------------------------------------
    def _start_write_back(self, last_entry_id: int):
        self.phase = RecoveryPhase.WRITING_BACK
        self._reads = {}  # replies for entries beyond the end (or still in flight) are ignored from now on
        first, ensemble = self.segments[-1]
        self.writer = LedgerWriter(self.ledger_id, ensemble=ensemble, segment_first_entry_id=first,
                                   write_quorum_size=self.write_quorum_size, ack_quorum_size=self.ack_quorum_size,
                                   rng=self._rng, digest_type=self._digest_type, last_add_confirmed=self.start,
                                   length=self._start_length, recovery=True)
        commands: list = []
        for entry, ledger_length in self.found:  # written back byte for byte, in order
            commands += self.writer.append_existing(entry, ledger_length)
        assert self.writer.last_add_pushed == last_entry_id
        return self._through_writer(commands + self.writer.close())

    def forward(self, commands: list) -> list:
        """Pass the result of a writer event (on_add_result, on_ensemble_changed, ...) through recovery."""
        self.events += 1
        return self._through_writer(commands)

    def on_closed(self) -> list:
        self.events += 1
        if self.writer is None:
            raise BksimError(f"ledger {self.ledger_id}: on_closed in phase {self.phase.value}")
        self.writer.on_closed()
        self.phase = RecoveryPhase.DONE
        return []

    def _through_writer(self, commands: list) -> list:
        out = []
        for c in commands:
            if isinstance(c, AddsFailed):
                out += self._fail(f"write-back failed: {c.reason}")
            else:
                out.append(c)
        return out

    def _fail(self, reason: str):
        self.phase = RecoveryPhase.FAILED
        self._reads = {}
        self.failure = reason
        return [RecoveryFailed(reason)]
