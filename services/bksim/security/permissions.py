"""Where authorization meets ZooKeeper: tenant admin roles and namespace grants, read and changed through the
metadata store port, decided by security/authz.py (PROTOCOL.md §8).

    /admin/tenants/<tenant>           {"adminRoles": [ROLE, ...]}              (Pulsar's TenantInfo)
    /admin/policies/<tenant>/<ns>     {..., "auth_policies": {"namespace_auth": ..., "destination_auth": ...}}

Changes are compare-and-set on the znode's version (re-read and re-apply on BadVersion, at most CAS_TRIES_MAX
times), so a grant never overwrites a concurrent policy change. Every check reads ZooKeeper (no cache): a revoke
is seen by the next call on every broker. A stream checks once, when it opens (as Pulsar checks when a producer
or consumer is created); a revoke does not end open streams.
"""
from __future__ import annotations

import json

from bksim.model.errors import BadVersionError, MetadataError, NoNodeError
from bksim.model.status import TopicStatus
from bksim.ports.metadata import MetadataStore
from bksim.security.authz import (AuthPolicies, Authorizer, GrantError, PermissionDenied, check_role, grant,
                                  revoke)
from bksim.topics.errors import TopicError, znode_object
from bksim.topics.names import TopicName, check_name, parse_namespace, policies_path, tenant_path

CAS_TRIES_MAX = 8
ADMIN_ROLES_KEY = "adminRoles"
AUTH_POLICIES_KEY = "auth_policies"
ADMIN_ROLES_MAX = 256


def _meta(what: str, e: MetadataError) -> TopicError:
    return TopicError(TopicStatus.METADATA_ERROR, f"{what}: {e}")


def denied(e: PermissionDenied) -> TopicError:
    return TopicError(TopicStatus.PERMISSION_DENIED, e.message)


def check_admin_roles(roles) -> list[str]:
    try:
        out = sorted({check_role(r) for r in roles})
    except GrantError as e:
        raise TopicError(TopicStatus.BAD_REQUEST, f"admin roles: {e}") from None
    if len(out) > ADMIN_ROLES_MAX:
        raise TopicError(TopicStatus.BAD_REQUEST, f"more than {ADMIN_ROLES_MAX} admin roles")
    return out


class Permissions:
    """Checks (each raises TopicError PERMISSION_DENIED naming role and action) and changes of grants."""

    def __init__(self, store: MetadataStore, authorizer: Authorizer) -> None:
        self.store = store
        self.authorizer = authorizer

    # ---- reading ---------------------------------------------------------------------------------------------
    async def _json(self, path: str, what: str) -> tuple[dict, int] | None:
        try:
            data, version = await self.store.get(path)
        except NoNodeError:
            return None
        except MetadataError as e:
            raise _meta(f"reading {what}", e) from None
        return znode_object(data, path), version

    async def tenant_admin_roles(self, tenant: str) -> frozenset[str]:
        """The admin roles of `tenant` (none when it does not exist)."""
        found = await self._json(tenant_path(check_name("tenant", tenant)), f"tenant {tenant}")
        return frozenset(map(str, found[0].get(ADMIN_ROLES_KEY) or ())) if found else frozenset()

    async def tenant_info(self, tenant: str) -> list[str]:
        """The admin roles of an existing tenant; TENANT_NOT_FOUND otherwise."""
        found = await self._json(tenant_path(check_name("tenant", tenant)), f"tenant {tenant}")
        if found is None:
            raise TopicError(TopicStatus.TENANT_NOT_FOUND, f"tenant {tenant} does not exist")
        return sorted(map(str, found[0].get(ADMIN_ROLES_KEY) or ()))

    async def auth_policies(self, namespace: str) -> AuthPolicies:
        tenant, ns = parse_namespace(namespace)
        found = await self._json(policies_path(tenant, ns), f"namespace {namespace}")
        return AuthPolicies.from_json(found[0].get(AUTH_POLICIES_KEY)) if found else AuthPolicies()

    # ---- checks ------------------------------------------------------------------------------------------------
    def require_super_user(self, role: str, action: str, resource: str) -> None:
        try:
            self.authorizer.require_super_user(role, action, resource)
        except PermissionDenied as e:
            raise denied(e) from None

    async def require_tenant_admin(self, role: str, action: str, tenant: str) -> None:
        if self.authorizer.is_super_user(role):
            return
        check_name("tenant", tenant)
        try:
            self.authorizer.require_tenant_admin(role, action, tenant, await self.tenant_admin_roles(tenant))
        except PermissionDenied as e:
            raise denied(e) from None

    async def require_namespace_admin(self, role: str, action: str, namespace: str) -> None:
        tenant, _ = parse_namespace(namespace)
        await self.require_tenant_admin(role, action, tenant)

    async def require_topic_admin(self, role: str, action: str, topic: str) -> None:
        await self.require_tenant_admin(role, action, TopicName.parse(topic).tenant)

    async def require_topic(self, role: str, action: str, topic: str) -> None:
        """produce / consume / lookup (either) on `topic`."""
        if self.authorizer.is_super_user(role):
            return
        name = TopicName.parse(topic)
        names = (str(name), str(name.base)) if name.base != name else (str(name),)
        admins = await self.tenant_admin_roles(name.tenant)
        policies = AuthPolicies() if role in admins else await self.auth_policies(name.ns)
        try:
            self.authorizer.require_topic(role, action, names, admins, policies)
        except PermissionDenied as e:
            raise denied(e) from None

    # ---- changes -------------------------------------------------------------------------------------------
    async def _update(self, path: str, what: str, missing: TopicError, change) -> dict:
        """Apply `change(doc) -> doc` to the JSON document at `path` by compare-and-set; the new document."""
        for _ in range(CAS_TRIES_MAX):
            found = await self._json(path, what)
            if found is None:
                raise missing
            doc, version = found
            doc = change(dict(doc))
            try:
                await self.store.set(path, json.dumps(doc, sort_keys=True).encode(), version)
                return doc
            except BadVersionError:
                continue
            except NoNodeError:
                raise missing from None
            except MetadataError as e:
                raise _meta(f"changing {what}", e) from None
        raise TopicError(TopicStatus.METADATA_ERROR, f"{what}: {CAS_TRIES_MAX} concurrent changes in a row; try again")

    async def set_tenant_admin_roles(self, tenant: str, roles) -> list[str]:
        check_name("tenant", tenant)
        roles = check_admin_roles(roles)

        def change(doc: dict) -> dict:
            doc[ADMIN_ROLES_KEY] = roles
            return doc
        await self._update(tenant_path(tenant), f"tenant {tenant}",
                           TopicError(TopicStatus.TENANT_NOT_FOUND, f"tenant {tenant} does not exist"), change)
        return roles

    def _topic_in(self, namespace: str, topic: str) -> str:
        if not topic:
            return ""
        name = TopicName.parse(topic)
        if name.ns != namespace:
            raise TopicError(TopicStatus.BAD_REQUEST, f"topic {topic} is not in namespace {namespace}")
        return str(name)

    async def _change_grants(self, namespace: str, change) -> AuthPolicies:
        tenant, ns = parse_namespace(namespace)
        out: list[AuthPolicies] = []

        def apply(doc: dict) -> dict:
            try:
                policies = change(AuthPolicies.from_json(doc.get(AUTH_POLICIES_KEY)))
            except GrantError as e:
                raise TopicError(TopicStatus.BAD_REQUEST, str(e)) from None
            doc[AUTH_POLICIES_KEY] = policies.to_json()
            out[:] = [policies]
            return doc
        await self._update(policies_path(tenant, ns), f"namespace {namespace}",
                           TopicError(TopicStatus.NAMESPACE_NOT_FOUND, f"namespace {namespace} does not exist"),
                           apply)
        return out[0]

    async def grant(self, namespace: str, role: str, actions, topic: str = "") -> AuthPolicies:
        topic = self._topic_in(namespace, topic)
        return await self._change_grants(namespace, lambda p: grant(p, role, actions, topic))

    async def revoke(self, namespace: str, role: str, topic: str = "") -> AuthPolicies:
        topic = self._topic_in(namespace, topic)
        return await self._change_grants(namespace, lambda p: revoke(p, role, topic))
