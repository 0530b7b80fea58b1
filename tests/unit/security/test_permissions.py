"""Grants and tenant admin roles in the metadata store (security/permissions.py), over the in-memory store."""
from __future__ import annotations

import asyncio
import json

import pytest

from bksim.metadata.memory import InMemoryMetadataStore
from bksim.model.status import TopicStatus
from bksim.security.authz import Authorizer
from bksim.security.permissions import Permissions
from bksim.topics.errors import TopicError

TOPIC = "persistent://acme/orders/new"


async def _setup():
    store = InMemoryMetadataStore()
    await store.create("/admin/tenants/acme", json.dumps({"adminRoles": ["acme-admin"]}).encode(), make_parents=True)
    await store.create("/admin/policies/acme/orders", json.dumps({"retention_ms": -1}).encode(), make_parents=True)
    return store, Permissions(store, Authorizer(super_user_roles=frozenset({"root"})))


def run(coro):
    return asyncio.run(coro)


def test_grants_are_stored_beside_the_policies_and_checked():
    async def go():
        store, perms = await _setup()
        with pytest.raises(TopicError) as e:
            await perms.require_topic("app", "produce", TOPIC)
        assert e.value.status is TopicStatus.PERMISSION_DENIED and "role 'app' may not produce" in e.value.message
        await perms.grant("acme/orders", "app", ["produce"])
        await perms.require_topic("app", "produce", TOPIC)
        await perms.require_topic("app", "produce", TOPIC + "-partition-2")
        await perms.grant("acme/orders", "reader", "consume", topic=TOPIC)
        await perms.require_topic("reader", "consume", TOPIC + "-partition-0")
        with pytest.raises(TopicError):
            await perms.require_topic("reader", "consume", "persistent://acme/orders/other")
        doc = json.loads((await store.get("/admin/policies/acme/orders"))[0])
        assert doc["retention_ms"] == -1  # the namespace's own policies are kept
        assert doc["auth_policies"] == {"namespace_auth": {"app": ["produce"]},
                                        "destination_auth": {TOPIC: {"reader": ["consume"]}}}
        await perms.revoke("acme/orders", "app")
        with pytest.raises(TopicError):
            await perms.require_topic("app", "produce", TOPIC)
    run(go())


def test_tenant_admins_and_super_users():
    async def go():
        _, perms = await _setup()
        await perms.require_tenant_admin("acme-admin", "create namespace", "acme")
        await perms.require_tenant_admin("root", "create namespace", "acme")
        with pytest.raises(TopicError) as e:
            await perms.require_tenant_admin("other-admin", "create namespace", "acme")
        assert "role 'other-admin' may not create namespace in tenant acme" in e.value.message
        assert await perms.set_tenant_admin_roles("acme", ["b", "a", "a"]) == ["a", "b"]
        assert await perms.tenant_info("acme") == ["a", "b"]
        with pytest.raises(TopicError):
            await perms.require_tenant_admin("acme-admin", "create namespace", "acme")
        with pytest.raises(TopicError) as e:
            await perms.tenant_info("nobody")
        assert e.value.status is TopicStatus.TENANT_NOT_FOUND
    run(go())


def test_refusals_change_nothing():
    async def go():
        store, perms = await _setup()
        before = await store.get("/admin/policies/acme/orders")
        for call in (perms.grant("acme/orders", "app", ["delete"]),
                     perms.grant("acme/orders", "app", "produce", topic="persistent://other/ns/t"),
                     perms.grant("acme/missing", "app", "produce")):
            with pytest.raises(TopicError) as e:
                await call
            assert e.value.status in (TopicStatus.BAD_REQUEST, TopicStatus.NAMESPACE_NOT_FOUND)
        assert await store.get("/admin/policies/acme/orders") == before
    run(go())


def test_concurrent_grants_are_all_kept():
    async def go():
        store, perms = await _setup()
        await asyncio.gather(*(perms.grant("acme/orders", f"r{i}", "consume") for i in range(6)))
        assert set((await perms.auth_policies("acme/orders")).namespace_auth) == {f"r{i}" for i in range(6)}
    run(go())
