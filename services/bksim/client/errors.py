"""The client's one exception type, `ClientError`, and how a failed gRPC call or an in-band stream error
becomes one.

`status` is always a TopicStatus name (proto/topic.proto): the broker's, taken from the trailing metadata
"bksim-status" of a refused unary call or from the in-band `Error` that ends a Produce/Subscribe stream;
when the broker did not answer (connection refused, deadline, a broken stream) the gRPC code is mapped to
the nearest TopicStatus (UNAVAILABLE -> SERVICE_UNAVAILABLE, DEADLINE_EXCEEDED -> TIMEOUT,
RESOURCE_EXHAUSTED -> TOO_MANY_REQUESTS, otherwise INTERNAL) and `from_broker` is False. The client's own
refusals (queue full, send timeout, closed objects, bad arguments) use TOO_MANY_REQUESTS, TIMEOUT and
BAD_REQUEST. `message` is the broker's text (or the client's, naming the thing).
"""
from __future__ import annotations

import grpc

from bksim.adapters.broker_client import call_error
from bksim.gen import topic_pb2
from bksim.model.errors import BksimError
from bksim.model.status import TopicStatus

STATUSES = frozenset(TopicStatus) - {TopicStatus.OK}

# gRPC code -> TopicStatus when the broker did not answer with a "bksim-status" trailer
_GRPC_TO_STATUS = {"UNAVAILABLE": TopicStatus.SERVICE_UNAVAILABLE, "DEADLINE_EXCEEDED": TopicStatus.TIMEOUT,
                   "RESOURCE_EXHAUSTED": TopicStatus.TOO_MANY_REQUESTS, "CANCELLED": TopicStatus.SERVICE_UNAVAILABLE,
                   "UNKNOWN": TopicStatus.INTERNAL, "INTERNAL": TopicStatus.INTERNAL,
                   "UNAUTHENTICATED": TopicStatus.UNAUTHENTICATED, "PERMISSION_DENIED": TopicStatus.PERMISSION_DENIED}

# What a producer or consumer survives by looking the topic up again and reconnecting.
RETRIABLE = frozenset({TopicStatus.NOT_OWNER, TopicStatus.TOPIC_FENCED, TopicStatus.SERVICE_UNAVAILABLE,
                       TopicStatus.METADATA_ERROR, TopicStatus.TOO_MANY_REQUESTS, TopicStatus.TIMEOUT})


class ClientError(BksimError):
    """A topic client call failed. `status`: a TopicStatus name; `message`: the details (the broker's text when
    it refused); `owner_address`: with NOT_OWNER, where the topic lives now ("" = unknown); `from_broker`: the
    broker refused (False: the call failed before or without its answer); `grpc_code`: the gRPC code name, if
    any."""

    def __init__(self, status: TopicStatus | str, message: str, *, owner_address: str = "",
                 from_broker: bool = False, grpc_code: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown topic status {status!r}")
        self.status = TopicStatus(status)
        self.message = message
        self.owner_address = owner_address
        self.from_broker = from_broker
        self.grpc_code = grpc_code
        super().__init__(f"{self.status}: {message}")

    @property
    def retriable(self) -> bool:
        """True when reconnecting (after a new lookup) may help. A transport-level INTERNAL counts (a grpc.aio
        stream can end that way when the broker ends it: grpc/grpc#36066); UNKNOWN (an exception in the
        broker's handler) does not."""
        return self.status in RETRIABLE or (not self.from_broker and self.grpc_code == "INTERNAL")


def from_rpc_error(e: grpc.RpcError, address: str) -> ClientError:
    """A ClientError from a failed gRPC call to the broker at `address`."""
    failed = call_error(e, address)  # reads the "bksim-status" trailer (grpc.aio and blocking calls alike)
    if failed.answered and failed.status in STATUSES:
        return ClientError(failed.status, failed.message, from_broker=True, grpc_code=failed.grpc_code)
    status = _GRPC_TO_STATUS.get(failed.grpc_code, TopicStatus.INTERNAL)
    return ClientError(status, f"{failed.grpc_code}: {failed.message}", grpc_code=failed.grpc_code)


def from_error_pb(error: topic_pb2.Error, address: str = "") -> ClientError:
    """A ClientError from the in-band Error that ends a Produce or Subscribe stream (or an AckResult/SeekResult)."""
    status = (TopicStatus(topic_pb2.TopicStatus.Name(error.status)) if error.status in topic_pb2.TopicStatus.values()
              else TopicStatus.INTERNAL)
    if status is TopicStatus.OK:
        status = TopicStatus.INTERNAL
        message = f"broker {address} sent an error with status OK: {error.message}"
    else:
        message = error.message or f"broker {address}: {status}"
    return ClientError(status, message, owner_address=error.owner_address, from_broker=True)
