"""adapters/grpc_input.py on an in-process grpc.aio server over loopback: a request that does not parse is
INVALID_ARGUMENT naming the type (unary, and a stream at its first malformed message, after the answers to
the valid ones before it), well-formed requests pass unchanged, unknown methods stay UNIMPLEMENTED, and status
messages are cut to DETAILS_CHARS_MAX."""
from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from bksim.adapters.grpc_input import DETAILS_CHARS_MAX, MalformedRequests, bounded_details
from bksim.gen import perf_echo_pb2, perf_echo_pb2_grpc

GARBAGE = b"\x0a\x7fabc"  # a length past the end of the message


class Echo(perf_echo_pb2_grpc.PerfEchoServicer):
    def __init__(self) -> None:
        self.seen: list[int] = []

    async def Echo(self, request_iterator, context):
        async for request in request_iterator:
            self.seen.append(request.batch_id)
            yield perf_echo_pb2.EchoAck(batch_id=request.batch_id)


async def _serve(echo: Echo):
    server = grpc.aio.server(interceptors=[MalformedRequests()])
    health = HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    perf_echo_pb2_grpc.add_PerfEchoServicer_to_server(echo, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_malformed_requests_are_invalid_argument():
    async def main():
        echo = Echo()
        server, address = await _serve(echo)
        try:
            async with grpc.aio.insecure_channel(address) as ch:
                ok = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert ok.status == health_pb2.HealthCheckResponse.SERVING
                raw = ch.unary_unary("/grpc.health.v1.Health/Check")
                try:
                    await raw(GARBAGE, timeout=5)
                    raise AssertionError("a malformed request was answered")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                    assert "malformed" in e.details() and "HealthCheckRequest" in e.details(), e.details()
                valid = perf_echo_pb2.EchoRequest(batch_id=7).SerializeToString()
                call = ch.stream_stream("/bksim.perf.v1.PerfEcho/Echo")(iter([valid, GARBAGE, valid]), timeout=5)
                answers = [perf_echo_pb2.EchoAck.FromString(b).batch_id async for b in _responses(call)]
                assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT, await call.details()
                assert answers in ([], [7]) and echo.seen == [7], (answers, echo.seen)
                try:
                    await ch.unary_unary("/no.such.Service/Method")(b"", timeout=5)
                    raise AssertionError("an unknown method was answered")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e
        finally:
            await server.stop(0)
    asyncio.run(main())


async def _responses(call):
    try:
        async for response in call:
            yield response
    except grpc.aio.AioRpcError:
        return


class AnswersAtTheEnd(perf_echo_pb2_grpc.PerfEchoServicer):
    """Reads the whole request stream, then answers each request: its writes come after the stream ended."""

    async def Echo(self, request_iterator, context):
        ids = [request.batch_id async for request in request_iterator]
        for batch_id in ids:
            await context.write(perf_echo_pb2.EchoAck(batch_id=batch_id))


def test_a_malformed_message_ends_the_stream_after_the_handler_answered_what_came_before():
    """The status goes once the handler has ended, not from the reading of the requests while the handler may be
    writing (grpc.aio can then lose the status, and the client waits for its deadline); so every answer the handler
    writes after the stream ended still reaches the client, then INVALID_ARGUMENT."""
    async def main():
        server = grpc.aio.server(interceptors=[MalformedRequests()])
        perf_echo_pb2_grpc.add_PerfEchoServicer_to_server(AnswersAtTheEnd(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                valid = [perf_echo_pb2.EchoRequest(batch_id=i).SerializeToString() for i in (7, 8)]
                call = ch.stream_stream("/bksim.perf.v1.PerfEcho/Echo")(iter(valid + [GARBAGE, valid[0]]), timeout=5)
                answers = [perf_echo_pb2.EchoAck.FromString(b).batch_id async for b in _responses(call)]
                code, details = await call.code(), await call.details()
        finally:
            await server.stop(None)
        assert answers == [7, 8], answers
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in details, (code, details)
    asyncio.run(main())


def test_bounded_details():
    assert bounded_details("short") == "short"
    long = "x" * 100_000
    cut = bounded_details(long)
    assert len(cut) <= DETAILS_CHARS_MAX and cut.endswith("(100000 characters, cut)"), cut[-60:]
