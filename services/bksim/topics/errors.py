"""The topic layer's one error type: a TopicStatus name (proto/topic.proto) and a message naming the problem.

The gRPC adapter maps the status to a gRPC code and the `bksim-status` trailer; the client raises it again.
"""
from __future__ import annotations

STATUSES = ("BAD_REQUEST", "TENANT_NOT_FOUND", "NAMESPACE_NOT_FOUND", "TOPIC_NOT_FOUND", "SUBSCRIPTION_NOT_FOUND",
            "ALREADY_EXISTS", "NOT_OWNER", "TOPIC_FENCED", "CONSUMER_BUSY", "NOT_ALLOWED", "INVALID_ACK",
            "MESSAGE_TOO_LARGE", "TOO_MANY_REQUESTS", "SERVICE_UNAVAILABLE", "METADATA_ERROR", "TIMEOUT", "INTERNAL")


class TopicError(Exception):
    def __init__(self, status: str, message: str, *, owner_address: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown topic status {status!r}")
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.owner_address = owner_address  # with NOT_OWNER: where the topic lives now, when known
