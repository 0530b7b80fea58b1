"""The auditor (PROTOCOL.md §6): one per cluster, it finds ledgers that lack replicas and marks them for the
replication workers. BookKeeper's AuditorElector, Auditor, AuditorBookieCheckTask and
AuditorCheckAllLedgersTask / AuditorReplicasCheckTask, over the MetadataStore and BookieTransport ports.

Election. Every candidate creates an ephemeral-sequential vote /ledgers/underreplication/auditorelection/V_<seq>
whose data is its owner id; the lowest vote is the auditor. A vote dies with its session, so when the
auditor's process dies the next vote wins.

Lost bookies. known = the bookies with a cookie (/ledgers/cookies); registered = writable ∪ read-only
registrations (a read-only bookie still serves its copies: it is not lost). A known bookie missing from the
registrations for `lost_bookie_recovery_delay_ms` (0 = at once) is lost; a bookie that registers again within
the delay cancels it, so a restart is not a loss. The bookie check marks every ledger whose metadata names a
lost bookie in any segment with the lost bookies it names (the worker replaces each in the segments that name
it). It scans the ledgers when a bookie becomes lost, and every `periodic_bookie_check_interval_ms` whatever
it saw before (losses missed while no auditor ran, marks of a scan that failed halfway). It also scans the
lost bookies' ledgers again when a registration came or went since the last check that the check does not
see (the cversion of a registration directory, its creates and deletes, grew by more than the names that
appeared and disappeared): a lost bookie may have come back and gone again between two checks, and while it
was back a worker may have kept it and removed the marks of its ledgers, which the auditor, seeing it
missing at both checks, would not restore.

Lost verdicts. A worker that finds entries no surviving replica holds records a lost verdict on the mark,
with the unregistered bookies whose silence it counted as "no copy" (marks.py). When a bookie is registered
again (and at every periodic bookie check, and whenever registrations changed unseen), the bookie check
withdraws every verdict that rested on a bookie registered now (`withdraw_void_lost`): it was down for now,
not lost, and its copies may be back. The ledger stays marked for the workers, no longer reported lost,
within one check of the bookie's return whatever the workers are busy with.

Check of all ledgers. For every CLOSED ledger, for every segment's entries [first, last] and every registered
bookie of its ensemble that must hold some of them (write sets: ledger/quorum.py), the auditor asks the
bookie which entries of the ledger it holds (`list_entries`, one call per bookie and ledger) and marks the
ledger with each bookie that lacks an entry it must hold: a truncated journal, a re-formatted bookie.
NO_LEDGER holds nothing; UNKNOWN_STATE (a limbo ledger of a re-formatted bookie: it
cannot say what it lost) counts as holding nothing; a bookie that does not answer is left to the bookie
check; any other status is reported, not marked. OPEN and IN_RECOVERY ledgers are skipped (their end is
not known; the bookie check covers their lost bookies).

A listed copy may still be damaged (a flipped byte in an entry log: the bookie lists the entry, a read answers
IO_ERROR or bytes whose digest fails). With `ledger_verification_percentage` p > 0 (BookKeeper's
auditorLedgerVerificationPercentage) the check also reads p% of every CLOSED ledger's entries (a fixed choice
by the ids: `verifies_entry`, the same in every process and run) from every bookie of the entry's write set
that lists it, in ReadEntries batches of `read_batch_entries` (one call per bookie and batch, at most
VERIFY_READS_PER_LEDGER_MAX in flight per ledger), and `verify_copies` judges the copies: IO_ERROR, NO_ENTRY,
NO_LEDGER, UNKNOWN_STATE, a digest or id mismatch, or bytes that differ from those a strict majority of the
verified copies agree on, is a missing copy on that bookie, marked as above. Verified copies that disagree
without a majority are reported, not marked (which one is right is not known); a copy not answered is not
judged. The replication worker runs the same judgement before it keeps a marked bookie.

It runs every `periodic_check_interval_ms`,
measured from the wall time of the last run recorded at /ledgers/underreplication/checkallledgersctime,
so a new auditor does not repeat a recent check; `trigger_check_all` records 0 there, which any auditor
takes as "run now" (the operators' `bksim autorecovery check-all`, from any process).

Everything is bounded: ledgers in flight (LEDGER_CHECK_CONCURRENCY, METADATA_READ_CONCURRENCY), the calls
a check makes (one per bookie and ledger), and every wait (the Clock port, woken early by `stop` and by
`trigger_check_all`). While /ledgers/underreplication/disable exists nothing is marked.

Where bksim differs from BookKeeper:
- polling instead of watches (the port has none): candidates re-read the votes, and the auditor re-reads
  cookies and registrations, every `bookie_check_interval_ms`; a bookie that came and went between two reads
  (where a watch would have fired twice) shows only in the directory's cversion, not by name, so the ledgers
  of every lost bookie are scanned again (BookKeeper's audit, too, marks the ledgers of every lost bookie);
- the lost-bookie delay is a configuration value, not a znode, and applies to each bookie even when several
  are missing at once (BookKeeper audits at once when more than one bookie is lost);
- the check of all ledgers compares entry lists (BookKeeper's replicas check, GET_LIST_OF_ENTRIES_OF_LEDGER)
  rather than reading the first and last entry of each fragment, so a hole in the middle is found too; at
  percentage 0 it reads no entry (BookKeeper's LedgerChecker still reads each fragment's first and last);
- the checks run one after another in the auditor's loop, as on BookKeeper's single-threaded auditor
  executor: a long check of all ledgers delays the next bookie check.

`run` raises SessionExpiredError when the auditor's metadata session is gone: its vote died with it, and the
owner starts a new Auditor on a new session. Other operating errors are logged and retried at the next turn.
"""
from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Iterator, Sequence, TypeVar

from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.broker.driver import cancelled_underneath
from bksim.formats.entry import decode_entry
from bksim.ledger.quorum import write_set_indexes
from bksim.metadata.ledger_manager import list_ledger_ids, read_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.metadata.paths import (AUDITOR_ELECTION, AUDITOR_VOTE_PREFIX, AVAILABLE, CHECK_ALL_LEDGERS_CTIME, COOKIES,
                                  READONLY, READONLY_CHILD, SEQUENCE_DIGITS)
from bksim.model.config import AutoRecoveryConfig
from bksim.model.errors import (BadVersionError, BksimError, BookieUnreachable, FormatError, MetadataFormatError,
                                NodeExistsError, NoNodeError, SessionExpiredError)
from bksim.model.status import StatusCode
from bksim.ports.bookie_transport import READ_BATCH_ENTRIES_MAX, BookieTransport
from bksim.ports.clock import Clock
from bksim.ports.metadata import ANY_VERSION, MetadataStore

# ledgers whose replicas are asked at once in a check of all ledgers; each asks the bookies of its segments
# (at most E per segment) at once, so about LEDGER_CHECK_CONCURRENCY * E list_entries calls are in flight
LEDGER_CHECK_CONCURRENCY = 8
# ledger metadata reads in flight while the bookie check scans for ledgers that name a lost bookie
METADATA_READ_CONCURRENCY = 32
# ReadEntries calls in flight for the verification of one ledger's copies (one per bookie and batch); with
# LEDGER_CHECK_CONCURRENCY ledgers at once, at most 64 calls of `read_batch_entries` entries each
VERIFY_READS_PER_LEDGER_MAX = 8
VERIFY_NOTES_MAX = 8  # problems a verification describes one by one (the rest are counted)
CHECK_ALL_REQUESTED = 0  # the check-all ctime that asks the auditor to run the check now
_VOTE_NAME_PREFIX = AUDITOR_VOTE_PREFIX.rsplit("/", 1)[1]  # "V_"
# answers of list_entries that say what the bookie holds: OK (its ranges), NO_LEDGER and UNKNOWN_STATE (nothing)
_HOLDS_NOTHING = frozenset({StatusCode.NO_LEDGER, StatusCode.UNKNOWN_STATE})
# answers of a read that say the bookie's copy is lost: damaged (IO_ERROR: the bookie's own digest or CRC check
# failed), or not there although it must be
_COPY_LOST = frozenset({StatusCode.IO_ERROR, StatusCode.NO_ENTRY, StatusCode.NO_LEDGER, StatusCode.UNKNOWN_STATE})
_MASK64 = (1 << 64) - 1
T = TypeVar("T")


def required_entries(first: int, last: int, index: int, ensemble_size: int, write_quorum_size: int) -> int:
    """How many entries of [first, last] the bookie at ensemble `index` must hold: those whose write set
    (ledger/quorum.py) contains `index`. Every E consecutive entries put each index in Qw write sets."""
    count = last - first + 1
    if count <= 0:
        return 0
    rounds, rest = divmod(count, ensemble_size)
    start = first + rounds * ensemble_size
    return rounds * write_quorum_size + sum(
        1 for entry_id in range(start, start + rest)
        if index in write_set_indexes(entry_id, ensemble_size, write_quorum_size))


def missing_entries(first: int, last: int, held: Sequence[tuple[int, int]], index: int, ensemble_size: int,
                    write_quorum_size: int) -> int:
    """How many entries of [first, last] the bookie at ensemble `index` must hold but does not, given the
    inclusive ranges it `held`."""
    missing, at = 0, first
    for low, high in sorted(held):
        if high < at:
            continue
        if low > last:
            break
        missing += required_entries(at, min(low - 1, last), index, ensemble_size, write_quorum_size)
        at = high + 1
        if at > last:
            return missing
    return missing + required_entries(at, last, index, ensemble_size, write_quorum_size)


def verifies_entry(ledger_id: int, entry_id: int, percentage: int) -> bool:
    """Whether a check verifying `percentage` (0..100) percent of the entries reads this one: a fixed
    pseudo-random choice from the ids (splitmix64's mix of both), the same in every process and every run, so
    the simulator stays deterministic and two checks at one percentage read the same entries."""
    if percentage >= 100:
        return True
    if percentage <= 0:
        return False
    x = (ledger_id * 0x9E3779B97F4A7C15 + entry_id + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) % 100 < percentage


def holds_entry(ranges: Sequence[tuple[int, int]], entry_id: int) -> bool:
    """Whether the sorted, disjoint inclusive `ranges` contain `entry_id`."""
    at = bisect.bisect_right(ranges, (entry_id, _MASK64)) - 1
    return at >= 0 and ranges[at][0] <= entry_id <= ranges[at][1]


@dataclass(slots=True)
class CopyCheck:
    """What `verify_copies` found: the copies it judged lost, per bookie; how many it read and found good;
    the copies it could not judge (no answer, another status); entries whose good copies disagree with no
    strict majority; a few problems in words."""
    damaged: dict[str, list[int]] = field(default_factory=dict)
    verified: int = 0
    unjudged: dict[str, list[int]] = field(default_factory=dict)
    divergent: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.notes) < VERIFY_NOTES_MAX:
            self.notes.append(text)


async def verify_copies(transport: BookieTransport, ledger_id: int, digest_type: str,
                        holders: Iterable[tuple[int, Sequence[str]]], batch_entries: int,
                        concurrency: int = VERIFY_READS_PER_LEDGER_MAX) -> CopyCheck:
    """Read every entry of `holders` ((entry id, the bookies whose copy to judge), ascending entry ids) from each
    of its bookies and judge the copies (see the module docstring): batches of `batch_entries` entry ids (at
    most READ_BATCH_ENTRIES_MAX), one ReadEntries call per bookie and batch, at most `concurrency` calls in
    flight; only one batch's ids and bytes are held at a time. Never raises for a bookie's answer or silence."""
    size = max(1, min(batch_entries, READ_BATCH_ENTRIES_MAX))
    check = CopyCheck()
    chunk: list[tuple[int, Sequence[str]]] = []
    for item in holders:
        chunk.append(item)
        if len(chunk) == size:
            await _verify_batch(transport, ledger_id, digest_type, chunk, concurrency, check)
            chunk = []
    if chunk:
        await _verify_batch(transport, ledger_id, digest_type, chunk, concurrency, check)
    for lists in (check.damaged, check.unjudged):
        for bookie in lists:
            lists[bookie].sort()
    return check


async def _verify_batch(transport: BookieTransport, ledger_id: int, digest_type: str,
                        chunk: list[tuple[int, Sequence[str]]], concurrency: int, check: CopyCheck) -> None:
    by_bookie: dict[str, list[int]] = {}
    for entry_id, bookies in chunk:
        for bookie in bookies:
            by_bookie.setdefault(bookie, []).append(entry_id)
    copies: dict[int, dict[str, bytes]] = {entry_id: {} for entry_id, _ in chunk}

    async def read(bookie: str) -> None:
        asked = by_bookie[bookie]
        try:
            results = await transport.read_entries(bookie, ledger_id, asked)
            if len(results) != len(asked):
                raise BookieUnreachable(bookie, f"answered {len(results)} results for {len(asked)} entry ids")
        except (BookieUnreachable, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and not cancelled_underneath():
                raise
            check.unjudged.setdefault(bookie, []).extend(asked)
            check.note(f"ledger {ledger_id}: {bookie} did not answer a read of {len(asked)} entries: {e}")
            return
        for entry_id, (status, data) in zip(asked, results):
            if status is StatusCode.OK:
                try:
                    decode_entry(data, digest_type, ledger_id=ledger_id, entry_id=entry_id)
                except FormatError as e:
                    check.damaged.setdefault(bookie, []).append(entry_id)
                    check.note(f"ledger {ledger_id} entry {entry_id} on {bookie}: {e}")
                    continue
                copies[entry_id][bookie] = bytes(data)
            elif status in _COPY_LOST:
                check.damaged.setdefault(bookie, []).append(entry_id)
                check.note(f"ledger {ledger_id} entry {entry_id} on {bookie}: {status.name}")
            else:
                check.unjudged.setdefault(bookie, []).append(entry_id)
                check.note(f"ledger {ledger_id} entry {entry_id} on {bookie}: {status.name} (not judged)")

    await _for_each(sorted(by_bookie), read, concurrency)
    for entry_id, good in copies.items():
        check.verified += len(good)
        variants: dict[bytes, list[str]] = {}
        for bookie, data in good.items():
            variants.setdefault(data, []).append(bookie)
        if len(variants) < 2:
            continue
        majority = max(variants.values(), key=len)
        if 2 * len(majority) <= len(good):
            check.divergent.append(entry_id)
            check.note(f"ledger {ledger_id} entry {entry_id}: verified copies differ with no majority ({sorted(good)})")
            continue
        for bookie in sorted(set(good) - set(majority)):
            check.verified -= 1
            check.damaged.setdefault(bookie, []).append(entry_id)
            check.note(f"ledger {ledger_id} entry {entry_id} on {bookie}: differs from the copies of "
                       f"{sorted(majority)}")


def segment_ranges(metadata: LedgerMetadata) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first, last, ensemble) of each segment of a CLOSED ledger that holds at least one entry."""
    assert metadata.is_closed
    out = []
    for i, segment in enumerate(metadata.segments):
        following = metadata.segments[i + 1].first_entry_id - 1 if i + 1 < len(metadata.segments) else None
        last = metadata.last_entry_id if following is None else min(following, metadata.last_entry_id)
        if last >= segment.first_entry_id:
            out.append((segment.first_entry_id, last, segment.ensemble))
    return out


async def _for_each(items: Sequence[T], action: Callable[[T], Awaitable[None]], concurrency: int) -> None:
    """Run `action` on every item, at most `concurrency` at once (a few workers pulling from one iterator).
    The first failure stops the others and is raised as itself (a SessionExpiredError first), not as a group."""
    pending = iter(items)

    async def worker() -> None:
        for item in pending:
            await action(item)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(items))):
                group.create_task(worker())
    except BaseExceptionGroup as failures:
        expired = [e for e in failures.exceptions if isinstance(e, SessionExpiredError)]
        raise (expired or failures.exceptions)[0] from None


class Auditor:
    """One candidate for auditor; the elected one checks the bookies and ledgers (see the module docstring)."""

    def __init__(self, store: MetadataStore, transport: BookieTransport, marks: UnderReplicationMarks, clock: Clock,
                 config: AutoRecoveryConfig, owner_id: str, log: Callable[[str], None] = lambda line: None) -> None:
        assert owner_id, "a candidate names itself in its vote"
        self.store = store
        self.transport = transport
        self.marks = marks
        self._clock = clock
        self.config = config
        self.owner_id = owner_id
        self._log = log
        self._vote: str | None = None  # the path of our vote
        self._missing_since: dict[str, float] = {}  # bookie -> monotonic ms it was first seen unregistered
        self._audited: set[str] = set()  # lost bookies whose ledgers a finished scan marked
        # registration directory -> (names, cversion or None if absent) at the last bookie check; {} before it
        self._listings: dict[str, tuple[frozenset[str], int | None]] = {}
        self._wake = asyncio.Event()
        self.leading = False  # what the last turn of `run` found
        self.last_bookie_check: dict | None = None
        self.last_check_all: dict | None = None

    # -- election ------------------------------------------------------------------------------------------

    @property
    def vote(self) -> str | None:
        """The path of our vote, once cast."""
        return self._vote

    async def elect(self) -> str:
        """Cast our vote (once; again only if it is gone) and return its path."""
        if self._vote is not None and await self.store.exists(self._vote) is not None:
            return self._vote
        self._vote = await self.store.create(AUDITOR_VOTE_PREFIX, self.owner_id.encode("utf-8"), ephemeral=True,
                                             sequential=True, make_parents=True)
        self._log(f"auditor election: {self.owner_id} voted {self._vote}")
        return self._vote

    async def _votes(self) -> list[str]:
        """Vote names, lowest first."""
        try:
            names = await self.store.children(AUDITOR_ELECTION)
        except NoNodeError:
            return []
        votes = [n for n in names if n.startswith(_VOTE_NAME_PREFIX) and n[-SEQUENCE_DIGITS:].isdigit()]
        return sorted(votes, key=lambda n: int(n[-SEQUENCE_DIGITS:]))

    async def is_auditor(self) -> bool:
        """True while our vote is the lowest."""
        votes = await self._votes()
        return self._vote is not None and bool(votes) and f"{AUDITOR_ELECTION}/{votes[0]}" == self._vote

    async def current_auditor(self) -> str | None:
        """The owner id in the lowest vote, or None without votes."""
        for name in await self._votes():
            try:
                data, _ = await self.store.get(f"{AUDITOR_ELECTION}/{name}")
            except NoNodeError:
                continue  # maybe: that candidate's session ended since we listed
            return data.decode("utf-8", "replace")
        return None

    # -- lost bookies --------------------------------------------------------------------------------------

    async def _children(self, path: str) -> list[str]:
        try:
            return await self.store.children(path)
        except NoNodeError:
            return []

    async def _registrations(self) -> tuple[list[str], set[str], dict[str, tuple[frozenset[str], int | None]]]:
        """(known bookies, registered bookies, {registration directory: (names, cversion or None if absent)})."""
        known = await self._children(COOKIES)
        listings: dict[str, tuple[frozenset[str], int | None]] = {}
        for path in (AVAILABLE, READONLY):
            try:
                names, cversion = await self.store.children_with_cversion(path)
            except NoNodeError:
                names, cversion = [], None
            listings[path] = (frozenset(names), cversion)
        writable = listings[AVAILABLE][0] - {READONLY_CHILD}
        return known, set(writable) | set(listings[READONLY][0]), listings

    async def _bookies(self) -> tuple[list[str], set[str]]:
        """(known bookies, registered bookies)."""
        known, registered, _ = await self._registrations()
        return known, registered

    def _registered_unseen(self, listings: dict[str, tuple[frozenset[str], int | None]]) -> bool:
        """Whether a registration directory changed since the last check in a way this check does not see:
        more creates and deletes (cversion) than names appeared and disappeared (a bookie came and went, or
        went and came back); records `listings` for the next check. False at the first check."""
        unseen = False
        if self._listings:
            for path, (names, cversion) in listings.items():
                seen_names, seen_cversion = self._listings.get(path, (frozenset(), None))
                changes = (cversion or 0) - (seen_cversion or 0)  # an absent directory has had no children
                seen = len(names - seen_names) + len(seen_names - names)
                unseen |= changes < 0 or changes > seen  # < 0: the directory was made again
        self._listings = listings
        return unseen

    def _track(self, known: Iterable[str], registered: set[str]) -> tuple[list[str], dict[str, float], list[str]]:
        """Update when each known bookie went missing; (lost bookies, {bookie: ms left before it is lost},
        bookies registered again since the last check)."""
        now = self._clock.monotonic_ms()
        missing = set(known) - registered
        returned = sorted(b for b in self._missing_since if b not in missing)
        for bookie in returned:
            del self._missing_since[bookie]
            self._audited.discard(bookie)
            self._log(f"auditor: bookie {bookie} is registered again")
        for bookie in sorted(missing - set(self._missing_since)):
            self._missing_since[bookie] = now
            self._log(f"auditor: bookie {bookie} is not registered (lost after "
                      f"{self.config.lost_bookie_recovery_delay_ms} ms)")
        delay = self.config.lost_bookie_recovery_delay_ms
        lost = sorted(b for b in missing if now - self._missing_since[b] >= delay)
        waiting = {b: delay - (now - self._missing_since[b]) for b in sorted(missing) if b not in lost}
        return lost, waiting, returned

    async def withdraw_void_verdicts(self, registered: set[str]) -> dict[int, list[str]]:
        """Withdraw every lost verdict that counted the silence of a bookie `registered` now as "no copy" (see
        the module docstring). {ledger id: those bookies} for the verdicts withdrawn."""
        _, withdrawn = await self.marks.withdraw_void_verdicts(await self.marks.list(), registered)
        for ledger_id, back in withdrawn.items():
            self._log(f"auditor: ledger {ledger_id}: its lost verdict counted the silence of {back}, registered "
                      f"again: withdrawn (the ledger stays marked)")
        return withdrawn

    async def check_bookies(self, *, full: bool = False) -> dict:
        """Find lost bookies and mark the ledgers that name them: scans the ledgers when a bookie is newly lost,
        or always with `full` (the periodic bookie check). Returns what it saw and did."""
        known, registered, listings = await self._registrations()
        unseen = self._registered_unseen(listings)
        lost, waiting, returned = self._track(known, registered)
        if unseen and self._audited:
            self._log(f"auditor: registrations changed unseen since the last check (a bookie came and went, or "
                      f"went and came back): the ledgers of the lost bookies {sorted(self._audited)} are scanned "
                      f"again")
            self._audited.clear()  # any of them may be the one: a worker may have kept it meanwhile
        report: dict = {"known": sorted(known), "registered": sorted(registered), "lost": lost, "waiting": waiting,
                        "registered_unseen": unseen, "disabled": False, "scanned": False, "ledgers": 0,
                        "marked": {}, "errors": [], "withdrawn": {}}
        if await self.marks.is_disabled():
            report["disabled"] = True
            return report
        if returned or unseen or full:
            report["withdrawn"] = await self.withdraw_void_verdicts(registered)
        if lost and (full or set(lost) - self._audited):
            scan = await self.mark_ledgers_of(lost)
            report.update(scanned=True, marked=scan["marked"], errors=scan["errors"], ledgers=scan["ledgers"])
            self._audited |= set(lost)
        return report

    async def mark_ledgers_of(self, bookies: Iterable[str]) -> dict:
        """Mark every ledger whose metadata names any of `bookies` in a segment, with the ones it names
        (also what a decommission does for a stopped bookie). {"ledgers": n, "marked": {id: [bookie]},
        "errors": [text]}."""
        wanted = set(bookies)
        ids = await list_ledger_ids(self.store)
        marked: dict[int, list[str]] = {}
        errors: list[str] = []

        async def scan(ledger_id: int) -> None:
            try:
                metadata, _ = await read_ledger_metadata(self.store, ledger_id)
            except NoNodeError:
                return  # maybe: deleted since the listing
            except MetadataFormatError as e:
                errors.append(f"ledger {ledger_id}: {e}")
                return
            named = sorted({b for s in metadata.segments for b in s.ensemble} & wanted)
            if named:
                await self.marks.mark(ledger_id, named)
                marked[ledger_id] = named
                self._log(f"auditor: ledger {ledger_id} marked under-replicated (lost bookies {named})")

        await _for_each(ids, scan, METADATA_READ_CONCURRENCY)
        return {"ledgers": len(ids), "marked": dict(sorted(marked.items())), "errors": errors}

    # -- check of all ledgers ------------------------------------------------------------------------------

    async def check_all_ledgers(self, verify_percentage: int | None = None,
                                on_checked: Callable[[int, int], None] | None = None) -> dict:
        """Ask every replica of every CLOSED ledger which entries it holds, verify the copies of
        `verify_percentage` percent of the entries (None: the configured `ledger_verification_percentage`),
        and mark the ledgers with the bookies that miss some or hold damaged ones. Returns {"ledgers",
        "checked", "marked": {id: {bookie: missing entries}}, "unreachable": {id: [bookie]}, "errors": [text],
        "disabled", "verify_percentage", "copies_verified", "copies_unjudged", "damaged": {id: {bookie:
        damaged copies}} (counted in "marked" too)}. `on_checked(done, total)` is called after each listed ledger
        (closed or not) is looked at: a command's progress."""
        percentage = self.config.ledger_verification_percentage if verify_percentage is None else verify_percentage
        assert 0 <= percentage <= 100, f"verify percentage {percentage}"
        report: dict = {"disabled": False, "ledgers": 0, "checked": 0, "marked": {}, "unreachable": {},
                        "errors": [], "verify_percentage": percentage, "copies_verified": 0, "copies_unjudged": 0,
                        "damaged": {}}
        if await self.marks.is_disabled():
            report["disabled"] = True
            return report
        started_ms = int(self._clock.wall_ms())
        ctime_version = await self.store.exists(CHECK_ALL_LEDGERS_CTIME)
        _, registered = await self._bookies()
        ids = await list_ledger_ids(self.store)
        report["ledgers"] = len(ids)
        looked_at = 0

        async def check_counted(ledger_id: int) -> None:
            nonlocal looked_at
            try:
                await check(ledger_id)
            finally:
                looked_at += 1
                if on_checked is not None:
                    on_checked(looked_at, len(ids))

        async def check(ledger_id: int) -> None:
            try:
                metadata, _ = await read_ledger_metadata(self.store, ledger_id)
            except NoNodeError:
                return  # maybe: deleted since the listing
            except MetadataFormatError as e:
                report["errors"].append(f"ledger {ledger_id}: {e}")
                return
            if not metadata.is_closed:
                return
            report["checked"] += 1
            missing = await self._check_ledger(ledger_id, metadata, registered, report, percentage)
            if missing:
                await self.marks.mark(ledger_id, missing)
                report["marked"][ledger_id] = missing
                damaged = report["damaged"].get(ledger_id)
                self._log(f"auditor: ledger {ledger_id} marked under-replicated (missing entries {missing}"
                          + (f"; damaged copies among them {damaged})" if damaged else ")"))

        await _for_each(ids, check_counted, LEDGER_CHECK_CONCURRENCY)
        for key in ("marked", "unreachable", "damaged"):
            report[key] = dict(sorted(report[key].items()))
        await self._record_check_all(started_ms, ctime_version)
        return report

    async def _check_ledger(self, ledger_id: int, metadata: LedgerMetadata, registered: set[str],
                            report: dict, percentage: int) -> dict[str, int]:
        """{bookie: entries it must hold and does not, or holds damaged} for the registered bookies of a CLOSED
        ledger (the copies of `percentage` percent of its entries are read and judged)."""
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        duties = [(first, last, index, bookie) for first, last, ensemble in segment_ranges(metadata)
                  for index, bookie in enumerate(ensemble)
                  if bookie in registered and required_entries(first, last, index, e, qw) > 0]
        asked = sorted({bookie for *_, bookie in duties})
        held: dict[str, list[tuple[int, int]]] = {}

        async def ask(bookie: str) -> None:
            try:
                status, ranges = await self.transport.list_entries(bookie, ledger_id)
            except BookieUnreachable:
                report["unreachable"].setdefault(ledger_id, []).append(bookie)
                return  # maybe: lost; the bookie check decides
            if status is StatusCode.OK:
                held[bookie] = list(ranges)
            elif status in _HOLDS_NOTHING:
                held[bookie] = []
            else:
                report["errors"].append(f"ledger {ledger_id}: bookie {bookie} answered {status.name}")

        await _for_each(asked, ask, len(asked))
        missing: dict[str, int] = {}
        for first, last, index, bookie in duties:
            if bookie in held:
                count = missing_entries(first, last, held[bookie], index, e, qw)
                if count:
                    missing[bookie] = missing.get(bookie, 0) + count
        if percentage > 0:
            for bookie, count in (await self._verify_ledger(ledger_id, metadata, held, report, percentage)).items():
                missing[bookie] = missing.get(bookie, 0) + count
        return dict(sorted(missing.items()))

    async def _verify_ledger(self, ledger_id: int, metadata: LedgerMetadata, held: dict[str, list[tuple[int, int]]],
                             report: dict, percentage: int) -> dict[str, int]:
        """{bookie: damaged copies} among the chosen entries' copies on the bookies that list them (a copy a
        bookie does not list is counted missing by the listing already)."""
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        ranges = {bookie: sorted(r) for bookie, r in held.items()}

        def holders() -> Iterator[tuple[int, list[str]]]:
            for first, last, ensemble in segment_ranges(metadata):
                for entry_id in range(first, last + 1):
                    if verifies_entry(ledger_id, entry_id, percentage):
                        listing = [ensemble[i] for i in write_set_indexes(entry_id, e, qw)
                                   if ensemble[i] in ranges and holds_entry(ranges[ensemble[i]], entry_id)]
                        if listing:
                            yield entry_id, listing

        check = await verify_copies(self.transport, ledger_id, metadata.digest_type, holders(),
                                    self.config.read_batch_entries)
        report["copies_verified"] += check.verified
        report["copies_unjudged"] += sum(len(ids) for ids in check.unjudged.values())
        report["errors"] += [f"ledger {ledger_id}: entry {entry_id}: verified copies differ with no majority"
                             for entry_id in check.divergent]
        damaged = {bookie: len(ids) for bookie, ids in sorted(check.damaged.items())}
        if damaged:
            report["damaged"][ledger_id] = damaged
            for note in check.notes:
                self._log(f"auditor: {note}")
        return damaged

    async def _record_check_all(self, started_ms: int, version: int | None) -> None:
        """Record when the check that just ended started; a request made meanwhile (a write since we read
        `version`) stays, so the check runs again."""
        data = str(started_ms).encode("ascii")
        try:
            if version is None:
                await self.store.create(CHECK_ALL_LEDGERS_CTIME, data, make_parents=True)
            else:
                await self.store.set(CHECK_ALL_LEDGERS_CTIME, data, version)
        except (NodeExistsError, BadVersionError, NoNodeError):
            pass  # maybe: trigger_check_all wrote since we read: keep its request

    async def check_all_due(self) -> bool:
        """Whether the check of all ledgers should run now: never ran, asked for, or its interval passed."""
        try:
            data, _ = await self.store.get(CHECK_ALL_LEDGERS_CTIME)
        except NoNodeError:
            return True
        try:
            ctime_ms = int(data.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            ctime_ms = CHECK_ALL_REQUESTED  # unreadable: run and rewrite it
        return (ctime_ms == CHECK_ALL_REQUESTED
                or self._clock.wall_ms() - ctime_ms >= self.config.periodic_check_interval_ms)

    async def trigger_check_all(self) -> None:
        """Ask the auditor, in whatever process it runs, to check all ledgers at its next turn; an auditor
        in this process is woken at once."""
        data = str(CHECK_ALL_REQUESTED).encode("ascii")
        try:
            await self.store.set(CHECK_ALL_LEDGERS_CTIME, data, ANY_VERSION)
        except NoNodeError:
            try:
                await self.store.create(CHECK_ALL_LEDGERS_CTIME, data, make_parents=True)
            except NodeExistsError:
                await self.store.set(CHECK_ALL_LEDGERS_CTIME, data, ANY_VERSION)
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: vote; while auditor, check the bookies every `bookie_check_interval_ms` (fully
        at election and every `periodic_bookie_check_interval_ms`) and all ledgers when due; otherwise
        re-read the election at the same pace. SessionExpiredError ends it (see the module docstring)."""
        next_full_check_ms = 0.0
        while not stop.is_set():
            try:
                await self.elect()
                leading = await self.is_auditor()
                if leading and not self.leading:
                    self._log(f"auditor: {self.owner_id} is the auditor")
                    next_full_check_ms = self._clock.monotonic_ms()
                elif self.leading and not leading:
                    self._log(f"auditor: {self.owner_id} is no longer the auditor")
                    self._missing_since.clear()
                    self._audited.clear()
                    self._listings = {}
                self.leading = leading
                if leading:
                    now = self._clock.monotonic_ms()
                    full = now >= next_full_check_ms
                    self.last_bookie_check = await self.check_bookies(full=full)
                    if full:
                        next_full_check_ms = now + self.config.periodic_bookie_check_interval_ms
                    if await self.check_all_due():
                        self.last_check_all = await self.check_all_ledgers()
            except SessionExpiredError:
                self.leading = False
                raise
            except BksimError as e:
                self._log(f"auditor: {type(e).__name__}: {e} (retrying in {self.config.bookie_check_interval_ms} ms)")
            await self._wait(self.config.bookie_check_interval_ms, stop)

    async def _wait(self, ms: float, stop: asyncio.Event) -> None:
        """Sleep `ms` on the Clock, or less when `stop` or a trigger comes first."""
        waits = [asyncio.ensure_future(self._clock.sleep_ms(ms)), asyncio.ensure_future(stop.wait()),
                 asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        self._wake.clear()

    def statistics(self) -> dict:
        """What `bksim autorecovery status` shows of this candidate."""
        return {"owner_id": self.owner_id, "vote": self._vote, "auditor": self.leading,
                "missing_since_ms": dict(sorted(self._missing_since.items())),
                "last_bookie_check": self.last_bookie_check, "last_check_all": self.last_check_all}
