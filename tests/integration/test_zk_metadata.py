"""ZkMetadataStore on the session's real ZooKeeper: the MetadataStore contract (tests/metadata_contract.py,
the same checks the in-memory store passes) and what only a real server shows: a session really expired
by a network partition (ZooKeeper's own timeout, not a close), a partition shorter than the session
timeout that the session survives, calls bounded by operation_timeout_ms, and a stopped client.

Partitions go through a TcpProxy between a second kazoo client and ZooKeeper. Sessions behind a proxy ask
for a 1 s timeout (the fixture's tickTime is 200 ms, so the server accepts 0.4-4 s): ZooKeeper expires
them about a second after the proxy is cut. Nothing sleeps to synchronise: every wait polls a condition
with a deadline.
"""
from __future__ import annotations

import asyncio
import logging
import time

import pytest
from kazoo.client import KazooClient

from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.model.errors import ConnectionLossError, SessionExpiredError
from helpers import wait_until_async
from bksim.chaos.proxy import TcpProxy
from metadata_contract import CONTRACT

SHORT_SESSION_S = 1.0
LONG_SESSION_S = 4.0  # the server's maximum with tickTime 200 ms (20 ticks)
EXPIRY_DEADLINE_S = 15.0
CONNECT_TIMEOUT_S = 10.0
FAST_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 1, "max_delay": 0.1}
LOG = logging.getLogger("tests.kazoo")


async def eventually(predicate, timeout_s: float, what: str):
    """Await `predicate()` until it returns a truthy value (returned) or the deadline passes (AssertionError)."""
    return await wait_until_async(predicate, timeout_s, interval_s=0.05, message=what)


def start_client(hosts: str, session_s: float) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=session_s, connection_retry=FAST_RETRY, logger=LOG)
    client.start(timeout=CONNECT_TIMEOUT_S)
    return client


class ZkHarness:
    """The contract's harness over a real ZooKeeper. `store` talks to ZooKeeper directly; every extra
    session goes through its own proxy, so `expire` can partition it and let ZooKeeper time it out."""

    def __init__(self, zookeeper, root: str) -> None:
        self.zookeeper = zookeeper
        self.root = root
        self._markers = f"{root}-sessions"  # outside root: the checks list root's children
        self._client = start_client(zookeeper.connect, LONG_SESSION_S)
        self.store = ZkMetadataStore(self._client)
        self._clients: list[KazooClient] = [self._client]
        self._proxies: list[TcpProxy] = []
        self._sessions: dict[int, tuple[TcpProxy, str]] = {}

    async def new_session(self) -> ZkMetadataStore:
        proxy = TcpProxy(self.zookeeper.port)
        self._proxies.append(proxy)
        client = await asyncio.to_thread(start_client, proxy.address, SHORT_SESSION_S)
        self._clients.append(client)
        session = ZkMetadataStore(client, operation_timeout_ms=500, read_tries_max=1)
        marker = await session.create(f"{self._markers}/s-", ephemeral=True, sequential=True, make_parents=True)
        self._sessions[id(session)] = (proxy, marker)
        return session

    async def expire(self, session: ZkMetadataStore) -> None:
        proxy, marker = self._sessions[id(session)]
        proxy.block()  # the client goes silent; ZooKeeper expires its session after the timeout
        await eventually(lambda: self._absent(marker), EXPIRY_DEADLINE_S, f"ZooKeeper to remove {marker}")
        proxy.unblock()  # kazoo reconnects and learns that its session is gone

        async def sees_expiry() -> bool:
            try:
                await session.exists("/")
            except SessionExpiredError:
                return True
            except ConnectionLossError:
                return False  # maybe: kazoo has not reconnected yet
            raise AssertionError("a call through an expired session succeeded")

        await eventually(sees_expiry, EXPIRY_DEADLINE_S, "the expired store to raise SessionExpiredError")

    async def _absent(self, path: str) -> bool:
        return await self.store.exists(path) is None

    def close(self) -> None:
        for client in self._clients:
            client.stop()
            client.close()
        for proxy in self._proxies:
            assert proxy.close(), "a proxy thread did not stop"


@pytest.fixture
def harness(zookeeper, zk_root):
    h = ZkHarness(zookeeper, zk_root)
    yield h
    h.close()


@pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__.removeprefix("check_"))
def test_contract(check, harness):
    asyncio.run(check(harness))


def test_expired_store_stays_expired_and_a_new_store_uses_the_new_session(harness, zk_root):
    async def scenario():
        await harness.store.create(zk_root)
        old = await harness.new_session()
        await old.create(f"{zk_root}/reg", b"old", ephemeral=True)
        await harness.expire(old)
        client = old._client
        await eventually(lambda: _connected(client), EXPIRY_DEADLINE_S, "kazoo to open a new session")
        assert old.expired and client.client_id[0] != old.session_id
        with pytest.raises(SessionExpiredError):
            await old.create(f"{zk_root}/reg", ephemeral=True)  # never on the new session behind its back
        assert await harness.store.exists(f"{zk_root}/reg") is None
        new = ZkMetadataStore(client)
        assert new.session_id == client.client_id[0]
        await new.create(f"{zk_root}/reg", b"new", ephemeral=True)
        assert await harness.store.get(f"{zk_root}/reg") == (b"new", 0)
        new.close()
        old.close()
    asyncio.run(scenario())


async def _connected(client: KazooClient) -> bool:
    return client.connected and client.client_id is not None


def test_short_partition_is_connection_loss_and_the_session_survives(zookeeper, zk_root):
    proxy = TcpProxy(zookeeper.port)
    client = start_client(proxy.address, LONG_SESSION_S)
    main = start_client(zookeeper.connect, LONG_SESSION_S)
    store = ZkMetadataStore(client, operation_timeout_ms=300, read_tries_max=2)

    async def scenario():
        await store.create(zk_root, b"v0")
        await store.create(f"{zk_root}/eph", ephemeral=True)
        proxy.block()
        started = time.monotonic()
        with pytest.raises(ConnectionLossError) as e:
            await store.get(zk_root)  # two tries of 300 ms, then "outcome unknown"
        assert e.value.path == zk_root
        with pytest.raises(ConnectionLossError):
            await store.set(zk_root, b"v1", 0)  # a write is not retried: its outcome is unknown
        elapsed = time.monotonic() - started
        assert 0.5 <= elapsed < 3.0, elapsed
        proxy.unblock()
        # the session outlives a partition shorter than its timeout: the ephemeral node is still there, and
        # the set may or may not have been applied (maybe: kazoo queued it until the reconnect)
        data, version = await eventually(lambda: _get_or_none(store, zk_root), EXPIRY_DEADLINE_S,
                                         "the store to answer again")
        assert (data, version) in ((b"v0", 0), (b"v1", 1))
        assert not store.expired
        assert await store.exists(f"{zk_root}/eph") == 0
        assert main.exists(f"{zk_root}/eph").ephemeralOwner == store.session_id

    try:
        asyncio.run(scenario())
    finally:
        store.close()
        for c in (client, main):
            c.stop()
            c.close()
        assert proxy.close(), "a proxy thread did not stop"


async def _get_or_none(store: ZkMetadataStore, path: str):
    try:
        return await store.get(path)
    except ConnectionLossError:
        return None


def test_stopped_client_is_an_expired_session(zookeeper, zk_root):
    client = start_client(zookeeper.connect, LONG_SESSION_S)
    main = start_client(zookeeper.connect, LONG_SESSION_S)
    store = ZkMetadataStore(client)

    async def scenario():
        await store.create(zk_root, make_parents=True)
        await store.create(f"{zk_root}/eph", ephemeral=True)
        client.stop()  # closes the session: ZooKeeper deletes its ephemeral nodes at once
        with pytest.raises(SessionExpiredError):
            await store.get(zk_root)
        assert main.exists(f"{zk_root}/eph") is None
        assert main.exists(zk_root) is not None

    try:
        asyncio.run(scenario())
    finally:
        client.close()
        main.stop()
        main.close()


def test_renewing_store_binds_the_new_session_and_registers_again(zookeeper, zk_root):
    """The broker's store (RenewingZkMetadataStore): after ZooKeeper expires its session (partition), the next
    call runs on the client's new session, after `on_new_session` re-created the ephemeral registration."""
    from bksim.adapters.zk_metadata import RenewingZkMetadataStore

    async def scenario():
        observer_client = start_client(zookeeper.connect, LONG_SESSION_S)
        observer = ZkMetadataStore(observer_client)
        proxy = TcpProxy(zookeeper.port)
        client = await asyncio.to_thread(start_client, proxy.address, SHORT_SESSION_S)
        registered: list[int] = []

        async def register(store) -> None:
            await store.create(f"{zk_root}/broker", b"me", ephemeral=True)
            registered.append(store.session_id)

        try:
            await observer.create(zk_root)
            store = RenewingZkMetadataStore(client, operation_timeout_ms=500, read_tries_max=1,
                                            on_new_session=register)
            await register(store)
            first = store.session_id
            proxy.block()
            await eventually(lambda: _absent(observer, f"{zk_root}/broker"), EXPIRY_DEADLINE_S,
                             "ZooKeeper to expire the session and remove the registration")
            proxy.unblock()
            await eventually(lambda: _connected(client), EXPIRY_DEADLINE_S, "kazoo to open a new session")
            assert await store.exists(zk_root) == 0  # a call after the expiry works, on the new session
            assert store.session_id != first and store.renewals == 1
            assert registered == [first, store.session_id]
            assert await observer.get(f"{zk_root}/broker") == (b"me", 0)
        finally:
            client.stop()
            client.close()
            observer_client.stop()
            observer_client.close()
            assert proxy.close(), "a proxy thread did not stop"
    asyncio.run(scenario())


async def _absent(store, path: str) -> bool:
    return await store.exists(path) is None
