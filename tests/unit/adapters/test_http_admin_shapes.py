"""The pure parts of the HTTP admin APIs (adapters/http_calls.py, http_bookie_admin.py, http_broker_admin.py):
Pulsar's Policies JSON to and from bksim's namespace policies, BookKeeper's ledger metadata fields, and the
stand-in gRPC context that turns a servicer's abort into a refusal with its trailers."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from bksim.adapters.http_bookie_admin import metadata_json
from bksim.adapters.http_broker_admin import policies_from_json, policies_json, topic_stats_json
from bksim.adapters.http_calls import CallContext, CallRefused
from bksim.gen import topic_pb2
from bksim.metadata.ledger_metadata import LedgerMetadata


def test_pulsar_policies_round_trip():
    p = policies_from_json({"retention_policies": {"retentionTimeInMinutes": 90, "retentionSizeInMB": 2},
                            "message_ttl_in_seconds": 30, "deduplicationEnabled": True})
    assert (p.retention_ms, p.retention_bytes, p.ttl_ms, p.dedup) == (90 * 60_000, 2 * 1024 * 1024, 30_000, True)
    doc = policies_json(topic_pb2.NamespaceInfo(namespace="t/ns", policies=p), {"namespace_auth": {"r": ["produce"]}})
    assert doc["retention_policies"] == {"retentionTimeInMinutes": 90, "retentionSizeInMB": 2}
    assert doc["message_ttl_in_seconds"] == 30 and doc["deduplicationEnabled"] is True
    assert doc["auth_policies"]["namespace_auth"] == {"r": ["produce"]}
    defaults = policies_from_json({})
    assert (defaults.retention_ms, defaults.retention_bytes, defaults.ttl_ms) == (0, -1, 0)
    odd = policies_json(topic_pb2.NamespaceInfo(policies=topic_pb2.NamespacePolicies(retention_ms=90_000,
                                                                                   retention_bytes=-1)), {})
    assert odd["retention_policies"] == {"retentionTimeInMinutes": 1.5, "retentionSizeInMB": -1}
    with pytest.raises(ValueError):
        policies_from_json({"message_ttl_in_seconds": "10"})
    with pytest.raises(ValueError):
        policies_from_json({"retention_policies": [1]})


def test_ledger_metadata_has_bookkeepers_names_and_no_password():
    md = LedgerMetadata.new(["b1:1", "b2:1", "b3:1"], 2, 2, password=b"secret", ctime_ms=7) \
        .with_new_segment(5, ["b1:1", "b4:1", "b3:1"])
    doc = metadata_json(12, md)
    assert doc["allEnsembles"] == {"0": ["b1:1", "b2:1", "b3:1"], "5": ["b1:1", "b4:1", "b3:1"]}
    assert (doc["ensembleSize"], doc["writeQuorumSize"], doc["ackQuorumSize"]) == (3, 2, 2)
    assert doc["state"] == "OPEN" and doc["closed"] is False and doc["digestType"] == "CRC32C"
    assert "secret" not in repr(doc) and "password" not in doc


def test_stats_add_pulsars_derived_fields():
    out = topic_stats_json({"msgRateIn": 4.0, "msgThroughputIn": 400.0, "msgInCounter": 9})
    assert out["averageMsgSize"] == 100.0 and out["replication"] == {} and out["msgInCounter"] == 9
    assert topic_stats_json({"msgRateIn": 0.0})["averageMsgSize"] == 0.0


def test_call_context_turns_an_abort_into_a_refusal_with_its_trailers():
    ctx = CallContext()
    ctx.set_trailing_metadata((("bksim-status", "NOT_OWNER"), ("bksim-owner", "127.0.0.1:9")))
    with pytest.raises(CallRefused) as e:
        asyncio.run(ctx.abort(grpc.StatusCode.UNAVAILABLE, "served elsewhere"))
    assert (e.value.code, e.value.details, e.value.status, e.value.owner_address) == \
        ("UNAVAILABLE", "served elsewhere", "NOT_OWNER", "127.0.0.1:9")
    assert e.value.http_status == 503
    assert CallRefused("PERMISSION_DENIED", "x").http_status == 403


def test_a_gc_round_over_plain_http_is_refused_when_bookies_require_client_certificates():
    from aiohttp.test_utils import make_mocked_request

    from bksim.adapters.http_bookie_admin import BookieHttpAdmin
    from bksim.adapters.http_server import ProcessParts
    from bksim.model.config import Config, SecurityConfig

    class Admin:
        asked = 0

        async def RunGc(self, request, context):
            Admin.asked += 1

    class Server:
        admin = Admin()

    def answer(security: SecurityConfig):
        config = Config(security=security)
        handler = BookieHttpAdmin(ProcessParts("bookie", config, {"server": Server()})).gc
        return asyncio.run(handler(make_mocked_request("PUT", "/api/v1/bookie/gc")))

    refused = answer(SecurityConfig(tls_client_auth=True))
    assert refused.status == 403 and "client certificate" in refused.text and Admin.asked == 0
    assert answer(SecurityConfig()).status == 200 and Admin.asked == 1
