"""The MetadataStore contract (services/bksim/ports/metadata.py) as behaviours, run against every implementation.

`tests/unit/metadata/test_memory_contract.py` runs them on InMemoryMetadataStore, and
`tests/integration/test_zk_metadata.py` on ZkMetadataStore over the session's real ZooKeeper: one list of
checks, two stores, so the in-memory twin the simulator uses cannot drift from ZooKeeper unnoticed.

Each check is `async def check_...(h: Harness)`. A harness gives:
- `h.store`: a MetadataStore (one session);
- `h.root`: an absolute path that does not exist yet, the check's own namespace;
- `await h.new_session()`: another MetadataStore on the same tree, with its own session;
- `await h.expire(session)`: expire that session for real and return once the store has removed its
  ephemeral nodes and calls through `session` raise SessionExpiredError.
Checks that use the fixed /ledgers layout (ids, ledger znodes) assume nothing about what else is there:
the ZooKeeper is shared by the whole test session.
"""
from __future__ import annotations

from typing import Awaitable, Callable, Protocol

import pytest

from bksim.metadata import ledger_manager as ledgers
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.paths import IDGEN, ledger_path
from bksim.model.errors import (BadVersionError, LedgerStateError, NoChildrenForEphemeralsError, NodeExistsError,
                                NoNodeError, NotEmptyError, SessionExpiredError)
from bksim.ports.metadata import MetadataStore


class Harness(Protocol):
    store: MetadataStore
    root: str

    async def new_session(self) -> MetadataStore: ...

    async def expire(self, session: MetadataStore) -> None: ...


async def check_create_get_set_versions(h: Harness) -> None:
    s, r = h.store, h.root
    assert await s.create(r, b"root") == r
    assert await s.create(f"{r}/a", b"x") == f"{r}/a"
    assert await s.get(f"{r}/a") == (b"x", 0)
    assert await s.set(f"{r}/a", b"y", 0) == 1
    assert await s.set(f"{r}/a", b"z", 1) == 2
    assert await s.get(f"{r}/a") == (b"z", 2)
    assert await s.set(f"{r}/a", b"", -1) == 3  # unconditional
    assert await s.exists(f"{r}/a") == 3
    assert await s.exists(f"{r}/missing") is None
    assert await s.get(r) == (b"root", 0)  # a child's writes do not touch the parent's data version
    await s.delete(f"{r}/a", 3)
    assert await s.exists(f"{r}/a") is None


async def check_cas_bad_version(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    await s.create(f"{r}/n", b"v0")
    await s.set(f"{r}/n", b"v1", 0)
    with pytest.raises(BadVersionError) as e:
        await s.set(f"{r}/n", b"stale", 0)  # a second writer that read version 0 loses
    assert e.value.path == f"{r}/n"
    assert await s.get(f"{r}/n") == (b"v1", 1)  # never overwritten
    with pytest.raises(BadVersionError):
        await s.set(f"{r}/n", b"future", 7)
    with pytest.raises(BadVersionError):
        await s.delete(f"{r}/n", 0)
    assert await s.exists(f"{r}/n") == 1
    await s.delete(f"{r}/n", 1)
    assert await s.exists(f"{r}/n") is None


async def check_no_node(h: Harness) -> None:
    s, r = h.store, h.root
    missing = f"{r}/missing"
    for call in (lambda: s.get(missing), lambda: s.set(missing, b"", -1), lambda: s.set(missing, b"", 0),
                 lambda: s.delete(missing), lambda: s.delete(missing, 0), lambda: s.children(missing)):
        with pytest.raises(NoNodeError) as e:
            await call()
        assert e.value.path == missing
    with pytest.raises(NoNodeError):
        await s.create(f"{r}/a/b", b"")  # the parent is missing
    assert await s.exists(r) is None  # and nothing was created on the way


async def check_node_exists(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    await s.create(f"{r}/n", b"first")
    with pytest.raises(NodeExistsError) as e:
        await s.create(f"{r}/n", b"second")
    assert e.value.path == f"{r}/n"
    with pytest.raises(NodeExistsError):
        await s.create(f"{r}/n", b"second", make_parents=True)
    assert await s.get(f"{r}/n") == (b"first", 0)
    with pytest.raises(NodeExistsError):
        await s.create("/")


async def check_not_empty(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    await s.create(f"{r}/p")
    await s.create(f"{r}/p/c")
    with pytest.raises(NotEmptyError) as e:
        await s.delete(f"{r}/p")
    assert e.value.path == f"{r}/p"
    assert await s.children(f"{r}/p") == ["c"]
    await s.delete(f"{r}/p/c")
    await s.delete(f"{r}/p")
    assert await s.children(r) == []


async def check_sequential_format(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    await s.create(f"{r}/q")
    assert await s.create(f"{r}/q/ID-", b"a", sequential=True) == f"{r}/q/ID-0000000000"
    await s.create(f"{r}/q/plain")  # every child created counts, sequential or not
    assert await s.create(f"{r}/q/ID-", sequential=True) == f"{r}/q/ID-0000000002"
    await s.delete(f"{r}/q/plain")  # deletes do not count: names are never reused
    await s.delete(f"{r}/q/ID-0000000000")
    assert await s.create(f"{r}/q/ID-", sequential=True, ephemeral=True) == f"{r}/q/ID-0000000003"
    assert await s.get(f"{r}/q/ID-0000000002") == (b"", 0)
    assert await s.children(f"{r}/q") == ["ID-0000000002", "ID-0000000003"]
    # a bare sequential child of a directory ("prefix/") is just the number
    await s.create(f"{r}/d")
    assert await s.create(f"{r}/d/", sequential=True) == f"{r}/d/0000000000"
    # with make_parents the new parent starts counting at 0
    assert await s.create(f"{r}/new/ID-", sequential=True, make_parents=True) == f"{r}/new/ID-0000000000"
    # a sequential name that collides with an existing node is NodeExists, and the counter does not move
    await s.create(f"{r}/c")
    await s.create(f"{r}/c/ID-0000000001")
    for _ in range(2):
        with pytest.raises(NodeExistsError):
            await s.create(f"{r}/c/ID-", sequential=True)


async def check_children_sorted(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    for name in ("b", "a", "10", "c", "9", "B"):
        await s.create(f"{r}/{name}")
    await s.create(f"{r}/a/x")
    assert await s.children(r) == ["10", "9", "B", "a", "b", "c"]  # names, not paths, sorted as strings
    assert await s.children(f"{r}/a") == ["x"]
    assert await s.children(f"{r}/b") == []


async def check_children_with_cversion(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    assert await s.children_with_cversion(r) == ([], 0)
    await s.create(f"{r}/b")
    await s.create(f"{r}/a")
    assert await s.children_with_cversion(r) == (["a", "b"], 2)
    await s.delete(f"{r}/a")  # a delete counts too
    assert await s.children_with_cversion(r) == (["b"], 3)
    other = await h.new_session()
    await other.create(f"{r}/a", ephemeral=True)  # the same name again
    await h.expire(other)
    assert await s.children_with_cversion(r) == (["b"], 5)  # the same names, but one came and went
    assert await s.create(f"{r}/ID-", sequential=True) == f"{r}/ID-0000000003"  # the sequential counter: creates
    assert (await s.children_with_cversion(r))[1] == 6
    assert await s.children_with_cversion(f"{r}/b") == ([], 0)
    with pytest.raises(NoNodeError):
        await s.children_with_cversion(f"{r}/missing")


async def check_make_parents(h: Harness) -> None:
    s, r = h.store, h.root
    assert await s.create(f"{r}/a/b/c", b"leaf", make_parents=True) == f"{r}/a/b/c"
    for parent in (r, f"{r}/a", f"{r}/a/b"):
        assert await s.get(parent) == (b"", 0)  # persistent, empty, version 0
    assert await s.get(f"{r}/a/b/c") == (b"leaf", 0)
    assert await s.create(f"{r}/a/b/d", b"", make_parents=True) == f"{r}/a/b/d"  # parents exist: fine
    assert await s.children(f"{r}/a/b") == ["c", "d"]
    # an ephemeral leaf gets persistent parents: they stay when the session goes
    other = await h.new_session()
    await other.create(f"{r}/e1/e2/eph", ephemeral=True, make_parents=True)
    await h.expire(other)
    assert await s.exists(f"{r}/e1/e2/eph") is None
    assert await s.exists(f"{r}/e1/e2") == 0


async def check_ephemeral_dies_with_session(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    other = await h.new_session()
    await other.create(f"{r}/eph", b"mine", ephemeral=True)
    seq = await other.create(f"{r}/ID-", ephemeral=True, sequential=True)
    await other.create(f"{r}/persistent", b"kept")
    await s.create(f"{r}/main-eph", ephemeral=True)  # another session's ephemeral is not touched
    assert await s.get(f"{r}/eph") == (b"mine", 0)  # visible to every session
    await h.expire(other)
    assert await s.exists(f"{r}/eph") is None
    assert await s.exists(seq) is None
    assert await s.get(f"{r}/persistent") == (b"kept", 0)
    assert await s.exists(f"{r}/main-eph") == 0
    with pytest.raises(SessionExpiredError):
        await other.get(f"{r}/persistent")
    with pytest.raises(SessionExpiredError):
        await other.create(f"{r}/late", ephemeral=True)
    assert await s.exists(f"{r}/late") is None
    assert await s.children(r) == ["main-eph", "persistent"]


async def check_ephemeral_can_be_deleted_and_has_no_children(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    other = await h.new_session()
    await other.create(f"{r}/eph", ephemeral=True)
    with pytest.raises(NoChildrenForEphemeralsError):
        await other.create(f"{r}/eph/child")
    with pytest.raises(NoChildrenForEphemeralsError):
        await s.create(f"{r}/eph/a/b", make_parents=True)
    await s.delete(f"{r}/eph", 0)  # any session may delete it (e.g. an operator clearing a registration)
    assert await s.exists(f"{r}/eph") is None
    await other.create(f"{r}/eph", b"again", ephemeral=True)  # and the owner may create it again
    assert await s.get(f"{r}/eph") == (b"again", 0)


async def check_allocate_ledger_id(h: Harness) -> None:
    ids = [await ledgers.allocate_ledger_id(h.store) for _ in range(5)]
    assert ids == list(range(ids[0], ids[0] + 5))  # consecutive: each allocation is one create under idgen
    assert ids[0] >= 0
    leftovers = [n for n in await h.store.children(IDGEN) if int(n[3:]) in ids]
    assert leftovers == []  # every idgen node was deleted again


async def check_ledger_metadata_znodes(h: Harness) -> None:
    s = h.store
    first = await ledgers.allocate_ledger_id(s)
    long_id = 10**10 + first  # the long (3/4/4/4/4) form; unique because `first` is
    meta = LedgerMetadata.new(["b1:1", "b2:1", "b3:1"], 2, 2, password=b"pw", ctime_ms=1)
    for ledger_id in (first, long_id):
        assert await ledgers.create_ledger_metadata(s, ledger_id, meta) == 0
        with pytest.raises(NodeExistsError):
            await ledgers.create_ledger_metadata(s, ledger_id, meta.closed(-1, 0))  # never replaced
        assert await ledgers.read_ledger_metadata(s, ledger_id) == (meta, 0)
    assert await s.exists(ledger_path(long_id)) == 0
    listed = await ledgers.list_ledger_ids(s)
    assert {first, long_id} <= set(listed) and listed == sorted(listed)

    recovering = meta.with_state(LedgerState.IN_RECOVERY)
    assert await ledgers.write_ledger_metadata(s, first, recovering, 0) == 1
    with pytest.raises(BadVersionError):
        await ledgers.write_ledger_metadata(s, first, meta.closed(5, 10), 0)  # a writer that read version 0
    assert await ledgers.read_ledger_metadata(s, first) == (recovering, 1)

    # the update loop (its conflict handling is unit-tested on the in-memory store)
    closed, version = await ledgers.update_ledger_metadata(s, first, lambda m: m.closed(3, 30), attempts_max=2)
    assert (closed.state, closed.last_entry_id, closed.length, version) == (LedgerState.CLOSED, 3, 30, 2)
    assert await ledgers.read_ledger_metadata(s, first) == (closed, 2)
    # closing again with the same values needs no write; with other values it is refused
    assert await ledgers.update_ledger_metadata(s, first, lambda m: m.closed(3, 30), attempts_max=1) == (closed, 2)
    with pytest.raises(LedgerStateError):
        await ledgers.update_ledger_metadata(s, first, lambda m: m.closed(7, 70), attempts_max=1)

    await ledgers.delete_ledger_metadata(s, first, 2)
    await ledgers.delete_ledger_metadata(s, long_id)
    listed = await ledgers.list_ledger_ids(s)
    assert first not in listed and long_id not in listed


async def check_sync_then_read_sees_another_sessions_write(h: Harness) -> None:
    s, r = h.store, h.root
    await s.create(r)
    other = await h.new_session()
    await other.create(f"{r}/made-elsewhere", b"x")
    await s.sync(r)
    assert await s.exists(f"{r}/made-elsewhere") == 0
    await h.expire(other)
    with pytest.raises(SessionExpiredError):
        await other.sync(r)


CONTRACT: list[Callable[[Harness], Awaitable[None]]] = [
    check_create_get_set_versions,
    check_cas_bad_version,
    check_no_node,
    check_node_exists,
    check_not_empty,
    check_sequential_format,
    check_children_sorted,
    check_children_with_cversion,
    check_make_parents,
    check_ephemeral_dies_with_session,
    check_ephemeral_can_be_deleted_and_has_no_children,
    check_allocate_ledger_id,
    check_ledger_metadata_znodes,
    check_sync_then_read_sees_another_sessions_write,
]
