"""Requests after a stream or a ledger was closed, and writers that never read their answers, against the real
bookie and broker: an Append stream to a ledger closed under it, writes going on after the broker ended a
stream, a second 'open' on Produce and Subscribe, a bookie add to a fenced ledger, and AddEntries and Append
streams whose responses are never read. Each refusal is precise, what was acknowledged before stays readable,
the processes keep serving, bounded (abuse.harness.abused)."""
from __future__ import annotations

import grpc

from abuse.harness import PASSWORD, SyncStream, abused, consume_all, new_namespace, produce
from abuse.test_abuse_slow import Sender
from bksim.formats.entry import encode_entry, master_key
from bksim.gen import bookie_pb2, bookie_pb2_grpc, broker_pb2, broker_pb2_grpc, topic_pb2, topic_pb2_grpc
from bksim.model.status import FLAG_FENCE

KEY = master_key(PASSWORD)


def _append(ledger: int, request_id: int, payloads: list[bytes], password: bytes = PASSWORD):
    return broker_pb2.AppendRequest(ledger_id=ledger, password=password, payloads=payloads, request_id=request_id)


def test_requests_after_close(target):
    conn = target.conn
    with abused(target, "requests after a stream or a ledger was closed"):
        with grpc.insecure_channel(target.broker.address) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            # an Append stream whose ledger is closed under it: what was acknowledged stays, the rest is refused
            ledger = conn.create(1, 1, 1, PASSWORD).ledger_id
            stream = SyncStream(stub.Append)
            stream.send(_append(ledger, 1, [b"a0", b"a1"]))
            first = stream.read()
            assert (first.request_id, first.first_entry_id, first.count) == (1, 0, 2), first
            assert conn.close_ledger(ledger, PASSWORD).last_entry_id == 1
            for request_id in range(2, 200):  # the client goes on writing after the broker ended the stream
                stream.send(_append(ledger, request_id, [b"late"]))
            responses, code, details = stream.rest()
            errors = [r for r in responses if r.error]
            assert [r for r in responses if not r.error] == [], responses
            assert errors and broker_pb2.LedgerStatus.Name(errors[-1].error) in ("LEDGER_CLOSED", "ABORTED"), responses
            assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE) and details, (code, details)
            stream.cancel()
            assert conn.read(ledger, PASSWORD, 0, 1) == {0: b"a0", 1: b"a1"}
            # a new Append stream on the closed ledger: LEDGER_CLOSED at once
            code = None
            try:
                list(stub.Append(iter([_append(ledger, 1, [b"x"])]), timeout=10))
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "closed" in details, (code, details)
            # a wrong password in the middle of a stream: the stream ends PERMISSION_DENIED, earlier acks stay
            ledger = conn.create(1, 1, 1, PASSWORD).ledger_id
            stream = SyncStream(stub.Append)
            stream.send(_append(ledger, 1, [b"b0"]))
            assert stream.read().count == 1
            stream.send(_append(ledger, 2, [b"b1"], password=b"wrong"))
            responses, code, details = stream.rest()
            assert code == grpc.StatusCode.PERMISSION_DENIED and "password" in details, (responses, code, details)
            assert conn.read(ledger, PASSWORD, 0, 0) == {0: b"b0"}
            # a second 'open' on Produce and on Subscribe
            topic = f"persistent://{new_namespace(target)}/after"
            acked = produce(target, topic, 5, 10)
            topics = topic_pb2_grpc.TopicsStub(ch)
            for method, request in [
                    (topics.Produce, topic_pb2.ProduceRequest(open=topic_pb2.ProducerOpen(topic=topic))),
                    (topics.Subscribe, topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
                        topic=topic, subscription="twice", type=topic_pb2.SHARED)))]:
                stream = SyncStream(method)
                stream.send(request)
                stream.read()  # ready / subscribed
                stream.send(request)
                for _ in range(50):
                    stream.send(request)
                responses, code, details = stream.rest()
                inband = [r.error for r in responses if r.WhichOneof("kind") == "error"]
                assert inband and inband[-1].status == topic_pb2.BAD_REQUEST, responses
                assert code == grpc.StatusCode.INVALID_ARGUMENT and details, (code, details)
                stream.cancel()
        consume_all(target, topic, acked)
        # a bookie add to a ledger fenced by a reader: FENCED, the fenced entries still read
        with grpc.insecure_channel(target.bookie.address) as ch:
            bookie = bookie_pb2_grpc.BookieStub(ch)
            ledger = 2 * 10**12
            add = lambda entry_id: list(bookie.AddEntries(iter([bookie_pb2.AddRequest(batch_id=entry_id, entries=[
                bookie_pb2.AddEntry(entry=encode_entry(ledger, entry_id, entry_id - 1, 0, b"f"), master_key=KEY)])]),
                timeout=10))[0]
            assert list(add(0).statuses) == [bookie_pb2.OK]
            fenced = bookie.ReadEntry(bookie_pb2.ReadEntryRequest(ledger_id=ledger, entry_id=0, flags=FLAG_FENCE,
                                                                  master_key=KEY), timeout=10)
            assert fenced.status == bookie_pb2.OK, fenced
            refused = add(1)
            assert list(refused.statuses) == [bookie_pb2.FENCED] and refused.message, refused
            assert bookie.ReadEntry(bookie_pb2.ReadEntryRequest(ledger_id=ledger, entry_id=0), timeout=10).status \
                == bookie_pb2.OK


def test_writers_that_never_read_their_answers(target):
    ledger = target.conn.create(1, 1, 1, PASSWORD).ledger_id
    with abused(target, "AddEntries and Append streams whose answers are never read", rss_growth_mib=96):
        with grpc.insecure_channel(target.bookie.address) as bookie_ch, \
                grpc.insecure_channel(target.broker.address) as broker_ch:
            adds = Sender(bookie_pb2.AddRequest(batch_id=i, entries=[bookie_pb2.AddEntry(
                entry=encode_entry(3 * 10**12, i * 10 + k, -1, 0, b"s" * 1000), master_key=KEY) for k in range(10)])
                for i in range(3000))
            add_call = bookie_pb2_grpc.BookieStub(bookie_ch).AddEntries(iter(adds), timeout=60)
            appends = Sender(_append(ledger, i, [b"p" * 2000] * 10) for i in range(1, 2001))
            append_call = broker_pb2_grpc.BrokerStub(broker_ch).Append(iter(appends), timeout=60)
            taken = adds.settled(3000), appends.settled(2000)
            print(f"[abuse] requests taken without their answers read: AddEntries {taken[0]} of 3000, "
                  f"Append {taken[1]} of 2000")
            adds.stop.set()
            appends.stop.set()
            add_call.cancel()
            append_call.cancel()
