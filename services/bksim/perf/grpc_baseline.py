"""grpc-baseline: a bare grpc.aio bidi echo stream, the denominator of `perf bookie-add`'s ratio.

Server (`python -m bksim.perf.grpc_baseline serve --port P`, a separate process like a bookie): for each
EchoRequest it immediately yields an EchoAck carrying the batch id and one packed status (0 = OK) per
record. It stores nothing; all it pays is what any gRPC Python server pays per batch: HTTP/2, protobuf
parsing of `batch` records, building and sending the ack.

Why this ack: proto/perf_echo.proto gives EchoRequest/EchoAck exactly the wire shape of the bookie's
AddRequest/AddResponse, so the baseline moves the same bytes in both directions as a real add of the same
batch. Echoing the records back instead would double the bytes the baseline moves and make it *slower* than
a bookie could be; acking with nothing would understate the (small) response cost.

Client (shared with bookie-add, see `drive`): one bidi stream driven by bookie_client.AddStream, the same
class the bookie benchmark uses, so both client sides do identical work; its window keeps at most
`inflight` batches unacknowledged. Each batch carries `batch` entries of `record_bytes` bytes in the format
of PROTOCOL.md §1 (unique ids, CRC32C digest, a real master key). A record's latency is from the moment
its batch is handed to the stream to the moment its ack arrives.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.adapters.bookie_client import FRAME_BYTES_MAX, AddStream
from bksim.adapters.bookie_server import server_options
from bksim.formats.entry import master_key
from bksim.gen import perf_echo_pb2, perf_echo_pb2_grpc
from bksim.model.config import BookieConfig
from bksim.perf.machine import process_cpu_s
from bksim.perf.procs import Child, ProcessGroup, free_port, run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

INFLIGHT_DEFAULT = 8  # batches unacknowledged per stream
READY_TIMEOUT_S = 30.0
RESPONSE_TIMEOUT_S = 30.0  # an ack slower than this breaks the run (BookieUnreachable)
MASTER_KEY = master_key(b"bksim-perf")


def channel_options() -> list[tuple[str, int]]:
    """The client channel options of bookie_client.BookieClient, so both benchmarks' channels match."""
    return [("grpc.max_receive_message_length", FRAME_BYTES_MAX), ("grpc.max_send_message_length", -1)]


# ---------------------------------------------------------------------------------------------- records
class EntryFactory:
    """Entries of exactly `record_bytes` bytes (36-byte header + payload) for one ledger, ids 0, 1, 2, ..."""

    def __init__(self, record_bytes: int, ledger_id: int) -> None:
        if record_bytes < HEADER_BYTES:
            raise ValueError(f"record_bytes must be >= {HEADER_BYTES} (the entry header), got {record_bytes}")
        self.record_bytes = record_bytes
        self.ledger_id = ledger_id
        self._payload = os.urandom(record_bytes - HEADER_BYTES)
        self._next_entry_id = 0
        self._length = 0

    def take(self, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            eid = self._next_entry_id
            self._length += len(self._payload)
            out.append(encode_entry(self.ledger_id, eid, eid - 1, self._length, self._payload))
            self._next_entry_id = eid + 1
        assert all(len(e) == self.record_bytes for e in out)
        return out


# ---------------------------------------------------------------------------------------------- driver
@dataclass
class DriveResult:
    latencies: LatencyRecorder
    elapsed_s: float  # first batch handed to the stream .. last ack
    batches: int
    not_ok: int  # records acknowledged with a non-OK status (not counted in latencies)
    first_error: str
    client_cpu_s: float


def build_request(request_type, batch_id: int, entries: list[bytes]):
    """An AddRequest-shaped message (bookie_pb2.AddRequest or perf_echo_pb2.EchoRequest) of `entries`, in the
    compact form (`data`, one master key and flags), as the bookie's clients send one ledger's batch."""
    return request_type(batch_id=batch_id, data=entries, master_key=MASTER_KEY, flags=0)


async def drive(stream: AddStream, request_type, entries: EntryFactory, batch: int, seconds: float,
                records_max: int = 0) -> DriveResult:
    """Send batches on `stream` (its window bounds the unacknowledged ones) until `seconds` pass and/or
    `records_max` records were sent; wait for every ack. Both benchmarks use this, on the same AddStream
    class of bksim.adapters.bookie_client, so their client sides do identical work.
    """
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    latencies = LatencyRecorder()
    state = {"last_ack": 0.0, "not_ok": 0, "error": "", "batches": 0}
    futures = []
    perf_counter = time.perf_counter

    def on_ack(future: asyncio.Future, submitted_at: float, n: int) -> None:
        acked_at = perf_counter()
        state["last_ack"] = max(state["last_ack"], acked_at)
        if future.cancelled() or future.exception() is not None:
            return  # raised below, by gather
        state["batches"] += 1
        ok = sum(1 for status in future.result().statuses if status == 0)
        if ok:
            latencies.add(acked_at - submitted_at, ok)
        if ok < n:
            state["not_ok"] += n - ok
            state["error"] = state["error"] or future.result().message or "non-OK status"

    cpu_start = time.process_time()
    start = perf_counter()
    deadline = start + seconds if seconds > 0 else float("inf")
    sent = 0
    batch_id = 0
    while perf_counter() < deadline:
        n = batch if records_max <= 0 else min(batch, records_max - sent)
        if n <= 0:
            break
        request = build_request(request_type, batch_id, entries.take(n))
        future = await stream.send_request(request)  # waits for window room
        submitted_at = perf_counter()
        future.add_done_callback(lambda f, t=submitted_at, k=n: on_ack(f, t, k))
        futures.append(future)
        sent += n
        batch_id += 1
        if len(futures) > 4096:  # keep the list short: drop acknowledged ones
            futures = [f for f in futures if not f.done()]
    await asyncio.gather(*futures)  # raises BookieUnreachable if the stream broke
    await asyncio.sleep(0)  # let the last done-callbacks run
    await stream.close()
    return DriveResult(latencies, state["last_ack"] - start, state["batches"], state["not_ok"], state["error"],
                       time.process_time() - cpu_start)


# ---------------------------------------------------------------------------------------------- echo client
class _EchoAsBookieStub:
    """Lets bookie_client.AddStream drive the echo service: Echo has AddEntries' exact message shapes."""

    def __init__(self, channel) -> None:
        self.AddEntries = perf_echo_pb2_grpc.PerfEchoStub(channel).Echo


async def drive_echo(channel, record_bytes: int, batch: int, inflight: int, seconds: float,
                     records_max: int = 0) -> DriveResult:
    stream = AddStream(_EchoAsBookieStub(channel), inflight, RESPONSE_TIMEOUT_S)
    return await drive(stream, perf_echo_pb2.EchoRequest, EntryFactory(record_bytes, ledger_id=1), batch,
                       seconds, records_max)


async def wait_channel_ready(channel, timeout_s: float, alive: Callable[[], bool], what: str) -> None:
    """Wait for the channel to connect; fail fast (with `what`) if the server process died."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not alive():
            raise RuntimeError(f"{what} exited before it became ready")
        try:
            await asyncio.wait_for(channel.channel_ready(), 0.25)
            return
        except asyncio.TimeoutError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s") from None


def measure(workdir: str, record_bytes: int, batch: int, inflight: int, seconds: float, records_max: int = 0,
            idle_guard: Callable[[str], float] = lambda label: 1.0) -> Result:
    """Start the echo server process, wait until ready and the CPU is idle, measure, stop it; the figures."""
    group = ProcessGroup()
    try:
        port = free_port()
        server = group.spawn("perf-echo-server", [sys.executable, "-m", "bksim.perf.grpc_baseline", "serve",
                                                  "--port", str(port)],
                             os.path.join(workdir, f"echo-server-{port}.log"))
        return run_interruptible(_measure(server, port, record_bytes, batch, inflight, seconds, records_max, idle_guard))
    finally:
        group.stop_all()


async def _measure(server: Child, port: int, record_bytes: int, batch: int, inflight: int, seconds: float,
                   records_max: int, idle_guard: Callable[[str], float]) -> Result:
    alive = server.alive
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options()) as channel:
        try:
            await wait_channel_ready(channel, READY_TIMEOUT_S, alive, f"echo server (pid {server.pid})")
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{e}; its log:\n{server.log_tail()}") from None
        idle = idle_guard("grpc-baseline")
        server_cpu_start = process_cpu_s(server.pid)
        result = await drive_echo(channel, record_bytes, batch, inflight, seconds, records_max)
        server_cpu_s = process_cpu_s(server.pid) - server_cpu_start
    out = drive_result("grpc-baseline", record_bytes, batch, inflight, result, idle, server_cpu_s)
    out.extra["server_pid"] = server.pid  # stopped when measure() returns
    return out


def drive_result(name: str, record_bytes: int, batch: int, inflight: int, result: DriveResult, idle: float,
                 server_cpu_s: float) -> Result:
    """A Result from a DriveResult, with the CPU use of both ends (cores = CPU seconds / elapsed)."""
    elapsed = result.elapsed_s
    extra = {"inflight_batches": inflight, "batches": result.batches,
             "batches_per_s": result.batches / elapsed if elapsed > 0 else 0.0,
             "server_cpu_cores": server_cpu_s / elapsed if elapsed > 0 else 0.0,
             "client_cpu_cores": result.client_cpu_s / elapsed if elapsed > 0 else 0.0}
    if result.not_ok:
        extra["records_not_ok"] = result.not_ok
        extra["first_error"] = result.first_error
    return make_result(name, record_bytes, batch, elapsed, result.latencies, idle, extra)


# ---------------------------------------------------------------------------------------------- server
class EchoServicer(perf_echo_pb2_grpc.PerfEchoServicer):
    async def Echo(self, request_iterator, context):
        async for request in request_iterator:
            yield perf_echo_pb2.EchoAck(batch_id=request.batch_id,
                                        statuses=[0] * (len(request.records) + len(request.data)))


async def serve(port: int, host: str = "127.0.0.1") -> None:
    server = grpc.aio.server(options=server_options(BookieConfig()))  # the bookie's server options
    perf_echo_pb2_grpc.add_PerfEchoServicer_to_server(EchoServicer(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"perf echo server listening on {host}:{bound} (pid {os.getpid()})", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bksim.perf.grpc_baseline")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the echo server until SIGTERM")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
