"""The metadata store as the pure layers see it: ZooKeeper's data model, nothing more (PROTOCOL.md §3).

A tree of nodes named by absolute paths ("/ledgers/00/0000/L0016"); each node has bytes and a data
version. One `MetadataStore` object is one ZooKeeper *session*: the ephemeral nodes it creates live as
long as the session, and once the session has expired every call through the object raises
SessionExpiredError (the owner opens a new session; nothing reconnects behind its back).
Implementations: `adapters.zk_metadata.ZkMetadataStore` (kazoo, a real ZooKeeper) and
`metadata.memory.InMemoryMetadataStore` (unit tests and the simulator); one contract test module runs
against both.

Versions and compare-and-set. A node is created with version 0; every successful `set` adds 1.
`set(path, data, version)` and `delete(path, version)` succeed only while the node's version equals
`version` (BadVersionError otherwise); version -1 means "any version" and is for nodes nobody races on
(cleanup, tests). **Every write the ledger protocol makes to ledger metadata is a CAS on the version it
read** (MetadataVersionsIncrease, PROTOCOL.md §7): on BadVersionError the caller re-reads and
re-decides from the new value; it never overwrites. A new ledger's node is created with `create`, which
fails with NodeExistsError rather than replace anything.

Errors (the MetadataError subtree of model/errors.py), each naming the path:
- NoNodeError: the node is missing; for `create`, its parent is (unless make_parents).
- NodeExistsError: `create` of an existing path (also when a sequential name collides).
- BadVersionError: a CAS lost (see above).
- NotEmptyError: `delete` of a node with children.
- NoChildrenForEphemeralsError: `create` under an ephemeral node.
- SessionExpiredError: this store's session is gone.
- ConnectionLossError: no answer in time. The outcome of a write is unknown: it may have been applied.
  Re-read before deciding; never assume it failed.
A malformed path ("", "a/b", "/a/", "/a//b", "/a/./b") is a bug in the caller: ValueError.

Sequential nodes: `create(prefix, sequential=True)` appends the parent's counter, zero-padded to 10
digits ("/ledgers/idgen/ID-" -> "/ledgers/idgen/ID-0000000007") and returns the full path. As in
ZooKeeper, the counter is the number of children ever created under the parent (sequential or not;
deletes do not count), so names are never reused while the parent exists. The node's cversion (ZooKeeper's
Stat.cversion) counts every change to its children, creates and deletes; `children_with_cversion` reads it
with the names, so a poller can tell that children came and went between two of its reads although the names
it sees are the same.

Ordering: every call is answered in the order the store applied it; a caller that awaits a write and
then reads sees its own write (ZooKeeper's per-session FIFO order).
"""
from __future__ import annotations

from typing import Protocol

ANY_VERSION = -1


class MetadataStore(Protocol):
    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        """Create a node with `data` at version 0 and return its path (with the sequence suffix if
        sequential). An ephemeral node belongs to this store's session. make_parents creates missing
        ancestors as persistent nodes with empty data (version 0)."""

    async def get(self, path: str) -> tuple[bytes, int]:
        """(data, version) of a node; NoNodeError if absent."""

    async def set(self, path: str, data: bytes, version: int) -> int:
        """Replace the data if the node's version is `version` (-1: any); returns the new version."""

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        """Delete a childless node if its version is `version` (-1: any)."""

    async def children(self, path: str) -> list[str]:
        """Names (not paths) of the node's children, sorted; NoNodeError if the node is absent."""

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        """(`children(path)`, the node's cversion: how many children were ever created or deleted under it),
        both from one read; NoNodeError if the node is absent."""

    async def exists(self, path: str) -> int | None:
        """The node's version, or None if it does not exist."""

    async def sync(self, path: str) -> None:
        """ZooKeeper's sync: reads this store issues afterwards see every write committed anywhere before the
        call began (a session on a lagging server catches up first). A no-op where reads are linearizable."""
