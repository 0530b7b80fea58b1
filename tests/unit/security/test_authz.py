"""Authorization decisions (security/authz.py): super-users, tenant admins, namespace and topic grants."""
from __future__ import annotations

import pytest

from bksim.security.authz import (AuthPolicies, Authorizer, GrantError, PermissionDenied, grant, parse_actions,
                                  parse_roles, revoke)

AUTHZ = Authorizer(super_user_roles=frozenset({"root"}), ledger_roles=frozenset({"ledgers"}))
T = ("persistent://t/ns/topic",)
P = ("persistent://t/ns/topic-partition-0", "persistent://t/ns/topic")


def test_super_user_and_tenant_admins():
    AUTHZ.require_super_user("root", "create", "tenant t")
    with pytest.raises(PermissionDenied, match="role 'alice' may not create tenant t"):
        AUTHZ.require_super_user("alice", "create", "tenant t")
    AUTHZ.require_tenant_admin("alice", "create namespace", "t", {"alice"})
    AUTHZ.require_tenant_admin("root", "create namespace", "t", set())
    with pytest.raises(PermissionDenied, match="not an admin role of tenant t"):
        AUTHZ.require_tenant_admin("bob", "create namespace", "t", {"alice"})


def test_namespace_grant_allows_only_its_actions():
    p = grant(AuthPolicies(), "app", "produce")
    AUTHZ.require_topic("app", "produce", T, set(), p)
    AUTHZ.require_topic("app", "lookup", T, set(), p)
    with pytest.raises(PermissionDenied) as e:
        AUTHZ.require_topic("app", "consume", T, set(), p)
    assert e.value.role == "app" and e.value.action == "consume"
    with pytest.raises(PermissionDenied):
        AUTHZ.require_topic("other", "lookup", T, set(), p)


def test_topic_grant_covers_its_partitions_only():
    p = grant(AuthPolicies(), "reader", ["consume"], topic=T[0])
    AUTHZ.require_topic("reader", "consume", P, set(), p)
    with pytest.raises(PermissionDenied):
        AUTHZ.require_topic("reader", "consume", ("persistent://t/ns/another",), set(), p)


def test_tenant_admin_may_produce_and_consume_in_its_tenant():
    AUTHZ.require_topic("admin", "produce", T, {"admin"}, AuthPolicies())


def test_revoke_and_json_round_trip():
    p = grant(grant(AuthPolicies(), "a", "produce,consume"), "b", "consume", topic=T[0])
    assert AuthPolicies.from_json(p.to_json()) == p
    assert p.to_json() == {"namespace_auth": {"a": ["consume", "produce"]},
                           "destination_auth": {T[0]: {"b": ["consume"]}}}
    q = revoke(revoke(p, "a"), "b", topic=T[0])
    assert q.to_json() == {"namespace_auth": {}, "destination_auth": {}}
    with pytest.raises(PermissionDenied):
        AUTHZ.require_topic("a", "produce", T, set(), q)


def test_bad_grants():
    with pytest.raises(GrantError, match="unknown: delete"):
        parse_actions("produce,delete")
    with pytest.raises(GrantError):
        parse_actions("")
    with pytest.raises(GrantError):
        grant(AuthPolicies(), " ", "produce")


def test_ledger_api():
    AUTHZ.require_ledger_api("root", "CreateLedger")
    AUTHZ.require_ledger_api("ledgers", "CreateLedger")
    with pytest.raises(PermissionDenied, match="role 'app' may not use the ledger API"):
        AUTHZ.require_ledger_api("app", "CreateLedger")


def test_parse_roles():
    assert parse_roles(" a, b,,c ") == {"a", "b", "c"} and parse_roles("") == frozenset()
