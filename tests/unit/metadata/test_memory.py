"""InMemoryMetadataStore beyond the shared contract: what the simulator relies on (deterministic session ids,
ZooKeeper's cversion, calls that never suspend, expiry reports) and caller bugs (malformed paths)."""
from __future__ import annotations

import asyncio

import pytest

from bksim.metadata.memory import InMemoryMetadataStore, NodeStat
from bksim.model.errors import SessionExpiredError


def run(coro):
    return asyncio.run(coro)


def test_stat_counts_like_zookeeper():
    async def scenario():
        tree = InMemoryMetadataStore()
        await tree.create("/p")
        await tree.create("/p/ID-", sequential=True)
        await tree.create("/p/x")
        await tree.create("/p/ID-", sequential=True)
        await tree.delete("/p/x")
        await tree.create("/p/ID-", sequential=True)
        await tree.set("/p", b"a", 0)
        # ZooKeeper said the same for this sequence: suffixes 0, 2, 3 and cversion 5 (4 creates + 1 delete)
        assert await tree.children("/p") == ["ID-0000000000", "ID-0000000002", "ID-0000000003"]
        assert tree.stat("/p") == NodeStat(version=1, cversion=5, ephemeral_owner=0, num_children=3)
        assert tree.stat("/missing") is None
    run(scenario())


def test_sessions_are_numbered_in_order_and_own_their_ephemerals():
    async def scenario():
        tree = InMemoryMetadataStore()
        assert tree.default_session.session_id == 1
        b1, b2 = tree.session("broker-1"), tree.session("broker-1")  # a restarted broker: a new session
        assert (b1.session_id, b2.session_id) == (2, 3)
        await tree.create("/brokers/available/broker-1", ephemeral=True, make_parents=True)
        await b1.create("/e1", ephemeral=True)
        await b1.create("/e2", ephemeral=True)
        await b1.create("/p")
        assert tree.stat("/e1").ephemeral_owner == 2
        await tree.delete("/e2")  # deleted by another session: no longer b1's
        assert tree.expire(b1) == ["/e1"]
        assert tree.expire(b1) == []  # expiring twice changes nothing
        assert not tree.is_alive(b1) and tree.is_alive(b2)
        assert tree.paths() == ["/", "/brokers", "/brokers/available", "/brokers/available/broker-1", "/p"]
        with pytest.raises(SessionExpiredError, match="session 2 \\(broker-1\\) expired"):
            await b1.children("/")
        assert await b2.children("/") == ["brokers", "p"]
        # the store's own session can expire too
        tree.expire(tree.default_session)
        with pytest.raises(SessionExpiredError):
            await tree.exists("/p")
        assert await b2.exists("/brokers/available/broker-1") is None
    run(scenario())


def test_calls_finish_without_suspending():
    tree = InMemoryMetadataStore()
    coro = tree.create("/n", b"x")
    with pytest.raises(StopIteration) as done:
        coro.send(None)  # one step, no await on the event loop: deterministic for the simulator
    assert done.value.value == "/n"


@pytest.mark.parametrize("path", ["", "n", "/n/", "/a//b", "/a/./b", "/a/../b", "/a\0"])
def test_malformed_paths_are_caller_bugs(path):
    async def scenario():
        tree = InMemoryMetadataStore()
        for call in (lambda: tree.create(path), lambda: tree.get(path), lambda: tree.exists(path),
                     lambda: tree.children(path), lambda: tree.delete(path), lambda: tree.set(path, b"", -1)):
            with pytest.raises(ValueError):
                await call()
    run(scenario())


def test_data_must_be_bytes_and_the_root_stays():
    async def scenario():
        tree = InMemoryMetadataStore()
        with pytest.raises(TypeError):
            await tree.create("/n", "text")  # type: ignore[arg-type]
        await tree.create("/n")
        with pytest.raises(TypeError):
            await tree.set("/n", "text", -1)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await tree.delete("/")
        assert await tree.get("/") == (b"", 0)
    run(scenario())
