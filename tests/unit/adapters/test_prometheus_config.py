"""adapters/prometheus_config.py: targets from a cluster's layout, the loopback rule, durations and the YAML emitter
(the files themselves are checked by promtool and a live Prometheus in tests/integration/test_monitor.py)."""
from __future__ import annotations

import pytest

from bksim.adapters.prometheus_config import (MonitorConfigError, ScrapeTarget, alerting_rules, cluster_targets,
                                              duration, prometheus_config, recording_rules, to_yaml)


def test_targets_follow_the_cluster_layout():
    targets = cluster_targets("127.0.0.1", 8000, 3, "localhost", 8080, 2)
    assert [(t.job, t.node, t.address) for t in targets] == [
        ("bookie", "bookie-1", "127.0.0.1:8000"), ("bookie", "bookie-2", "127.0.0.1:8001"),
        ("bookie", "bookie-3", "127.0.0.1:8002"), ("broker", "broker-1", "localhost:8080"),
        ("broker", "broker-2", "localhost:8081")]
    assert [t.node for t in cluster_targets("127.0.0.1", 0, 3, "127.0.0.1", 8080, 1)] == ["broker-1"]  # no HTTP


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "example.com", "::", ""])
def test_a_target_off_loopback_is_refused(host):
    with pytest.raises(MonitorConfigError, match="not a loopback address"):
        ScrapeTarget("bookie", "bookie-1", host, 8000)


def test_loopback_addresses_are_accepted():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert ScrapeTarget("broker", "broker-1", host, 8080).host == host


def test_bad_ports_and_jobs_are_refused():
    with pytest.raises(MonitorConfigError, match="out of range"):
        ScrapeTarget("bookie", "bookie-1", "127.0.0.1", 65536)
    with pytest.raises(MonitorConfigError, match="not bookie or broker"):
        ScrapeTarget("zookeeper", "zk", "127.0.0.1", 2181)


def test_config_has_one_static_config_per_target_and_scrapes_itself_on_loopback_only():
    doc = prometheus_config(cluster_targets("127.0.0.1", 8000, 2, "127.0.0.1", 8080, 1), ["/r/a.yml"], 0.5,
                            "127.0.0.1:9090")
    assert doc["global"]["scrape_interval"] == "500ms" and doc["rule_files"] == ["/r/a.yml"]
    jobs = {j["job_name"]: j["static_configs"] for j in doc["scrape_configs"]}
    assert jobs["bookie"] == [{"targets": ["127.0.0.1:8000"], "labels": {"node": "bookie-1"}},
                              {"targets": ["127.0.0.1:8001"], "labels": {"node": "bookie-2"}}]
    assert jobs["prometheus"] == [{"targets": ["127.0.0.1:9090"], "labels": {"node": "prometheus"}}]
    with pytest.raises(MonitorConfigError, match="loopback"):
        prometheus_config([], [], 5, "192.168.1.1:9090")
    with pytest.raises(MonitorConfigError, match="positive"):
        prometheus_config([], [], 0)


def test_durations():
    assert [duration(s) for s in (15, 0.5, 1.25, 0.0001)] == ["15s", "500ms", "1250ms", "1ms"]


def test_yaml_of_nested_values():
    text = to_yaml({"a": [{"b": 1, "c": ["x", 'q"uote']}, []], "d": {}, "e": True, "f": "{{ $labels.node }}"})
    assert text == ('a:\n'
                    '  - b: 1\n'
                    '    c:\n'
                    '      - "x"\n'
                    '      - "q\\"uote"\n'
                    '  - []\n'
                    'd: {}\n'
                    'e: true\n'
                    'f: "{{ $labels.node }}"\n')


def test_rules_name_the_exported_metrics():
    exprs = " ".join(r["expr"] for g in recording_rules()["groups"] + alerting_rules()["groups"] for r in g["rules"])
    for name in ("bookkeeper_server_ADD_ENTRY_REQUEST_count", "bookie_journal_JOURNAL_SYNC_bucket",
                 "pulsar_in_messages_total", "pulsar_msg_backlog", "bookie_SERVER_STATUS",
                 "auditor_NUM_UNDER_REPLICATED_LEDGERS"):
        assert name in exprs
    alerts = alerting_rules()["groups"][0]["rules"]
    assert {a["alert"]: a["for"] for a in alerts} == {"BksimProcessDown": "1m", "BookieReadOnly": "1m",
                                                      "UnderReplicatedLedgers": "5m", "TopicBacklogGrowing": "10m"}
