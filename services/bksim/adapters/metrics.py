"""`/metrics` of a bookie or broker: Prometheus text format (prometheus_client), collected at scrape time.

Nothing here sits on a hot path. The pure layers keep plain counters (`stats` dicts, per-topic counters) and
bounded latency histograms (model/histogram.py LatencyHistogram); a scrape reads them between two event-loop
steps and turns them into metric families (a custom Collector per process, in a registry of its own, plus
prometheus_client's ProcessCollector: process_cpu_seconds_total, process_resident_memory_bytes, ...). Without
an HTTP port nothing is exported and nothing is collected; the histograms are recorded either way (one
bisect and three additions per journal group, add batch or topic entry).

Names: upstream's where a metric has an upstream equivalent (BookKeeper: `bookie_journal_JOURNAL_SYNC`,
`bookkeeper_server_ADD_ENTRY_REQUEST`, `bookie_SERVER_STATUS`, ...; Pulsar: `pulsar_in_messages_total`,
`pulsar_msg_backlog`, `pulsar_subscription_back_log`, ...), `bksim_` otherwise. Latency histograms are in
milliseconds (BookKeeper's unit), buckets model/histogram.BUCKETS_MS. BookKeeper's upper-case counters keep
their upstream name without a `_total` suffix and are typed gauge (a Prometheus counter must end in
`_total`); rate() works on them as on a counter. docs/observability.md "## Metrics" lists every metric.

Bounded label sets: per-topic and per-subscription series only for the first `broker.metrics_topics_max`
topics (and as many (topic, subscription) pairs), in name order; the rest are summed into one series with
topic="_other" (namespace="_other", subscription="_other"), so a broker with 100,000 topics still answers a
scrape of a bounded size and Prometheus's series count stays bounded.

Under-replicated ledgers (`auditor_NUM_UNDER_REPLICATED_LEDGERS`, upstream's auditor gauge): a bookie that runs
autorecovery (`autorecovery.enabled`) counts the marks under /ledgers/underreplication/ledgers in ZooKeeper,
in a worker thread before the scrape is answered, at most every UNDER_REPLICATED_REFRESH_S (a cached count in
between), visiting at most UNDER_REPLICATED_NODES_MAX znodes (beyond that the count is a lower bound); every such
bookie exports the cluster's count (upstream: the elected auditor only), so alerts take max(). When ZooKeeper
does not answer within zookeeper.operation_timeout_ms the gauge is left out of that scrape.

Must not: block the event loop beyond one collection (no I/O on the loop: every other value is in memory).
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Iterable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from bksim.metadata.paths import UNDERREPLICATED_LEDGERS, ledger_id_from_underreplicated_name
from bksim.model.histogram import LatencyHistogram

OTHER = "_other"  # the label value of the series that sums the topics beyond the cap
UNDER_REPLICATED_REFRESH_S = 10.0  # ZooKeeper is walked at most this often (Prometheus scrapes every 15 s)
UNDER_REPLICATED_NODES_MAX = 50_000  # znodes one count visits at most (4 hex levels + the marks)
_HEX = frozenset("0123456789abcdef")


# -- building blocks ---------------------------------------------------------------------------------------

def histogram(name: str, doc: str, series: Iterable[tuple[list[str], LatencyHistogram]],
              labels: Iterable[str] = ()) -> HistogramMetricFamily:
    """A histogram family (milliseconds) from LatencyHistograms, one per label-value list."""
    family = HistogramMetricFamily(name, doc + " (ms)", labels=list(labels), unit="")
    for values, h in series:
        buckets = [("+Inf" if bound == float("inf") else _le(bound), n) for bound, n in h.cumulative()]
        family.add_metric(values, buckets, h.sum_ms)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def labelled(kind: type, name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], float]]) -> Metric:
    family = kind(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


class FamiliesCollector:
    """A prometheus_client collector around a function that yields metric families at scrape time."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families()


# -- bookie --------------------------------------------------------------------------------------------------

def bookie_families(engine, server=None, gc=None) -> Iterator[Metric]:
    """A bookie's metrics from its BookieEngine, BookieServer (request latencies, admission) and
    GarbageCollector (each may be None in a unit test)."""
    stats = engine.statistics()
    journal = stats["journal"]
    latency = engine.latencies()
    yield histogram("bookie_journal_JOURNAL_SYNC", "journal group write + fdatasync latency",
                    [([], latency["journal_sync"])])
    yield histogram("bookie_journal_JOURNAL_ADD_ENTRY", "journal record queued -> covered by a sync, per record",
                    [([], latency["journal_add"])])
    yield histogram("bookie_flush", "checkpoint: write cache half to entry log and index, then the mark",
                    [([], latency["flush"])])
    yield gauge("bookie_journal_JOURNAL_QUEUE_SIZE", "journal records queued, not yet written",
                journal["queued_records"])
    yield counter("bksim_bookie_journal_syncs", "journal groups written and synced", journal["groups"])
    yield counter("bksim_bookie_journal_written_bytes", "bytes written to the journal", journal["bytes"])
    yield gauge("bookie_write_cache_size", "bytes in the write cache (active + being flushed)",
                stats["write_cache_bytes"] + stats["flushing_bytes"])
    yield gauge("bookie_ACTIVE_LEDGER_TOTAL", "ledgers this bookie holds", stats["ledgers"])
    logs = engine.entry_log_stats()
    yield gauge("bookie_ACTIVE_ENTRY_LOG_TOTAL", "entry logs on disk (the one being written included)", len(logs))
    yield gauge("bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES", "bytes of entry records in the entry logs",
                sum(log["bytes"] for log in logs))
    yield gauge("bookie_SERVER_STATUS", "1 writable, 0 read-only", 0 if stats["read_only"] else 1)
    for key, name, doc in (("adds", "bksim_bookie_add_entries", "entries offered to the engine's write path"),
                           ("reads", "bksim_bookie_read_entries", "entry reads served by the engine"),
                           ("fences", "bksim_bookie_fences", "ledgers fenced (fencing reads)"),
                           ("checkpoints", "bksim_bookie_checkpoints", "checkpoints (write cache -> entry log)"),
                           ("throttled", "bksim_bookie_throttled_writes", "add batches that waited for write-cache room")):
        yield counter(name, doc, stats[key])
    if server is not None:
        servicer = server.servicer
        yield histogram("bookkeeper_server_ADD_ENTRY_REQUEST", "add request received -> response sent, per entry",
                        [([], servicer.add_request_latency)])
        yield histogram("bookkeeper_server_READ_ENTRY_REQUEST", "read request received -> answered, per entry",
                        [([], servicer.read_request_latency)])
        s = servicer.statistics()
        yield gauge("bookkeeper_server_ADD_ENTRY_REJECTED", "entries refused by the in-flight bounds (a counter)",
                    s["add_rejected_entries"])
        yield gauge("bookkeeper_server_ADD_ENTRY_IN_PROGRESS", "entries admitted, not yet answered",
                    s["add_inflight_total"])
    if gc is not None:
        t = gc.statistics()
        yield gauge("bookie_DELETED_LEDGER_TOTAL", "ledgers deleted by garbage collection (a counter)",
                    t["ledgers_deleted"])
        yield labelled(CounterMetricFamily, "bksim_bookie_gc_rounds", "garbage collection rounds", ["result"],
                       [(["done"], t["rounds"] - t["rounds_failed"]), (["failed"], t["rounds_failed"])])
        yield counter("bksim_bookie_gc_entry_logs_deleted", "entry logs deleted (no live ledger)", t["logs_deleted"])
        yield counter("bksim_bookie_compaction_entry_logs", "entry logs compacted", t["logs_compacted"])
        yield counter("bksim_bookie_gc_freed_bytes", "bytes freed by deletion and compaction", t["bytes_freed"])
        yield counter("bksim_bookie_compaction_copied_bytes", "live bytes copied by compaction", t["bytes_copied"])


# -- broker --------------------------------------------------------------------------------------------------

def broker_families(service, topics, topics_max: int) -> Iterator[Metric]:
    """A broker's metrics from its LedgerService and TopicService (None: no topic layer)."""
    s = service.stats
    yield gauge("bookkeeper_client_NUM_ENSEMBLE_CHANGE", "ensemble changes this broker's writers and recoveries "
                                                         "stored (a counter)", s["ensemble_changes"])
    yield counter("bksim_broker_ledgers_created", "ledgers created by this broker", s["ledgers_created"])
    yield labelled(CounterMetricFamily, "bksim_broker_ledger_recoveries", "ledger recoveries run by this broker",
                   ["result"], [(["closed"], s["recoveries"]), (["failed"], s["recoveries_failed"])])
    yield counter("bksim_broker_writers_fenced", "ledgers this broker wrote that another client fenced",
                  s["writers_fenced"])
    yield gauge("bksim_broker_ledgers_open", "ledgers this broker writes now", len(service.open_handles))
    yield gauge("bksim_broker_quarantined_bookies", "bookies kept out of new ensembles now",
                len(service.quarantined()))
    if topics is None:
        return
    yield labelled(CounterMetricFamily, "bksim_broker_topic_ownership_changes", "topics this broker took "
                   "(loaded) or lost (fenced: another broker owns them)", ["change"],
                   [(["loaded"], topics.stats["topics_loaded"]), (["lost"], topics.stats["topics_lost"])])
    yield gauge("pulsar_topics_count", "topics this broker serves", len(topics.topics))
    yield from topic_families(topics.topics, topics_max)


def topic_families(loaded: dict, topics_max: int) -> Iterator[Metric]:
    """Per-topic and per-subscription families, capped at `topics_max` series each (module docstring)."""
    keys = sorted(loaded)
    own, rest = keys[:topics_max], keys[topics_max:]
    rows: dict[str, list] = {name: [] for name in _TOPIC_FIELDS}
    latency = LatencyHistogram()
    subs: list[tuple[str, str, dict]] = []
    for group, values in ((own, None), (rest, [OTHER, OTHER])):
        totals = dict.fromkeys(_TOPIC_FIELDS, 0)
        for key in group:
            topic = loaded[key]
            latency.merge(topic.ml.add_latency)
            sub_stats = {name: sub.stats() for name, sub in sorted(topic.subscriptions.items())}
            v = {"pulsar_in_messages": topic.messages_in, "pulsar_in_bytes": topic.bytes_in,
                 "pulsar_out_messages": sum(sub.messages_out for sub in topic.subscriptions.values()),
                 "pulsar_out_bytes": sum(sub.bytes_out for sub in topic.subscriptions.values()),
                 "pulsar_msg_backlog": sum(st["msgBacklog"] for st in sub_stats.values()),
                 "pulsar_storage_size": topic.ml.total_size, "pulsar_producers_count": len(topic.producers),
                 "pulsar_subscriptions_count": len(topic.subscriptions)}
            if values is None:
                for name in _TOPIC_FIELDS:
                    rows[name].append(([topic.name.ns, key], v[name]))
            else:
                for name in _TOPIC_FIELDS:
                    totals[name] += v[name]
            subs += [(key, name, st) for name, st in sub_stats.items()]
        if values is not None and group:
            for name in _TOPIC_FIELDS:
                rows[name].append((values, totals[name]))
    for name, (kind, doc) in _TOPIC_FIELDS.items():
        yield labelled(kind, name, doc, ["namespace", "topic"], rows[name])
    yield histogram("pulsar_storage_write_latency", "managed-ledger add -> confirmed (durable at Qa), per entry, "
                                                    "all topics of this broker", [([], latency)])
    own_subs, rest_subs = subs[:topics_max], subs[topics_max:]
    backlog = [([key, name], st["msgBacklog"]) for key, name, st in own_subs]
    unacked = [([key, name], st["unackedMessages"]) for key, name, st in own_subs]
    if rest_subs:
        backlog.append(([OTHER, OTHER], sum(st["msgBacklog"] for _, _, st in rest_subs)))
        unacked.append(([OTHER, OTHER], sum(st["unackedMessages"] for _, _, st in rest_subs)))
    yield labelled(GaugeMetricFamily, "pulsar_subscription_back_log", "messages not yet acknowledged by the "
                   "subscription (its cursor's backlog)", ["topic", "subscription"], backlog)
    yield labelled(GaugeMetricFamily, "pulsar_subscription_unacked_messages", "messages delivered to the "
                   "subscription's consumers, not yet acknowledged", ["topic", "subscription"], unacked)


_TOPIC_FIELDS = {
    "pulsar_in_messages": (CounterMetricFamily, "messages published to the topic on this broker"),
    "pulsar_in_bytes": (CounterMetricFamily, "payload bytes published to the topic on this broker"),
    "pulsar_out_messages": (CounterMetricFamily, "messages delivered to the topic's consumers"),
    "pulsar_out_bytes": (CounterMetricFamily, "bytes delivered to the topic's consumers"),
    "pulsar_msg_backlog": (GaugeMetricFamily, "the topic's backlog: summed over its subscriptions"),
    "pulsar_storage_size": (GaugeMetricFamily, "bytes of the topic's ledgers (payloads)"),
    "pulsar_producers_count": (GaugeMetricFamily, "producers connected to the topic"),
    "pulsar_subscriptions_count": (GaugeMetricFamily, "subscriptions of the topic"),
}


# -- under-replicated ledgers (autorecovery) -----------------------------------------------------------------

def count_under_replicated(children: Callable[[str], list[str]], nodes_max: int = UNDER_REPLICATED_NODES_MAX) -> int:
    """The marks under UNDERREPLICATED_LEDGERS (4 hex levels, then urL<id>), listing with `children(path)` (a
    blocking ZooKeeper call: run in a thread); a vanished node counts as empty. Stops after `nodes_max` listed
    or counted znodes (the count is then a lower bound)."""
    budget = [nodes_max]

    def walk(path: str, levels: int) -> int:
        if budget[0] <= 0:
            return 0
        budget[0] -= 1
        try:
            names = children(path)
        except Exception as e:  # noqa: BLE001 - kazoo's NoNodeError: removed while we walked
            if type(e).__name__ == "NoNodeError":
                return 0
            raise
        if levels == 0:
            found = sum(1 for n in names if ledger_id_from_underreplicated_name(n) is not None)
            budget[0] -= found
            return found
        return sum(walk(f"{path}/{n}", levels - 1) for n in names if len(n) == 4 and set(n) <= _HEX)

    return walk(UNDERREPLICATED_LEDGERS, 4)


class UnderReplicatedCount:
    """The cached count of under-replicated ledgers (module docstring); `value` None until a count succeeded
    and after one failed."""

    def __init__(self, children: Callable[[str], list[str]], timeout_s: float,
                 refresh_s: float = UNDER_REPLICATED_REFRESH_S) -> None:
        self._children, self._timeout_s, self._refresh_s = children, timeout_s, refresh_s
        self.value: int | None = None
        self._counted_at = float("-inf")

    async def refresh(self) -> None:
        if time.monotonic() - self._counted_at < self._refresh_s:
            return
        self._counted_at = time.monotonic()
        try:
            self.value = await asyncio.wait_for(asyncio.to_thread(count_under_replicated, self._children),
                                                self._timeout_s)
        except Exception:  # noqa: BLE001 - ZooKeeper unreachable or slow: no gauge this time
            self.value = None

    def families(self) -> Iterator[Metric]:
        if self.value is not None:
            yield gauge("auditor_NUM_UNDER_REPLICATED_LEDGERS", "ledgers marked under-replicated in ZooKeeper "
                                                                "(the whole cluster)", self.value)


# -- the route --------------------------------------------------------------------------------------------

def registry_of(families: Callable[[], Iterator[Metric]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamiliesCollector(families))
    ProcessCollector(registry=registry)
    return registry


def metrics_route(registry: CollectorRegistry,
                  before: Callable[[], Awaitable[None]] | None = None) -> list[web.RouteDef]:
    """GET /metrics: `before()` (if any: async, e.g. a count read in a thread), then one collection."""
    async def handle(request: web.Request) -> web.Response:
        if before is not None:
            await before()
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [web.get("/metrics", handle)]


def bookie_metrics_routes(parts) -> list[web.RouteDef]:
    """The bookie's `/metrics` (bookie_cmd.bookie_http_routes); with autorecovery, the under-replicated count."""
    config = parts.config
    under = (UnderReplicatedCount(parts.zk.get_children, config.zookeeper.operation_timeout_ms / 1000)
             if config.autorecovery.enabled else None)

    def families() -> Iterator[Metric]:
        yield from bookie_families(parts.engine, parts.server, parts.gc)
        if under is not None:
            yield from under.families()

    return metrics_route(registry_of(families), under.refresh if under is not None else None)


def broker_metrics_routes(parts) -> list[web.RouteDef]:
    """The broker's `/metrics` (broker_cmd.broker_http_routes)."""
    topics_max = parts.config.broker.metrics_topics_max
    return metrics_route(registry_of(lambda: broker_families(parts.service, parts.topics, topics_max)))
