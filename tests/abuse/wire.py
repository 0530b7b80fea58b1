"""Hand-built protobuf wire bytes and raw gRPC calls for the abuse suite.

Raw calls go through `channel.unary_unary` / `stream_stream` with no serializer (the bytes given are the
message as sent) and no deserializer, so a test sends exactly what it built, whatever the .proto says.
"""
from __future__ import annotations

import grpc

from bksim.gen import bookie_pb2, broker_pb2, topic_pb2

CALL_DEADLINE_S = 5.0
# Codes that say "the server did not handle this": an unhandled exception (UNKNOWN) or a server fault (INTERNAL).
UNHANDLED = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

# Bytes no protobuf parser accepts, each for another reason.
MALFORMED = {
    "truncated varint": b"\x08\x80\x80\x80",
    "length past the end": b"\x0a\x7fabc",
    "wire type 7": b"\x0f\x01",
    "field number 0": b"\x00\x01",
    "end group without start": b"\x0c",
    "varint of 11 bytes": b"\x08" + b"\xff" * 10 + b"\x01",
}


def methods(service) -> list[tuple[str, bool, bool]]:
    """(path, client_streaming, server_streaming) of every method of a service descriptor."""
    return [(f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming) for m in service.methods]


SERVICES = {
    "bookie": [bookie_pb2.DESCRIPTOR.services_by_name["Bookie"], bookie_pb2.DESCRIPTOR.services_by_name["BookieAdmin"]],
    "broker": [broker_pb2.DESCRIPTOR.services_by_name["Broker"], topic_pb2.DESCRIPTOR.services_by_name["Topics"]],
}


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 travels as its 64-bit two's complement (10 bytes)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def field_bytes(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def field_fixed64(number: int, value: int) -> bytes:
    return varint(number << 3 | 1) + (value & ((1 << 64) - 1)).to_bytes(8, "little")


def call(channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool, messages: list[bytes],
         timeout_s: float = CALL_DEADLINE_S) -> tuple[grpc.StatusCode, str, list[bytes]]:
    """One raw call: (status code, details, response bytes). Stream requests are sent, then half-closed."""
    responses: list[bytes] = []
    try:
        if not client_streaming and not server_streaming:
            responses.append(channel.unary_unary(path)(messages[0], timeout=timeout_s))
        elif not client_streaming:
            responses.extend(channel.unary_stream(path)(messages[0], timeout=timeout_s))
        elif not server_streaming:
            responses.append(channel.stream_unary(path)(iter(messages), timeout=timeout_s))
        else:
            responses.extend(channel.stream_stream(path)(iter(messages), timeout=timeout_s))
    except grpc.RpcError as e:
        return e.code(), e.details() or "", responses
    return grpc.StatusCode.OK, "", responses
