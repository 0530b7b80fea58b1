"""The topic layer's one error type: a TopicStatus (proto/topic.proto) and a message naming the problem.

The gRPC adapter maps the status to a gRPC code and the `bksim-status` trailer; the client raises it again.
"""
from __future__ import annotations

import json

from bksim.model.errors import BksimError
from bksim.model.status import TopicStatus


class TopicError(BksimError):
    def __init__(self, status: TopicStatus | str, message: str, *, owner_address: str = "") -> None:
        try:
            status = TopicStatus(status)
        except ValueError:
            raise ValueError(f"unknown topic status {status!r}") from None
        if status is TopicStatus.OK:
            raise ValueError(f"a TopicError needs a failure status, not OK ({message})")
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.owner_address = owner_address  # with NOT_OWNER: where the topic lives now, when known


def znode_object(data: bytes | None, path: str) -> dict:
    """A znode's JSON object ({} for an empty node); METADATA_ERROR naming the path when it is not one (not
    JSON, nested too deep, an integer of thousands of digits, an array)."""
    try:
        doc = json.loads(data or b"{}")
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, int() digits: ValueErrors
        raise TopicError(TopicStatus.METADATA_ERROR, f"{path}: not JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise TopicError(TopicStatus.METADATA_ERROR, f"{path}: not a JSON object")
    return doc
