"""Ledger metadata over the MetadataStore port (PROTOCOL.md §3): id allocation, the ledger znodes, listing.

Pure over the port (ports/metadata.py; its docstring is the contract, its errors are re-exported here):
any MetadataStore works, ZooKeeper or the in-memory twin.

Ledger ids. `allocate_ledger_id` creates an ephemeral-sequential node /ledgers/idgen/ID-<seq>, takes the
sequence number as the id and deletes the node again (BookKeeper's ZkLedgerIdGenerator does the same;
ephemeral, so a crash between the two steps leaves nothing behind). ZooKeeper's counter for a parent
counts every child ever created under it, so the ids are 0, 1, 2, ... and **never repeat while
/ledgers/idgen exists**; bksim never deletes /ledgers/idgen. Ids therefore start at 0 on a new cluster,
which collides with nothing: no ledger exists before the first allocation, and no id is reused after a
delete (a reused id could meet stale entries a bookie has not garbage-collected yet). Should the node be
recreated by hand, the counter restarts; `create_ledger_metadata` still never replaces a ledger (it is a
`create`: NodeExistsError, the caller allocates again). The counter is a signed 32-bit int in ZooKeeper:
this generator gives ids below 2^31 and refuses beyond (MetadataError).

Updates. Every write of existing ledger metadata is a CAS on the version the caller read:
`write_ledger_metadata` requires a version >= 0, and `update_ledger_metadata` is the read-modify-CAS loop
of the protocol (BookKeeper's MetadataUpdateLoop): on BadVersionError it re-reads and asks the caller's
`change` function again, with the new value, so a conflict is re-decided, never overwritten.
"""
from __future__ import annotations

import re
from typing import Callable

from bksim.metadata import ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.metadata.paths import (IDGEN, IDGEN_PREFIX, LEDGERS_ROOT, LONG_LEVELS, SHORT_LEVELS,
                                  ledger_id_from_idgen_path, ledger_id_from_path, ledger_path)
from bksim.model.errors import (BadVersionError, ConnectionLossError, MetadataError,
                                NoChildrenForEphemeralsError, NodeExistsError, NoNodeError, NotEmptyError,
                                SessionExpiredError)
from bksim.ports.metadata import ANY_VERSION, MetadataStore

__all__ = [
    "MetadataStore", "ANY_VERSION", "MetadataError", "NoNodeError", "NodeExistsError", "BadVersionError",
    "NotEmptyError", "NoChildrenForEphemeralsError", "SessionExpiredError", "ConnectionLossError",
    "IDGEN_ID_MAX", "allocate_ledger_id", "create_ledger_metadata", "read_ledger_metadata",
    "write_ledger_metadata", "update_ledger_metadata", "delete_ledger_metadata", "list_ledger_ids",
]

IDGEN_ID_MAX = 2**31 - 1  # ZooKeeper's sequence counter is an int; past it the suffix goes negative


async def allocate_ledger_id(store: MetadataStore) -> int:
    """A ledger id no earlier call returned (see the module docstring): create, parse, delete an idgen node."""
    created = await store.create(IDGEN_PREFIX, b"", ephemeral=True, sequential=True, make_parents=True)
    try:
        await store.delete(created)
    except NoNodeError:
        pass  # maybe: the session expired in between and took the ephemeral node with it
    try:
        ledger_id = ledger_id_from_idgen_path(created)
    except ValueError:
        ledger_id = -1
    if not 0 <= ledger_id <= IDGEN_ID_MAX:
        raise MetadataError(created, f"the id counter of {IDGEN} is exhausted or corrupt "
                                     f"(ids come from a signed 32-bit counter)")
    return ledger_id


async def create_ledger_metadata(store: MetadataStore, ledger_id: int, metadata: LedgerMetadata) -> int:
    """Create the ledger's znode (parents as needed); returns its version (0). NodeExistsError if the ledger
    exists: never replaced."""
    await store.create(ledger_path(ledger_id), ledger_metadata.encode(metadata), make_parents=True)
    return 0


async def read_ledger_metadata(store: MetadataStore, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """(metadata, version); NoNodeError if the ledger does not exist, MetadataFormatError if it is garbage."""
    path = ledger_path(ledger_id)
    data, version = await store.get(path)
    return ledger_metadata.decode(data, source=f"ledger {ledger_id} ({path})"), version


async def write_ledger_metadata(store: MetadataStore, ledger_id: int, metadata: LedgerMetadata,
                                version: int) -> int:
    """CAS `metadata` onto the znode version the caller read; returns the new version (BadVersionError if
    someone wrote in between: re-read and re-decide)."""
    assert version >= 0, "ledger metadata is only ever written as a compare-and-set on the version read"
    return await store.set(ledger_path(ledger_id), ledger_metadata.encode(metadata), version)


async def update_ledger_metadata(
        store: MetadataStore, ledger_id: int, change: Callable[[LedgerMetadata], LedgerMetadata | None], *,
        attempts_max: int) -> tuple[LedgerMetadata, int]:
    """Read, `change`, CAS; on a lost CAS read again and call `change` on the new value (at most
    `attempts_max` rounds, then the last BadVersionError). `change` returns the wanted value, or None /
    the same value when no write is needed; it may raise (e.g. LedgerStateError: the ledger got CLOSED),
    which ends the loop. Returns the (metadata, version) now stored."""
    assert attempts_max >= 1
    for attempt in range(1, attempts_max + 1):
        current, version = await read_ledger_metadata(store, ledger_id)
        wanted = change(current)
        if wanted is None or wanted == current:
            return current, version
        try:
            return wanted, await write_ledger_metadata(store, ledger_id, wanted, version)
        except BadVersionError:
            if attempt == attempts_max:
                raise
    raise AssertionError("unreachable")


async def delete_ledger_metadata(store: MetadataStore, ledger_id: int, version: int = ANY_VERSION) -> None:
    """Delete the ledger's znode (BookKeeper deletes unconditionally; pass a version to make it a CAS).
    Its parent directories stay, as in BookKeeper."""
    await store.delete(ledger_path(ledger_id), version)


async def list_ledger_ids(store: MetadataStore) -> list[int]:
    """Every ledger id with a znode under /ledgers, sorted. Walks the short (2/4/4) and long (3/4/4/4/4)
    trees; other children of /ledgers (available, cookies, idgen, ...) and non-canonical names are
    skipped. A node deleted while the walk runs is skipped; one created meanwhile may be missed."""
    ids: list[int] = []
    for levels in (SHORT_LEVELS, LONG_LEVELS):
        await _walk(store, LEDGERS_ROOT, levels, ids)
    return sorted(ids)


async def _walk(store: MetadataStore, path: str, levels: tuple[re.Pattern[str], ...], out: list[int]) -> None:
    try:
        names = await store.children(path)
    except NoNodeError:
        return  # maybe: deleted while we walked
    for name in names:
        if not levels[0].fullmatch(name):
            continue
        child = f"{path}/{name}"
        if len(levels) > 1:
            await _walk(store, child, levels[1:], out)
            continue
        try:
            out.append(ledger_id_from_path(child))
        except ValueError:
            pass  # a long-form path of a short id: not a ledger bksim wrote
