"""Authorization at brokers, Pulsar's model (PROTOCOL.md §8): pure decisions over roles, tenant admins and grants.

    super-user roles (security.super_user_roles)   anything: create tenants, set tenant admins, every topic,
                                                   the raw ledger API
    tenant admin roles (the tenant's adminRoles)   namespaces, topics, grants and stats inside that tenant, and
                                                   produce/consume there
    grants (a namespace's auth_policies)           produce / consume on every topic of a namespace
                                                   (namespace_auth) or on one topic (destination_auth; a grant
                                                   on a partitioned topic covers its partitions)
    ledger roles (security.ledger_roles)           the raw ledger API (Broker service), besides super-users

Everything else is denied: a grant in one tenant gives nothing in another. Stored form (JSON, the "auth_policies"
key of the namespace policies znode, as Pulsar keeps it):

    {"namespace_auth": {ROLE: ["consume", "produce"]},
     "destination_auth": {"persistent://t/ns/topic": {ROLE: ["produce"]}}}

The tenant znode holds {"adminRoles": [ROLE, ...]} (Pulsar's TenantInfo). This module reads no store and no
clock: security/permissions.py loads the documents and asks here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bksim.model.errors import BksimError

ACTIONS = ("produce", "consume")
ROLE_CHARS_MAX = 256
GRANTS_PER_NAMESPACE_MAX = 10_000  # roles in namespace_auth plus (topic, role) pairs in destination_auth


class PermissionDenied(BksimError):
    """A role may not do an action; the message names the role, the action and the resource."""

    def __init__(self, role: str, action: str, resource: str, why: str) -> None:
        super().__init__(f"role {role!r} may not {action} {resource}: {why}")
        self.role = role
        self.action = action
        self.message = str(self)


class GrantError(BksimError):
    """A grant that cannot be stored: unknown action, bad role, too many grants."""


def parse_roles(text: str) -> frozenset[str]:
    """'a, b,c' -> {'a', 'b', 'c'} (empty items dropped)."""
    return frozenset(r.strip() for r in text.split(",") if r.strip())


def parse_actions(items) -> frozenset[str]:
    """'produce,consume' or ['produce'] -> the actions; GrantError for an unknown or no action."""
    if isinstance(items, str):
        items = items.split(",")
    actions = frozenset(a.strip() for a in items if a.strip())
    unknown = sorted(actions - set(ACTIONS))
    if unknown or not actions:
        raise GrantError(f"actions must be one or more of {', '.join(ACTIONS)}"
                         + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    return actions


def check_role(role: str) -> str:
    if not isinstance(role, str) or not role.strip() or len(role) > ROLE_CHARS_MAX or role != role.strip():
        raise GrantError(f"a role must be 1-{ROLE_CHARS_MAX} characters without surrounding spaces")
    return role


@dataclass(frozen=True, slots=True)
class AuthPolicies:
    """The grants of one namespace."""
    namespace_auth: dict[str, frozenset[str]] = field(default_factory=dict)
    destination_auth: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)

    @staticmethod
    def from_json(d: dict | None) -> "AuthPolicies":
        d = d or {}
        return AuthPolicies(
            {str(r): frozenset(a) & frozenset(ACTIONS) for r, a in (d.get("namespace_auth") or {}).items()},
            {str(t): {str(r): frozenset(a) & frozenset(ACTIONS) for r, a in roles.items()}
             for t, roles in (d.get("destination_auth") or {}).items()})

    def to_json(self) -> dict:
        return {"namespace_auth": {r: sorted(a) for r, a in sorted(self.namespace_auth.items())},
                "destination_auth": {t: {r: sorted(a) for r, a in sorted(roles.items())}
                                     for t, roles in sorted(self.destination_auth.items())}}

    def actions_of(self, role: str, topics: tuple[str, ...]) -> frozenset[str]:
        """What `role` may do on a topic known by `topics` (its name, and its partitioned base name)."""
        out = self.namespace_auth.get(role, frozenset())
        for t in topics:
            out = out | self.destination_auth.get(t, {}).get(role, frozenset())
        return out

    def size(self) -> int:
        return len(self.namespace_auth) + sum(len(r) for r in self.destination_auth.values())


def grant(policies: AuthPolicies, role: str, actions, topic: str = "") -> AuthPolicies:
    """`policies` with `actions` granted to `role` on the namespace (topic "") or on one topic. A grant replaces
    the role's earlier actions at the same level (as Pulsar's grant-permission does)."""
    check_role(role)
    acts = parse_actions(actions)
    ns_auth = dict(policies.namespace_auth)
    dest = {t: dict(r) for t, r in policies.destination_auth.items()}
    if topic:
        dest.setdefault(topic, {})[role] = acts
    else:
        ns_auth[role] = acts
    out = AuthPolicies(ns_auth, dest)
    if out.size() > GRANTS_PER_NAMESPACE_MAX:
        raise GrantError(f"more than {GRANTS_PER_NAMESPACE_MAX} grants in one namespace")
    return out


def revoke(policies: AuthPolicies, role: str, topic: str = "") -> AuthPolicies:
    """`policies` without `role`'s grant on the namespace (topic "") or on one topic (absent: unchanged)."""
    ns_auth = dict(policies.namespace_auth)
    dest = {t: dict(r) for t, r in policies.destination_auth.items()}
    if topic:
        dest.get(topic, {}).pop(role, None)
        if topic in dest and not dest[topic]:
            del dest[topic]
    else:
        ns_auth.pop(role, None)
    return AuthPolicies(ns_auth, dest)


@dataclass(frozen=True, slots=True)
class Authorizer:
    """The decisions; each `require_*` returns None or raises PermissionDenied."""
    super_user_roles: frozenset[str] = frozenset()
    ledger_roles: frozenset[str] = frozenset()

    def is_super_user(self, role: str) -> bool:
        return role in self.super_user_roles

    def require_super_user(self, role: str, action: str, resource: str) -> None:
        if not self.is_super_user(role):
            raise PermissionDenied(role, action, resource, "only a super-user may (security.super_user_roles)")

    def is_tenant_admin(self, role: str, admin_roles) -> bool:
        return self.is_super_user(role) or role in admin_roles

    def require_tenant_admin(self, role: str, action: str, tenant: str, admin_roles, resource: str = "") -> None:
        if not self.is_tenant_admin(role, admin_roles):
            raise PermissionDenied(role, action, resource or f"in tenant {tenant}",
                                   f"it is not an admin role of tenant {tenant} nor a super-user")

    def require_topic(self, role: str, action: str, topic_names: tuple[str, ...], admin_roles,
                      policies: AuthPolicies) -> None:
        """`action` (produce / consume / lookup: either of them) on a topic known by `topic_names` (the topic
        first, then its partitioned base name)."""
        if self.is_tenant_admin(role, admin_roles):
            return
        allowed = policies.actions_of(role, topic_names)
        ok = bool(allowed) if action == "lookup" else action in allowed
        if not ok:
            raise PermissionDenied(role, action, f"on {topic_names[0]}",
                                   f"no {'produce or consume' if action == 'lookup' else action} grant on the "
                                   f"topic or its namespace")

    def require_ledger_api(self, role: str, method: str) -> None:
        if not (self.is_super_user(role) or role in self.ledger_roles):
            raise PermissionDenied(role, "use", f"the ledger API ({method})",
                                   "only super-users and security.ledger_roles may")
