"""Backlog quotas (Pulsar's BacklogQuota and BacklogQuotaManager): the pure decisions, no I/O.

A namespace may limit each of its topics' *backlog*: the messages after the slowest durable subscription's
mark-delete position (readers and the dedup cursor hold nothing back). Two kinds, at most one quota of each:

    destination_storage   limit_bytes    the backlog's estimated bytes (each ledger's bytes spread evenly over
                                         its entries, as Pulsar's getEstimatedBacklogSize)
    message_age           limit_time_ms  now minus the publish time of the oldest unacknowledged message (the
                                         entry after the slowest mark-delete)

and one policy each:

    producer_request_hold       sends wait at the broker until the backlog is under every held limit
    producer_exception          sends fail with PRODUCER_BLOCKED_QUOTA_EXCEEDED
    consumer_backlog_eviction   the slowest subscriptions' mark-delete moves forward until the backlog is at
                                EVICTION_TARGET (90%) of the limit; what they skip is gone for them

A topic with no durable subscription has no backlog. A quota must stay below a set retention (retention_bytes
or retention_ms > 0), as Pulsar refuses one that does not ("Backlog Quota exceeds configured retention quota").
Topic (topics/topic.py) applies the decisions; TopicService stores the quotas in the namespace's policies znode.
"""
from __future__ import annotations

from dataclasses import dataclass

from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError
from bksim.topics.positions import Position

DESTINATION_STORAGE = "destination_storage"
MESSAGE_AGE = "message_age"
TYPES = (DESTINATION_STORAGE, MESSAGE_AGE)
PRODUCER_REQUEST_HOLD = "producer_request_hold"
PRODUCER_EXCEPTION = "producer_exception"
CONSUMER_BACKLOG_EVICTION = "consumer_backlog_eviction"
POLICIES = (PRODUCER_REQUEST_HOLD, PRODUCER_EXCEPTION, CONSUMER_BACKLOG_EVICTION)
EVICTION_TARGET = 0.9  # eviction brings the backlog down to 90% of the limit (Pulsar's reduction factor)


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    type: str      # DESTINATION_STORAGE or MESSAGE_AGE
    limit: int     # bytes or milliseconds, > 0
    policy: str

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise TopicError(TopicStatus.BAD_REQUEST, f"backlog quota type {self.type!r} is not one of {list(TYPES)}")
        if self.policy not in POLICIES:
            raise TopicError(TopicStatus.BAD_REQUEST,
                             f"backlog quota policy {self.policy!r} is not one of {list(POLICIES)}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit <= 0:
            unit = "bytes" if self.type == DESTINATION_STORAGE else "ms"
            raise TopicError(TopicStatus.BAD_REQUEST, f"backlog quota {self.type}: the limit must be > 0 {unit}, "
                                                      f"not {self.limit!r}")

    def describe(self) -> str:
        limit = f"{self.limit} bytes" if self.type == DESTINATION_STORAGE else f"{self.limit} ms"
        return f"{self.type} {limit} ({self.policy})"

    def to_json(self) -> dict:
        key = "limit_bytes" if self.type == DESTINATION_STORAGE else "limit_time_ms"
        return {key: self.limit, "policy": self.policy}

    @staticmethod
    def from_json(kind: str, d: dict) -> "BacklogQuota":
        key = "limit_bytes" if kind == DESTINATION_STORAGE else "limit_time_ms"
        return BacklogQuota(kind, int(d[key]), str(d["policy"]))


def quotas_from_json(d: dict | None) -> tuple[BacklogQuota, ...]:
    """The policies znode's "backlog_quota_map" {type: {limit_bytes|limit_time_ms, policy}}, in TYPES order."""
    d = d or {}
    return tuple(BacklogQuota.from_json(kind, d[kind]) for kind in TYPES if kind in d)


def quotas_to_json(quotas: tuple[BacklogQuota, ...]) -> dict:
    return {q.type: q.to_json() for q in quotas}


def check_against_retention(quota: BacklogQuota, retention_ms: int, retention_bytes: int) -> None:
    """BAD_REQUEST when the quota is not below the namespace's set retention of the same kind."""
    if quota.type == DESTINATION_STORAGE and retention_bytes > 0 and quota.limit >= retention_bytes:
        raise TopicError(TopicStatus.BAD_REQUEST,
                         f"backlog quota {quota.describe()} exceeds the namespace's retention of {retention_bytes} "
                         f"bytes: the quota must be below the retention (increase the retention and retry)")
    if quota.type == MESSAGE_AGE and retention_ms > 0 and quota.limit >= retention_ms:
        raise TopicError(TopicStatus.BAD_REQUEST,
                         f"backlog quota {quota.describe()} exceeds the namespace's retention of {retention_ms} "
                         f"ms: the quota must be below the retention (increase the retention and retry)")


def with_quota(quotas: tuple[BacklogQuota, ...], quota: BacklogQuota) -> tuple[BacklogQuota, ...]:
    """`quotas` with `quota` replacing the one of its type."""
    return tuple(sorted([q for q in quotas if q.type != quota.type] + [quota], key=lambda q: TYPES.index(q.type)))


def without_quota(quotas: tuple[BacklogQuota, ...], kind: str) -> tuple[BacklogQuota, ...]:
    if kind not in TYPES:
        raise TopicError(TopicStatus.BAD_REQUEST, f"backlog quota type {kind!r} is not one of {list(TYPES)}")
    return tuple(q for q in quotas if q.type != kind)


# ---- the backlog and the decisions ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LedgerSpan:
    """One ledger of a managed ledger as the estimate needs it: its entries and their payload bytes."""
    ledger_id: int
    entries: int
    size: int


def backlog_bytes(ledgers: list[LedgerSpan], mark_delete: Position) -> int:
    """Estimated bytes of the entries after `mark_delete` (each ledger's bytes spread evenly over its entries)."""
    total = 0
    for span in ledgers:
        if span.entries <= 0 or span.ledger_id < mark_delete.ledger:
            continue
        after = span.entries if span.ledger_id > mark_delete.ledger else span.entries - (mark_delete.entry + 1)
        if after > 0:
            total += span.size if after == span.entries else span.size * after // span.entries
    return total


def breached(quotas: tuple[BacklogQuota, ...], size_bytes: int, oldest_age_ms: int | None) -> list[BacklogQuota]:
    """The quotas the backlog is over (a backlog exactly at a limit is not over it)."""
    out = []
    for q in quotas:
        if q.type == DESTINATION_STORAGE and size_bytes > q.limit:
            out.append(q)
        elif q.type == MESSAGE_AGE and oldest_age_ms is not None and oldest_age_ms > q.limit:
            out.append(q)
    return out


def size_eviction_mark_delete(ledgers: list[LedgerSpan], mark_delete: Position, limit_bytes: int) -> Position | None:
    """The mark-delete position the slowest subscriptions move to so that the estimated backlog after it is at
    most EVICTION_TARGET x `limit_bytes`: the newest entries that fit stay, the older ones are skipped. None when
    the backlog after `mark_delete` already fits."""
    target = int(limit_bytes * EVICTION_TARGET)
    if backlog_bytes(ledgers, mark_delete) <= target:
        return None
    kept = 0.0
    for span in reversed(ledgers):  # from the newest entry backwards, keep what fits in the target
        if span.entries <= 0 or span.ledger_id < mark_delete.ledger:
            continue
        first = 0 if span.ledger_id > mark_delete.ledger else mark_delete.entry + 1
        available = span.entries - first
        per_entry = span.size / span.entries
        fit = available if per_entry <= 0 else min(available, int((target - kept) // per_entry))
        if fit < available:
            return Position(span.ledger_id, span.entries - 1 - fit)  # mark-delete here: the `fit` after it stay
        kept += available * per_entry
    return None


def age_eviction_cutoff_ms(now_ms: int, limit_time_ms: int) -> int:
    """Messages published before this are skipped by message_age eviction (the backlog's oldest message is then
    at most EVICTION_TARGET x the limit old)."""
    return now_ms - int(limit_time_ms * EVICTION_TARGET)
