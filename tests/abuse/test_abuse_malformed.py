"""Malformed bytes as messages, to every method of every service of the bookie (Bookie, BookieAdmin) and the
broker (Broker, Topics): each call whose bytes the request type's parser refuses ends with INVALID_ARGUMENT
and a message naming the problem (a unary call, and a stream at its first such message), never UNKNOWN or
INTERNAL; the processes keep serving (abuse.harness.abused)."""
from __future__ import annotations

import grpc

from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from abuse.harness import abused
from abuse.wire import MALFORMED, SERVICES, UNHANDLED, call, methods


def test_malformed_bytes_to_every_method(target):
    seen = []
    with abused(target, "malformed bytes to every method"):
        for name, services in SERVICES.items():
            address = target.processes[name].address
            with grpc.insecure_channel(address) as channel:
                for service in services:
                    for method, (path, cs, ss) in zip(service.methods, methods(service)):
                        request_type = message_factory.GetMessageClass(method.input_type)
                        for what, data in MALFORMED.items():
                            try:
                                request_type.FromString(data)
                                parses = True  # e.g. field number 0 in a message without fields
                            except DecodeError:
                                parses = False
                            code, details, _ = call(channel, path, cs, ss, [data])
                            seen.append((path, what, parses, code, details))
    refused = [s for s in seen if not s[2]]
    assert len(refused) >= len(seen) - 10, f"only {len(refused)} of {len(seen)} cases are malformed"
    wrong = [s for s in refused if s[3] != grpc.StatusCode.INVALID_ARGUMENT or "malformed" not in s[4]]
    wrong += [s for s in seen if s[3] in UNHANDLED]
    assert not wrong, "\n".join(f"{p} <- {w}: {c.name} {d!r}" for p, w, _, c, d in wrong[:20])
