"""`bksim monitor`: Debian's Prometheus scraping a real cluster (ZooKeeper, a bookie, a broker) on loopback.

The first test runs the whole path: `cluster up`, `monitor up` on a free port, Prometheus's HTTP API showing
every target up, samples of the bookie's and the broker's own metrics (bookie_SERVER_STATUS 1,
pulsar_topics_count), every bookie series the rules read, a topic's pulsar_in_messages_total and
pulsar_msg_backlog equal to the broker's own topic stats after a produce and a consume, the add-rate and backlog
recording rules' series, the rule groups loaded and evaluated,
the process-down alert pending once the broker is killed, `monitor status` following, and `cluster down`
stopping Prometheus by its pid. The others check the rule files with promtool: `check rules` accepts them and
refuses a broken one, and `promtool test rules` feeds synthetic series to the alerting rules (read-only bookie,
under-replicated ledgers, growing backlog) and the recording rules, so their expressions are checked against
the metric names and the `for` durations without waiting minutes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from bksim.adapters import processes
from bksim.adapters.prometheus_config import (RULES_FILE_ALERTS, RULES_FILE_RECORDING, alerting_rules,
                                              recording_rules, to_yaml)
from bksim.adapters.prometheus_server import PROMTOOL
from helpers import free_port, kill_leftovers, wait_until
from integration.test_cluster_cmd import write_config as cluster_config

SCRAPE_INTERVAL_S = 0.5


@pytest.fixture(autouse=True)
def nothing_left_running(tmp_path):
    """Every process a test here starts names its tmp dir: none may outlive the test (killed by pid, and the
    test fails)."""
    yield
    left = kill_leftovers(str(tmp_path))
    assert not left, f"processes left running after the test (killed now): {left}"


def write_config(tmp_path) -> str:
    """One bookie and one broker, topics on one bookie, every port free."""
    return cluster_config(tmp_path, bookies=1, brokers=1,
                          extra="[topic]\nensemble_size = 1\nwrite_quorum_size = 1\nack_quorum_size = 1\n")


def bksim(config: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", "--config", config, *args], env=env,
                          capture_output=True, text=True, timeout=60)


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, never a proxy
    with opener.open(url, timeout=2.0) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def test_monitor_scrapes_a_real_cluster_and_stops_with_it(tmp_path):
    config = write_config(tmp_path)
    run = tmp_path / "run"
    port = free_port()
    up = bksim(config, "cluster", "up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        started = time.monotonic()
        mon = bksim(config, "monitor", "up", "--port", str(port), "--scrape-interval", str(SCRAPE_INTERVAL_S),
                    "--retention", "1h")
        assert mon.returncode == 0, mon.stdout + mon.stderr + _log(run)
        assert "files checked by promtool" in mon.stdout and f"on http://127.0.0.1:{port}" in mon.stdout
        pid = processes.read_pid(str(run / "pids" / "prometheus.pid"))
        assert processes.is_alive(pid, "prometheus")
        cmdline = processes.cmdline(pid)
        assert f"--web.listen-address=127.0.0.1:{port}" in cmdline
        assert f"--storage.tsdb.path={run / 'monitor' / 'data'}" in cmdline

        def all_up():
            targets = api(port, "targets", state="active")["activeTargets"]
            if len(targets) == 3 and all(t["health"] == "up" for t in targets):
                return targets
            raise AssertionError([(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets])
        targets = wait_until(all_up, 20.0, 0.1, "every scrape target up")
        assert sorted(t["labels"]["node"] for t in targets) == ["bookie-1", "broker-1", "prometheus"]
        assert all(urllib.parse.urlsplit(t["scrapeUrl"]).hostname == "127.0.0.1" for t in targets)
        scrape_s = time.monotonic() - started

        ups = api(port, "query", query="up")["result"]
        assert sorted((s["metric"]["node"], s["value"][1]) for s in ups) == \
            [("bookie-1", "1"), ("broker-1", "1"), ("prometheus", "1")]
        # the processes' own metrics, not only Prometheus's synthetic `up`: samples from each node's /metrics
        own = api(port, "query", query='count by (node) ({job=~"bookie|broker"})')["result"]
        assert sorted(s["metric"]["node"] for s in own) == ["bookie-1", "broker-1"], own
        assert all(int(s["value"][1]) > 1 for s in own)
        status = api(port, "query", query="bookie_SERVER_STATUS")["result"]
        assert [(s["metric"]["node"], s["value"][1]) for s in status] == [("bookie-1", "1")]  # writable
        # every bookie series the rules read is exported under that name (the topic ones appear with a topic)
        used = ["bookie_SERVER_STATUS", "bookie_journal_JOURNAL_SYNC_bucket", "bookie_journal_JOURNAL_ADD_ENTRY_bucket",
                "bookkeeper_server_ADD_ENTRY_REQUEST_bucket", "bookkeeper_server_ADD_ENTRY_REQUEST_count",
                "bookkeeper_server_READ_ENTRY_REQUEST_count"]
        names = api(port, "query", query='group by (__name__) ({__name__=~"%s", node="bookie-1"})' % "|".join(used))
        assert sorted(s["metric"]["__name__"] for s in names["result"]) == sorted(used)
        topics = api(port, "query", query="pulsar_topics_count")["result"]
        assert [(s["metric"]["node"], s["value"][1]) for s in topics] == [("broker-1", "0")]

        def recorded():  # a recording rule's output over the bookie's add-request histogram (two scrapes needed)
            return api(port, "query", query="node:bookkeeper_server_ADD_ENTRY_REQUEST:rate1m")["result"]
        rates = wait_until(recorded, 10.0, 0.1, "the add-rate recording rule's series")
        assert [(s["metric"]["node"], s["value"][1]) for s in rates] == [("bookie-1", "0")]  # no traffic yet

        def rules_evaluated():
            groups = api(port, "rules")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return (sorted(g["name"] for g in groups) == ["bksim-alerts", "bksim-recording"]
                    and all(r["health"] == "ok" for r in rules) and groups)
        groups = wait_until(rules_evaluated, 10.0, 0.1, "both rule groups loaded and evaluated")
        by_name = {g["name"]: g for g in groups}
        assert {r["name"] for r in by_name["bksim-alerts"]["rules"]} == \
            {"BksimProcessDown", "BookieReadOnly", "UnderReplicatedLedgers", "TopicBacklogGrowing"}
        assert len(by_name["bksim-recording"]["rules"]) == len(recording_rules()["groups"][0]["rules"])

        # a topic's messages and backlog: 5 produced, 2 received and acknowledged by subscription s
        topic = "persistent://acme/ops/t"
        for args in (("tenant", "create", "acme"), ("namespace", "create", "acme/ops"), ("topic", "create", topic),
                     ("produce", topic, "--count", "5", "-m", "m"),
                     ("consume", topic, "-s", "s", "-n", "2", "--position", "earliest")):
            done = bksim(config, *args)
            assert done.returncode == 0, (args, done.stdout, done.stderr)

        stats = bksim(config, "topic", "stats", topic)
        assert stats.returncode == 0, stats.stdout + stats.stderr
        backlog = json.loads(stats.stdout)["subscriptions"]["s"]["msgBacklog"]
        assert 0 < backlog < 5  # what the broker itself says; Prometheus must say the same

        def same_as_the_broker():
            got = {q: api(port, "query", query=q)["result"] for q in (
                f'pulsar_in_messages_total{{topic="{topic}"}}', f'pulsar_msg_backlog{{topic="{topic}"}}',
                "cluster:pulsar_msg_backlog:sum")}
            values = {q: [r["value"][1] for r in rows] for q, rows in got.items()}
            if list(values.values()) == [["5"], [str(backlog)], [str(backlog)]]:
                return values
            raise AssertionError(values)
        wait_until(same_as_the_broker, 10.0, 0.1, "the topic's messages in and backlog, and the backlog recording rule")

        status = bksim(config, "monitor", "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert {t["node"]: t["health"] for t in json.loads(status.stdout)["targets"]} == \
            {"bookie-1": "up", "broker-1": "up", "prometheus": "up"}

        # a running one is reloaded where it listens
        again = bksim(config, "monitor", "up", "--port", str(free_port()), "--scrape-interval", str(SCRAPE_INTERVAL_S))
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"reloaded pid {pid} on http://127.0.0.1:{port}" in again.stdout

        broker_pid = processes.read_pid(str(run / "pids" / "broker-1.pid"))
        assert processes.kill9(broker_pid)

        def process_down_pending():
            alerts = api(port, "alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "BksimProcessDown"]
        alerts = wait_until(process_down_pending, 10.0, 0.1, "BksimProcessDown pending for the killed broker")
        assert [(a["labels"]["node"], a["state"]) for a in alerts] == [("broker-1", "pending")]
        assert bksim(config, "monitor", "status").returncode == 1
        print(f"\nmonitor: every target up {scrape_s:.1f}s after `monitor up` began")
    finally:
        down = bksim(config, "cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"prometheus: stopped pid {pid}" in down.stdout
    assert not processes.is_alive(pid) and not (run / "pids" / "prometheus.pid").exists()
    assert bksim(config, "monitor", "status").returncode == 3


def _log(run) -> str:
    path = run / "logs" / "prometheus.log"
    return path.read_text() if path.exists() else ""


def test_monitor_refuses_a_non_loopback_address(tmp_path):
    config = write_config(tmp_path)
    done = bksim(config, "monitor", "up", "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2 and "loopback" in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "run" / "pids" / "prometheus.pid").exists()


def test_promtool_checks_the_rule_files_and_refuses_a_broken_one(tmp_path):
    config = write_config(tmp_path)
    done = bksim(config, "monitor", "config")
    assert done.returncode == 0, done.stdout + done.stderr
    rules = tmp_path / "run" / "monitor" / "rules"
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules / RULES_FILE_RECORDING),
                              str(rules / RULES_FILE_ALERTS)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout and "SUCCESS: 4 rules found" in checked.stdout
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(to_yaml({"groups": [{"name": "b", "rules": [{"alert": "X", "expr": "rate(up[1m]"}]}]}))
    refused = subprocess.run([PROMTOOL, "check", "rules", str(broken)], capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "FAILED" in refused.stdout + refused.stderr


def test_promtool_unit_tests_of_the_rules(tmp_path):
    """Synthetic series through the alerting and recording rules (promtool test rules, 15 s evaluation)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / RULES_FILE_ALERTS).write_text(to_yaml(alerting_rules()))
    (rules / RULES_FILE_RECORDING).write_text(to_yaml(recording_rules()))
    base = {"job": "bookie", "node": "bookie-1", "instance": "127.0.0.1:8000"}

    def labels(name: str, **extra) -> str:
        pairs = {**base, **extra}
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"
    topic = "persistent://public/default/t"
    broker = {"job": "broker", "node": "broker-1", "instance": "127.0.0.1:8080"}
    tests = {"rule_files": [str(rules / RULES_FILE_ALERTS), str(rules / RULES_FILE_RECORDING)],
             "evaluation_interval": "15s",
             "tests": [{
                 "interval": "15s",
                 "input_series": [
                     # writable 2 minutes, then read-only
                     {"series": labels("bookie_SERVER_STATUS"), "values": "1x7 0x12"},
                     {"series": labels("auditor_NUM_UNDER_REPLICATED_LEDGERS"),
                      "values": "0x3 4x40"},
                     # a backlog growing by 15 messages every 15 s for 20 minutes
                     {"series": 'pulsar_msg_backlog{job="broker",node="broker-1",instance="127.0.0.1:8080",'
                                f'topic="{topic}"}}', "values": "0+15x80"},
                     {"series": labels("bookkeeper_server_ADD_ENTRY_REQUEST_count"), "values": "0+150x20"},
                     {"series": 'up{' + ",".join(f'{k}="{v}"' for k, v in broker.items()) + '}',
                      "values": "1x3 0x8"},
                 ],
                 "alert_rule_test": [
                     {"eval_time": "1m", "alertname": "BookieReadOnly", "exp_alerts": []},
                     # read-only from 2m, pending for 1m: firing at 3m
                     {"eval_time": "3m15s", "alertname": "BookieReadOnly",
                      "exp_alerts": [{"exp_labels": {**base, "severity": "warning"},
                                      "exp_annotations": {"summary": "bookie bookie-1 is read-only (disk full or "
                                                                     "journal failed)"}}]},
                     {"eval_time": "4m", "alertname": "UnderReplicatedLedgers", "exp_alerts": []},
                     {"eval_time": "6m", "alertname": "UnderReplicatedLedgers",
                      "exp_alerts": [{"exp_labels": {"severity": "warning"},
                                      "exp_annotations": {"summary": "4 ledger(s) under-replicated for 5m"}}]},
                     {"eval_time": "9m", "alertname": "TopicBacklogGrowing", "exp_alerts": []},
                     {"eval_time": "16m", "alertname": "TopicBacklogGrowing",
                      "exp_alerts": [{"exp_labels": {"topic": topic, "severity": "warning"},
                                      "exp_annotations": {"summary": f"backlog of {topic} growing for 10m "
                                                                     "(1 msg/s)"}}]},
                     {"eval_time": "2m30s", "alertname": "BksimProcessDown",
                      "exp_alerts": [{"exp_labels": {**broker, "severity": "critical"},
                                      "exp_annotations": {"summary": "broker-1 (127.0.0.1:8080) does not answer "
                                                                     "/metrics"}}]},
                 ],
                 "promql_expr_test": [
                     {"expr": "node:bookkeeper_server_ADD_ENTRY_REQUEST:rate1m", "eval_time": "3m",
                      "exp_samples": [{"labels": 'node:bookkeeper_server_ADD_ENTRY_REQUEST:rate1m{'
                                                 'instance="127.0.0.1:8000",node="bookie-1"}', "value": 10}]},
                     {"expr": "cluster:pulsar_msg_backlog:sum", "eval_time": "1m",
                      "exp_samples": [{"labels": "cluster:pulsar_msg_backlog:sum", "value": 60}]},
                 ],
             }]}
    path = tmp_path / "rules_test.yml"
    path.write_text(to_yaml(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_monitor_refuses_a_port_another_process_holds(tmp_path):
    """A port already served (here by an HTTP server answering 200 to everything, as another Prometheus answers
    /-/ready) is an error before anything starts, not another server's readiness taken for ours."""
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ready")

        def log_message(self, *args):
            pass

    config = write_config(tmp_path)
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        done = bksim(config, "monitor", "up", "--port", str(other.server_address[1]))
    finally:
        other.shutdown()
        other.server_close()
        thread.join(5.0)
    assert done.returncode == 2 and "did not start" in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "run" / "pids" / "prometheus.pid").exists()
