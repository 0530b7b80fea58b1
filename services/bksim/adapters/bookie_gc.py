"""The garbage collector's metadata port (bookie/gc.py LedgerSource) over the MetadataStore port.

`ledger_ids` first checks that the store is this bookie's cluster (`/ledgers/INSTANCEID` equals the instance id
the bookie's cookie and journals carry: a bookie pointed at another or a wiped ZooKeeper must not take "no
ledgers there" for "every ledger deleted"), then lists every ledger znode (metadata/ledger_manager.py
list_ledger_ids). Before listing it syncs (ZooKeeper's sync on /ledgers): the bookie's session may be
on a server behind the leader, and a ledger created and written just before the round must be in the listing.
`ledger_exists` is one `exists` read of the ledger's znode (after that sync). Every MetadataError (connection
loss, expired session, ...) propagates: the round stops before deleting anything.
"""
from __future__ import annotations

from bksim.metadata.ledger_manager import list_ledger_ids
from bksim.metadata.paths import INSTANCEID, LEDGERS_ROOT, ledger_path
from bksim.model.errors import MetadataError, NoNodeError
from bksim.ports.metadata import MetadataStore


class MetadataLedgerSource:
    def __init__(self, store: MetadataStore, instance_id: str) -> None:
        self._store, self._instance_id = store, instance_id

    async def ledger_ids(self) -> list[int]:
        try:
            data, _version = await self._store.get(INSTANCEID)
        except NoNodeError:
            raise MetadataError(INSTANCEID, "missing: not listing ledgers of a metadata store without this "
                                            "cluster's instance id") from None
        if data.decode(errors="replace").strip() != self._instance_id:
            raise MetadataError(INSTANCEID, f"holds {data[:64]!r}, this bookie belongs to cluster "
                                            f"{self._instance_id}: not listing another cluster's ledgers")
        # the bookie's session may be on a ZooKeeper server behind the leader: without a sync, a ledger created
        # (and written here) just before this round could be missing from both the listing and the second read
        await self._store.sync(LEDGERS_ROOT)
        return await list_ledger_ids(self._store)

    async def ledger_exists(self, ledger_id: int) -> bool:
        return await self._store.exists(ledger_path(ledger_id)) is not None
