"""failover: the producer's gap when the broker that owns its topic is killed (kill -9), on a fresh cluster.

The cluster: perf/ledger_write.LedgerCluster (real ZooKeeper, `bookies` bookie processes, two brokers). The
brokers' ZooKeeper session timeout is `session_timeout_ms` (the children's BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS):
the killed owner's ephemeral ownership znode lives that long, so it bounds the takeover from below, as in Pulsar.

The run: a topic (dedup on), one Producer through both brokers sending `rate` messages/s of `message_bytes`
(send_async, batching 1 ms). After `before_s` seconds the owner is killed with SIGKILL. The run goes on
until receipts have flowed again for `after_s` seconds (bounded by the session timeout + 60 s). Figures:
- gap: the longest time between two consecutive receipts (the producer-to-producer gap);
- kill -> first receipt: from the SIGKILL to the first receipt after it;
- then every receipted message is consumed from the beginning (Exclusive, earliest): lost must be 0, and
  with dedup no message may sit at two positions.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from bksim.adapters import processes
from bksim.client import Client, ClientError, InitialPosition, SubscriptionType
from bksim.model.config import Config
from bksim.perf.ledger_write import LedgerCluster

RECEIVE_MS = 20_000


@dataclass
class FailoverResult:
    session_timeout_ms: int
    sent: int
    receipted: int
    failed: int
    gap_s: float
    kill_to_first_receipt_s: float
    lost: int
    stored_twice: int

    def __str__(self) -> str:
        return (f"failover: session timeout {self.session_timeout_ms} ms; {self.receipted}/{self.sent} messages "
                f"receipted ({self.failed} failed); producer gap {self.gap_s:.2f} s; kill -> first receipt "
                f"{self.kill_to_first_receipt_s:.2f} s; lost {self.lost}; stored twice {self.stored_twice}")


def measure(workdir: str, config: Config, *, bookies: int = 3, session_timeout_ms: int = 4_000, rate: int = 2_000,
            message_bytes: int = 100, before_s: float = 3.0, after_s: float = 3.0,
            config_path: str | None = None) -> FailoverResult:
    env = {"BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(session_timeout_ms)}
    cluster = LedgerCluster(workdir, bookies, config, config_path, brokers=2, child_env=env).__enter__()
    second = cluster.brokers[1]
    try:
        return _run(cluster, [cluster.broker_address, second.address], {cluster.broker_address: cluster.broker,
                                                                         second.address: second},
                    session_timeout_ms, rate, message_bytes, before_s, after_s)
    finally:
        cluster.__exit__(None, None, None)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


def _run(cluster, addresses, children, session_timeout_ms, rate, message_bytes, before_s, after_s):
    client = None
    for _ in range(200):  # the brokers come up: bounded retries of the first admin call
        try:
            client = Client(addresses, operation_timeout_ms=30_000)
            client.list_tenants()
            break
        except ClientError:
            if client is not None:
                client.close()
            client = None
            time.sleep(0.2)
    if client is None:
        raise RuntimeError(f"the brokers did not answer:\n{cluster.logs()}")
    try:
        tenant = f"perf{uuid.uuid4().hex[:6]}"
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}/ns", retention_ms=-1, dedup=True)
        topic = f"persistent://{tenant}/ns/failover"
        client.create_topic(topic)
        consumer = client.subscribe(topic, "check", SubscriptionType.Exclusive,
                                    initial_position=InitialPosition.Earliest)
        producer = client.create_producer(topic, producer_name="failover-probe", batching_max_publish_delay_ms=1,
                                          send_timeout_ms=session_timeout_ms + 60_000, max_pending_messages=100_000,
                                          block_if_queue_full=True)
        receipts: list[float] = []
        receipted: dict[int, object] = {}
        failed: list[int] = []
        lock = threading.Lock()

        def callback_for(i):
            def done(error, msg_id):
                with lock:
                    if error is not None or msg_id is None:
                        failed.append(i)
                    else:
                        receipts.append(time.monotonic())
                        receipted[i] = msg_id
            return done

        payload = b"x" * max(0, message_bytes - 8)
        t0 = time.monotonic()
        sent = 0
        killed_at = None
        owner = children[client.lookup(topic)["address"]]
        deadline = t0 + before_s + session_timeout_ms / 1000 + 60
        while time.monotonic() < deadline:
            now = time.monotonic()
            while sent < (now - t0) * rate:
                producer.send_async(b"%08d" % sent + payload, callback_for(sent))
                sent += 1
            if killed_at is None and now - t0 >= before_s:
                processes.kill9(owner.pid, timeout_s=10.0)
                killed_at = time.monotonic()
            if killed_at is not None:
                with lock:
                    after = [t for t in receipts if t > killed_at]
                if after and time.monotonic() - after[0] >= after_s:
                    break
            time.sleep(0.002)
        producer.flush()
        with lock:
            times = sorted(receipts)
            first_after = next((t for t in times if killed_at is not None and t > killed_at), None)
        gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        wanted = {b"%08d" % i for i in receipted}
        seen: dict[bytes, set] = {}
        while not wanted <= set(seen):
            m = consumer.receive(RECEIVE_MS)
            mid = m.message_id()
            seen.setdefault(m.data()[:8], set()).add((mid.ledger, mid.entry, mid.batch_index))
            consumer.acknowledge(m)
        producer.close()
        consumer.close()
        return FailoverResult(session_timeout_ms, sent, len(receipted), len(failed), gap,
                              (first_after - killed_at) if first_after and killed_at else float("nan"),
                              len(wanted - set(seen)), sum(1 for v in seen.values() if len(v) > 1))
    finally:
        client.close()

