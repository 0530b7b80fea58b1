"""Admin calls and errors of the client against the fake Topics service."""
from __future__ import annotations

import pytest

from bksim.client import Client, ClientError
from bksim.client.core import parse_service_url
from bksim.model.status import TopicStatus
from tests.unit.client.conftest import TOPIC


def test_tenants_namespaces_topics(fake, client):
    client.create_tenant("t")
    assert client.list_tenants() == ["t"]
    ns = client.create_namespace("t/ns", retention_ms=-1, ttl_ms=5, dedup=True)
    assert ns == {"namespace": "t/ns", "retention_ms": -1, "retention_bytes": -1, "ttl_ms": 5, "dedup": True,
                  "backlog_quotas": {}}
    assert client.get_namespace("t/ns") == ns
    assert client.list_namespaces("t") == ["t/ns"]
    assert client.create_topic(TOPIC, partitions=3) == {"topic": TOPIC, "partitions": 3}
    assert client.get_topic(TOPIC)["partitions"] == 3
    assert client.list_topics("t/ns") == [TOPIC]
    assert client.lookup(f"{TOPIC}-partition-1")["address"] == fake.addresses[0]
    assert client.topic_stats(f"{TOPIC}-partition-0") == {"msgInCounter": 0, "subscriptions": {}}
    assert client.topic_stats_internal(f"{TOPIC}-partition-0")["ledgers"][0]["entries"] == 0
    assert client.delete_topic(TOPIC) == {"topic": TOPIC, "partitions": 3}
    assert client.list_topics("t/ns") == []


def test_refusals_carry_the_brokers_status_and_text(fake, client):
    with pytest.raises(ClientError) as e:
        client.create_namespace("nobody/ns")
    assert (e.value.status, e.value.from_broker, e.value.grpc_code) == ("TENANT_NOT_FOUND", True, "NOT_FOUND")
    assert "nobody" in e.value.message and str(e.value).startswith("TENANT_NOT_FOUND: ")


def test_a_dead_service_address_is_skipped(fake):
    with Client(["127.0.0.1:1", fake.addresses[0]], operation_timeout_ms=2_000) as c:
        c.create_tenant("t")
        assert c.list_tenants() == ["t"]


def test_no_broker_answers(fake):
    with Client("127.0.0.1:1", operation_timeout_ms=1_000) as c:
        with pytest.raises(ClientError) as e:
            c.list_tenants()
    assert e.value.status is TopicStatus.SERVICE_UNAVAILABLE and not e.value.from_broker


def test_service_url_forms():
    assert parse_service_url("bksim://a:1,b:2/") == ["a:1", "b:2"]
    assert parse_service_url(["a:1", "a:1"]) == ["a:1"]
    with pytest.raises(ClientError) as e:
        parse_service_url("nohost")
    assert e.value.status is TopicStatus.BAD_REQUEST


def test_closed_client_refuses(fake):
    c = Client(fake.addresses)
    c.close()
    with pytest.raises(ClientError) as e:
        c.list_tenants()
    assert "closed" in e.value.message
