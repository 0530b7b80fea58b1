"""Malformed bytes as messages, to every method of every service of the bookie (Bookie, BookieAdmin) and the
broker (Broker, Topics): each call whose bytes the request type's parser refuses ends with INVALID_ARGUMENT
and a message naming the problem (a unary call, and a stream at its first such message), never UNKNOWN or
INTERNAL; the processes keep serving (abuse.harness.abused)."""
from __future__ import annotations

import grpc

from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from abuse.harness import abused
from abuse.wire import MALFORMED, SERVICES, UNHANDLED, call, methods


def test_malformed_bytes_to_every_method(target):
    seen = []
    with abused(target, "malformed bytes to every method"):
        for name, services in SERVICES.items():
            address = target.processes[name].address
            with grpc.insecure_channel(address) as channel:
                for service in services:
                    for method, (path, cs, ss) in zip(service.methods, methods(service)):
                        request_type = message_factory.GetMessageClass(method.input_type)
                        for what, data in MALFORMED.items():
                            try:
                                request_type.FromString(data)
                                parses = True  # e.g. field number 0 in a message without fields
                            except DecodeError:
                                parses = False
                            code, details, _ = call(channel, path, cs, ss, [data])
                            seen.append((path, what, parses, code, details))
    refused = [s for s in seen if not s[2]]
    assert len(refused) >= len(seen) - 10, f"only {len(refused)} of {len(seen)} cases are malformed"
    wrong = [s for s in refused if s[3] != grpc.StatusCode.INVALID_ARGUMENT or "malformed" not in s[4]]
    wrong += [s for s in seen if s[3] in UNHANDLED]
    assert not wrong, "\n".join(f"{p} <- {w}: {c.name} {d!r}" for p, w, _, c, d in wrong[:20])


def test_malformed_message_in_the_middle_of_a_stream(target):
    """A stream whose first messages are valid and then one is not: INVALID_ARGUMENT with a message, the
    answers to the valid ones as far as they got, and the entries they acknowledged readable."""
    from bksim.formats.entry import encode_entry, master_key
    from bksim.gen import bookie_pb2, broker_pb2, topic_pb2
    from abuse.harness import PASSWORD, new_namespace, produce
    ledger = target.conn.create(1, 1, 1, PASSWORD).ledger_id
    topic = f"persistent://{new_namespace(target)}/mid"
    produce(target, topic, 1, 10)
    garbage = MALFORMED["length past the end"]
    cases = [
        ("bookie", "/bksim.bookie.v1.Bookie/AddEntries", [bookie_pb2.AddRequest(batch_id=1, entries=[
            bookie_pb2.AddEntry(entry=encode_entry(4 * 10**12, 0, -1, 0, b"v"), master_key=master_key(PASSWORD))])]),
        ("broker", "/bksim.broker.v1.Broker/Append", [broker_pb2.AppendRequest(
            ledger_id=ledger, password=PASSWORD, payloads=[b"m0", b"m1"], request_id=1)]),
        ("broker", "/bksim.topic.v1.Topics/Produce", [topic_pb2.ProduceRequest(open=topic_pb2.ProducerOpen(
            topic=topic))]),
        ("broker", "/bksim.topic.v1.Topics/Subscribe", [topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
            topic=topic, subscription="mid")), topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=10))]),
    ]
    with abused(target, "a malformed message in the middle of a stream"):
        for name, path, valid in cases:
            with grpc.insecure_channel(target.processes[name].address) as channel:
                code, details, _ = call(channel, path, True, True,
                                        [m.SerializeToString() for m in valid] + [garbage, garbage])
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in details, (path, code, details)
    got = target.conn.read(ledger, PASSWORD, 0, -1)
    assert got in ({}, {0: b"m0", 1: b"m1"}), got  # the request before the garbage: all of it or none
