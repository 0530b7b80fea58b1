"""The HTTP admin APIs on real processes (adapters/http_bookie_admin.py, http_broker_admin.py): BookKeeper's bookie
endpoints on a bookie's http_port and Pulsar's /admin/v2 on a broker's, over real ZooKeeper and bookies, with a
plain HTTP client (urllib, 127.0.0.1 only).

One bookie with an HTTP port, one open broker A and one broker B with token authentication and authorization
(super-user `root`). The numbers are checked against the gRPC view of the same things (the client's topic
stats, the broker's ledger metadata); errors against Pulsar's and BookKeeper's status codes; the auth cases
against the gRPC API's rules; the last test runs docs/observability.md's curl script.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid

import pytest

from bksim.adapters.broker_client import SyncBrokerClient
from bksim.client import Client, InitialPosition
from bksim.security.tokens import SigningKey, create_secret_key, create_token
from helpers import free_port, wait_until
from integration.bookie_harness import BookieProcess

MESSAGES = 30
TOPIC_ENV = {"BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
             "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1"}
AUTH_ENV = {"BKSIM_SECURITY_AUTH_ENABLED": "true", "BKSIM_SECURITY_AUTHORIZATION_ENABLED": "true",
            "BKSIM_SECURITY_SUPER_USER_ROLES": "root"}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def http(method: str, url: str, body=None, token: str | None = None, follow: bool = True):
    """(status, headers, JSON or text) of one request; never raises for an HTTP error status."""
    assert url.startswith("http://127.0.0.1:"), url
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(*([] if follow else [_NoRedirect()]))
    try:
        with opener.open(request, timeout=20) as r:
            status, headers, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    text = raw.decode()
    try:
        return status, headers, json.loads(text) if text.strip() else None
    except ValueError:
        return status, headers, text


class Env:
    def __init__(self, bookie, bookie_http, a, a_http, b, b_http, key) -> None:
        self.bookie, self.a, self.b = bookie, a, b
        self.bookie_url = f"http://127.0.0.1:{bookie_http}"
        self.a_url = f"http://127.0.0.1:{a_http}"
        self.b_url = f"http://127.0.0.1:{b_http}"
        self.key = key

    def token(self, role: str) -> str:
        return create_token(self.key, role)


@pytest.fixture(scope="module")
def env(broker_cluster, tmp_path_factory):
    key_dir = tmp_path_factory.mktemp("keys")
    secret = str(key_dir / "secret.key")
    create_secret_key(secret)
    bookie_http, a_http, b_http = free_port(), free_port(), free_port()
    bookie = BookieProcess(broker_cluster.zookeeper, broker_cluster.base_dir, name="bookie-http",
                           env={"BKSIM_BOOKIE_HTTP_PORT": str(bookie_http)})
    broker_cluster.bookies.append(bookie)
    bookie.spawn()
    bookie.wait_registered(broker_cluster.zk)
    broker_cluster.settle(1)
    (a,) = broker_cluster.start_brokers(1, env={**TOPIC_ENV, "BKSIM_BROKER_HTTP_PORT": str(a_http)})
    (b,) = broker_cluster.start_brokers(1, env={**TOPIC_ENV, **AUTH_ENV, "BKSIM_BROKER_HTTP_PORT": str(b_http),
                                                "BKSIM_SECURITY_TOKEN_SECRET_KEY_FILE": secret})
    return Env(bookie, bookie_http, a, a_http, b, b_http, SigningKey.from_secret_file(secret))


@pytest.fixture(scope="module")
def produced(env):
    """Tenant/namespace/topic made through broker A's HTTP API; MESSAGES produced, 5 acked with a hole."""
    tenant = f"h{uuid.uuid4().hex[:6]}"
    ns, topic = f"{tenant}/ns", f"persistent://{tenant}/ns/t"
    assert http("PUT", f"{env.a_url}/admin/v2/tenants/{tenant}", {"adminRoles": ["ops"],
                                                                "allowedClusters": ["bksim"]})[0] == 204
    assert http("PUT", f"{env.a_url}/admin/v2/namespaces/{ns}",
                {"retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
                 "deduplicationEnabled": True})[0] == 204
    assert http("PUT", f"{env.a_url}/admin/v2/persistent/{ns}/t")[0] == 204
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{ns}/t/stats")[0] == 200  # A takes the topic (B has auth)
    with Client(env.a.address, operation_timeout_ms=10_000) as c:
        consumer = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        producer = c.create_producer(topic, "p1", batching_enabled=False)
        for i in range(MESSAGES):
            producer.send(f"m{i}".encode())
        received = [consumer.receive(timeout_ms=10_000) for _ in range(MESSAGES)]
        for i in (0, 1, 2, 3, 5):
            consumer.acknowledge(received[i])
        grpc_stats = wait_until(lambda: (lambda s: s if s["subscriptions"]["sub"]["msgBacklog"] == MESSAGES - 5
                                         else None)(c.topic_stats(topic)), 10, message="acks to reach the cursor")
        yield {"tenant": tenant, "ns": ns, "topic": topic, "grpc_stats": grpc_stats, "client": c}
        producer.close()
        consumer.close()


# ---- bookie --------------------------------------------------------------------------------------------------

def test_bookie_endpoints(env, produced):
    status, headers, body = http("GET", f"{env.bookie_url}/heartbeat")
    assert (status, body) == (200, "OK\n")
    status, _, info = http("GET", f"{env.bookie_url}/api/v1/bookie/info")
    assert status == 200 and set(info) == {"freeSpace", "totalSpace"} and 0 < info["freeSpace"] <= info["totalSpace"]
    status, _, state = http("GET", f"{env.bookie_url}/api/v1/bookie/state")
    assert state == {"running": True, "readOnly": False, "shuttingDown": False, "availableForHighPriorityWrites": True}
    _, _, rw = http("GET", f"{env.bookie_url}/api/v1/bookie/list_bookies?type=rw")
    assert env.bookie.bookie_id in rw and rw[env.bookie.bookie_id] is None
    _, _, named = http("GET", f"{env.bookie_url}/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert named[env.bookie.bookie_id] == "127.0.0.1"
    assert http("GET", f"{env.bookie_url}/api/v1/bookie/list_bookies?type=ro")[2] == {}
    assert http("GET", f"{env.bookie_url}/api/v1/bookie/list_bookies?type=xx")[0] == 400
    status, _, cluster = http("GET", f"{env.bookie_url}/api/v1/bookie/cluster_info")
    assert status == 200 and cluster["writableBookiesCount"] == len(rw) >= 1 and cluster["readonlyBookiesCount"] == 0
    assert cluster["totalBookiesCount"] == len(rw) + cluster["unavailableBookiesCount"]
    assert cluster["ledgerReplicationEnabled"] is True and isinstance(cluster["auditorElected"], bool)


def test_ledger_metadata_matches_the_broker(env, produced):
    internal = http("GET", f"{env.a_url}/admin/v2/persistent/{produced['ns']}/t/internalStats")[2]
    ledger_id = internal["ledgers"][0]["ledgerId"]
    status, _, body = http("GET", f"{env.bookie_url}/api/v1/ledger/metadata?ledger_id={ledger_id}")
    assert status == 200 and list(body) == [str(ledger_id)]
    md = body[str(ledger_id)]
    grpc_view = SyncBrokerClient(env.a.address, deadline_s=10).get_metadata(ledger_id).to_dict()
    assert (md["ensembleSize"], md["writeQuorumSize"], md["ackQuorumSize"]) == \
        (grpc_view["ensemble_size"], grpc_view["write_quorum_size"], grpc_view["ack_quorum_size"])
    assert md["state"] == grpc_view["state"] and md["lastEntryId"] == grpc_view["last_entry_id"]
    assert md["allEnsembles"] == {str(s["first_entry_id"]): s["ensemble"] for s in grpc_view["segments"]}
    assert md["ctime"] == grpc_view["ctime_ms"] and md["digestType"] == "CRC32C" and "password" not in md
    assert http("GET", f"{env.bookie_url}/api/v1/ledger/metadata?ledger_id=999999999")[0] == 404
    assert http("GET", f"{env.bookie_url}/api/v1/ledger/metadata?ledger_id=abc")[0] == 400
    assert http("GET", f"{env.bookie_url}/api/v1/ledger/metadata")[0] == 400


def test_bookie_gc(env):
    assert http("GET", f"{env.bookie_url}/api/v1/bookie/gc")[2] == {"is_in_force_gc": "false"}
    before = http("GET", f"{env.bookie_url}/api/v1/bookie/gc_details")[2][0]["totals"]["rounds"]
    status, _, body = http("PUT", f"{env.bookie_url}/api/v1/bookie/gc", {"forceMinor": True})
    assert status == 200 and body == f"Triggered GC on BookieServer: {env.bookie.bookie_id}"
    details = http("GET", f"{env.bookie_url}/api/v1/bookie/gc_details")[2]
    assert details[0]["totals"]["rounds"] == before + 1 and "minor" in details[0]["lastRounds"]
    assert details[0]["lastMinorCompactionTime"] > 0 and details[0]["forceCompacting"] is False
    assert http("PUT", f"{env.bookie_url}/api/v1/bookie/gc", b"[1")[0] == 400
    assert http("DELETE", f"{env.bookie_url}/api/v1/bookie/gc")[0] == 405


# ---- broker --------------------------------------------------------------------------------------------------

def test_tenants_and_namespaces(env, produced):
    tenant, ns = produced["tenant"], produced["ns"]
    assert tenant in http("GET", f"{env.a_url}/admin/v2/tenants")[2]
    assert http("GET", f"{env.a_url}/admin/v2/tenants/{tenant}")[2] == {"adminRoles": ["ops"], "allowedClusters": []}
    status, _, body = http("PUT", f"{env.a_url}/admin/v2/tenants/{tenant}", {"adminRoles": []})
    assert status == 409 and tenant in body["reason"]
    assert http("GET", f"{env.a_url}/admin/v2/tenants/nosuch{tenant}")[0] == 404
    assert http("PUT", f"{env.a_url}/admin/v2/tenants/bad%20name", {})[0] == 412
    assert http("PUT", f"{env.a_url}/admin/v2/tenants/{tenant}x", {"adminRoles": "ops"})[0] == 400
    assert http("GET", f"{env.a_url}/admin/v2/namespaces/{tenant}")[2] == [ns]
    policies = http("GET", f"{env.a_url}/admin/v2/namespaces/{ns}")[2]
    assert policies["retention_policies"] == {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    assert policies["deduplicationEnabled"] is True and policies["message_ttl_in_seconds"] == 0
    assert produced["client"].get_namespace(ns)["retention_ms"] == 60 * 60_000  # the gRPC view agrees
    assert http("PUT", f"{env.a_url}/admin/v2/namespaces/{ns}")[0] == 409
    assert http("GET", f"{env.a_url}/admin/v2/namespaces/{tenant}/nosuch")[0] == 404
    assert http("PUT", f"{env.a_url}/admin/v2/namespaces/{tenant}/n2", b"{oops")[0] == 400
    assert http("POST", f"{env.a_url}/admin/v2/namespaces/{ns}/permissions/app", ["consume"])[0] == 204
    assert http("GET", f"{env.a_url}/admin/v2/namespaces/{ns}/permissions")[2] == {"app": ["consume"]}
    assert http("DELETE", f"{env.a_url}/admin/v2/namespaces/{ns}/permissions/app")[0] == 204
    assert http("DELETE", f"{env.a_url}/admin/v2/namespaces/{ns}")[0] == 409  # it has a topic
    assert http("PUT", f"{env.a_url}/admin/v2/namespaces/{tenant}/gone")[0] == 204
    assert http("DELETE", f"{env.a_url}/admin/v2/namespaces/{tenant}/gone")[0] == 204
    assert http("GET", f"{env.a_url}/admin/v2/namespaces/{tenant}")[2] == [ns]


def test_backlog_quotas_with_pulsars_paths_and_units(env, produced):
    url = f"{env.a_url}/admin/v2/namespaces/{produced['ns']}"
    assert http("POST", f"{url}/backlogQuota?backlogQuotaType=message_age",
                {"limitTime": 120, "policy": "producer_exception"})[0] == 204
    assert http("POST", f"{url}/backlogQuota", {"limitSize": 10 << 20, "limitTime": -1,
                                                "policy": "consumer_backlog_eviction"})[0] == 204
    expected = {"destination_storage": {"limitSize": 10 << 20, "limitTime": -1, "policy": "consumer_backlog_eviction"},
                "message_age": {"limitSize": -1, "limitTime": 120, "policy": "producer_exception"}}
    assert http("GET", f"{url}/backlogQuotaMap")[2] == expected
    assert http("GET", url)[2]["backlog_quota_map"] == expected
    assert produced["client"].get_backlog_quotas(produced["ns"])["message_age"]["limit_time_ms"] == 120_000
    status, _, body = http("POST", f"{url}/backlogQuota?backlogQuotaType=message_age",
                           {"limitTime": 3600, "policy": "producer_exception"})  # the retention is 60 minutes
    assert status == 412 and "retention" in body["reason"]
    assert http("POST", f"{url}/backlogQuota", {"limitSize": 5, "policy": "drop"})[0] == 400
    assert http("DELETE", f"{url}/backlogQuota?backlogQuotaType=message_age")[0] == 204
    assert http("DELETE", f"{url}/backlogQuota")[0] == 204
    assert http("GET", f"{url}/backlogQuotaMap")[2] == {}


def test_topics_list_create_partitions_delete(env, produced):
    ns = produced["ns"]
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{ns}")[2] == [produced["topic"]]
    assert http("PUT", f"{env.a_url}/admin/v2/persistent/{ns}/t")[0] == 409
    assert http("PUT", f"{env.a_url}/admin/v2/persistent/{ns}/pt/partitions", 3)[0] == 204
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{ns}/pt/partitions")[2] == {"partitions": 3}
    assert http("PUT", f"{env.a_url}/admin/v2/persistent/{ns}/px/partitions", "three")[0] == 412
    assert http("DELETE", f"{env.a_url}/admin/v2/persistent/{ns}/pt")[0] == 204
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{ns}/pt/partitions")[0] == 404
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{ns}/nosuch/stats")[0] == 404
    assert http("GET", f"{env.a_url}/admin/v2/persistent/{produced['tenant']}/nosuch")[0] == 404


def test_topic_stats_match_the_grpc_view(env, produced):
    status, _, stats = http("GET", f"{env.a_url}/admin/v2/persistent/{produced['ns']}/t/stats")
    assert status == 200
    grpc_stats = produced["grpc_stats"]
    assert stats["msgInCounter"] == MESSAGES == grpc_stats["msgInCounter"]
    assert stats["bytesInCounter"] == grpc_stats["bytesInCounter"] and stats["storageSize"] > 0
    sub = stats["subscriptions"]["sub"]
    assert sub["msgBacklog"] == MESSAGES - 5 and sub["msgOutCounter"] == MESSAGES
    assert sub["unackedMessages"] == MESSAGES - 5 and len(sub["consumers"]) == 1
    assert [p["producerName"] for p in stats["publishers"]] == ["p1"]
    assert {"msgRateIn", "msgThroughputIn", "averageMsgSize", "replication", "deduplicationStatus"} <= set(stats)
    assert stats["deduplicationStatus"] == "Enabled"
    internal = http("GET", f"{env.a_url}/admin/v2/persistent/{produced['ns']}/t/internalStats")[2]
    assert internal["entriesAddedCounter"] == MESSAGES == internal["numberOfEntries"]
    assert internal["currentLedgerEntries"] == MESSAGES
    assert internal["totalSize"] == stats["storageSize"]
    assert sum(x["entries"] for x in internal["ledgers"]) == MESSAGES
    cursor = internal["cursors"]["sub"]
    first = internal["ledgers"][0]["ledgerId"]
    assert cursor["markDeletePosition"] == f"{first}:3"
    assert cursor["individuallyDeletedMessages"] == f"[({first}:4..{first}:5]]"
    assert cursor["readPosition"] == f"{first}:{MESSAGES}"


# ---- auth ----------------------------------------------------------------------------------------------------

def test_broker_auth(env, produced):
    url = f"{env.b_url}/admin/v2/tenants"
    status, _, body = http("GET", url)
    assert status == 401 and "no token" in body["reason"]
    forged_key = SigningKey.from_secret_file(_other_key(env))
    forged = create_token(forged_key, "root")
    status, _, body = http("GET", url, token=forged)
    assert status == 401 and "signature" in body["reason"] and forged not in json.dumps(body)
    assert http("GET", url, token="not-a-jwt")[0] == 401
    root = env.token("root")
    assert produced["tenant"] in http("GET", url, token=root)[2]
    status, _, body = http("GET", url, token=env.token("ops"))
    assert status == 403 and "role 'ops' may not list" in body["reason"]
    ns = produced["ns"]
    # a tenant admin may read its namespace, but not another tenant's
    assert http("GET", f"{env.b_url}/admin/v2/namespaces/{ns}", token=env.token("ops"))[0] == 200
    status, _, body = http("PUT", f"{env.b_url}/admin/v2/tenants/z{produced['tenant']}", {"adminRoles": []},
                           token=env.token("ops"))
    assert status == 403 and "role 'ops' may not create" in body["reason"]
    status, _, body = http("GET", f"{env.b_url}/admin/v2/persistent/{ns}/t/stats", token=env.token("stranger"))
    assert status == 403 and "stranger" in body["reason"]
    # the topic lives on broker A: B redirects to A's HTTP port, as Pulsar does
    status, headers, _ = http("GET", f"{env.b_url}/admin/v2/persistent/{ns}/t/stats", token=root, follow=False)
    assert status == 307 and headers["Location"] == f"{env.a_url}/admin/v2/persistent/{ns}/t/stats"
    assert http("GET", f"{env.bookie_url}/heartbeat")[0] == 200  # health stays open
    log = open(env.b.log_path).read()
    assert root not in log and forged not in log


def _other_key(env) -> str:
    path = os.path.join(os.path.dirname(env.b.log_path), f"other-{uuid.uuid4().hex[:6]}.key")
    create_secret_key(path)
    return path


# ---- the documented curl script ------------------------------------------------------------------------------

def test_docs_curl_script(env, produced, repo_root):
    text = open(os.path.join(repo_root, "docs", "observability.md")).read()
    script = text.split("<!-- http-admin-curl -->", 2)[1].split("```bash", 1)[1].split("```", 1)[0]
    run_env = dict(os.environ, BOOKIE=env.bookie_url, BROKER=env.a_url, NS=produced["ns"], TOPIC="t",
                   LEDGER=str(http("GET", f"{env.a_url}/admin/v2/persistent/{produced['ns']}/t/internalStats")
                              [2]["ledgers"][0]["ledgerId"]))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=run_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"msgInCounter": 30' in done.stdout and '"is_in_force_gc"' in done.stdout
