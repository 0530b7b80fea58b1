"""What the monitoring Prometheus reads: its configuration (`prometheus.yml`) and its rule files, as text.

Owns: the scrape targets of a cluster (one per bookie and broker HTTP port, job "bookie" / "broker", a `node`
label naming the process: bookie-1, broker-2, ...; and Prometheus itself, job "prometheus"), the recording rules
and the alerting rules, and their YAML.
The files are written by adapters.prometheus_server; nothing here touches a file, a socket or a clock.

Invariants: every target is a loopback address (ScrapeTarget refuses any other host), so the Prometheus this
configures only ever scrapes this machine; every rule names metrics as the bookies and brokers export them
(upstream's names: BookKeeper's `bookkeeper_server_*`, `bookie_*`, `bookie_journal_*`, Pulsar's `pulsar_*`).

The YAML is written by a small emitter of dicts, lists, strings and numbers (every string double-quoted with
JSON's escapes, which YAML's double-quoted scalars read the same), so no YAML library is needed.
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

RULES_FILE_RECORDING = "bksim-recording.rules.yml"
RULES_FILE_ALERTS = "bksim-alerts.rules.yml"

# How long a condition holds before its alert fires. A bookie turns read-only on a full disk and may turn writable
# again after a checkpoint or a compaction (seconds), so 1 minute ignores the flapping; under-replicated ledgers
# are normal for the minutes autorecovery takes to copy a lost bookie's ledgers; a backlog grows during any burst
# faster than the consumers, so only a trend of 10 minutes is a finding.
BOOKIE_READ_ONLY_FOR = "1m"
PROCESS_DOWN_FOR = "1m"
UNDER_REPLICATED_FOR = "5m"
BACKLOG_GROWING_FOR = "10m"
BACKLOG_TREND_WINDOW = "5m"  # deriv() over this window: the backlog's slope in messages per second
RATE_WINDOW = "1m"  # rate() windows of the recording rules: at least 4 scrapes at the default 15 s interval


class MonitorConfigError(ValueError):
    """A scrape target or setting the monitoring configuration refuses (not loopback, bad port)."""


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One HTTP endpoint serving /metrics: `job` "bookie" or "broker", `node` its process name (bookie-1)."""
    job: str
    node: str
    host: str
    port: int

    def __post_init__(self) -> None:
        if self.job not in ("bookie", "broker"):
            raise MonitorConfigError(f"scrape target {self.node}: job {self.job!r} is not bookie or broker")
        if not is_loopback(self.host):
            raise MonitorConfigError(f"scrape target {self.node}: {self.host} is not a loopback address "
                                     f"(the monitor scrapes only this machine)")
        if not 0 < self.port < 65536:
            raise MonitorConfigError(f"scrape target {self.node}: port {self.port} out of range")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cluster_targets(host_bookie: str, bookie_http_port_base: int, bookies: int,
                    host_broker: str, broker_http_port_base: int, brokers: int) -> list[ScrapeTarget]:
    """The targets of a cluster laid out as `bksim cluster up` lays it out: bookie i on bookie_http_port_base +
    i - 1, broker i on broker_http_port_base + i - 1; a base of 0 (no HTTP) gives no target of that kind."""
    targets = [ScrapeTarget("bookie", f"bookie-{i}", host_bookie, bookie_http_port_base + i - 1)
               for i in range(1, bookies + 1) if bookie_http_port_base]
    targets += [ScrapeTarget("broker", f"broker-{i}", host_broker, broker_http_port_base + i - 1)
                for i in range(1, brokers + 1) if broker_http_port_base]
    return targets


def prometheus_config(targets: list[ScrapeTarget], rule_files: list[str], scrape_interval_s: float,
                      self_address: str | None = None) -> dict:
    """prometheus.yml as a dict: one job per kind, one static config per target (so its `node` label is its own);
    with `self_address` (host:port, loopback) also job "prometheus", the server scraping its own /metrics."""
    if scrape_interval_s <= 0:
        raise MonitorConfigError(f"scrape interval {scrape_interval_s}s must be positive")
    interval = duration(scrape_interval_s)
    jobs = []
    if self_address is not None:
        host = self_address.rsplit(":", 1)[0]
        if not is_loopback(host):
            raise MonitorConfigError(f"Prometheus's own address {self_address} is not a loopback address")
        jobs.append({"job_name": "prometheus", "static_configs": [{"targets": [self_address],
                                                                   "labels": {"node": "prometheus"}}]})
    for job in ("bookie", "broker"):
        ours = [t for t in targets if t.job == job]
        if ours:
            jobs.append({"job_name": job, "metrics_path": "/metrics", "scheme": "http",
                         "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in ours]})
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": duration(min(scrape_interval_s, 10.0)),
                       "external_labels": {"monitor": "bksim"}},
            "rule_files": list(rule_files),
            "scrape_configs": jobs}


def duration(seconds: float) -> str:
    """A Prometheus duration: whole milliseconds ("1500ms") or seconds ("15s")."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def recording_rules() -> dict:
    """Rates and quantiles a dashboard or an alert reads without recomputing them (Prometheus's level:metric:ops
    naming): per bookie, adds and reads served per second and the journal sync and add-request p99 from their
    histograms; per topic, messages in and out per second; the cluster's backlog."""
    w = RATE_WINDOW
    p99 = "histogram_quantile(0.99, sum by (instance, node, le) (rate({name}_bucket[{w}])))"
    rules = [
        ("node:bookkeeper_server_ADD_ENTRY_REQUEST:rate" + w,
         f"sum by (instance, node) (rate(bookkeeper_server_ADD_ENTRY_REQUEST_count[{w}]))"),
        ("node:bookkeeper_server_READ_ENTRY_REQUEST:rate" + w,
         f"sum by (instance, node) (rate(bookkeeper_server_READ_ENTRY_REQUEST_count[{w}]))"),
        ("node:bookkeeper_server_ADD_ENTRY_REQUEST:p99_" + w, p99.format(name="bookkeeper_server_ADD_ENTRY_REQUEST", w=w)),
        ("node:bookie_journal_JOURNAL_SYNC:p99_" + w, p99.format(name="bookie_journal_JOURNAL_SYNC", w=w)),
        ("node:bookie_journal_JOURNAL_ADD_ENTRY:p99_" + w, p99.format(name="bookie_journal_JOURNAL_ADD_ENTRY", w=w)),
        ("topic:pulsar_in_messages:rate" + w, f"sum by (topic) (rate(pulsar_in_messages_total[{w}]))"),
        ("topic:pulsar_out_messages:rate" + w, f"sum by (topic) (rate(pulsar_out_messages_total[{w}]))"),
        ("cluster:pulsar_msg_backlog:sum", "sum(pulsar_msg_backlog)"),
    ]
    return {"groups": [{"name": "bksim-recording", "rules": [{"record": r, "expr": e} for r, e in rules]}]}


def alerting_rules() -> dict:
    """A bookie or broker whose /metrics does not answer; a read-only bookie (BookKeeper's bookie_SERVER_STATUS:
    1 writable, 0 read-only); ledgers under-replicated for UNDER_REPLICATED_FOR (the auditor's count); a topic's
    backlog growing for BACKLOG_GROWING_FOR."""
    def alert(name, expr, for_, severity, summary):
        return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
                "annotations": {"summary": summary}}
    return {"groups": [{"name": "bksim-alerts", "rules": [
        alert("BksimProcessDown", "up == 0", PROCESS_DOWN_FOR, "critical",
              "{{ $labels.node }} ({{ $labels.instance }}) does not answer /metrics"),
        alert("BookieReadOnly", "bookie_SERVER_STATUS == 0", BOOKIE_READ_ONLY_FOR, "warning",
              "bookie {{ $labels.node }} is read-only (disk full or journal failed)"),
        alert("UnderReplicatedLedgers", "max(auditor_NUM_UNDER_REPLICATED_LEDGERS) > 0",
              UNDER_REPLICATED_FOR, "warning",
              "{{ $value }} ledger(s) under-replicated for " + UNDER_REPLICATED_FOR),
        alert("TopicBacklogGrowing", f"sum by (topic) (deriv(pulsar_msg_backlog[{BACKLOG_TREND_WINDOW}])) > 0",
              BACKLOG_GROWING_FOR, "warning",
              "backlog of {{ $labels.topic }} growing for " + BACKLOG_GROWING_FOR + " ({{ $value }} msg/s)"),
    ]}]}


def to_yaml(value, indent: int = 0) -> str:
    """YAML block style of dicts, lists, strings, ints, floats and booleans (a trailing newline)."""
    return "".join(line + "\n" for line in _lines(value, indent))


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no YAML for {type(value).__name__}")


def _lines(value, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:")
                out.extend(_lines(item, indent + 2))
            else:
                out.append(f"{pad}{key}: {_empty(item) if isinstance(item, (dict, list)) else _scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _lines(item, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out.extend(inner[1:])
            else:
                out.append(f"{pad}- {_empty(item) if isinstance(item, (dict, list)) else _scalar(item)}")
    else:
        out.append(pad + _scalar(value))
    return out


def _empty(value) -> str:
    return "{}" if isinstance(value, dict) else "[]"
