"""The abuse suite's target (the `target` fixture of tests/abuse/conftest.py): one real bookie and one real broker (Topics service on) over the session's
ZooKeeper (tests/conftest.py), started once for the whole directory by the integration harnesses
(integration.broker_harness.BrokerCluster), and the checks every abuse case ends with.

`abused(target, case)` wraps one case: before it, the resident set of both processes; after it, for each
process: the pid alive, gRPC health SERVING, the growth of VmRSS within the case's bound (`rss_growth_mib`),
and its peak (VmHWM) printed, no unhandled exception in its log (UNHANDLED_MARKS); then a well-behaved client still gets its service (a ledger created, entries
appended and read back, through the broker, within WELL_BEHAVED_DEADLINE_S), and every entry acknowledged so
far by the well-behaved client (before the abuse and, when the case runs one, during it) reads back
identical. The broker runs with `requests_inflight_max` = REQUESTS_INFLIGHT_MAX, so an RPC an abusive
client leaves counted (an abandoned stream that never releases its slot) soon starves every other client.

Nothing here sleeps to synchronise: waits are helpers.wait_until or gRPC deadlines.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bksim.adapters import processes
from bksim.model.config import FRAME_BYTES_MAX
from helpers import wait_until
from integration.broker_harness import BrokerCluster, BrokerConn, payload

REQUESTS_INFLIGHT_MAX = 64     # the test broker's bound on concurrent RPCs (abandoned RPCs must give it back)
PAYLOAD_BYTES_MAX = 64 * 1024  # broker_harness's payload_bytes_max
BROKER_FRAME_BYTES = 8 * 1024 * 1024  # the broker's gRPC message bound (broker_server.server_options)
BOOKIE_FRAME_BYTES = FRAME_BYTES_MAX  # the bookie's frame_bytes_max (the default)
BOOKIE_ENTRY_BYTES = 5 * 1024 * 1024  # the bookie's entry_bytes_max (the default)
WELL_BEHAVED_DEADLINE_S = 10.0
PASSWORD = b"abuse-suite"
HEALTH_DEADLINE_S = 5.0
# what Python, asyncio and grpc.aio write to a process's log (its stderr) for an exception nobody handled
UNHANDLED_MARKS = ("Traceback (most recent call last)", "exception was never retrieved", "Exception in callback",
                   "Unexpected error in")

BOOKIE_REQUESTS_INFLIGHT_MAX = 512  # the test bookie's bound on concurrent RPCs (open AddEntries streams count)
# The cases saturate both cores on purpose. The integration harness's 2 s session (for tests that wait for a killed
# process's session to expire) drops a ZooKeeper connection whose ping goes unanswered for ~1.3 s, and a well-behaved
# call then fails with "no answer from the metadata store". Nothing here waits for an expiry: the longest session
# the fixture's ZooKeeper grants (20 ticks of 200 ms).
SESSION_ENV = {"BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": "4000"}
BOOKIE_ENV = {**SESSION_ENV, "BKSIM_BOOKIE_REQUESTS_INFLIGHT_MAX": str(BOOKIE_REQUESTS_INFLIGHT_MAX)}
BROKER_ENV = {**SESSION_ENV, "BKSIM_BROKER_REQUESTS_INFLIGHT_MAX": str(REQUESTS_INFLIGHT_MAX),
              "BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
              "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1", "BKSIM_TOPIC_MESSAGE_BYTES_MAX": "60000"}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of a process, in KiB."""
    memory = processes.memory_bytes(pid)
    return {"VmRSS": memory["rss"] // 1024, "VmHWM": memory["peak"] // 1024}


def socket_count(pid: int) -> int:
    """Open sockets of a process (its TCP connections and listeners)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except FileNotFoundError:
            pass
    return n


def health(address: str, service: str = "") -> str:
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                            timeout=HEALTH_DEADLINE_S)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


@dataclasses.dataclass
class Target:
    cluster: BrokerCluster
    bookie: object
    broker: object
    conn: BrokerConn
    acked: dict[int, dict[int, bytes]] = dataclasses.field(default_factory=dict)  # ledger -> entry -> payload
    peaks: dict[str, list[tuple[str, int, int]]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def processes(self):
        return {"bookie": self.bookie, "broker": self.broker}

    def write_and_read(self, entries: int = 20) -> float:
        """A well-behaved client: a ledger created, `entries` appended, every one read back; the seconds it
        took (asserted within WELL_BEHAVED_DEADLINE_S). What was acknowledged is remembered in `acked`."""
        start = time.monotonic()
        with BrokerConn(self.broker.address, deadline_s=WELL_BEHAVED_DEADLINE_S) as conn:
            ledger = conn.create(1, 1, 1, PASSWORD).ledger_id
            payloads = [payload(ledger, i) for i in range(entries)]
            response = conn.append_once(ledger, PASSWORD, payloads)
            assert (response.first_entry_id, response.count) == (0, entries), response
            with self.lock:
                self.acked[ledger] = dict(enumerate(payloads))
            assert conn.read(ledger, PASSWORD, 0, entries - 1) == dict(enumerate(payloads))
        took = time.monotonic() - start
        assert took < WELL_BEHAVED_DEADLINE_S, f"the well-behaved client took {took:.1f}s"
        return took

    def check_acknowledged(self) -> None:
        """Every entry the well-behaved client saw acknowledged reads back identical."""
        with self.lock:
            acked = {ledger: dict(entries) for ledger, entries in self.acked.items()}
        for ledger, entries in acked.items():
            got = self.conn.read(ledger, PASSWORD, 0, max(entries))
            assert got == entries, f"ledger {ledger}: acknowledged entries do not read back identical"

    def log_sizes(self) -> dict[str, int]:
        return {name: os.path.getsize(p.log_path) for name, p in self.processes.items()}

    def check_logs(self, since: dict[str, int], case: str) -> None:
        """Nothing since `since` in either process's log says an exception went unhandled."""
        for name, p in self.processes.items():
            with open(p.log_path, "rb") as f:
                f.seek(since[name])
                text = f.read().decode(errors="replace")
            bad = [line for line in text.splitlines() if any(m in line for m in UNHANDLED_MARKS)]
            assert not bad, f"{case}: the {name} log shows an unhandled exception:\n" + "\n".join(bad[:10])

    def check_alive(self) -> None:
        for name, p in self.processes.items():
            assert p.alive(), f"{name} pid {p.pid} died:\n{p.log_tail()}"
            status = health(p.address)
            assert status == "SERVING", f"{name} health {status}"


class Background:
    """The well-behaved client running write_and_read in a loop while an abuse case runs."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.target.write_and_read(entries=5)
                self.rounds += 1
        except BaseException as e:  # noqa: BLE001 - reported by join()
            self.error = e

    def join(self) -> None:
        self.stop.set()
        self.thread.join(WELL_BEHAVED_DEADLINE_S * 2)
        assert not self.thread.is_alive(), "the well-behaved client hung during the abuse"
        if self.error is not None:
            raise AssertionError(f"the well-behaved client failed during the abuse: {self.error!r}") from self.error


@contextlib.contextmanager
def abused(target: Target, case: str, rss_growth_mib: float = 64.0, during: bool = True):
    """Run one abuse case (the with-block) under the checks of the module docstring. With `during`, the
    well-behaved client runs in a loop alongside the case, and must complete at least one round."""
    target.check_alive()
    target.write_and_read()
    logs = target.log_sizes()
    before = {name: proc_status(p.pid) for name, p in target.processes.items()}
    background = Background(target) if during else None
    if background is not None:
        background.thread.start()
        wait_until(lambda: background.rounds >= 1 or background.error is not None, WELL_BEHAVED_DEADLINE_S,
                   message="a first round of the well-behaved client")
    try:
        yield
    finally:
        if background is not None:
            background.join()
    target.check_alive()
    after = {name: proc_status(p.pid) for name, p in target.processes.items()}
    for name in target.processes:
        growth = (after[name]["VmRSS"] - before[name]["VmRSS"]) / 1024
        target.peaks.setdefault(name, []).append((case, after[name]["VmHWM"], after[name]["VmRSS"]))
        print(f"[abuse] {case}: {name} VmRSS {before[name]['VmRSS'] / 1024:.0f} -> {after[name]['VmRSS'] / 1024:.0f} "
              f"MiB (growth {growth:+.1f}, bound {rss_growth_mib:.0f}), peak VmHWM {after[name]['VmHWM'] / 1024:.0f} MiB")
        assert growth <= rss_growth_mib, (f"{case}: {name} resident set grew {growth:.1f} MiB "
                                          f"(bound {rss_growth_mib} MiB)")
    target.write_and_read()
    target.check_acknowledged()
    target.check_logs(logs, case)


# -- streams and topics ------------------------------------------------------------------------------------

class SyncStream:
    """A bidirectional call over the blocking API (which keeps the server's status, see broker_harness):
    `send` queues a request, `read` takes the next response (bounded by the call's deadline), `half_close`
    ends the requests, `cancel` abandons the call."""

    def __init__(self, method, timeout_s: float = 20.0) -> None:
        import queue
        self._requests: "queue.Queue" = queue.Queue()
        self.call = method(iter(self._requests.get, None), timeout=timeout_s)

    def send(self, request) -> None:
        self._requests.put(request)

    def half_close(self) -> None:
        self._requests.put(None)

    def read(self):
        return next(self.call)

    def rest(self) -> tuple[list, grpc.StatusCode, str]:
        """Every response left and the final status (code, details)."""
        out = []
        try:
            for response in self.call:
                out.append(response)
        except grpc.RpcError as e:
            return out, e.code(), e.details() or ""
        return out, grpc.StatusCode.OK, ""

    def cancel(self) -> None:
        self.call.cancel()
        self._requests.put(None)  # ends the request thread of the blocking API


def new_namespace(target: "Target") -> str:
    """A fresh tenant/ns on the broker (retention forever)."""
    from bksim.gen import topic_pb2, topic_pb2_grpc
    import uuid
    tenant = f"abuse{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(target.broker.address) as ch:
        stub = topic_pb2_grpc.TopicsStub(ch)
        stub.CreateTenant(topic_pb2.CreateTenantRequest(tenant=tenant), timeout=WELL_BEHAVED_DEADLINE_S)
        stub.CreateNamespace(topic_pb2.CreateNamespaceRequest(
            namespace=f"{tenant}/ns", policies=topic_pb2.NamespacePolicies(retention_ms=-1, retention_bytes=-1)),
            timeout=WELL_BEHAVED_DEADLINE_S)
    return f"{tenant}/ns"


def produce(target: "Target", topic: str, count: int, size: int, batch: int = 10) -> dict[tuple[int, int], list[bytes]]:
    """`count` messages of `size` bytes (payload i starts with its index) in Sends of `batch`, to `topic`
    (created when missing); what the receipts
    acknowledged: (ledger, entry) -> payloads of that entry."""
    from bksim.gen import topic_pb2, topic_pb2_grpc
    acked: dict[tuple[int, int], list[bytes]] = {}
    with grpc.insecure_channel(target.broker.address) as ch:
        stub = topic_pb2_grpc.TopicsStub(ch)
        try:
            stub.CreateTopic(topic_pb2.CreateTopicRequest(topic=topic), timeout=WELL_BEHAVED_DEADLINE_S)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.ALREADY_EXISTS, e
        stream = SyncStream(stub.Produce, timeout_s=60.0)
        stream.send(topic_pb2.ProduceRequest(open=topic_pb2.ProducerOpen(topic=topic)))
        first = stream.read()
        assert first.WhichOneof("kind") == "ready", first
        sends = {}
        for request_id, first in enumerate(range(0, count, batch), start=1):
            payloads = [(b"%d|" % i).ljust(size, b"m") for i in range(first, min(first + batch, count))]
            sends[request_id] = payloads
            stream.send(topic_pb2.ProduceRequest(send=topic_pb2.Send(request_id=request_id, messages=[
                topic_pb2.Message(payload=p, sequence_id=first + k) for k, p in enumerate(payloads)])))
        stream.half_close()
        responses, code, details = stream.rest()
        assert code == grpc.StatusCode.OK, f"produce: {code.name} {details}"
        for r in responses:
            assert r.WhichOneof("kind") == "receipt", r
            acked[(r.receipt.ledger_id, r.receipt.entry_id)] = sends[r.receipt.request_id]
    assert sum(map(len, acked.values())) == count
    return acked


def consume_all(target: "Target", topic: str, expected: dict[tuple[int, int], list[bytes]]) -> None:
    """A fresh subscription from the earliest message receives every acknowledged message, identical."""
    from bksim.formats.message import decode_entry
    from bksim.gen import topic_pb2, topic_pb2_grpc
    import uuid
    got: dict[tuple[int, int], list[bytes]] = {}
    with grpc.insecure_channel(target.broker.address) as ch:
        stream = SyncStream(topic_pb2_grpc.TopicsStub(ch).Subscribe, timeout_s=30.0)
        stream.send(topic_pb2.ConsumeRequest(open=topic_pb2.SubscribeOpen(
            topic=topic, subscription=f"check-{uuid.uuid4().hex[:6]}", initial_position=topic_pb2.EARLIEST)))
        stream.send(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=sum(map(len, expected.values())))))
        try:
            while len(got) < len(expected):
                r = stream.read()
                assert r.WhichOneof("kind") in ("subscribed", "deliveries", "active_change"), r
                for d in r.deliveries.deliveries:
                    got[(d.ledger_id, d.entry_id)] = [m.payload for m in decode_entry(d.entry)[1]]
        finally:
            stream.cancel()
    assert got == expected, f"{len(got)} of {len(expected)} acknowledged entries read back identical"
