"""grpc-baseline: a bare grpc.aio bidi echo stream, the denominator of `perf bookie-add`'s ratio.

Server (`python -m bksim.perf.grpc_baseline serve --port P`, a separate process like a bookie): for each
EchoRequest it immediately yields an EchoAck carrying the batch id and one packed status (0 = OK) per
record. It stores nothing; all it pays is what any gRPC Python server pays per batch: HTTP/2, protobuf
parsing of `batch` records, building and sending the ack.

Why this ack: proto/perf_echo.proto gives EchoRequest/EchoAck exactly the wire shape of the bookie's
AddRequest/AddResponse, so the baseline moves the same bytes in both directions as a real add of the same
batch. Echoing the records back instead would double the bytes the baseline moves and make it *slower* than
a bookie could be; acking with nothing would understate the (small) response cost.

Client (shared with bookie-add, see `drive`): one bidi stream; an async-generator request iterator keeps at
most `inflight` batches unacknowledged; each batch carries `batch` entries of `record_bytes` bytes in the
format of PROTOCOL.md §1 (unique ids, CRC32C digest), built the same way for both benchmarks. A record's
latency is from the moment its batch is handed to gRPC to the moment its ack is read.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import grpc

from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.gen import perf_echo_pb2, perf_echo_pb2_grpc
from bksim.model.config import BookieConfig
from bksim.perf.machine import process_cpu_s
from bksim.perf.procs import Child, ProcessGroup, free_port
from bksim.perf.stats import LatencyRecorder, Result, make_result

TARGET_RATIO = 0.5
INFLIGHT_DEFAULT = 8  # batches unacknowledged per stream
READY_TIMEOUT_S = 30.0
MASTER_KEY = bytes(32)  # SHA-256 sized, as the bookie expects


def channel_options() -> list[tuple[str, int]]:
    frame = BookieConfig().frame_bytes_max
    return [("grpc.max_send_message_length", frame), ("grpc.max_receive_message_length", frame)]


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
    elapsed_s: float  # first batch handed to gRPC .. last ack read
    batches: int
    not_ok: int  # records acknowledged with a non-OK status (not counted in latencies)
    first_error: str
    client_cpu_s: float


async def drive(open_stream: Callable[[AsyncIterator], AsyncIterator], make_request: Callable[[int, list[bytes]], object],
                read_ack: Callable[[object], tuple[int, int, str]], entries: EntryFactory, batch: int,
                inflight: int, seconds: float, records_max: int = 0) -> DriveResult:
    """Stream batches with at most `inflight` unacknowledged, until `seconds` pass and/or `records_max` are sent.

    open_stream(requests) -> responses; make_request(batch_id, entries) -> message;
    read_ack(response) -> (batch id, OK record count, first non-OK reason).
    """
    if batch <= 0 or inflight <= 0:
        raise ValueError(f"batch and inflight must be > 0, got {batch} and {inflight}")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    window = asyncio.Semaphore(inflight)
    sent_at: dict[int, tuple[float, int]] = {}
    latencies = LatencyRecorder()
    state = {"sent": 0, "start": 0.0, "not_ok": 0, "error": ""}
    cpu_start = time.process_time()

    async def requests():
        batch_id = 0
        deadline = None
        while True:
            await window.acquire()
            now = time.perf_counter()
            if deadline is None:
                state["start"] = now
                deadline = now + seconds if seconds > 0 else float("inf")
            n = batch if records_max <= 0 else min(batch, records_max - state["sent"])
            if now >= deadline or n <= 0:
                return
            request = make_request(batch_id, entries.take(n))
            state["sent"] += n
            sent_at[batch_id] = (time.perf_counter(), n)
            batch_id += 1
            yield request

    last_ack = 0.0
    batches = 0
    async for response in open_stream(requests()):
        last_ack = time.perf_counter()
        batch_id, ok, error = read_ack(response)
        submitted_at, n = sent_at.pop(batch_id)
        if ok:
            latencies.add(last_ack - submitted_at, ok)
        if ok < n:
            state["not_ok"] += n - ok
            state["error"] = state["error"] or error or "non-OK status"
        batches += 1
        window.release()
    if sent_at:
        raise RuntimeError(f"stream ended with {len(sent_at)} batches unacknowledged")
    return DriveResult(latencies, last_ack - state["start"], batches, state["not_ok"], state["error"],
                       time.process_time() - cpu_start)


# ---------------------------------------------------------------------------------------------- echo client
async def drive_echo(channel, record_bytes: int, batch: int, inflight: int, seconds: float,
                     records_max: int = 0) -> DriveResult:
    stub = perf_echo_pb2_grpc.PerfEchoStub(channel)

    def make_request(batch_id: int, items: list[bytes]):
        request = perf_echo_pb2.EchoRequest(batch_id=batch_id)
        add = request.records.add
        for entry in items:
            add(entry=entry, master_key=MASTER_KEY, flags=0)
        return request

    def read_ack(ack) -> tuple[int, int, str]:
        return ack.batch_id, sum(1 for s in ack.statuses if s == 0), ack.message

    return await drive(stub.Echo, make_request, read_ack, EntryFactory(record_bytes, ledger_id=1), batch,
                       inflight, seconds, records_max)


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
        return asyncio.run(_measure(server, port, record_bytes, batch, inflight, seconds, records_max, idle_guard))
    finally:
        group.stop_all()


async def _measure(server: Child, port: int, record_bytes: int, batch: int, inflight: int, seconds: float,
                   records_max: int, idle_guard: Callable[[str], float]) -> Result:
    alive = lambda: server.exited() is None  # noqa: E731
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options()) as channel:
        try:
            await wait_channel_ready(channel, READY_TIMEOUT_S, alive, f"echo server (pid {server.pid})")
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{e}; its log:\n{server.log_tail()}") from None
        idle = idle_guard("grpc-baseline")
        server_cpu_start = process_cpu_s(server.pid)
        result = await drive_echo(channel, record_bytes, batch, inflight, seconds, records_max)
        server_cpu_s = process_cpu_s(server.pid) - server_cpu_start
    return drive_result("grpc-baseline", record_bytes, batch, inflight, result, idle, server_cpu_s)


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
            yield perf_echo_pb2.EchoAck(batch_id=request.batch_id, statuses=[0] * len(request.records))


async def serve(port: int, host: str = "127.0.0.1") -> None:
    server = grpc.aio.server(options=channel_options())
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
