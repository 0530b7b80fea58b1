"""Status codes as code: the bookie's `StatusCode` (PROTOCOL.md §2.1; values match proto/bookie.proto's
StatusCode), the ledger client's `LedgerStatus` (proto/broker.proto) and the topic layer's `TopicStatus`
(proto/topic.proto).

`LedgerStatus` and `TopicStatus` are `str`-valued: each member's value is its proto name, the text the servers
put in the "bksim-status" trailer and that log lines and JSON show, so `f"{status}"`, `status.encode()` and
`json.dumps` give the name exactly. Code compares members (`e.status is LedgerStatus.FENCED`), never strings.
"""
from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    OK = 0
    NO_LEDGER = 1  # explicit negative: this bookie never durably held the ledger
    NO_ENTRY = 2  # explicit negative: this bookie never durably held the entry
    FENCED = 3
    UNAUTHORIZED = 4
    READ_ONLY = 5
    TOO_MANY_REQUESTS = 6
    IO_ERROR = 7  # the truth is unknown (corrupt or unreadable storage): never a "no"
    BAD_REQUEST = 8
    UNKNOWN_STATE = 9  # the bookie cannot say: a ledger that may predate its format (limbo): never a "no"


# Explicit negatives: the only answers that count toward "this entry does not exist" (PROTOCOL.md §4 step 4).
EXPLICIT_NEGATIVES = frozenset({StatusCode.NO_LEDGER, StatusCode.NO_ENTRY})
# Answers to a fencing read that mean the fence is durable on the bookie. UNKNOWN_STATE is among them: a
# bookie fences a limbo ledger like any other and only declines to say whether it lacks the entry asked for.
FENCE_CONFIRMED = frozenset({StatusCode.OK, StatusCode.NO_ENTRY, StatusCode.NO_LEDGER, StatusCode.UNKNOWN_STATE})


# Add flags and read flags (bit values, shared by wire and journal).
FLAG_RECOVERY_ADD = 0x1
FLAG_FENCE = 0x1


class LedgerStatus(enum.StrEnum):
    """How a ledger operation ended (proto/broker.proto's LedgerStatus; the broker's LedgerError carries one)."""
    OK = "OK"
    BAD_REQUEST = "BAD_REQUEST"
    NOT_ENOUGH_BOOKIES = "NOT_ENOUGH_BOOKIES"
    NO_SUCH_LEDGER = "NO_SUCH_LEDGER"
    UNAUTHORIZED = "UNAUTHORIZED"
    LEDGER_CLOSED = "LEDGER_CLOSED"
    NOT_WRITER = "NOT_WRITER"
    FENCED = "FENCED"
    READ_BEYOND_LAC = "READ_BEYOND_LAC"
    READ_FAILED = "READ_FAILED"
    RECOVERY_FAILED = "RECOVERY_FAILED"
    TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"
    METADATA_ERROR = "METADATA_ERROR"
    ABORTED = "ABORTED"  # the writer gave up (broker shutting down, ledger deleted)
    INTERNAL = "INTERNAL"


class TopicStatus(enum.StrEnum):
    """How a topic operation ended (proto/topic.proto's TopicStatus; TopicError and the client's ClientError
    carry one)."""
    OK = "OK"
    BAD_REQUEST = "BAD_REQUEST"
    TENANT_NOT_FOUND = "TENANT_NOT_FOUND"
    NAMESPACE_NOT_FOUND = "NAMESPACE_NOT_FOUND"
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    SUBSCRIPTION_NOT_FOUND = "SUBSCRIPTION_NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    NOT_OWNER = "NOT_OWNER"  # another broker owns the topic (or it is being taken over): look up again
    TOPIC_FENCED = "TOPIC_FENCED"  # this broker lost the topic while serving it (CAS conflict, session expiry)
    CONSUMER_BUSY = "CONSUMER_BUSY"  # an Exclusive subscription already has a consumer
    NOT_ALLOWED = "NOT_ALLOWED"
    INVALID_ACK = "INVALID_ACK"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"  # a bounded queue is full
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"  # not enough bookies, ZooKeeper unreachable, shutting down
    METADATA_ERROR = "METADATA_ERROR"
    TIMEOUT = "TIMEOUT"
    INTERNAL = "INTERNAL"
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no token, or one that does not verify
    PERMISSION_DENIED = "PERMISSION_DENIED"  # the caller's role may not do this
    PRODUCER_BLOCKED_QUOTA_EXCEEDED = "PRODUCER_BLOCKED_QUOTA_EXCEEDED"  # backlog over a quota (producer_exception)
    CONSUMER_ASSIGN_ERROR = "CONSUMER_ASSIGN_ERROR"  # Key_Shared sticky hash ranges malformed or overlapping
