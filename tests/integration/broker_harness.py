"""Real `bksim broker run` processes over real bookies and ZooKeeper, and the client-side bookkeeping the broker
guarantee tests share.

- `BrokerProcess`: one broker of the local-cluster launcher (bookie_harness.launcher: configured only through
  BKSIM_ environment variables, cwd the test's tmp dir, so no deploy/bksim.toml is read); ready when its
  /brokers/available/<id> node exists (it registers after its gRPC server started); stopped by pid.
- `BrokerCluster`: bookies and brokers on the session's ZooKeeper. Bookies are never restarted: a killed one is
  replaced by a fresh bookie (new port, new directories), and `settle(n)` waits until the writable
  registrations are exactly the live bookies, so placement and ensemble changes never see a dead bookie's
  lingering node (nor another test module's).
- `BrokerConn`: one broker through the project's SyncBrokerClient, except Append streams, which use the
  blocking generated stub (see "the client side" for why); a refused call raises BrokerCallError (`status`:
  the LedgerStatus name from the trailing metadata "bksim-status", `grpc_code`).
- `AppendRun` / `stream_appends`: a pipelined Append stream whose payloads encode their append index
  (`payload(ledger, i)`), recording exactly what the AppendResponses acknowledged; `Background` runs a call
  (a recovery) alongside it.

Invariants: every wait has a deadline (helpers.wait_until, gRPC deadlines); nothing sleeps to synchronise;
every process started here is stopped by its pid.
"""
from __future__ import annotations

import collections
import random
import threading
from dataclasses import dataclass, field
from typing import Callable

import grpc
from kazoo.client import KazooClient

from bksim.adapters import processes
from bksim.adapters.broker_client import BrokerCallError, LedgerInfo, SyncBrokerClient, call_error
from bksim.gen import broker_pb2, broker_pb2_grpc
from bksim.metadata.paths import AVAILABLE, READONLY_CHILD, broker_path
from helpers import wait_until
from integration.bookie_harness import (SESSION_TIMEOUT_MS, START_TIMEOUT_S, STOP_TIMEOUT_S, BookieProcess,
                                       kazoo_client, launcher)

BROKER_MARKER = "bksim.cli.main broker run"
CALL_DEADLINE_S = 15.0  # a unary call to a broker; generous (recovery, ensemble change), always bounded
PAYLOAD_BYTES_MAX = 64 * 1024  # the test brokers' payload_bytes_max (so an oversize payload is cheap to send)
MESSAGE_BYTES_MAX = 8 * 1024 * 1024  # gRPC message bound of the blocking Append channel (both ways)

# Broker options for the tests. bookie_timeout_ms stays at its default: a killed bookie resets its connections,
# so the broker learns of it at once, and a shorter timeout would only add ensemble changes on a loaded machine.
BROKER_ENV = {
    "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_BROKER_PAYLOAD_BYTES_MAX": str(PAYLOAD_BYTES_MAX),
}


class BrokerProcess:
    """One broker process; can be started, killed (-9) and stopped (SIGTERM)."""

    def __init__(self, zookeeper, base_dir: str, name: str = "broker", env: dict[str, str] | None = None) -> None:
        self.zookeeper = zookeeper
        self.launcher = launcher(zookeeper, str(base_dir))
        overrides = {"BKSIM_BROKER_BROKER_ID": None, **BROKER_ENV, **(env or {})}  # the default id: host:port
        self.node = self.launcher.add_broker(env=overrides, name=name)
        self.base_dir = str(base_dir)
        self.port = self.node.port
        self.broker_id = self.node.node_id
        self.address = self.broker_id
        self.log_path = self.node.log_path

    @property
    def pid(self) -> int | None:
        return self.node.pid

    def environment(self) -> dict[str, str]:
        return dict(self.node.env)

    def spawn(self) -> int:
        return self.launcher.spawn(self.node)

    def wait_registered(self, zk: KazooClient, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait for /brokers/available/<id> (written once the gRPC server listens); returns its session."""
        path = broker_path(self.broker_id)

        def registered():
            if not self.alive():
                raise AssertionError(f"broker exited during start-up:\n{self.log_tail()}")
            stat = zk.exists(path)
            return stat is not None and stat.ephemeralOwner

        try:
            return wait_until(registered, timeout_s, interval_s=0.05, message=f"{path} registered")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- broker log ---\n{self.log_tail()}") from None

    def alive(self) -> bool:
        return processes.is_alive(self.pid, BROKER_MARKER)

    def kill9(self) -> None:
        assert processes.kill9(self.pid, timeout_s=10.0, expect_in_cmdline=BROKER_MARKER), \
            f"broker pid {self.pid} survived SIGKILL"

    def cleanup(self) -> None:
        if self.pid is not None and self.alive():
            self.launcher.stop(self.node, STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        return processes.tail(self.log_path, lines)


class BrokerCluster:
    """Bookies and brokers for one test module on the session's ZooKeeper (see the module docstring)."""

    def __init__(self, zookeeper, base_dir: str) -> None:
        self.zookeeper = zookeeper
        self.base_dir = str(base_dir)
        self.zk = kazoo_client(zookeeper)
        self.bookies: list[BookieProcess] = []
        self.brokers: list[BrokerProcess] = []

    # -- bookies --------------------------------------------------------------------------------------------
    def live_bookies(self) -> list[BookieProcess]:
        return [b for b in self.bookies if b.alive()]

    def bookie(self, bookie_id: str) -> BookieProcess:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(f"bookie {bookie_id} was not started by this cluster")

    def registered_writable(self) -> set[str]:
        if not self.zk.exists(AVAILABLE):
            return set()
        return {c for c in self.zk.get_children(AVAILABLE) if c != READONLY_CHILD}

    def settle(self, bookies: int, timeout_s: float = 3 * SESSION_TIMEOUT_MS / 1000 + 5) -> None:
        """Start fresh bookies until `bookies` are alive, then wait until the writable registrations are exactly
        the live bookies (a killed bookie's node lives until its session expires)."""
        fresh = []
        for _ in range(bookies - len(self.live_bookies())):
            b = BookieProcess(self.zookeeper, self.base_dir, name=f"bookie-{len(self.bookies) + 1}")
            self.bookies.append(b)
            b.spawn()
            fresh.append(b)
        for b in fresh:
            b.wait_registered(self.zk)
        live = {b.bookie_id for b in self.live_bookies()}
        assert len(live) == bookies, f"{len(live)} live bookies, wanted {bookies}"
        wait_until(lambda: self.registered_writable() == live, timeout_s, interval_s=0.05,
                   message=f"writable registrations {sorted(self.registered_writable())} to be exactly the live "
                           f"bookies {sorted(live)}")

    # -- brokers --------------------------------------------------------------------------------------------
    def start_brokers(self, n: int, env: dict[str, str] | None = None) -> list[BrokerProcess]:
        fresh = [BrokerProcess(self.zookeeper, self.base_dir, name=f"broker-{len(self.brokers) + i + 1}", env=env)
                 for i in range(n)]
        self.brokers.extend(fresh)
        for b in fresh:
            b.spawn()
        for b in fresh:
            b.wait_registered(self.zk)
        return fresh

    def cleanup(self) -> None:
        for p in [*self.brokers, *self.bookies]:
            p.cleanup()
        self.zk.stop()
        self.zk.close()


# -- the client side ---------------------------------------------------------------------------------------
# Unary calls and reads go through the project's client (SyncBrokerClient). Append streams use the blocking
# generated stub instead: grpc.aio (which BrokerClient's AppendStream is built on) reports a stream's status as
# INTERNAL "Internal error from Core" (debug string 'Failed "execute_batch": (SendMessageOperation,)') when a
# client write races the server ending the stream (grpc/grpc#36066); with AppendStream that hid FENCED in about
# 1 of 8 fenced streams here. The blocking API keeps the server's status.

def stream_error(e: grpc.RpcError, address: str) -> BrokerCallError:
    """The BrokerCallError of a failed blocking call (same rules as BrokerClient: status from "bksim-status")."""
    return call_error(e, address)  # reads only code(), details() and trailing_metadata(), which grpc.Call has


class BrokerConn:
    """One broker: SyncBrokerClient's calls (deadlines, BrokerCallError) under short names, plus the Append
    paths over the blocking stub (`append_once`, and `stream_appends` below)."""

    def __init__(self, address: str, deadline_s: float = CALL_DEADLINE_S) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.client = SyncBrokerClient(address, deadline_s=deadline_s, recover_deadline_s=deadline_s)
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX)])
        self.stub = broker_pb2_grpc.BrokerStub(self.channel)

    def __enter__(self) -> "BrokerConn":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()
        self.channel.close()

    def create(self, e: int, qw: int, qa: int, password: bytes) -> LedgerInfo:
        return self.client.create_ledger(e, qw, qa, password=password)

    def metadata(self, ledger_id: int) -> LedgerInfo:
        return self.client.get_metadata(ledger_id)

    def open(self, ledger_id: int, password: bytes, recover: bool) -> tuple[LedgerInfo, int]:
        return self.client.open_ledger(ledger_id, password=password, recover=recover)

    def close_ledger(self, ledger_id: int, password: bytes) -> LedgerInfo:
        return self.client.close_ledger(ledger_id, password=password)

    def read_lac(self, ledger_id: int, password: bytes) -> int:
        return self.client.read_lac(ledger_id, password=password)

    def read(self, ledger_id: int, password: bytes, first: int = 0, last: int = -1) -> dict[int, bytes]:
        """Entries first..last (-1: up to the LAC) as {entry id: payload}; ids must come in order, once each."""
        entries = self.client.read_entries(ledger_id, first, last, password=password)
        ids = [entry_id for entry_id, _ in entries]
        assert ids == list(range(first, first + len(ids))), f"ReadEntries gave ids out of order: {ids[:20]}"
        return dict(entries)

    def list_ledgers(self) -> set[int]:
        return set(self.client.list_ledgers())

    def health(self) -> str:
        return self.client.health()

    def append_once(self, ledger_id: int, password: bytes, payloads: list[bytes]) -> broker_pb2.AppendResponse:
        """One AppendRequest on a fresh stream; its one response (or BrokerCallError)."""
        request = broker_pb2.AppendRequest(ledger_id=ledger_id, password=password, payloads=payloads, request_id=1)
        try:
            responses = list(self.stub.Append(iter([request]), timeout=self.deadline_s))
        except grpc.RpcError as e:
            raise stream_error(e, self.address) from None
        assert len(responses) == 1, f"{len(responses)} responses to one request: {responses}"
        return responses[0]


# -- payloads and the Append stream ------------------------------------------------------------------------

def payload(ledger_id: int, index: int) -> bytes:
    """The payload appended as the `index`-th entry of a ledger: names both, then 0..700 deterministic bytes."""
    rng = random.Random(ledger_id * 1_000_003 + index)
    return f"ledger {ledger_id} entry {index}|".encode() + rng.randbytes(rng.randint(0, 700))


@dataclass
class AppendRun:
    """What one Append stream sent and what its responses acknowledged."""
    ledger_id: int
    sent: int = 0                                          # payloads sent: indexes 0 .. sent-1
    acked: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload, from the AppendResponses
    error: BrokerCallError | None = None                   # how the stream ended, if not cleanly
    responses: int = 0
    inband_error: str = ""                                 # LedgerStatus of the stream's in-band last message

    @property
    def max_acked(self) -> int:
        return max(self.acked, default=-1)


def stream_appends(conn: BrokerConn, ledger_id: int, password: bytes, *, batch: int = 10, window: int = 16,
                   target: int, on_target: Callable[[], object] | None = None, total: int | None = None,
                   until_error: bool = False, entries_max: int = 200_000, timeout_s: float = 30.0) -> AppendRun:
    """Pipeline AppendRequests of `batch` payloads (at most `window` unanswered) to a ledger that starts empty.

    When `target` entries are acknowledged, `on_target()` is called once (from the thread reading responses; it
    must not block long). The stream then goes on until `total` entries are acknowledged (then it is closed
    cleanly), or, with `until_error`, until the broker ends it with an error (at most `entries_max` entries are
    sent; reaching that is a test failure). Every response is checked: in request order, `count` = the
    request's payloads, `first_entry_id` = the append index of its first payload (one writer, so entry ids
    are the append order).
    """
    run = AppendRun(ledger_id)
    room = threading.Semaphore(window)
    stop = threading.Event()
    unanswered: collections.deque = collections.deque()

    def requests():  # consumed by gRPC's own thread
        request_id = 0
        while not stop.is_set() and run.sent < entries_max:
            if not room.acquire(timeout=timeout_s) or stop.is_set():
                return
            request_id += 1
            payloads = [payload(ledger_id, run.sent + i) for i in range(batch)]
            unanswered.append((request_id, run.sent, payloads))
            run.sent += len(payloads)
            yield broker_pb2.AppendRequest(ledger_id=ledger_id, password=password, payloads=payloads,
                                           request_id=request_id)

    call = conn.stub.Append(requests(), timeout=timeout_s)
    fired = False
    try:
        # answers that were ready at once share a message (`next`)
        for response in (r for message in call for r in (message, *message.next)):
            if response.error:  # the in-band reason, sent just before the stream's status
                run.inband_error = broker_pb2.LedgerStatus.Name(response.error)
                continue
            request_id, first_index, payloads = unanswered.popleft()
            count = len(payloads)
            assert (response.request_id, response.first_entry_id, response.count) == (request_id, first_index, count), \
                f"response {response} does not match request {request_id} (indexes {first_index}+{count})"
            assert response.last_add_confirmed >= first_index + count - 1, response
            for i, data in enumerate(payloads):  # the bytes sent, under the ids the response names
                run.acked[response.first_entry_id + i] = data
            run.responses += 1
            room.release()
            if not fired and len(run.acked) >= target:
                fired = True
                if on_target is not None:
                    on_target()
            if total is not None and len(run.acked) >= total:
                stop.set()
    except grpc.RpcError as e:
        run.error = stream_error(e, conn.address)
    finally:
        stop.set()
        room.release()  # the request thread may wait for room
        call.cancel()
    if until_error:
        assert run.error is not None, (f"the stream ended cleanly after {len(run.acked)} acknowledged entries "
                                       f"({run.sent} sent, entries_max {entries_max})")
    return run


class Background:
    """A call run in a thread (e.g. a recovery started while a stream goes on); `result()` joins (bounded)."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self._value: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float = CALL_DEADLINE_S + 5):
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the background call did not return within {timeout_s}s"
        if self._error is not None:
            raise self._error
        return self._value


def check_ledger_contents(ledger_id: int, entries: dict[int, bytes], last_entry_id: int,
                          acked: dict[int, bytes]) -> list[str]:
    """Problems (empty = none) with a closed ledger's entries 0..last_entry_id as read: every id present, each
    entry the payload appended at that index (acknowledged or recovered, nothing else), every acknowledged
    entry at or below last_entry_id with identical bytes."""
    problems = []
    if sorted(entries) != list(range(last_entry_id + 1)):
        problems.append(f"read ids {min(entries, default=None)}..{max(entries, default=None)} "
                        f"({len(entries)} entries), expected 0..{last_entry_id}")
    for entry_id, data in sorted(entries.items()):
        if data != payload(ledger_id, entry_id):
            problems.append(f"entry {entry_id}: {data[:40]!r}... is not the payload appended at index {entry_id}")
    above = sorted(e for e in acked if e > last_entry_id)
    if above:
        problems.append(f"{len(above)} acknowledged entries above last_entry_id {last_entry_id}: {above[:5]}")
    for entry_id, data in sorted(acked.items()):
        if entry_id <= last_entry_id and entries.get(entry_id) != data:
            problems.append(f"acknowledged entry {entry_id} reads back as {entries.get(entry_id, b'<missing>')[:40]!r}")
    return problems[:10]
