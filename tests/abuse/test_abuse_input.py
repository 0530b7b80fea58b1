"""Hostile values in well-formed messages, against the real bookie and broker: messages above the frame bound,
wrong wire types, unknown fields, unknown enum values, negative and huge ids and counts. Each call gets the
precise answer written next to it (a gRPC code with a message, or a bookie status in the response), never
UNKNOWN or INTERNAL and never the bookie's "internal error"; the processes keep serving, bounded
(abuse.harness.abused)."""
from __future__ import annotations

import grpc
import pytest

from abuse.harness import BOOKIE_ENTRY_BYTES, BOOKIE_FRAME_BYTES, BROKER_FRAME_BYTES, PASSWORD, PAYLOAD_BYTES_MAX, \
    abused
from abuse.wire import UNLIMITED, call, field_bytes, field_fixed64, field_varint
from bksim.formats.entry import encode_entry, master_key
from bksim.gen import bookie_pb2, bookie_pb2_grpc, broker_pb2, broker_pb2_grpc, topic_pb2, topic_pb2_grpc

I64_MAX = 2**63 - 1
I32_MAX = 2**31 - 1
KEY = master_key(PASSWORD)
Code = grpc.StatusCode


def _code(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return Code.OK, ""


def _check(results: list[tuple[str, grpc.StatusCode, str, set]]) -> None:
    wrong = [(what, code.name, details) for what, code, details, expected in results
             if code not in expected or (code != Code.OK and not details)]
    assert not wrong, "\n".join(f"{w}: {c} {d!r}" for w, c, d in wrong)


@pytest.fixture(scope="module")
def ledger(target):
    """A ledger of the broker with 10 entries (E = Qw = Qa = 1 on the suite's bookie)."""
    conn = target.conn
    ledger_id = conn.create(1, 1, 1, PASSWORD).ledger_id
    conn.append_once(ledger_id, PASSWORD, [b"x%d" % i for i in range(10)])
    return ledger_id


def test_oversized_messages(target, ledger):
    """Above the frame bound: RESOURCE_EXHAUSTED from gRPC before the server buffers it; above the payload or
    entry bound but within the frame: the request is refused (INVALID_ARGUMENT, BAD_REQUEST)."""
    results = []
    with abused(target, "oversized messages"):
        with grpc.insecure_channel(target.bookie.address, options=UNLIMITED) as ch:
            big = field_varint(1, 1) + field_bytes(2, field_bytes(1, b"\0" * BOOKIE_FRAME_BYTES))
            code, details, _ = call(ch, "/bksim.bookie.v1.Bookie/AddEntries", True, True, [big])
            results.append(("bookie AddEntries above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            code, details, _ = call(ch, "/bksim.bookie.v1.Bookie/ReadEntries", False, False,
                                    [field_varint(1, 1) + field_bytes(4, b"k" * (BOOKIE_FRAME_BYTES + 1))])
            results.append(("bookie ReadEntries above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            stub = bookie_pb2_grpc.BookieStub(ch)
            entry = encode_entry(ledger + 10**9, 0, -1, 0, b"e" * BOOKIE_ENTRY_BYTES)  # above entry_bytes_max
            responses = list(stub.AddEntries(iter([bookie_pb2.AddRequest(
                batch_id=7, entries=[bookie_pb2.AddEntry(entry=entry, master_key=KEY)])]), timeout=10))
            assert [list(r.statuses) for r in responses] == [[bookie_pb2.BAD_REQUEST]], responses
            assert "bytes" in responses[0].message, responses[0].message
        with grpc.insecure_channel(target.broker.address, options=UNLIMITED) as ch:
            big = field_varint(1, ledger) + field_bytes(3, b"\0" * BROKER_FRAME_BYTES)
            code, details, _ = call(ch, "/bksim.broker.v1.Broker/Append", True, True, [big])
            results.append(("broker Append above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            code, details, _ = call(ch, "/bksim.topic.v1.Topics/CreateTenant", False, False,
                                    [field_bytes(1, b"t" * BROKER_FRAME_BYTES)])
            results.append(("broker CreateTenant above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            stub = broker_pb2_grpc.BrokerStub(ch)
            code, details = _code(lambda: list(stub.Append(iter([broker_pb2.AppendRequest(
                ledger_id=ledger, password=PASSWORD, payloads=[b"p" * (PAYLOAD_BYTES_MAX + 1)], request_id=1)]),
                timeout=10)))
            results.append(("broker Append payload above payload_bytes_max", code, details, {Code.INVALID_ARGUMENT}))
            code, details = _code(lambda: topic_pb2_grpc.TopicsStub(ch).CreateTenant(
                topic_pb2.CreateTenantRequest(tenant="t" * 1_000_000), timeout=10))
            results.append(("broker CreateTenant name of 1 MB", code, details, {Code.INVALID_ARGUMENT}))
    _check(results)
