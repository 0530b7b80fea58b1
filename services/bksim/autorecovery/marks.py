"""Under-replication marks over the MetadataStore port (PROTOCOL.md §6): which ledgers miss replicas, who is
copying them, and the operators' switch. BookKeeper's ZkLedgerUnderreplicationManager, with JSON data.

    /ledgers/underreplication/ledgers/<4 hex>/<4 hex>/<4 hex>/<4 hex>/urL<id>   the mark of a ledger
    /ledgers/underreplication/locks/urL<id>       ephemeral: the worker copying it (data: its owner id)
    /ledgers/underreplication/disable             exists = marking and replication paused

A mark says "these bookies of this ledger lack copies they must hold": its data is compact JSON
``{"format_version": 1, "missing": [bookie, ...], "ctime_ms": ..., "lost_entries": n, "note": "...",
"lost_on": [bookie, ...]}``. `missing` is sorted and never empty for a mark bksim writes; `lost_entries` and
`note` are what a worker found when no surviving replica held some entries (0 and "" until then): its *lost
verdict*. `lost_on` (sorted; absent in older data: none) names the unregistered bookies whose silence that
verdict counted as "no copy": it holds only while they all stay unregistered, so it is void once one of them
is registered again (`void_lost_on`), and whoever sees that (the auditor, a worker) withdraws it
(`withdraw_void_lost`).

Rules:
- One mark per ledger. Marking a marked ledger merges the bookies into it (a read-modify-CAS loop; a lost
  CAS re-reads and merges again, never overwrites). A mark naming no new bookie is left as it is.
- A lost verdict is written and withdrawn only by a CAS on the mark read (`set_lost`, `withdraw_void_lost`); a
  merge keeps it.
- A mark is removed only by `replicated(mark)`, and only while its version is the one the caller read: a
  ledger re-marked during a copy (a second bookie went) stays marked for the next round.
- A lock is an ephemeral node, so it dies with the worker's session: a worker that crashes mid-copy frees
  its ledger for another worker. `release` deletes only a lock this object took and that still carries its
  owner id.
- Empty hex directories left by `replicated` are deleted (a concurrent mark that loses its parent retries).

Where bksim differs from BookKeeper: the data is JSON rather than a protobuf text format and carries the
worker's finding (lost entries, a note) for `bksim autorecovery status`; nothing here watches a node (the port
has no watches): callers poll (`list`, `is_disabled`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Iterable

from bksim.metadata.paths import (UNDERREPLICATED_LEDGERS, UNDERREPLICATION_DISABLE, UNDERREPLICATION_LOCKS,
                                  ledger_id_from_underreplicated_name, underreplicated_path,
                                  underreplication_lock_path)
from bksim.model.errors import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError, SessionExpiredError
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

FORMAT_VERSION = 1
# rounds of the merge loop before the last BadVersionError is raised: each lost round means another writer
# changed the mark, and only a few writers (the auditor, a decommission) ever mark a ledger
MARK_CAS_ATTEMPTS_MAX = 16
HEX_LEVELS = 4  # the 64-bit id as four 16-bit hex chunks
_HEX_CHUNK_CHARS = 4


@dataclass(frozen=True, slots=True)
class Mark:
    """One ledger's mark as read (version = the znode's data version; -1 = not stored)."""
    ledger_id: int
    missing: tuple[str, ...]
    ctime_ms: int
    lost_entries: int = 0
    note: str = ""
    lost_on: tuple[str, ...] = ()  # the bookies whose silence the lost verdict counted as "no copy"
    version: int = -1


def void_lost_on(mark: Mark, registered: Iterable[str]) -> list[str]:
    """The bookies of the mark's lost verdict whose silence it counted as "no copy" and that are `registered`
    now, sorted: the verdict is void when there is any (they were away for now, not lost: their copies may be
    back). [] for a mark without a verdict, or whose verdict rests on answers only."""
    if mark.lost_entries <= 0:
        return []
    return sorted(set(mark.lost_on) & set(registered))


def encode_mark(mark: Mark) -> bytes:
    doc = {"format_version": FORMAT_VERSION, "missing": list(mark.missing), "ctime_ms": mark.ctime_ms,
           "lost_entries": mark.lost_entries, "note": mark.note, "lost_on": list(mark.lost_on)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_mark(ledger_id: int, data: bytes, version: int) -> Mark:
    """The mark in `data`. Data that does not decode still marks the ledger: a Mark without bookies whose
    note says what is wrong (the next `mark` replaces it with good data)."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
        missing = doc["missing"]
        ctime_ms, lost, note = doc["ctime_ms"], doc.get("lost_entries", 0), doc.get("note", "")
        lost_on = doc.get("lost_on", [])
        if (doc.get("format_version") != FORMAT_VERSION or not isinstance(missing, list)
                or not all(isinstance(b, str) and b for b in missing) or not isinstance(ctime_ms, int)
                or not isinstance(lost, int) or not isinstance(note, str) or not isinstance(lost_on, list)
                or not all(isinstance(b, str) and b for b in lost_on)):
            raise ValueError("unexpected fields")
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        return Mark(ledger_id, (), 0, note=f"undecodable mark data ({e}): {bytes(data)[:64]!r}", version=version)
    return Mark(ledger_id, tuple(sorted(set(missing))), ctime_ms, lost, note, tuple(sorted(set(lost_on))), version)


class UnderReplicationMarks:
    """The marks, locks and disable switch of one metadata session (see the module docstring)."""

    def __init__(self, store: MetadataStore, clock: Clock) -> None:
        self.store = store
        self._clock = clock
        self._held: dict[int, str] = {}  # ledger id -> owner id of the locks this object took

    # -- marks ---------------------------------------------------------------------------------------------

    async def mark(self, ledger_id: int, missing: Iterable[str]) -> Mark:
        """Mark `ledger_id` as lacking copies on `missing` (at least one bookie): create the mark, or merge the
        bookies into the existing one. Returns the mark as stored. BadVersionError after
        MARK_CAS_ATTEMPTS_MAX lost rounds."""
        wanted = tuple(sorted(set(missing)))
        assert wanted and all(isinstance(b, str) and b for b in wanted), f"bookie ids to mark: {wanted!r}"
        path = underreplicated_path(ledger_id)
        for attempt in range(1, MARK_CAS_ATTEMPTS_MAX + 1):
            current = await self.get(ledger_id)
            try:
                if current is None:
                    new = Mark(ledger_id, wanted, int(self._clock.wall_ms()))
                    await self.store.create(path, encode_mark(new), make_parents=True)
                    return replace(new, version=0)
                merged = tuple(sorted(set(current.missing) | set(wanted)))
                if merged == current.missing:
                    return current
                if current.missing:
                    new = replace(current, missing=merged)
                else:  # undecodable data: replaced by a fresh mark
                    new = Mark(ledger_id, merged, int(self._clock.wall_ms()))
                version = await self.store.set(path, encode_mark(new), current.version)
                return replace(new, version=version)
            except (NodeExistsError, NoNodeError, BadVersionError):
                # another writer created, deleted or changed the mark (or removed an empty parent): re-read
                if attempt == MARK_CAS_ATTEMPTS_MAX:
                    raise
        raise AssertionError("unreachable")

    async def get(self, ledger_id: int) -> Mark | None:
        try:
            data, version = await self.store.get(underreplicated_path(ledger_id))
        except NoNodeError:
            return None
        return decode_mark(ledger_id, data, version)

    async def replicated(self, mark: Mark) -> bool:
        """Remove the mark (the ledger is fully replicated again), only if it is still the mark read: False
        when it was re-marked meanwhile (the caller keeps working on the new mark). True when it is gone,
        also when someone else removed it. The lock is not released here (see `release`)."""
        assert mark.version >= 0, "only a mark read from the store can be removed"
        path = underreplicated_path(mark.ledger_id)
        try:
            await self.store.delete(path, mark.version)
        except NoNodeError:
            return True
        except BadVersionError:
            return False
        await self._delete_empty_parents(path)
        return True

    async def set_lost(self, mark: Mark, lost_entries: int, note: str, lost_on: Iterable[str] = ()) -> Mark:
        """Record a worker's finding on the mark (CAS on mark.version): `lost_entries` entries no surviving
        replica holds, why, and the unregistered bookies whose silence it counted as "no copy" (`lost_on`).
        BadVersionError if the mark changed since it was read (re-read, re-decide), NoNodeError if it is gone."""
        assert mark.version >= 0 and lost_entries >= 0
        new = replace(mark, lost_entries=lost_entries, note=note, lost_on=tuple(sorted(set(lost_on))))
        version = await self.store.set(underreplicated_path(mark.ledger_id), encode_mark(new), mark.version)
        return replace(new, version=version)

    async def withdraw_void_lost(self, mark: Mark, registered: Iterable[str]) -> tuple[Mark | None, list[str]]:
        """Withdraw the mark's lost verdict if it is void (`void_lost_on`: a bookie whose silence it counted is
        `registered`): the ledger stays marked as before, its entries no longer reported lost. A CAS on the mark
        read; when another writer changed it meanwhile, the mark is read and judged again. Returns the mark as
        stored now (None: gone) and the registered bookies of the verdict withdrawn ([]: none was).
        BadVersionError after MARK_CAS_ATTEMPTS_MAX lost rounds."""
        registered = set(registered)
        path = underreplicated_path(mark.ledger_id)
        current: Mark | None = mark
        for attempt in range(1, MARK_CAS_ATTEMPTS_MAX + 1):
            back = void_lost_on(current, registered)
            if not back:
                return current, []
            new = replace(current, lost_entries=0, note="", lost_on=())
            try:
                version = await self.store.set(path, encode_mark(new), current.version)
                return replace(new, version=version), back
            except NoNodeError:
                return None, []
            except BadVersionError:
                if attempt == MARK_CAS_ATTEMPTS_MAX:
                    raise
                current = await self.get(mark.ledger_id)
                if current is None:
                    return None, []
        raise AssertionError("unreachable")

    async def withdraw_void_verdicts(self, marks: Iterable[Mark], registered: Iterable[str]
                                     ) -> tuple[list[Mark], dict[int, list[str]]]:
        """`withdraw_void_lost` of each of `marks` whose lost verdict is void. Returns the marks as stored now (those
        gone meanwhile left out) and {ledger id: the registered bookies of the verdict} for each one withdrawn."""
        registered = set(registered)
        current: list[Mark] = []
        withdrawn: dict[int, list[str]] = {}
        for mark in marks:
            if void_lost_on(mark, registered):
                ledger_id = mark.ledger_id
                mark, back = await self.withdraw_void_lost(mark, registered)
                if back:
                    withdrawn[ledger_id] = back
                if mark is None:
                    continue
            current.append(mark)
        return current, withdrawn

    async def _delete_empty_parents(self, path: str) -> None:
        parent = path
        for _ in range(HEX_LEVELS):
            parent = parent.rsplit("/", 1)[0]
            try:
                await self.store.delete(parent)
            except (NotEmptyError, NoNodeError):
                return  # maybe: another mark lives there, or a concurrent cleanup got it first

    # -- locks ---------------------------------------------------------------------------------------------

    async def claim(self, ledger_id: int, owner: str) -> bool:
        """Take the ledger's lock for `owner` (an ephemeral node of the store's ZooKeeper session, data = owner
        id); False when any lock exists, this object's own included."""
        assert owner, "a lock names its owner"
        try:
            await self.store.create(underreplication_lock_path(ledger_id), owner.encode("utf-8"),
                                    ephemeral=True, make_parents=True)
        except NodeExistsError:
            return False
        self._held[ledger_id] = owner
        return True

    async def release(self, ledger_id: int) -> None:
        """Delete the ledger's lock if this object took it and it still names the same owner; otherwise
        nothing (a lock lost with the session may belong to another worker now). Never raises for a lock
        that is gone, also not when the store's ZooKeeper session expired (its locks went with it)."""
        owner = self._held.pop(ledger_id, None)
        if owner is None:
            return
        path = underreplication_lock_path(ledger_id)
        try:
            data, version = await self.store.get(path)
            if data.decode("utf-8", "replace") == owner:
                await self.store.delete(path, version)
        except (NoNodeError, BadVersionError, SessionExpiredError):
            pass  # maybe: our session lost it (with the session), or it changed hands: not ours to delete

    async def lock_owner(self, ledger_id: int) -> str | None:
        try:
            data, _ = await self.store.get(underreplication_lock_path(ledger_id))
        except NoNodeError:
            return None
        return data.decode("utf-8", "replace")

    def held(self) -> list[int]:
        """Ledger ids whose locks this object took and has not released, sorted."""
        return sorted(self._held)

    # -- the operators' switch -----------------------------------------------------------------------------

    async def disable(self) -> None:
        """Pause marking and replication cluster-wide (BookKeeper's `autorecovery -disable`)."""
        try:
            await self.store.create(UNDERREPLICATION_DISABLE, b"", make_parents=True)
        except NodeExistsError:
            pass

    async def enable(self) -> None:
        try:
            await self.store.delete(UNDERREPLICATION_DISABLE)
        except NoNodeError:
            pass

    async def is_disabled(self) -> bool:
        return await self.store.exists(UNDERREPLICATION_DISABLE) is not None

    # -- listing (last: the method name `list` shadows the builtin inside the class body) -----------------

    async def list(self, limit: int | None = None) -> list[Mark]:
        """The marks, by ledger id (at most `limit` of them, the lowest ids). Walks the hex hierarchy; a mark
        removed during the walk is skipped, one created meanwhile may be missed."""
        found: list[Mark] = []
        await self._walk(UNDERREPLICATED_LEDGERS, HEX_LEVELS, found, limit)
        return found

    async def _walk(self, path: str, levels: int, out: list[Mark], limit: int | None) -> None:
        try:
            names = await self.store.children(path)
        except NoNodeError:
            return  # maybe: removed while we walked
        for name in names:
            if limit is not None and len(out) >= limit:
                return
            child = f"{path}/{name}"
            if levels > 0:
                if len(name) == _HEX_CHUNK_CHARS and all(c in "0123456789abcdef" for c in name):
                    await self._walk(child, levels - 1, out, limit)
                continue
            ledger_id = ledger_id_from_underreplicated_name(name)
            if ledger_id is None or underreplicated_path(ledger_id) != child:
                continue  # not a mark bksim wrote
            mark = await self.get(ledger_id)
            if mark is not None:
                out.append(mark)
