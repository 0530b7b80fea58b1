"""The operators' side of autorecovery (BookKeeper's BookKeeperAdmin and the shell's `listunderreplicated`,
`whoisauditor`, `decommissionbookie` and the replicas check): what `bksim autorecovery status`,
`list-underreplicated`, `bksim bookie decommission` and `bksim ledger replicas` show and do, over the
MetadataStore and BookieTransport ports.

- `status`: the auditor (the owner of the lowest vote), every candidate (each autorecovery daemon votes and
  runs one replication worker), the disable switch, the marks (lost ledgers: marks whose worker found
  entries no surviving replica holds), known and registered bookies, the last check of all ledgers.
- `underreplicated`: one row per mark: ledger, missing bookies, the lock's owner, age, lost entries.
- `decommission`: a stopped bookie leaves the cluster. Refused (DecommissionError, nothing changed) while the
  bookie is registered, writable or read-only, or when it has no cookie (unknown). Otherwise every ledger
  naming it is marked (Auditor.mark_ledgers_of), then it waits, re-marking any ledger that still names it
  without a mark, until no ledger metadata names it and no mark lists it, and deletes its cookie, so the
  auditor stops counting it as lost. The wait is bounded (`timeout_ms`); past it the cookie stays and a
  later decommission goes on where this one stopped. The replication workers do the copying: something
  must run them (a bookie with autorecovery on, or `bksim autorecovery run`).
- `check_all`: the check of all ledgers run here and now (Auditor.check_all_ledgers on an auditor that never
  votes), reading `verify_percentage` percent of the entries' copies; it marks as the auditor does and records
  its start as the last check of all ledgers.
- `replicas`: per segment and bookie of one ledger, which entries the bookie holds (list_entries, the call
  the auditor's check of all ledgers makes) and how many its write sets say it must hold.

Waits use the Clock port; reads of many ledgers are bounded in flight (SCAN_CONCURRENCY).
"""
from __future__ import annotations

import asyncio
from typing import Callable, Sequence

from bksim.autorecovery.auditor import Auditor, missing_entries, required_entries
from bksim.autorecovery.marks import Mark, UnderReplicationMarks
from bksim.metadata.ledger_manager import list_ledger_ids, read_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.metadata.paths import (AUDITOR_ELECTION, AVAILABLE, CHECK_ALL_LEDGERS_CTIME, COOKIES, READONLY,
                                  READONLY_CHILD, SEQUENCE_DIGITS, cookie_path)
from bksim.model.errors import BksimError, BookieUnreachable, MetadataFormatError, NoNodeError
from bksim.model.status import StatusCode
from bksim.ports.bookie_transport import BookieTransport
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

SCAN_CONCURRENCY = 32  # ledger metadata reads in flight while looking for ledgers that name a bookie
DECOMMISSION_POLL_MS = 500
PROGRESS_EVERY_MS = 5_000  # a decommission prints its progress at least this often (and on every change)


class DecommissionError(BksimError):
    """A decommission refused (the bookie is registered or unknown) or not finished within its bound."""


# -- reading the cluster ---------------------------------------------------------------------------------------

async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return await store.children(path)
    except NoNodeError:
        return []


async def registered_bookies(store: MetadataStore) -> dict[str, list[str]]:
    """{"writable": [...], "readonly": [...]}, sorted."""
    writable = [b for b in await _children(store, AVAILABLE) if b != READONLY_CHILD]
    return {"writable": sorted(writable), "readonly": sorted(await _children(store, READONLY))}


async def known_bookies(store: MetadataStore) -> list[str]:
    """Bookies with a cookie, sorted."""
    return sorted(await _children(store, COOKIES))


async def candidates(store: MetadataStore) -> list[dict]:
    """The auditor election's votes, lowest (the auditor) first: {"vote", "owner"}."""
    names = [n for n in await _children(store, AUDITOR_ELECTION) if n[-SEQUENCE_DIGITS:].isdigit()]
    out = []
    for name in sorted(names, key=lambda n: int(n[-SEQUENCE_DIGITS:])):
        try:
            data, _ = await store.get(f"{AUDITOR_ELECTION}/{name}")
        except NoNodeError:
            continue  # maybe: that candidate's session ended since we listed
        out.append({"vote": name, "owner": data.decode("utf-8", "replace")})
    return out


async def ledgers_naming(store: MetadataStore, bookie_id: str) -> list[int]:
    """Ids of the ledgers whose metadata names `bookie_id` in any segment, sorted."""
    ids = await list_ledger_ids(store)
    found: list[int] = []
    pending = iter(ids)

    async def scan() -> None:
        for ledger_id in pending:
            try:
                metadata, _ = await read_ledger_metadata(store, ledger_id)
            except (NoNodeError, MetadataFormatError):
                continue  # maybe: deleted since the listing; unreadable metadata names nobody we can replace
            if any(bookie_id in s.ensemble for s in metadata.segments):
                found.append(ledger_id)

    await asyncio.gather(*(scan() for _ in range(min(SCAN_CONCURRENCY, len(ids)))))
    return sorted(found)


def mark_row(mark: Mark, owner: str | None, now_ms: int) -> dict:
    return {"ledger_id": mark.ledger_id, "missing": list(mark.missing), "claimed_by": owner,
            "ctime_ms": mark.ctime_ms, "age_ms": max(0, now_ms - mark.ctime_ms) if mark.ctime_ms else None,
            "lost_entries": mark.lost_entries, "note": mark.note}


async def underreplicated(marks: UnderReplicationMarks, clock: Clock) -> list[dict]:
    """One row per mark, by ledger id (see mark_row)."""
    now = int(clock.wall_ms())
    return [mark_row(m, await marks.lock_owner(m.ledger_id), now) for m in await marks.list()]


async def status(store: MetadataStore, marks: UnderReplicationMarks, clock: Clock) -> dict:
    """What `bksim autorecovery status` shows (see the module docstring)."""
    votes = await candidates(store)
    rows = await underreplicated(marks, clock)
    registered = await registered_bookies(store)
    known = await known_bookies(store)
    live = set(registered["writable"]) | set(registered["readonly"])
    try:
        data, _ = await store.get(CHECK_ALL_LEDGERS_CTIME)
        check_all = int(data.decode("ascii"))
    except NoNodeError:
        check_all = None
    except (UnicodeDecodeError, ValueError):
        check_all = -1
    return {"auditor": votes[0]["owner"] if votes else None, "candidates": [v["owner"] for v in votes],
            "disabled": await marks.is_disabled(), "underreplicated": len(rows),
            "lost_ledgers": [r["ledger_id"] for r in rows if r["lost_entries"]],
            "claimed": {r["ledger_id"]: r["claimed_by"] for r in rows if r["claimed_by"]},
            "marks": rows, "bookies": {"known": known, **registered, "missing": sorted(set(known) - live)},
            "check_all_ctime_ms": check_all}


async def check_all(auditor: Auditor, verify_percentage: int,
                    on_checked: Callable[[int, int], None] | None = None) -> dict:
    """Run the check of all ledgers now, verifying `verify_percentage` (0..100) percent of the entries' copies;
    its report (Auditor.check_all_ledgers; `on_checked(done, total)` after each ledger looked at)."""
    return await auditor.check_all_ledgers(verify_percentage=verify_percentage, on_checked=on_checked)


# -- decommission ------------------------------------------------------------------------------------------------

async def check_decommissionable(store: MetadataStore, bookie_id: str) -> None:
    """DecommissionError unless `bookie_id` is known (has a cookie) and not registered."""
    registered = await registered_bookies(store)
    for kind in ("writable", "readonly"):
        if bookie_id in registered[kind]:
            raise DecommissionError(f"bookie {bookie_id} is registered ({kind}): stop it first; nothing changed")
    if await store.exists(cookie_path(bookie_id)) is None:
        raise DecommissionError(f"unknown bookie {bookie_id}: no cookie at {cookie_path(bookie_id)}; nothing "
                                f"changed")


async def decommission(store: MetadataStore, marks: UnderReplicationMarks, auditor: Auditor, clock: Clock,
                       bookie_id: str, *, timeout_ms: float, poll_ms: float = DECOMMISSION_POLL_MS,
                       progress: Callable[[str], None] = lambda line: None) -> dict:
    """Mark every ledger of the stopped `bookie_id`, wait until none names it and no mark lists it, delete its
    cookie. DecommissionError when refused (nothing changed) or when `timeout_ms` passes first (cookie kept).
    Returns {"bookie", "marked", "waited_ms"}."""
    await check_decommissionable(store, bookie_id)
    started = clock.monotonic_ms()
    if await marks.is_disabled():
        progress("autorecovery is disabled (`bksim autorecovery enable`): nothing is repaired until it is enabled")
    scan = await auditor.mark_ledgers_of([bookie_id])
    progress(f"marked {len(scan['marked'])} of {scan['ledgers']} ledgers that name {bookie_id}")
    for error in scan["errors"]:
        progress(f"skipped: {error}")
    last_said: tuple | None = None
    said_at = started
    while True:
        naming = await ledgers_naming(store, bookie_id)
        listed = [m for m in await marks.list() if bookie_id in m.missing]
        for ledger_id in sorted(set(naming) - {m.ledger_id for m in listed}):
            await marks.mark(ledger_id, [bookie_id])  # a ledger that names it again, or lost its mark
        now = clock.monotonic_ms()
        state = (tuple(naming), tuple(m.ledger_id for m in listed))
        if state != last_said or now - said_at >= PROGRESS_EVERY_MS:
            lost = [m.ledger_id for m in listed if m.lost_entries]
            progress(f"{(now - started) / 1000:.1f} s: {len(naming)} ledgers name {bookie_id}, {len(listed)} marks "
                     f"list it" + (f" (lost entries in ledgers {lost})" if lost else ""))
            last_said, said_at = state, now
        if not naming and not listed:
            break
        if now - started >= timeout_ms:
            raise DecommissionError(
                f"bookie {bookie_id} not decommissioned within {timeout_ms / 1000:.0f} s: ledgers {naming[:20]} "
                f"still name it, {len(listed)} marks list it; its cookie is kept (run the command again to go on)")
        await clock.sleep_ms(poll_ms)
    await check_decommissionable(store, bookie_id)  # it must not have started meanwhile
    try:
        await store.delete(cookie_path(bookie_id))
    except NoNodeError:
        pass  # maybe: another decommission finished first
    waited = clock.monotonic_ms() - started
    progress(f"no ledger names {bookie_id}; its cookie {cookie_path(bookie_id)} is deleted")
    return {"bookie": bookie_id, "marked": sorted(scan["marked"]), "waited_ms": round(waited)}


# -- replicas of one ledger --------------------------------------------------------------------------------------

def segment_bounds(metadata: LedgerMetadata) -> list[tuple[int, int | None]]:
    """(first, last) of each segment; last is None for the open end of a ledger that is not CLOSED, and below
    first for a segment without entries."""
    out = []
    for i, segment in enumerate(metadata.segments):
        if i + 1 < len(metadata.segments):
            last: int | None = metadata.segments[i + 1].first_entry_id - 1
            if metadata.is_closed:
                last = min(last, metadata.last_entry_id)
        else:
            last = metadata.last_entry_id if metadata.is_closed else None
        out.append((segment.first_entry_id, last))
    return out


def _clip(ranges: Sequence[tuple[int, int]], first: int, last: int | None) -> list[tuple[int, int]]:
    out = []
    for low, high in ranges:
        low, high = max(low, first), high if last is None else min(high, last)
        if low <= high:
            out.append((low, high))
    return out


async def replicas(store: MetadataStore, transport: BookieTransport, ledger_id: int) -> dict:
    """Per segment and bookie of `ledger_id`: the entries it holds (inclusive ranges within the segment), how
    many it must hold (None while the segment's end is open) and how many of those it lacks."""
    metadata, _ = await read_ledger_metadata(store, ledger_id)
    bookies = sorted({b for s in metadata.segments for b in s.ensemble})
    answers: dict[str, dict] = {}

    async def ask(bookie: str) -> None:
        try:
            code, ranges = await transport.list_entries(bookie, ledger_id)
        except BookieUnreachable as e:
            answers[bookie] = {"status": "UNREACHABLE", "error": str(e), "ranges": None}
            return
        held = list(ranges) if code is StatusCode.OK else [] if code is StatusCode.NO_LEDGER else None
        answers[bookie] = {"status": code.name, "error": None, "ranges": held}

    await asyncio.gather(*(ask(b) for b in bookies))
    e, qw = metadata.ensemble_size, metadata.write_quorum_size
    segments = []
    for (first, last), segment in zip(segment_bounds(metadata), metadata.segments):
        rows = []
        for index, bookie in enumerate(segment.ensemble):
            answer = answers[bookie]
            held = None if answer["ranges"] is None else _clip(answer["ranges"], first, last)
            should = None if last is None else required_entries(first, last, index, e, qw)
            missing = (None if last is None or held is None
                       else missing_entries(first, last, held, index, e, qw))
            rows.append({"bookie": bookie, "index": index, "status": answer["status"], "error": answer["error"],
                         "holds": [list(r) for r in held] if held is not None else None,
                         "holds_count": sum(h - l + 1 for l, h in held) if held is not None else None,
                         "should_hold": should, "missing": missing})
        segments.append({"first_entry_id": first, "last_entry_id": last, "replicas": rows})
    return {"ledger_id": ledger_id, "state": metadata.state.name, "ensemble_size": e, "write_quorum_size": qw,
            "ack_quorum_size": metadata.ack_quorum_size, "last_entry_id": metadata.last_entry_id,
            "segments": segments}
