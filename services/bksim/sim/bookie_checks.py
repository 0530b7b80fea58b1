"""What the simulated clients know about one bookie, and the invariants its answers must keep.

Owns the history of a bookie simulation: per ledger, the bytes of every entry ever generated (one id,
one content, forever), which adds, fences and explicit LACs were ACKNOWLEDGED, the LACs ever sent, and
the entries whose entry-log record the simulator damaged. "Acknowledged before" uses a logical tick that
advances at every submission and every answer, so concurrent operations are judged only by what was
known when they were submitted.

Invariants (PROTOCOL.md §2.1, §7), each raised as InvariantViolation(name, detail):
- AllAckedEntriesAreReadable: an entry acknowledged before a read is read back OK with identical bytes
  (IO_ERROR is tolerated only on a ledger whose entry-log record the simulator damaged), and the last
  entry (entry -1) is never below the highest entry acknowledged before the read.
- UnknownIsNeverNo: NO_ENTRY / NO_LEDGER never for an acknowledged entry, nor NO_LEDGER for a ledger with
  anything acknowledged (entry, fence or explicit LAC).
- NoOutOfOrderEntries: an OK read of id i returns the bytes generated for id i (or, on a damaged ledger,
  bytes whose digest does not verify: a reader detects those; undetectable wrong bytes never).
- AcknowledgedFenceHolds: after a fence is acknowledged, a normal add submitted later is never OK.
- LacMonotonic: within one incarnation of the bookie, the known LAC of a ledger never decreases; across
  restarts it never falls below the durable floor (the highest LAC piggybacked on an acknowledged entry or
  written by an acknowledged explicit LAC); and it is never above every LAC ever sent (LacNeverInvented).
  One exception: on a ledger with a damaged entry-log record, an entry read's LAC may be only a lower bound
  (the bookie serves an entry even when the last entry, where the LAC comes from, is unreadable); ReadLac
  answers stay strict (IO_ERROR rather than a lower LAC), and no answer's LAC is ever invented.
- LastmarkMonotonic: the durable checkpoint mark never moves backwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bksim.formats import entry as entry_fmt
from bksim.model.errors import FormatError
from bksim.model.status import StatusCode as S


class InvariantViolation(Exception):
    """The bookie broke an invariant: a bug in the code under simulation (or in the simulator)."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant, self.detail = invariant, detail
        super().__init__(f"{invariant}: {detail}")


@dataclass(slots=True)
class LedgerHistory:
    ledger_id: int
    master_key: bytes
    entries: dict[int, bytes] = field(default_factory=dict)  # every entry ever generated
    next_entry_id: int = 0
    ledger_length: int = 0
    acked_at: dict[int, int] = field(default_factory=dict)  # entry id -> tick of its first acknowledgement
    highest_acked: int = -1  # the writer's LAC: what the next generated entry piggybacks
    lac_sent_max: int = -1  # highest LAC ever sent to the bookie (piggybacked or explicit), acked or not
    lac_floor: list[tuple[int, int]] = field(default_factory=list)  # (tick, floor) each time the floor rose
    fence_acked_at: int | None = None
    anything_acked_at: int | None = None  # tick of the first acknowledged add, fence or explicit LAC
    damaged: set[int] = field(default_factory=set)  # entries whose entry-log record the simulator flipped

    def floor_at(self, tick: int) -> int:
        """The durable LAC floor as known at `tick`."""
        floor = -1
        for at, value in self.lac_floor:
            if at >= tick:
                break
            floor = value
        return floor

    def acked_before(self, entry_id: int, tick: int) -> bool:
        at = self.acked_at.get(entry_id)
        return at is not None and at < tick

    def highest_acked_before(self, tick: int) -> int:
        return max((e for e, at in self.acked_at.items() if at < tick), default=-1)


class BookieHistory:
    """The clients' knowledge and the checks. A violation raises InvariantViolation, unless its invariant is
    in `tolerated` (known engine issues, see known_issues.py): then it is recorded in `tolerated_seen`,
    reported through `on_tolerated`, and the run goes on checking everything else."""

    def __init__(self, tolerated: frozenset[str] = frozenset(),
                 on_tolerated: Callable[[InvariantViolation], None] = lambda v: None) -> None:
        self.tick = 0
        self.ledgers: dict[int, LedgerHistory] = {}
        self.acked_entries = 0
        self.tolerated = tolerated
        self.tolerated_seen: list[InvariantViolation] = []
        self._on_tolerated = on_tolerated
        self._lac_seen: dict[int, int] = {}  # this incarnation: last known LAC answered per ledger
        self._lastmark: tuple[int, int] = (0, 0)

    def violate(self, invariant: str, detail: str) -> None:
        violation = InvariantViolation(invariant, detail)
        if invariant not in self.tolerated:
            raise violation
        self.tolerated_seen.append(violation)
        self._on_tolerated(violation)

    def next_tick(self) -> int:
        self.tick += 1
        return self.tick

    def ledger(self, ledger_id: int, master_key: bytes) -> LedgerHistory:
        history = self.ledgers.get(ledger_id)
        if history is None:
            history = self.ledgers[ledger_id] = LedgerHistory(ledger_id, master_key)
        return history

    def new_incarnation(self) -> None:
        """The bookie restarted: in-memory LAC knowledge may legitimately start lower (down to the floor)."""
        self._lac_seen = {}

    # -- the workload's writer ---------------------------------------------------------------------------
    def generate(self, ledger: LedgerHistory, payload: bytes) -> int:
        """Generate the next entry of `ledger` (piggybacking the writer's LAC); return its id."""
        entry_id = ledger.next_entry_id
        ledger.next_entry_id += 1
        ledger.ledger_length += len(payload)
        ledger.entries[entry_id] = entry_fmt.encode_entry(ledger.ledger_id, entry_id, ledger.highest_acked,
                                                          ledger.ledger_length, payload)
        return entry_id

    def sent_lac(self, ledger: LedgerHistory, lac: int) -> None:
        ledger.lac_sent_max = max(ledger.lac_sent_max, lac)

    # -- acknowledgements --------------------------------------------------------------------------------
    def add_answered(self, ledger: LedgerHistory, entry_id: int, recovery: bool, status: S, submitted: int,
                     tick: int) -> None:
        if status is not S.OK:
            return
        if not recovery and ledger.fence_acked_at is not None and ledger.fence_acked_at < submitted:
            self.violate("AcknowledgedFenceHolds", f"normal add {ledger.ledger_id}:{entry_id} submitted at tick "
                         f"{submitted} answered OK, but a fence of the ledger was acknowledged at tick "
                         f"{ledger.fence_acked_at}")
        if entry_id not in ledger.acked_at:
            ledger.acked_at[entry_id] = tick
            self.acked_entries += 1
        if entry_id > ledger.highest_acked:
            ledger.highest_acked = entry_id
        self._raise_floor(ledger, entry_fmt.parse_ids(ledger.entries[entry_id])[2], tick)

    def fence_acknowledged(self, ledger: LedgerHistory, tick: int) -> None:
        if ledger.fence_acked_at is None:
            ledger.fence_acked_at = tick
        self._anything(ledger, tick)

    def explicit_lac_acknowledged(self, ledger: LedgerHistory, lac: int, tick: int) -> None:
        self._raise_floor(ledger, lac, tick)

    def _raise_floor(self, ledger: LedgerHistory, lac: int, tick: int) -> None:
        self._anything(ledger, tick)
        if lac > ledger.floor_at(tick + 1):
            ledger.lac_floor.append((tick, lac))

    def _anything(self, ledger: LedgerHistory, tick: int) -> None:
        if ledger.anything_acked_at is None:
            ledger.anything_acked_at = tick

    # -- answers to reads --------------------------------------------------------------------------------
    def check_read(self, ledger: LedgerHistory, entry_id: int, submitted: int, status: S, data: bytes,
                   lac: int, what: str) -> None:
        """A ReadEntry answer (entry_id -1 = last entry)."""
        lid = ledger.ledger_id
        known = ledger.anything_acked_at is not None and ledger.anything_acked_at < submitted
        if entry_id >= 0:
            acked = ledger.acked_before(entry_id, submitted)
        else:
            acked = ledger.highest_acked_before(submitted) >= 0
        if status in (S.NO_ENTRY, S.NO_LEDGER) and acked:
            self.violate("UnknownIsNeverNo", f"{what}: {status.name} for {lid}:{entry_id}, acknowledged before "
                         f"the read was submitted")
        elif status is S.NO_LEDGER and known:
            self.violate("UnknownIsNeverNo", f"{what}: NO_LEDGER for ledger {lid}, which has acknowledged "
                         f"operations")
        elif status is S.IO_ERROR and acked and not ledger.damaged:
            self.violate("AllAckedEntriesAreReadable", f"{what}: IO_ERROR for acknowledged {lid}:{entry_id} "
                         f"with no damage injected in ledger {lid}")
        if status is S.OK:
            self._check_bytes(ledger, entry_id, submitted, data, what)
        if status in (S.OK, S.NO_ENTRY):
            self._check_lac(ledger, lac, submitted, what, lower_bound=status is S.OK and ledger.damaged)

    def _check_bytes(self, ledger: LedgerHistory, entry_id: int, submitted: int, data: bytes, what: str) -> None:
        lid = ledger.ledger_id
        if entry_id == -1:  # the last entry: which one it is comes from its header
            try:
                got_lid, entry_id, _ = entry_fmt.parse_ids(data)
            except FormatError as e:
                got_lid, entry_id = lid, -1
                if not ledger.damaged:
                    self.violate("NoOutOfOrderEntries", f"{what}: last entry of {lid} unparsable: {e}")
            highest = ledger.highest_acked_before(submitted)
            if not ledger.damaged and got_lid != lid:
                self.violate("NoOutOfOrderEntries", f"{what}: last entry of {lid} is from ledger {got_lid}")
            elif not ledger.damaged and entry_id < highest:
                self.violate("AllAckedEntriesAreReadable", f"{what}: last entry of {lid} is {entry_id}, but "
                             f"{highest} was acknowledged before the read")
        expected = ledger.entries.get(entry_id)
        if expected is not None and data == expected:
            return
        if ledger.damaged:
            try:
                entry_fmt.decode_entry(data, ledger_id=lid, entry_id=entry_id)
            except FormatError:
                return  # maybe: damaged bytes, served unverified: a reader's digest check rejects them
        self.violate("NoOutOfOrderEntries", f"{what}: {lid}:{entry_id} read back {len(data)} bytes that are not "
                     f"the entry generated for that id" + ("" if expected is None else f" ({len(expected)} bytes)"))

    def check_lac_answer(self, ledger: LedgerHistory, submitted: int, status: S, lac: int, last_entry_id: int,
                         what: str) -> None:
        """A ReadLac answer: (status, known LAC, last entry id stored)."""
        lid = ledger.ledger_id
        known = ledger.anything_acked_at is not None and ledger.anything_acked_at < submitted
        if status is S.NO_LEDGER and known:
            self.violate("UnknownIsNeverNo", f"{what}: NO_LEDGER for ledger {lid}, which has acknowledged "
                         f"operations")
        elif status is S.IO_ERROR and known and not ledger.damaged:
            self.violate("AllAckedEntriesAreReadable", f"{what}: IO_ERROR from ReadLac of ledger {lid} with no "
                         f"damage injected")
        elif status is S.OK:
            highest = ledger.highest_acked_before(submitted)
            if last_entry_id < highest:
                self.violate("AllAckedEntriesAreReadable", f"{what}: last entry of ledger {lid} is "
                             f"{last_entry_id}, but {highest} was acknowledged")
            self._check_lac(ledger, lac, submitted, what)

    def _check_lac(self, ledger: LedgerHistory, lac: int, submitted: int, what: str,
                   lower_bound: bool = False) -> None:
        """`lower_bound`: the answer's LAC may be below what the bookie knew (an entry served while its ledger's
        last entry is unreadable): only LacNeverInvented applies, and it does not lower what was seen."""
        lid = ledger.ledger_id
        # on a ledger with a damaged entry-log record, a wrong LAC comes from reading that record unverified
        damaged = " (the ledger has a damaged entry-log record)" if ledger.damaged else ""
        if lower_bound:
            if lac > ledger.lac_sent_max:
                self.violate("LacFromDamagedEntry", f"{what}: known LAC of ledger {lid} is {lac}, but no LAC above "
                             f"{ledger.lac_sent_max} was ever sent to the bookie{damaged}")
            return
        seen = self._lac_seen.get(lid, -1)
        self._lac_seen[lid] = lac
        if lac < seen:
            self.violate("LacFromDamagedEntry" if damaged else "LacMonotonic", f"{what}: known LAC of ledger "
                         f"{lid} went from {seen} to {lac} within one run of the bookie{damaged}")
        floor = ledger.floor_at(submitted)
        if lac < floor:
            self.violate("LacFromDamagedEntry" if damaged else "LacMonotonicAcrossRestarts", f"{what}: known "
                         f"LAC of ledger {lid} is {lac}, below {floor}, a LAC acknowledged durably before the "
                         f"read{damaged}")
        if lac > ledger.lac_sent_max:
            self.violate("LacFromDamagedEntry" if damaged else "LacNeverInvented", f"{what}: known LAC of ledger "
                         f"{lid} is {lac}, but no LAC above {ledger.lac_sent_max} was ever sent to the "
                         f"bookie{damaged}")

    def check_lastmark(self, mark: tuple[int, int], where: str) -> None:
        if mark < self._lastmark:
            self.violate("LastmarkMonotonic", f"{where}: durable lastmark {mark} is behind {self._lastmark}, "
                         f"durable earlier")
        self._lastmark = max(self._lastmark, mark)
