"""Reading a ledger as sans-I/O state machines (PROTOCOL.md §4 "Reads").

- LacRead: the LAC of an OPEN ledger, by ReadLac to every bookie of the last segment, done under the same
  quorum-coverage rule as fencing (without the FENCE flag): then no bookie that stayed silent can hold an
  entry confirmed above the answer. The answer is the highest LAC any bookie reported.
- EntryRead: one entry at or below the known LAC (a reader never returns an entry above it). Asks the first
  replica of the entry's write set; on an error, a negative or a digest mismatch asks the next one; when the
  shell's `speculative_read_ms` timer fires without an answer (on_speculative_timeout) it also asks the next.
  The first reply that verifies wins. If every replica failed, the read fails (for an entry at or below the
  LAC every negative means lost data: it is reported, never turned into "no such entry"). Replicas in
  `avoid` (the shell's recently failed bookies) are asked last.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bksim.formats.entry import Entry, decode_entry
from bksim.ledger.quorum import covered, write_set_indexes
from bksim.ledger.recovery import ReadEntry
from bksim.model.digest import DIGEST_CRC32C
from bksim.model.errors import FormatError
from bksim.model.status import StatusCode

DECISIVE = (StatusCode.OK, StatusCode.NO_ENTRY, StatusCode.NO_LEDGER)


@dataclass(frozen=True, slots=True)
class ReadLac:
    """Ask `bookie` for its known LAC (and last stored entry). Report with LacRead.on_reply."""
    bookie: str


@dataclass(slots=True)
class LacRead:
    ensemble: tuple[str, ...]
    write_quorum_size: int
    ack_quorum_size: int
    lac: int = -1
    done: bool = False
    failed: str | None = None
    _replies: dict[str, bool] = field(default_factory=dict)

    def start(self) -> list[ReadLac]:
        return [ReadLac(b) for b in self.ensemble]

    def on_reply(self, bookie: str, status: StatusCode | None, lac: int = -1) -> bool:
        """Record a reply (status None = timeout). True once the LAC is decided (or the read failed)."""
        if self.done or bookie not in self.ensemble or bookie in self._replies:
            return self.done
        decisive = status in DECISIVE
        if status is StatusCode.OK:
            self.lac = max(self.lac, lac)
        self._replies[bookie] = decisive
        unknown = {i for i, b in enumerate(self.ensemble) if not self._replies.get(b, False)}
        if covered(len(self.ensemble), self.write_quorum_size, self.ack_quorum_size, unknown):
            self.done = True
        elif len(self._replies) == len(self.ensemble):
            self.done = True
            self.failed = f"no quorum coverage for the LAC: silent or failing bookies {sorted(self.ensemble[i] for i in unknown)}"
        return self.done


@dataclass(slots=True)
class EntryRead:
    ledger_id: int
    entry_id: int
    ensemble: tuple[str, ...]  # of the segment holding entry_id
    write_quorum_size: int
    digest_type: str = DIGEST_CRC32C
    avoid: frozenset[str] = frozenset()  # bookies that failed recently: asked after the others (BookKeeper
    # reorders read sets by bookie health the same way)
    entry: Entry | None = None
    failed: str | None = None
    _replicas: list[str] = field(default_factory=list)
    _asked: int = 0
    _answered: set[str] = field(default_factory=set)
    _problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        replicas = [self.ensemble[i] for i in write_set_indexes(self.entry_id, len(self.ensemble), self.write_quorum_size)]
        self._replicas = [b for b in replicas if b not in self.avoid] + [b for b in replicas if b in self.avoid]

    @property
    def done(self) -> bool:
        return self.entry is not None or self.failed is not None

    def start(self) -> list[ReadEntry]:
        return self._ask_next()

    def on_speculative_timeout(self) -> list[ReadEntry]:
        """No answer within speculative_read_ms: ask one more replica (if any is left) in parallel."""
        return [] if self.done else self._ask_next()

    def on_reply(self, bookie: str, status: StatusCode | None, data: bytes = b"") -> list[ReadEntry]:
        if self.done or bookie not in self._replicas[:self._asked] or bookie in self._answered:
            return []
        self._answered.add(bookie)
        if status is StatusCode.OK:
            try:
                self.entry = decode_entry(data, self.digest_type, ledger_id=self.ledger_id, entry_id=self.entry_id)
                return []
            except FormatError as e:
                self._problems.append(f"{bookie}: {e}")
        else:
            self._problems.append(f"{bookie}: {status.name if status is not None else 'timeout'}")
        if len(self._answered) == len(self._replicas):
            self.failed = (f"entry {self.ledger_id}:{self.entry_id} unreadable on every replica: "
                           + "; ".join(self._problems))
            return []
        if len(self._answered) == self._asked:  # everyone asked so far has failed: try the next replica
            return self._ask_next()
        return []

    def _ask_next(self) -> list[ReadEntry]:
        if self._asked >= len(self._replicas):
            return []
        bookie = self._replicas[self._asked]
        self._asked += 1
        return [ReadEntry(bookie, self.entry_id)]
