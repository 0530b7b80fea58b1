"""Hostile consumers on the broker's Subscribe stream (topic.proto): Flow permits of 2^31-1, zero and negative,
acks of message ids never delivered or that do not exist, unknown enum values, requests after the stream
ended, and a consumer that never reads. Each refusal is precise (an in-band Error with its TopicStatus, then
INVALID_ARGUMENT; an AckResult error for an ack that asked for one); the messages produced before and during
are all there afterwards for a fresh subscription (abuse.harness.consume_all), and the broker keeps serving,
bounded (abuse.harness.abused)."""
from __future__ import annotations

import uuid

import grpc

from abuse.harness import SyncStream, abused, consume_all, new_namespace, produce
from bksim.gen import topic_pb2, topic_pb2_grpc

I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1


def _subscribe(ch, topic: str, **open_fields) -> SyncStream:
    stream = SyncStream(topic_pb2_grpc.TopicsStub(ch).Subscribe)
    stream.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
        topic=topic, subscription=open_fields.pop("subscription", f"s-{uuid.uuid4().hex[:6]}"), **open_fields)))
    return stream


def _next(stream: SyncStream):
    """The next response other than an ActiveConsumerChange (sent to Exclusive and Failover consumers)."""
    while True:
        r = stream.read()
        if r.WhichOneof("kind") != "active_change":
            return r


def _ended(stream: SyncStream, status: str, code=grpc.StatusCode.INVALID_ARGUMENT) -> str:
    """The stream ends with an in-band Error of `status`, then gRPC `code`; returns the error message."""
    responses, got_code, details = stream.rest()
    errors = [r.error for r in responses if r.WhichOneof("kind") == "error"]
    assert errors and topic_pb2.TopicStatus.Name(errors[-1].status) == status, (responses, got_code, details)
    assert got_code == code and details, (got_code, details)
    return details


def test_hostile_flow_acks_and_enums(target):
    ns = new_namespace(target)
    topic = f"persistent://{ns}/t"
    acked = produce(target, topic, 50, 100)
    ledger, entry = min(acked)
    with abused(target, "hostile flow, acks and enum values"):
        with grpc.insecure_channel(target.broker.address) as ch:
            for permits in (I32_MAX, 0, -1, -I32_MAX - 1):
                stream = _subscribe(ch, topic)
                assert stream.read().WhichOneof("kind") == "subscribed"
                stream.send(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=permits)))
                assert "permits" in _ended(stream, "BAD_REQUEST")
            # acks of ids never delivered, each answered in an AckResult (request_id set); the stream goes on
            stream = _subscribe(ch, topic, initial_position=topic_pb2.EARLIEST)
            assert stream.read().WhichOneof("kind") == "subscribed"
            bad = [(-1, -1, -1, 0), (ledger, I64_MAX, -1, 0), (I64_MAX, 0, -1, 0), (ledger, -5, -1, 0),
                   (ledger, entry, I32_MAX, I32_MAX), (ledger, entry, -7, 3), (ledger, entry, 5, 3)]
            for request_id, (l, e, bi, bs) in enumerate(bad, start=1):
                stream.send(topic_pb2.ConsumeRequest(ack=topic_pb2.Ack(request_id=request_id, ids=[
                    topic_pb2.AckId(ledger_id=l, entry_id=e, batch_index=bi, batch_size=bs)])))
            results = {}
            while len(results) < len(bad):
                r = _next(stream)
                assert r.WhichOneof("kind") == "ack_result", r
                results[r.ack_result.request_id] = r.ack_result.error
            wrong = {bad[i - 1]: (topic_pb2.TopicStatus.Name(e.status), e.message) for i, e in results.items()
                     if e.status != topic_pb2.INVALID_ACK or not e.message}
            assert not wrong, wrong
            # an ack without request_id that fails ends the stream (nobody to answer otherwise)
            stream.send(topic_pb2.ConsumeRequest(ack=topic_pb2.Ack(ids=[topic_pb2.AckId(
                ledger_id=ledger, entry_id=I64_MAX, batch_index=-1)])))
            _ended(stream, "INVALID_ACK")
            # requests after the stream ended: the client's writes go nowhere, the broker is unaffected
            for _ in range(100):
                stream.send(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=1)))
            stream.cancel()
            # unknown enum values in SubscribeOpen
            stream = _subscribe(ch, topic, type=99)
            assert "subscription type" in _ended(stream, "BAD_REQUEST")
            stream = _subscribe(ch, topic, initial_position=7)
            assert "initial position" in _ended(stream, "BAD_REQUEST")
            # seeks to positions that do not exist, a cumulative ack on Shared
            stream = _subscribe(ch, topic, type=topic_pb2.SHARED)
            assert stream.read().WhichOneof("kind") == "subscribed"
            for request_id, (l, e) in enumerate([(-5, -9), (I64_MAX, I64_MAX), (ledger, I64_MAX)], start=1):
                stream.send(topic_pb2.ConsumeRequest(seek=topic_pb2.Seek(request_id=request_id, position=topic_pb2.AckId(
                    ledger_id=l, entry_id=e))))
                r = _next(stream)  # answered, the stream goes on: taken as the nearest position, or refused
                assert r.WhichOneof("kind") == "seek_result" and r.seek_result.request_id == request_id, r
                assert r.seek_result.error.status in (topic_pb2.OK, topic_pb2.BAD_REQUEST), r
            stream.send(topic_pb2.ConsumeRequest(ack=topic_pb2.Ack(request_id=10, cumulative=True, ids=[
                topic_pb2.AckId(ledger_id=ledger, entry_id=entry, batch_index=-1)])))
            r = _next(stream)
            assert r.ack_result.error.status == topic_pb2.NOT_ALLOWED, r
            stream.cancel()
    consume_all(target, topic, acked)
