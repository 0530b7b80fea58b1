"""The abuse suite's target (the `target` fixture of tests/abuse/conftest.py): one real bookie and one real broker (Topics service on) over the session's
ZooKeeper (tests/conftest.py), started once for the whole directory by the integration harnesses
(integration.broker_harness.BrokerCluster), and the checks every abuse case ends with.

`abused(target, case)` wraps one case: before it, the resident set of both processes; after it, for each
process: the pid alive, gRPC health SERVING, the growth of VmRSS within the case's bound (`rss_growth_mib`),
and its peak (VmHWM) printed; then a well-behaved client still gets its service (a ledger created, entries
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

from helpers import wait_until
from integration.bookie_harness import BookieProcess
from integration.broker_harness import BrokerCluster, BrokerConn, payload

REQUESTS_INFLIGHT_MAX = 64     # the test broker's bound on concurrent RPCs (abandoned RPCs must give it back)
PAYLOAD_BYTES_MAX = 64 * 1024  # broker_harness's payload_bytes_max
BROKER_FRAME_BYTES = 8 * 1024 * 1024  # the broker's gRPC message bound (broker_server.server_options)
BOOKIE_FRAME_BYTES = 1024 * 1024 + 64 * 1024  # the test bookie's frame_bytes_max
BOOKIE_ENTRY_BYTES = 1024 * 1024
WELL_BEHAVED_DEADLINE_S = 10.0
PASSWORD = b"abuse-suite"
HEALTH_DEADLINE_S = 5.0

BOOKIE_ENV = {"BKSIM_BOOKIE_FRAME_BYTES_MAX": str(BOOKIE_FRAME_BYTES),
              "BKSIM_BOOKIE_ENTRY_BYTES_MAX": str(BOOKIE_ENTRY_BYTES)}
BROKER_ENV = {"BKSIM_BROKER_REQUESTS_INFLIGHT_MAX": str(REQUESTS_INFLIGHT_MAX),
              "BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
              "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1", "BKSIM_TOPIC_MESSAGE_BYTES_MAX": "60000"}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of a process, in KiB, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


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
