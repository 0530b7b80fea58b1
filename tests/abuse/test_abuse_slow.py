"""Slow readers that never drain a server stream, against the real broker: readers of a ledger (ReadEntries)
that take one message and stop, a consumer with 1,000,000 permits that never reads its deliveries, and a
consumer that sends acks asking for AckResults and never reads them. The broker keeps serving others while
they hang, its resident set stays within the stated bound, and everything acknowledged reads back
(abuse.harness.abused, abuse.harness.consume_all)."""
from __future__ import annotations

import threading
import uuid

import grpc

from abuse.harness import PASSWORD, SyncStream, abused, consume_all, new_namespace, produce
from bksim.gen import broker_pb2, broker_pb2_grpc, topic_pb2, topic_pb2_grpc
from helpers import wait_until

READERS = 8
LEDGER_ENTRIES = 200
ENTRY_BYTES = 60_000
ACKS = 200_000  # each refused, so each answered by an AckResult with an error (~450 bytes held per answer)
# Each ack names one entry with this many batch indexes (~3.9 KB on the wire), and the abusing client's channel
# keeps its receive window at gRPC's initial 64 KB (no BDP probing): the transports then buffer a few thousand
# requests and answers, not hundreds of thousands, and the pushback comes from the broker's bound within seconds
# however fast this machine runs
ACK_INDEXES = 2000


class Sender:
    """Feeds `requests` to a stream call from a thread, counting what gRPC took (the blocking API takes the
    next request only when flow control lets it send)."""

    def __init__(self, requests) -> None:
        self.taken = 0
        self._requests = requests
        self.stop = threading.Event()

    def __iter__(self):
        for r in self._requests:
            if self.stop.is_set():
                return
            self.taken += 1
            yield r

    def settled(self, total: int, quiet_polls: int = 3, interval_s: float = 0.3, timeout_s: float = 20.0) -> int:
        """Wait until every request was taken, or none was taken over `quiet_polls` polls (the call pushes back);
        returns how many were taken."""
        seen = []

        def done():
            seen.append(self.taken)
            return self.taken >= total or (len(seen) > quiet_polls and len(set(seen[-quiet_polls - 1:])) == 1)
        wait_until(done, timeout_s, interval_s=interval_s, message="the sender to finish or be pushed back")
        return self.taken


def test_ledger_readers_that_never_drain(target):
    with grpc.insecure_channel(target.broker.address) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        ledger = target.conn.create(1, 1, 1, PASSWORD).ledger_id
        for first in range(0, LEDGER_ENTRIES, 50):
            target.conn.append_once(ledger, PASSWORD, [bytes([i % 251]) * ENTRY_BYTES for i in range(first, first + 50)])
        with abused(target, f"{READERS} ledger readers that never drain ({LEDGER_ENTRIES * ENTRY_BYTES >> 20} MiB each)",
                    rss_growth_mib=96):
            calls = [stub.ReadEntries(broker_pb2.ReadEntriesRequest(ledger_id=ledger, password=PASSWORD,
                                                                    first_entry_id=0, last_entry_id=-1), timeout=60)
                     for _ in range(READERS)]
            for call in calls:
                assert next(call).entries[0].entry_id == 0
            target.write_and_read()  # served while they hang
            for call in calls:
                call.cancel()


def test_consumer_that_never_reads_deliveries(target):
    topic = f"persistent://{new_namespace(target)}/slow"
    acked = produce(target, topic, 10, 1000)
    with abused(target, "a consumer with 1,000,000 permits that never reads", rss_growth_mib=96):
        with grpc.insecure_channel(target.broker.address) as ch:
            stream = SyncStream(topic_pb2_grpc.TopicsStub(ch).Subscribe, timeout_s=60)
            stream.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
                topic=topic, subscription="never-reads", initial_position=topic_pb2.EARLIEST)))
            stream.send(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=1_000_000)))
            acked.update(produce(target, topic, 2000, 8000, batch=5))  # 16 MB the consumer may receive and never reads
            stream.cancel()
    consume_all(target, topic, acked)


def test_consumer_that_never_reads_its_ack_results(target):
    topic = f"persistent://{new_namespace(target)}/acks"
    acked = produce(target, topic, 10, 100)
    ledger, entry = min(acked)
    with abused(target, f"acks (up to {ACKS}) whose AckResults are never read", rss_growth_mib=48):
        with grpc.insecure_channel(target.broker.address, options=[("grpc.http2.bdp_probe", 0)]) as ch:
            def requests():
                yield topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
                    topic=topic, subscription=f"acks-{uuid.uuid4().hex[:6]}", type=topic_pb2.SHARED))
                indexes = range(1, ACK_INDEXES)
                for request_id in range(1, ACKS + 1):  # ids that do not exist: an error each
                    yield topic_pb2.ConsumeRequest(ack=topic_pb2.Ack(request_id=request_id, ids=[topic_pb2.AckId(
                        ledger_id=ledger, entry_id=entry + 10**9 + request_id, batch_index=0, batch_size=ACK_INDEXES,
                        more_batch_indexes=indexes)]))
            sender = Sender(requests())
            call = topic_pb2_grpc.TopicsStub(ch).Subscribe(iter(sender), timeout=60)
            taken = sender.settled(ACKS + 1, timeout_s=50.0)
            # (the count includes what the client's and the server's transports buffer)
            print(f"[abuse] {taken} of {ACKS + 1} requests left the client before it was pushed back")
            # a broker that read on without writing its answers would take every request
            assert taken < ACKS // 10, f"{taken} of {ACKS + 1} requests taken: the broker did not push back"
            sender.stop.set()
            call.cancel()
    consume_all(target, topic, acked)
