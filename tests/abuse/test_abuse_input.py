"""Hostile values in well-formed messages, against the real bookie and broker: messages above the frame bound,
wrong wire types, unknown fields, unknown enum values, negative and huge ids and counts. Each call gets the
precise answer written next to it (a gRPC code with a message, or a bookie status in the response), never
UNKNOWN or INTERNAL and never the bookie's "internal error"; the processes keep serving, bounded
(abuse.harness.abused)."""
from __future__ import annotations

import grpc
import pytest

from abuse.harness import BOOKIE_ENTRY_BYTES, BOOKIE_FRAME_BYTES, BROKER_FRAME_BYTES, PASSWORD, PAYLOAD_BYTES_MAX, \
    abused
from abuse.wire import UNLIMITED, call, field_bytes, field_fixed64, field_varint
from bksim.formats.entry import encode_entry, master_key
from bksim.gen import bookie_pb2, bookie_pb2_grpc, broker_pb2, broker_pb2_grpc, topic_pb2, topic_pb2_grpc

I64_MAX = 2**63 - 1
I32_MAX = 2**31 - 1
KEY = master_key(PASSWORD)
Code = grpc.StatusCode


def _code(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return Code.OK, ""


def _check(results: list[tuple[str, grpc.StatusCode, str, set]]) -> None:
    wrong = [(what, code.name, details) for what, code, details, expected in results
             if code not in expected or (code != Code.OK and not details)]
    assert not wrong, "\n".join(f"{w}: {c} {d!r}" for w, c, d in wrong)


@pytest.fixture(scope="module")
def ledger(target):
    """A ledger of the broker with 10 entries (E = Qw = Qa = 1 on the suite's bookie)."""
    conn = target.conn
    ledger_id = conn.create(1, 1, 1, PASSWORD).ledger_id
    conn.append_once(ledger_id, PASSWORD, [b"x%d" % i for i in range(10)])
    return ledger_id


def test_oversized_messages(target, ledger):
    """Above the frame bound: RESOURCE_EXHAUSTED from gRPC before the server buffers it; above the payload or
    entry bound but within the frame: the request is refused (INVALID_ARGUMENT, BAD_REQUEST)."""
    results = []
    with abused(target, "oversized messages"):
        with grpc.insecure_channel(target.bookie.address, options=UNLIMITED) as ch:
            big = field_varint(1, 1) + field_bytes(2, field_bytes(1, b"\0" * BOOKIE_FRAME_BYTES))
            code, details, _ = call(ch, "/bksim.bookie.v1.Bookie/AddEntries", True, True, [big])
            results.append(("bookie AddEntries above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            code, details, _ = call(ch, "/bksim.bookie.v1.Bookie/ReadEntries", False, False,
                                    [field_varint(1, 1) + field_bytes(4, b"k" * (BOOKIE_FRAME_BYTES + 1))])
            results.append(("bookie ReadEntries above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            stub = bookie_pb2_grpc.BookieStub(ch)
            entry = encode_entry(ledger + 10**9, 0, -1, 0, b"e" * BOOKIE_ENTRY_BYTES)  # above entry_bytes_max
            responses = list(stub.AddEntries(iter([bookie_pb2.AddRequest(
                batch_id=7, entries=[bookie_pb2.AddEntry(entry=entry, master_key=KEY)])]), timeout=10))
            assert [list(r.statuses) for r in responses] == [[bookie_pb2.BAD_REQUEST]], responses
            assert "bytes" in responses[0].message, responses[0].message
        with grpc.insecure_channel(target.broker.address, options=UNLIMITED) as ch:
            big = field_varint(1, ledger) + field_bytes(3, b"\0" * BROKER_FRAME_BYTES)
            code, details, _ = call(ch, "/bksim.broker.v1.Broker/Append", True, True, [big])
            results.append(("broker Append above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            code, details, _ = call(ch, "/bksim.topic.v1.Topics/CreateTenant", False, False,
                                    [field_bytes(1, b"t" * BROKER_FRAME_BYTES)])
            results.append(("broker CreateTenant above frame", code, details, {Code.RESOURCE_EXHAUSTED}))
            stub = broker_pb2_grpc.BrokerStub(ch)
            code, details = _code(lambda: list(stub.Append(iter([broker_pb2.AppendRequest(
                ledger_id=ledger, password=PASSWORD, payloads=[b"p" * (PAYLOAD_BYTES_MAX + 1)], request_id=1)]),
                timeout=10)))
            results.append(("broker Append payload above payload_bytes_max", code, details, {Code.INVALID_ARGUMENT}))
            code, details = _code(lambda: topic_pb2_grpc.TopicsStub(ch).CreateTenant(
                topic_pb2.CreateTenantRequest(tenant="t" * 1_000_000), timeout=10))
            results.append(("broker CreateTenant name of 1 MB", code, details, {Code.INVALID_ARGUMENT}))
    _check(results)


def test_wrong_wire_types_and_unknown_fields(target, ledger):
    """A known field with another wire type is kept as an unknown field (the field reads as its default), an
    unknown field is skipped: the request is answered as if they were absent; invalid UTF-8 in a string
    field does not parse: INVALID_ARGUMENT."""
    unknown = field_varint(99, 7) + field_bytes(100, b"junk") + field_fixed64(101, -1)
    results = []
    with abused(target, "wrong wire types and unknown fields"):
        with grpc.insecure_channel(target.bookie.address) as ch:
            # ReadLac with ledger_id sent as bytes: answered as ReadLac of ledger 0
            code, details, out = call(ch, "/bksim.bookie.v1.Bookie/ReadLac", False, False,
                                      [field_bytes(1, b"\x01\x02") + unknown])
            results.append(("bookie ReadLac, ledger id as bytes", code, details, {Code.OK}))
            assert bookie_pb2.ReadLacResponse.FromString(out[0]) == bookie_pb2_grpc.BookieStub(ch).ReadLac(
                bookie_pb2.ReadLacRequest(ledger_id=0), timeout=5)
            # ReadEntry of a real entry with unknown fields around it: the entry
            code, details, out = call(ch, "/bksim.bookie.v1.Bookie/ReadEntry", False, False,
                                      [unknown + field_varint(1, ledger) + field_varint(2, 3) + unknown])
            results.append(("bookie ReadEntry with unknown fields", code, details, {Code.OK}))
            response = bookie_pb2.ReadEntryResponse.FromString(out[0])
            assert response.status == bookie_pb2.OK and response.entry.endswith(b"x3"), response
            # AddEntries whose entries field (a message) is a varint: a request without entries
            code, details, out = call(ch, "/bksim.bookie.v1.Bookie/AddEntries", True, True,
                                      [field_varint(1, 5) + field_varint(2, 12345)])
            results.append(("bookie AddEntries, entries as varint", code, details, {Code.OK}))
            assert [bookie_pb2.AddResponse.FromString(b).batch_id for b in out] == [5]
        with grpc.insecure_channel(target.broker.address) as ch:
            # GetLedgerMetadata with ledger_id as fixed64 of the real id: ledger 0 asked, not the real one
            code, details, out = call(ch, "/bksim.broker.v1.Broker/GetLedgerMetadata", False, False,
                                      [field_fixed64(1, ledger) + unknown])
            results.append(("broker GetLedgerMetadata, ledger id as fixed64", code, details,
                            {Code.NOT_FOUND, Code.OK}))
            code, details, out = call(ch, "/bksim.broker.v1.Broker/ReadLac", False, False,
                                      [field_varint(1, ledger) + field_bytes(2, PASSWORD) + unknown])
            results.append(("broker ReadLac with unknown fields", code, details, {Code.OK}))
            assert broker_pb2.ReadLacResponse.FromString(out[0]).last_add_confirmed == 9
            # Append with payloads sent as varints: a request of no payloads, answered with count 0
            code, details, out = call(ch, "/bksim.broker.v1.Broker/Append", True, True,
                                      [field_varint(1, ledger) + field_bytes(2, PASSWORD) + field_varint(3, 1)
                                       + field_varint(4, 77)])
            results.append(("broker Append, payloads as varint", code, details, {Code.OK}))
            assert [(r.request_id, r.count) for r in map(broker_pb2.AppendResponse.FromString, out)] == [(77, 0)]
            code, details, _ = call(ch, "/bksim.topic.v1.Topics/CreateTenant", False, False,
                                    [field_bytes(1, b"\xff\xfe bad utf-8")])
            results.append(("broker CreateTenant, tenant not UTF-8", code, details, {Code.INVALID_ARGUMENT}))
            code, details, _ = call(ch, "/bksim.topic.v1.Topics/Lookup", False, False,
                                    [field_varint(1, 42) + unknown])
            results.append(("broker Lookup, topic as varint", code, details, {Code.INVALID_ARGUMENT}))
    _check(results)


def test_negative_and_huge_ids(target, ledger):
    """Negative, zero and 2^63-1 ledger and entry ids, counts of -1 and 2^31-1: each refused with its status."""
    results = []
    bookie_statuses = []
    with abused(target, "negative and huge ids"):
        with grpc.insecure_channel(target.bookie.address) as ch:
            stub = bookie_pb2_grpc.BookieStub(ch)
            for lid, eid in [(-1, 0), (ledger, -5), (I64_MAX, I64_MAX), (ledger, I64_MAX), (-I64_MAX - 1, -1)]:
                r = stub.ReadEntry(bookie_pb2.ReadEntryRequest(ledger_id=lid, entry_id=eid), timeout=5)
                bookie_statuses.append((f"ReadEntry {lid}:{eid}", r.status, r.message,
                                        {bookie_pb2.BAD_REQUEST, bookie_pb2.NO_LEDGER, bookie_pb2.NO_ENTRY}))
                r = stub.ReadEntry(bookie_pb2.ReadEntryRequest(ledger_id=lid, entry_id=eid, flags=0xFFFFFFFF,
                                                               master_key=b"k"), timeout=5)
                bookie_statuses.append((f"ReadEntry {lid}:{eid} every flag", r.status, r.message,
                                        {bookie_pb2.BAD_REQUEST, bookie_pb2.NO_LEDGER, bookie_pb2.NO_ENTRY,
                                         bookie_pb2.UNAUTHORIZED}))
            for ids in ([-7, I64_MAX, -1], [2**40] * 3, []):
                r = stub.ReadEntries(bookie_pb2.ReadEntriesRequest(ledger_id=ledger, entry_ids=ids), timeout=5)
                for i, res in enumerate(r.results):
                    bookie_statuses.append((f"ReadEntries {ids}[{i}]", res.status, res.message,
                                            {bookie_pb2.BAD_REQUEST, bookie_pb2.NO_ENTRY, bookie_pb2.OK}))
            for lid, first in [(-1, 0), (ledger, -3), (ledger, I64_MAX), (I64_MAX, 0)]:
                r = stub.ListEntries(bookie_pb2.ListEntriesRequest(ledger_id=lid, first_entry=first), timeout=5)
                bookie_statuses.append((f"ListEntries {lid} from {first}", r.status, r.message,
                                        {bookie_pb2.BAD_REQUEST, bookie_pb2.NO_LEDGER, bookie_pb2.OK}))
            for lid, lac, expected in [(-1, 0, {bookie_pb2.BAD_REQUEST}), (ledger, -9, {bookie_pb2.UNAUTHORIZED}),
                                       (ledger, I64_MAX, {bookie_pb2.UNAUTHORIZED}),
                                       (I64_MAX, 1, {bookie_pb2.OK})]:  # a new ledger takes the key it is given
                r = stub.WriteLac(bookie_pb2.WriteLacRequest(ledger_id=lid, last_add_confirmed=lac, master_key=b"k"),
                                  timeout=5)
                bookie_statuses.append((f"WriteLac {lid} lac {lac} key b'k'", r.status, r.message, expected))
                r = stub.ReadLac(bookie_pb2.ReadLacRequest(ledger_id=lid), timeout=5)
                bookie_statuses.append((f"ReadLac {lid}", r.status, r.message,
                                        {bookie_pb2.BAD_REQUEST, bookie_pb2.NO_LEDGER, bookie_pb2.OK}))
            adds = [(-1, 0, {bookie_pb2.BAD_REQUEST}), (ledger + 10**6, -5, {bookie_pb2.BAD_REQUEST}),
                    (-I64_MAX - 1, I64_MAX, {bookie_pb2.BAD_REQUEST}),
                    (ledger + 10**6, I64_MAX, {bookie_pb2.OK})]  # the largest entry id is an entry id
            responses = list(stub.AddEntries(iter([bookie_pb2.AddRequest(batch_id=1, entries=[
                bookie_pb2.AddEntry(entry=encode_entry(lid, eid, -1, 0, b"p"), master_key=KEY)
                for lid, eid, _ in adds])]), timeout=10))
            for (lid, eid, expected), status in zip(adds, responses[0].statuses, strict=True):
                bookie_statuses.append((f"AddEntries entry {lid}:{eid}", status,
                                        "" if status == bookie_pb2.OK else responses[0].message, expected))
        with grpc.insecure_channel(target.broker.address) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            for lid, first, last, expected in [
                    (-1, 0, 0, {Code.NOT_FOUND, Code.INVALID_ARGUMENT}),
                    (I64_MAX, 0, -1, {Code.NOT_FOUND}),
                    (ledger, -5, 3, {Code.INVALID_ARGUMENT}),
                    (ledger, 0, I64_MAX, {Code.OUT_OF_RANGE}),
                    (ledger, I64_MAX, I64_MAX, {Code.OUT_OF_RANGE}),
                    (ledger, 5, 2, {Code.INVALID_ARGUMENT}),
                    (ledger, 0, -7, {Code.INVALID_ARGUMENT})]:
                code, details = _code(lambda: list(stub.ReadEntries(broker_pb2.ReadEntriesRequest(
                    ledger_id=lid, password=PASSWORD, first_entry_id=first, last_entry_id=last), timeout=10)))
                results.append((f"broker ReadEntries {lid} {first}..{last}", code, details, expected))
            for lid in (-1, 10**15, I64_MAX, -I64_MAX - 1):  # none of them a ledger
                for name, fn in [
                        ("GetLedgerMetadata", lambda: stub.GetLedgerMetadata(
                            broker_pb2.GetLedgerMetadataRequest(ledger_id=lid), timeout=10)),
                        ("ReadLac", lambda: stub.ReadLac(broker_pb2.ReadLacRequest(ledger_id=lid, password=PASSWORD),
                                                         timeout=10)),
                        ("OpenLedger recover", lambda: stub.OpenLedger(broker_pb2.OpenLedgerRequest(
                            ledger_id=lid, password=PASSWORD, recover=True), timeout=10)),
                        ("CloseLedger", lambda: stub.CloseLedger(broker_pb2.CloseLedgerRequest(
                            ledger_id=lid, password=PASSWORD), timeout=10)),
                        ("DeleteLedger", lambda: stub.DeleteLedger(broker_pb2.DeleteLedgerRequest(
                            ledger_id=lid, password=PASSWORD), timeout=10)),
                        ("Append", lambda: list(stub.Append(iter([broker_pb2.AppendRequest(
                            ledger_id=lid, password=PASSWORD, payloads=[b"p"], request_id=1)]), timeout=10)))]:
                    code, details = _code(fn)
                    results.append((f"broker {name} ledger {lid}", code, details,
                                    {Code.NOT_FOUND, Code.INVALID_ARGUMENT}))
            for e, qw, qa in [(-1, 1, 1), (0, 0, 0), (1, 2, 1), (I32_MAX, I32_MAX, I32_MAX), (3, 2, -2)]:
                code, details = _code(lambda: stub.CreateLedger(broker_pb2.CreateLedgerRequest(
                    ensemble_size=e, write_quorum_size=qw, ack_quorum_size=qa, password=PASSWORD), timeout=10))
                results.append((f"broker CreateLedger E={e} Qw={qw} Qa={qa}", code, details,
                                {Code.INVALID_ARGUMENT, Code.UNAVAILABLE}))
            topics = topic_pb2_grpc.TopicsStub(ch)
            tenant = f"abuse{ledger}"
            topics.CreateTenant(topic_pb2.CreateTenantRequest(tenant=tenant), timeout=10)
            topics.CreateNamespace(topic_pb2.CreateNamespaceRequest(namespace=f"{tenant}/ns"), timeout=10)
            for partitions in (-1, I32_MAX, -I32_MAX - 1):
                code, details = _code(lambda: topics.CreateTopic(topic_pb2.CreateTopicRequest(
                    topic=f"persistent://{tenant}/ns/t", partitions=partitions), timeout=10))
                results.append((f"broker CreateTopic partitions {partitions}", code, details, {Code.INVALID_ARGUMENT}))
            code, details = _code(lambda: topics.Lookup(topic_pb2.LookupRequest(
                topic=f"persistent://{tenant}/ns/t-partition-{I64_MAX}"), timeout=10))
            results.append(("broker Lookup partition 2^63-1", code, details, {Code.INVALID_ARGUMENT}))
    wrong = [(w, bookie_pb2.StatusCode.Name(s), m) for w, s, m, expected in bookie_statuses
             if s not in expected or "internal error" in m or (s != bookie_pb2.OK and not m)]
    assert not wrong, "\n".join(f"bookie {w}: {s} {m!r}" for w, s, m in wrong)
    _check(results)
