"""What the simulated clients know about a bookie that collects garbage, and the invariants of garbage
collection and compaction (bookie/gc.py, bookie/compaction.py, the engine's "Garbage collection").

GcHistory extends the bookie world's history (bookie_checks.BookieHistory) with the metadata store's side:
when each ledger was deleted from the metadata (`meta_deleted_at`), the tick of every listing (each
garbage-collection round's generation read: a round can delete only ledgers absent from the metadata when
its listing began, and only if nothing touched them after), every add attempt of each entry (registered when
the engine gets it, with its answer if one came from a live incarnation), and the last round that reported
deleting each ledger (its listing tick and the tick of its report).

Invariants, each raised as InvariantViolation(name, detail):
- LiveEntriesStayReadable: an entry acknowledged before a read is read back OK with its bytes, never
  NO_ENTRY / NO_LEDGER, never other bytes, IO_ERROR only on a ledger whose entry-log record the world damaged
  (the bookie world's AllAckedEntriesAreReadable, UnknownIsNeverNo and NoOutOfOrderEntries, under this name)
  while its ledger is in the metadata; once the ledger is deleted from the metadata, an acknowledged entry may
  vanish only in a round whose listing began after the entry's last acknowledged add (the generation rule: a
  ledger touched after a round's generation is not deleted by that round) and which read the metadata after the
  deletion: its listing began after it, or its verification read found the ledger gone (a stale listing may
  miss a ledger that still existed when the round began).
- DeletedStaysDeleted: after a round reported deleting ledger L (listing at tick R), a read submitted later
  returns an entry of L (or a ReadLac names it as the last entry held) only if an add of that entry could have come back: one answered after R, one never
  answered (its incarnation crashed: its journal record may be above the mark the round persisted), or one
  answered IO_ERROR (a failed journal: written, maybe, never synced). Journal replay of such an add re-creates
  L until the next round deletes it again (engine docstring); nothing else of L is ever served again.
- On a ledger deleted from the metadata, nothing is checked about fences and LACs any more (a deleted ledger's
  fence and LAC are gone with it, and a later add re-creates it unfenced).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bksim.formats import entry as entry_fmt
from bksim.model.errors import FormatError
from bksim.model.status import StatusCode as S
from bksim.sim.bookie_checks import BookieHistory, LedgerHistory

_LIVE_NAMES = frozenset(("AllAckedEntriesAreReadable", "UnknownIsNeverNo", "NoOutOfOrderEntries"))


@dataclass(slots=True)
class AddAttempt:
    """One add of one entry, as the engine got it."""
    submitted: int
    answered: int | None = None  # None: never answered by a live incarnation (crash)
    status: S | None = None


class GcHistory(BookieHistory):
    def __init__(self, tolerated: frozenset[str] = frozenset(),
                 on_tolerated: Callable = lambda v: None) -> None:
        super().__init__(tolerated, on_tolerated)
        self.meta_deleted_at: dict[int, int] = {}
        self.listings: list[int] = []  # ticks, ascending
        self.gc_deleted: dict[int, tuple[int, int]] = {}  # ledger -> (listing tick, report tick) of the last round
        self._absent_in_round: dict[int, list[int]] = {}  # ledger -> listing ticks of rounds that verified it gone
        self._attempts: dict[tuple[int, int], list[AddAttempt]] = {}
        self._acks: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (submitted, answered) of OK adds
        self._live_check = False

    def violate(self, invariant: str, detail: str) -> None:
        if self._live_check and invariant in _LIVE_NAMES:
            invariant, detail = "LiveEntriesStayReadable", f"({invariant}) {detail}"
        super().violate(invariant, detail)

    # -- what the world tells it -------------------------------------------------------------------------
    def listing_started(self) -> int:
        tick = self.next_tick()
        self.listings.append(tick)
        return tick

    def verified_absent(self, ledger_id: int) -> None:
        """A round's verification read found the ledger gone (rounds never overlap: the last listing is its own)."""
        self._absent_in_round.setdefault(ledger_id, []).append(self.listings[-1])

    def deleted_from_metadata(self, ledger: LedgerHistory) -> None:
        self.meta_deleted_at[ledger.ledger_id] = self.next_tick()
        self._lac_seen.pop(ledger.ledger_id, None)

    def deleted_by_gc(self, ledger_ids: list[int]) -> None:
        """A round's report named these ledgers (delete_ledgers returned: the deletion is durable)."""
        if not ledger_ids:
            return
        listing = self.listings[-1]  # rounds never overlap: the last listing is this round's
        tick = self.next_tick()
        for lid in ledger_ids:
            if lid not in self.meta_deleted_at:
                self.violate("LiveEntriesStayReadable", f"a garbage-collection round (listing at tick {listing}) "
                             f"deleted ledger {lid}, which the metadata store holds")
            self.gc_deleted[lid] = (listing, tick)

    def add_attempt(self, ledger: LedgerHistory, entry_id: int, submitted: int) -> AddAttempt:
        attempt = AddAttempt(submitted)
        self._attempts.setdefault((ledger.ledger_id, entry_id), []).append(attempt)
        return attempt

    def add_answered(self, ledger: LedgerHistory, entry_id: int, recovery: bool, status: S, submitted: int,
                     tick: int) -> None:
        if status is S.OK:
            self._acks.setdefault((ledger.ledger_id, entry_id), []).append((submitted, tick))
        # a deleted ledger's fence went with it: a normal add may re-create it unfenced
        deleted = ledger.ledger_id in self.meta_deleted_at
        super().add_answered(ledger, entry_id, recovery or deleted, status, submitted, tick)

    # -- answers ------------------------------------------------------------------------------------------
    def check_read(self, ledger: LedgerHistory, entry_id: int, submitted: int, status: S, data: bytes,
                   lac: int, what: str) -> None:
        if ledger.ledger_id not in self.meta_deleted_at:
            self._live_check = True
            try:
                super().check_read(ledger, entry_id, submitted, status, data, lac, what)
            finally:
                self._live_check = False
            return
        self._check_deleted_read(ledger, entry_id, submitted, status, data, what)

    def check_lac_answer(self, ledger: LedgerHistory, submitted: int, status: S, lac: int, last_entry_id: int,
                         what: str) -> None:
        lid = ledger.ledger_id
        if lid not in self.meta_deleted_at:
            self._live_check = True
            try:
                super().check_lac_answer(ledger, submitted, status, lac, last_entry_id, what)
            finally:
                self._live_check = False
            return
        deletion = self.gc_deleted.get(lid)
        if status is S.OK and last_entry_id >= 0 and deletion is not None and deletion[1] < submitted and \
                not self._may_return(lid, last_entry_id, deletion[0]):
            self.violate("DeletedStaysDeleted", f"{what}: ReadLac of ledger {lid} says it holds entries up to "
                         f"{last_entry_id} after a garbage-collection round (listing at tick {deletion[0]}, reported "
                         f"at tick {deletion[1]}) deleted it, and no add of that entry could bring it back")

    def _check_deleted_read(self, ledger: LedgerHistory, entry_id: int, submitted: int, status: S, data: bytes,
                            what: str) -> None:
        lid = ledger.ledger_id
        if status is S.OK:
            eid = entry_id
            if entry_id == -1:
                try:
                    got_lid, eid, _ = entry_fmt.parse_ids(data)
                except FormatError:
                    got_lid, eid = lid, None
                if got_lid != lid and not ledger.damaged:
                    self.violate("NoOutOfOrderEntries", f"{what}: last entry of {lid} is from ledger {got_lid}")
            if eid is None or data != ledger.entries.get(eid):
                if ledger.damaged and _digest_fails(data, lid, eid):
                    return  # maybe: damaged bytes served unverified; a reader's digest check rejects them
                if eid is None:
                    self.violate("NoOutOfOrderEntries", f"{what}: last entry of {lid} unparsable")
                self.violate("NoOutOfOrderEntries", f"{what}: {lid}:{eid} read back {len(data)} bytes that are "
                             f"not the entry generated for that id")
            deletion = self.gc_deleted.get(lid)
            if deletion is not None and deletion[1] < submitted and not self._may_return(lid, eid, deletion[0]):
                self.violate("DeletedStaysDeleted", f"{what}: {lid}:{eid} served after a garbage-collection round "
                             f"(listing at tick {deletion[0]}, reported at tick {deletion[1]}) deleted ledger "
                             f"{lid}, and no add of that entry could bring it back (every add was answered before "
                             f"the round began)")
            return
        if entry_id < 0 or not ledger.acked_before(entry_id, submitted):
            return
        if status is S.IO_ERROR and ledger.damaged:
            return  # maybe: the damaged record is this entry's
        if status in (S.NO_ENTRY, S.NO_LEDGER, S.IO_ERROR):
            eligible = self._may_be_gone(lid, entry_id, submitted)
            if status is S.IO_ERROR:
                self.violate("DeletedStaysDeleted" if eligible else "LiveEntriesStayReadable",
                             f"{what}: IO_ERROR for acknowledged {lid}:{entry_id} with no damage injected")
            elif not eligible:
                self.violate("LiveEntriesStayReadable", f"{what}: {status.name} for {lid}:{entry_id}, acknowledged "
                             f"(add submitted at tick {self._last_ack_submitted(lid, entry_id, submitted)}); ledger "
                             f"{lid} was deleted from the metadata at tick {self.meta_deleted_at[lid]}, but no "
                             f"listing began after both (a round may delete only what nothing touched after its "
                             f"generation)")

    def _last_ack_submitted(self, lid: int, entry_id: int, before: int) -> int:
        return max((s for s, answered in self._acks.get((lid, entry_id), ()) if answered < before), default=-1)

    def _may_be_gone(self, lid: int, entry_id: int, read_submitted: int) -> bool:
        """Some round listed after the entry's last acknowledged add, and after the ledger left the metadata or
        with a verification that found it gone."""
        acked = self._last_ack_submitted(lid, entry_id, read_submitted)
        after = max(self.meta_deleted_at[lid], acked)
        return any(after < tick < read_submitted for tick in reversed(self.listings)) or \
            any(acked < tick < read_submitted for tick in self._absent_in_round.get(lid, ()))

    def _may_return(self, lid: int, entry_id: int, listing: int) -> bool:
        """An add of the entry whose journal record may be above the mark of the round that listed at `listing`."""
        return any(a.answered is None or a.answered > listing or a.status is S.IO_ERROR
                   for a in self._attempts.get((lid, entry_id), ()))


def _digest_fails(data: bytes, ledger_id: int, entry_id: int | None) -> bool:
    try:
        entry_fmt.decode_entry(data, ledger_id=ledger_id, entry_id=entry_id if entry_id is not None else -1)
    except FormatError:
        return True
    return False
