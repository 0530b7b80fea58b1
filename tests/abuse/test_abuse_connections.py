"""Connections and streams an abusive client opens and leaves, against the real bookie and broker: streams of
every kind (bookie AddEntries; broker Append, ReadEntries, Produce, Subscribe) cancelled midway, never
half-closed; the same left behind by a client process killed -9; 3,000 idle AddEntries streams on one
connection to the bookie (beyond its requests_inflight_max); and 1,000 idle connections to each server.

The broker runs with requests_inflight_max = REQUESTS_INFLIGHT_MAX (abuse.harness), and every one of these
streams holds one of those slots while it runs: after the abuse, exactly REQUESTS_INFLIGHT_MAX streams can be
open at once again and the next one is refused RESOURCE_EXHAUSTED (`slots_free`), so a single slot an
abandoned stream kept would show. The processes keep serving, bounded (abuse.harness.abused)."""
from __future__ import annotations

import asyncio
import collections
import resource
import subprocess
import sys
import textwrap

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from abuse.harness import BOOKIE_REQUESTS_INFLIGHT_MAX, PASSWORD, REQUESTS_INFLIGHT_MAX, SyncStream, abused, \
    consume_all, new_namespace, proc_status, produce, socket_count
from bksim.formats.entry import encode_entry, master_key
from bksim.gen import bookie_pb2, bookie_pb2_grpc, broker_pb2, broker_pb2_grpc, topic_pb2, topic_pb2_grpc
from helpers import wait_until, wait_until_async

STREAMS_PER_KIND = 10  # at once, per round (40 of the broker's REQUESTS_INFLIGHT_MAX slots: others keep theirs)
ROUNDS = 4
IDLE_CONNECTIONS = 1000  # to each server


def _open_streams(ledger: int, topic: str, bookie_ch, broker_ch) -> list[SyncStream | grpc.Call]:
    """STREAMS_PER_KIND streams of each kind, each with a request sent and none half-closed."""
    broker, topics = broker_pb2_grpc.BrokerStub(broker_ch), topic_pb2_grpc.TopicsStub(broker_ch)
    bookie = bookie_pb2_grpc.BookieStub(bookie_ch)
    out = []
    for i in range(STREAMS_PER_KIND):
        s = SyncStream(broker.Append)
        s.send(broker_pb2.AppendRequest(ledger_id=ledger, password=PASSWORD, payloads=[b"a"], request_id=1))
        out.append(s)
        out.append(broker.ReadEntries(broker_pb2.ReadEntriesRequest(ledger_id=ledger, password=PASSWORD,
                                                                    first_entry_id=0, last_entry_id=-1), timeout=20))
        s = SyncStream(topics.Produce)
        s.send(topic_pb2.ProduceRequest(open=topic_pb2.ProducerOpen(topic=topic)))
        s.send(topic_pb2.ProduceRequest(send=topic_pb2.Send(request_id=1, messages=[topic_pb2.Message(payload=b"m")])))
        out.append(s)
        s = SyncStream(topics.Subscribe)
        s.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(topic=topic, subscription="abandoned",
                                                                     type=topic_pb2.SHARED)))
        s.send(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=1000)))
        out.append(s)
        s = SyncStream(bookie.AddEntries)
        s.send(bookie_pb2.AddRequest(batch_id=1, entries=[bookie_pb2.AddEntry(
            entry=encode_entry(10**12 + i, 0, -1, 0, b"abandoned"), master_key=master_key(PASSWORD))]))
        out.append(s)
    return out


def slots_free(target, topic: str, timeout_s: float = 60.0) -> None:
    """Wait until REQUESTS_INFLIGHT_MAX Subscribe streams are open at once (each answered 'subscribed'); then
    the next stream is refused RESOURCE_EXHAUSTED."""
    def all_open() -> bool:
        with grpc.insecure_channel(target.broker.address) as ch:
            stub = topic_pb2_grpc.TopicsStub(ch)
            streams = []
            try:
                for _ in range(REQUESTS_INFLIGHT_MAX):
                    s = SyncStream(stub.Subscribe, timeout_s=10)
                    s.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
                        topic=topic, subscription="slots", type=topic_pb2.SHARED)))
                    streams.append(s)
                for s in streams:
                    first = s.read()
                    if first.WhichOneof("kind") == "error":  # a slot is still held
                        assert first.error.status == topic_pb2.TOO_MANY_REQUESTS, first
                        return False
                    assert first.WhichOneof("kind") == "subscribed", first
                extra = SyncStream(stub.Subscribe, timeout_s=10)
                extra.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
                    topic=topic, subscription="slots", type=topic_pb2.SHARED)))
                responses, code, details = extra.rest()
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "requests_inflight_max" in details, \
                    (responses, code, details)
                return True
            finally:
                for s in streams:
                    s.cancel()
    wait_until(all_open, timeout_s, interval_s=0.2,
               message=f"{REQUESTS_INFLIGHT_MAX} streams open at once (every abandoned stream's slot given back)")


def test_streams_cancelled_midway(target):
    ledger = target.conn.create(1, 1, 1, PASSWORD).ledger_id
    target.conn.append_once(ledger, PASSWORD, [b"x" * 60_000] * 20)
    topic = f"persistent://{new_namespace(target)}/abandoned"
    acked = produce(target, topic, 20, 100)
    with abused(target, f"{ROUNDS * STREAMS_PER_KIND * 5} streams cancelled midway, never half-closed"):
        with grpc.insecure_channel(target.bookie.address) as bookie_ch, \
                grpc.insecure_channel(target.broker.address) as broker_ch:
            for _ in range(ROUNDS):
                streams = _open_streams(ledger, topic, bookie_ch, broker_ch)
                # read one response of a few of each kind, so those are surely running in the servers
                for s in streams[:10]:
                    try:
                        s.read() if isinstance(s, SyncStream) else next(s)
                    except grpc.RpcError as e:  # beyond the broker's bound
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                for s in streams:
                    s.cancel()
    slots_free(target, topic)  # (it takes every slot: not while the well-behaved client runs)
    consume_all(target, topic, acked)


CHILD = textwrap.dedent('''
    import sys, grpc
    sys.path.insert(0, sys.argv[1])
    from abuse import test_abuse_connections as t
    bookie_ch, broker_ch = grpc.insecure_channel(sys.argv[2]), grpc.insecure_channel(sys.argv[3])
    streams = t._open_streams(int(sys.argv[4]), sys.argv[5], bookie_ch, broker_ch)
    for s in streams[:5]:
        s.read() if isinstance(s, t.SyncStream) else next(s)
    print("open", flush=True)
    sys.stdin.read()
''')


def test_streams_of_a_client_killed_9(target, repo_root):
    ledger = target.conn.create(1, 1, 1, PASSWORD).ledger_id
    target.conn.append_once(ledger, PASSWORD, [b"y" * 60_000] * 20)
    topic = f"persistent://{new_namespace(target)}/killed"
    produce(target, topic, 5, 10)
    with abused(target, f"{STREAMS_PER_KIND * 5} streams of a client killed -9"):
        child = subprocess.Popen([sys.executable, "-c", CHILD, f"{repo_root}/tests", target.bookie.address,
                                  target.broker.address, str(ledger), topic],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "open", "the client did not open its streams"
        finally:
            child.kill()  # SIGKILL: its sockets close without a cancel or a half-close
            child.wait(10)
    slots_free(target, topic)


def test_idle_connections(target):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 2 * IDLE_CONNECTIONS + 1000 < soft, f"fd limit {soft} too low for {IDLE_CONNECTIONS} connections"
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel (no shared subchannel)

    async def connect_all() -> None:
        channels = [grpc.aio.insecure_channel(p.address, options=options)
                    for p in (target.bookie, target.broker) for _ in range(IDLE_CONNECTIONS)]
        try:
            for i in range(0, len(channels), 100):
                responses = await asyncio.gather(*(health_pb2_grpc.HealthStub(c).Check(
                    health_pb2.HealthCheckRequest(), timeout=20) for c in channels[i:i + 100]))
                assert all(r.status == health_pb2.HealthCheckResponse.SERVING for r in responses)
            for name, p in target.processes.items():
                sockets = socket_count(p.pid)
                print(f"[abuse] {name} holds {sockets} sockets with {IDLE_CONNECTIONS} idle connections open")
                assert sockets >= IDLE_CONNECTIONS, f"{name}: {sockets} sockets"
            await asyncio.to_thread(target.write_and_read)  # served beside them
        finally:
            await asyncio.gather(*(c.close() for c in channels))

    with abused(target, f"{IDLE_CONNECTIONS} idle connections to each server", rss_growth_mib=128):
        asyncio.run(connect_all())


IDLE_STREAMS = 3000  # held at once without the bound: 3,000 x ~25 KiB, the bookie grew 74 MiB


def test_idle_streams_beyond_the_bookies_bound(target):
    """Streams opened and never written to hold a bookie RPC each (~25 KiB): the bookie serves at most
    BOOKIE_REQUESTS_INFLIGHT_MAX at once and refuses the rest RESOURCE_EXHAUSTED at once, so its resident set
    stays bounded however many a client opens. (While they are held the bookie has no room for others:
    the well-behaved client runs before and after, not during.)"""
    async def hold() -> None:
        before = proc_status(target.bookie.pid)["VmRSS"]
        async with grpc.aio.insecure_channel(target.bookie.address) as ch:
            stub = bookie_pb2_grpc.BookieStub(ch)
            calls = [stub.AddEntries(timeout=60) for _ in range(IDLE_STREAMS)]
            await wait_until_async(lambda: sum(c.done() for c in calls) >= IDLE_STREAMS - BOOKIE_REQUESTS_INFLIGHT_MAX,
                                   20.0, interval_s=0.1, message="the streams beyond the bookie's bound refused")
            refused = [c for c in calls if c.done()]
            codes = collections.Counter([(await c.code(), await c.details()) for c in refused])
            # the server refuses each with RESOURCE_EXHAUSTED; the client's transport sometimes reports a stream
            # the server ended before the client half-closed as CANCELLED (the reset that follows the trailers)
            exhausted = codes[(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")]
            assert {code for code, _ in codes} <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}, codes
            assert exhausted >= len(refused) // 2, codes
            growth = (proc_status(target.bookie.pid)["VmRSS"] - before) / 1024
            print(f"[abuse] {IDLE_STREAMS} idle AddEntries streams: {len(refused)} refused ({exhausted} "
                  f"RESOURCE_EXHAUSTED), the bookie grew {growth:.1f} MiB holding the rest")
            # (the refused ones cost too while they are being refused: about 40 MiB of the growth at 3,000)
            assert growth < 64, f"the bookie grew {growth:.1f} MiB holding {IDLE_STREAMS - len(refused)} idle streams"
            for c in calls:
                c.cancel()

    with abused(target, f"{IDLE_STREAMS} idle AddEntries streams on one connection", during=False):
        asyncio.run(hold())
