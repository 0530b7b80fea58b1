"""How the client classifies a failed gRPC call to a broker (client/errors.py): a status the broker sent (the
"bksim-status" trailer) is the broker's refusal; a gRPC code with no trailer is the transport's, and a
transport-level INTERNAL (grpc.aio's "Internal error from Core" when a stream write races the connection
breaking, grpc/grpc#36066) is worth a reconnect."""
from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata

from bksim.adapters.broker_client import STATUS_KEY, call_error
from bksim.client.errors import from_rpc_error

ADDRESS = "127.0.0.1:1"


def rpc_error(code: grpc.StatusCode, details: str, trailer: str | None = None) -> AioRpcError:
    trailing = Metadata((STATUS_KEY, trailer)) if trailer is not None else Metadata()
    return AioRpcError(code, Metadata(), trailing, details)


def test_an_internal_error_of_the_transport_is_retriable_and_not_the_brokers():
    e = from_rpc_error(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"), ADDRESS)
    assert (e.status, e.grpc_code, e.from_broker, e.retriable) == ("INTERNAL", "INTERNAL", False, True), e
    assert not call_error(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"), ADDRESS).from_broker


def test_an_internal_error_the_broker_sent_is_final():
    e = from_rpc_error(rpc_error(grpc.StatusCode.INTERNAL, "a bug", trailer="INTERNAL"), ADDRESS)
    assert (e.status, e.from_broker, e.retriable) == ("INTERNAL", True, False), e


def test_the_brokers_refusals_and_the_transports_unavailability():
    e = from_rpc_error(rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "not mine", trailer="NOT_OWNER"), ADDRESS)
    assert (e.status, e.from_broker, e.retriable) == ("NOT_OWNER", True, True), e
    e = from_rpc_error(rpc_error(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer"), ADDRESS)
    assert (e.status, e.from_broker, e.retriable) == ("SERVICE_UNAVAILABLE", False, True), e
    e = from_rpc_error(rpc_error(grpc.StatusCode.UNKNOWN, "Exception calling application"), ADDRESS)
    assert (e.status, e.retriable) == ("INTERNAL", False), e
