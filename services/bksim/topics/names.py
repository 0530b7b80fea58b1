"""Topic names and where the topic layer keeps things in ZooKeeper (PROTOCOL.md §3, §5).

    persistent://<tenant>/<namespace>/<local name>         a topic; a partition is <local name>-partition-<i>

    /admin/tenants/<tenant>                                  {"adminRoles": [role, ...]}
    /admin/policies/<tenant>/<ns>                            namespace policies (retention, TTL, dedup) and
                                                             grants ("auth_policies", security/permissions.py)
    /admin/partitioned-topics/<tenant>/<ns>/persistent/<t>   {"partitions": N}
    /managed-ledgers/<tenant>/<ns>/persistent/<t>            managed ledger (ledger list, properties)
    /managed-ledgers/<tenant>/<ns>/persistent/<t>/<cursor>   cursor (cursor ledger id, mark-delete, ...)
    /ownership/<tenant>/<ns>/<t>                             ephemeral owner of a topic (one per partition)

Tenant, namespace and local names are restricted to [A-Za-z0-9_.=-] (1..128 characters) so they are safe as
znode names; subscription names become cursor znode names through URL quoting.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from bksim.topics.errors import TopicError
from bksim.model.status import TopicStatus

SCHEME = "persistent://"
PARTITION_SUFFIX = "-partition-"
PARTITIONS_MAX = 10_000
_NAME = re.compile(r"^[A-Za-z0-9_.=-]{1,128}$")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>[0-9]+)$")

ADMIN_ROOT = "/admin"
TENANTS_ROOT = "/admin/tenants"
POLICIES_ROOT = "/admin/policies"
PARTITIONED_ROOT = "/admin/partitioned-topics"
MANAGED_LEDGERS_ROOT = "/managed-ledgers"
OWNERSHIP_ROOT = "/ownership"


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise TopicError(TopicStatus.BAD_REQUEST, f"{kind} name {name!r} is not valid: use 1-128 of [A-Za-z0-9_.=-]")
    return name


def parse_namespace(text: str) -> tuple[str, str]:
    """'tenant/ns' -> (tenant, ns)."""
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 2:
        raise TopicError(TopicStatus.BAD_REQUEST, f"namespace {text!r} is not of the form 'tenant/namespace'")
    return check_name("tenant", parts[0]), check_name("namespace", parts[1])


@dataclass(frozen=True, slots=True)
class TopicName:
    tenant: str
    namespace: str
    local: str  # includes the -partition-<i> suffix for a partition

    @staticmethod
    def parse(text: str) -> "TopicName":
        if not isinstance(text, str) or not text.startswith(SCHEME):
            raise TopicError(TopicStatus.BAD_REQUEST,
                             f"topic {text!r} must look like persistent://tenant/namespace/topic")
        parts = text[len(SCHEME):].split("/")
        if len(parts) != 3:
            raise TopicError(TopicStatus.BAD_REQUEST,
                             f"topic {text!r} must look like persistent://tenant/namespace/topic")
        name = TopicName(check_name("tenant", parts[0]), check_name("namespace", parts[1]), check_name("topic", parts[2]))
        if name.partition_index is not None and name.partition_index >= PARTITIONS_MAX:
            raise TopicError(TopicStatus.BAD_REQUEST, f"topic {text!r}: partition index beyond {PARTITIONS_MAX - 1}")
        return name

    def __str__(self) -> str:
        return f"{SCHEME}{self.tenant}/{self.namespace}/{self.local}"

    @property
    def ns(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int | None:
        m = _PARTITION.match(self.local)
        return int(m.group("index")) if m else None

    @property
    def base(self) -> "TopicName":
        """The partitioned topic a partition belongs to (itself for a non-partition)."""
        m = _PARTITION.match(self.local)
        return TopicName(self.tenant, self.namespace, m.group("base")) if m else self

    def partition(self, index: int) -> "TopicName":
        return TopicName(self.tenant, self.namespace, f"{self.local}{PARTITION_SUFFIX}{index}")

    # ---- ZooKeeper paths ----
    @property
    def managed_ledger_path(self) -> str:
        return f"{MANAGED_LEDGERS_ROOT}/{self.tenant}/{self.namespace}/persistent/{self.local}"

    @property
    def partitioned_path(self) -> str:
        return f"{PARTITIONED_ROOT}/{self.tenant}/{self.namespace}/persistent/{self.local}"

    @property
    def ownership_path(self) -> str:
        return f"{OWNERSHIP_ROOT}/{self.tenant}/{self.namespace}/{self.local}"

    def cursor_path(self, subscription: str) -> str:
        return f"{self.managed_ledger_path}/{cursor_node(subscription)}"


def cursor_node(subscription: str) -> str:
    if not isinstance(subscription, str) or not 1 <= len(subscription) <= 256:
        raise TopicError(TopicStatus.BAD_REQUEST, f"subscription name {subscription!r} must be 1-256 characters")
    return urllib.parse.quote(subscription, safe="")


def subscription_of(node: str) -> str:
    return urllib.parse.unquote(node)


def tenant_path(tenant: str) -> str:
    return f"{TENANTS_ROOT}/{tenant}"


def policies_path(tenant: str, namespace: str) -> str:
    return f"{POLICIES_ROOT}/{tenant}/{namespace}"


def namespace_managed_ledgers(tenant: str, namespace: str) -> str:
    return f"{MANAGED_LEDGERS_ROOT}/{tenant}/{namespace}/persistent"


def namespace_partitioned(tenant: str, namespace: str) -> str:
    return f"{PARTITIONED_ROOT}/{tenant}/{namespace}/persistent"
