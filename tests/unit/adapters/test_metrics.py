"""adapters/metrics.py: the families a scrape exports, from a real BookieEngine, a real LedgerService over fake
bookies, and stand-in topic objects; the per-topic cap; the text parses with prometheus_client's parser."""
from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from types import SimpleNamespace

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bksim.adapters.clock import SystemClock
from bksim.adapters.http_server import ProcessParts
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.metrics import (OTHER, bookie_families, bookie_metrics_routes, broker_families,
                                    count_under_replicated, registry_of, topic_families)
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.broker.ledgers import LedgerService
from bksim.formats.entry import encode_entry
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path, underreplicated_path
from bksim.model.config import BookieConfig, BrokerConfig, Config
from bksim.model.errors import LedgerError
from bksim.model.histogram import LatencyHistogram
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

KEY = b"k" * 32


def scrape(families) -> dict[str, list]:
    """name -> samples, through the text format and prometheus_client's parser."""
    text = generate_latest(registry_of(families)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples, name, **labels):
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_a_bookie_exports_its_journal_latencies_and_state(tmp_path):
    async def run():
        engine = BookieEngine(BookieConfig(), disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                              instance_id=str(uuid.uuid4()), journal_dir=str(tmp_path / "j"),
                              ledger_dir=str(tmp_path / "l"), log=lambda line: None)
        await engine.start()
        try:
            statuses, _ = await engine.add_entries([(encode_entry(1, i, -1, 0, b"x" * 10), KEY, 0) for i in range(25)])
            assert all(s == 0 for s in statuses)
            return scrape(lambda: bookie_families(engine))
        finally:
            await engine.close()

    m = asyncio.run(run())
    assert value(m["bookie_journal_JOURNAL_ADD_ENTRY"], "bookie_journal_JOURNAL_ADD_ENTRY_count") >= 25
    syncs = value(m["bookie_journal_JOURNAL_SYNC"], "bookie_journal_JOURNAL_SYNC_count")
    assert syncs >= 1 and value(m["bookie_journal_JOURNAL_SYNC"], "bookie_journal_JOURNAL_SYNC_bucket", le="+Inf") == syncs
    assert value(m["bksim_bookie_add_entries"], "bksim_bookie_add_entries_total") == 25
    assert value(m["bookie_SERVER_STATUS"], "bookie_SERVER_STATUS") == 1
    assert value(m["bookie_ACTIVE_LEDGER_TOTAL"], "bookie_ACTIVE_LEDGER_TOTAL") == 1
    assert value(m["bookie_write_cache_size"], "bookie_write_cache_size") > 0
    assert value(m["bookie_ACTIVE_ENTRY_LOG_TOTAL"], "bookie_ACTIVE_ENTRY_LOG_TOTAL") >= 1
    assert "process_cpu_seconds" in m  # prometheus_client's process collector rides along


def _topic(key: str, messages_in: int, subs: dict[str, tuple[int, int, int]]):
    """A stand-in for topics/topic.Topic with the attributes the exporter reads; subs: name -> (out, backlog,
    unacked)."""
    tenant, ns = key.split("//")[1].split("/")[:2]
    ml = SimpleNamespace(add_latency=LatencyHistogram(), total_size=100 * messages_in)
    ml.add_latency.observe(2.0, messages_in)
    return SimpleNamespace(
        name=SimpleNamespace(ns=f"{tenant}/{ns}"), messages_in=messages_in, bytes_in=10 * messages_in, ml=ml,
        producers={"p": object()},
        subscriptions={n: SimpleNamespace(messages_out=o, bytes_out=10 * o,
                                          stats=lambda b=b, u=u: {"msgBacklog": b, "unackedMessages": u})
                       for n, (o, b, u) in subs.items()})


def test_topics_beyond_the_cap_are_summed_into_one_series():
    loaded = {f"persistent://t/ns/topic-{i:02d}": _topic(f"persistent://t/ns/topic-{i:02d}", i + 1,
                                                          {"a": (i, 2 * i, 1), "b": (0, 1, 0)}) for i in range(5)}
    m = scrape(lambda: topic_families(loaded, 3))
    in_samples = m["pulsar_in_messages"]
    assert [s.labels["topic"] for s in in_samples] == [*sorted(loaded)[:3], OTHER]
    assert value(in_samples, "pulsar_in_messages_total", topic="persistent://t/ns/topic-00", namespace="t/ns") == 1
    assert value(in_samples, "pulsar_in_messages_total", topic=OTHER) == 4 + 5  # topic-03 and topic-04
    assert sum(s.value for s in in_samples) == sum(t.messages_in for t in loaded.values())
    assert value(m["pulsar_msg_backlog"], "pulsar_msg_backlog", topic="persistent://t/ns/topic-02") == 4 + 1
    backlog = m["pulsar_subscription_back_log"]
    assert len(backlog) == 3 + 1  # three (topic, subscription) pairs of their own, the other seven summed
    assert value(backlog, "pulsar_subscription_back_log", topic=OTHER, subscription=OTHER) == \
        sum(2 * i + 1 for i in range(5)) - (0 + 1 + 2)  # everything but topic-00's a, b and topic-01's a
    assert value(m["pulsar_storage_write_latency"], "pulsar_storage_write_latency_count") == 15
    assert value(m["pulsar_out_messages"], "pulsar_out_messages_total", topic=OTHER) == 3 + 4


def test_a_cap_of_zero_keeps_one_series_and_no_topics_keeps_none():
    loaded = {"persistent://t/ns/x": _topic("persistent://t/ns/x", 7, {"s": (1, 2, 3)})}
    m = scrape(lambda: topic_families(loaded, 0))
    assert [(s.labels["topic"], s.value) for s in m["pulsar_in_messages"]] == [(OTHER, 7)]
    assert value(m["pulsar_subscription_unacked_messages"], "pulsar_subscription_unacked_messages",
                 subscription=OTHER) == 3
    empty = scrape(lambda: topic_families({}, 10))
    assert empty["pulsar_in_messages"] == [] and empty["pulsar_subscription_back_log"] == []


# -- broker counters: a real LedgerService over fake bookies and the in-memory metadata store -----------------

def test_a_broker_counts_ensemble_changes_recoveries_and_fenced_writers():
    bookies, password = [f"b{i}" for i in range(5)], b"pw"

    async def run():
        store = InMemoryMetadataStore()
        for b in bookies:
            await store.session("bookies").create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
        fake = FakeBookies(bookies)
        a, b = (LedgerService(store=store.session(f"broker-{i}"), transport=fake, rng=random.Random(i),
                              clock=ManualClock(sleeps_advance=True), config=BrokerConfig(speculative_read_ms=50))
                for i in range(2))
        h = await a.create_ledger(3, 3, 2, password=password)
        await asyncio.gather(*[h.append(b"x") for _ in range(10)])
        fake[h.metadata.ensemble[1]].down = True
        await asyncio.gather(*[h.append(b"y") for _ in range(10)])  # an ensemble change
        await b.open_ledger(h.ledger_id, password=password, recover=True)  # B fences A's writer
        with pytest.raises(LedgerError):
            await h.append(b"late")
        return scrape(lambda: broker_families(a, None, 10)), scrape(lambda: broker_families(b, None, 10))

    m_a, m_b = asyncio.run(run())
    assert value(m_a["bookkeeper_client_NUM_ENSEMBLE_CHANGE"], "bookkeeper_client_NUM_ENSEMBLE_CHANGE") == 1
    assert value(m_a["bksim_broker_ledgers_created"], "bksim_broker_ledgers_created_total") == 1
    assert value(m_a["bksim_broker_writers_fenced"], "bksim_broker_writers_fenced_total") == 1
    assert value(m_a["bksim_broker_ledgers_open"], "bksim_broker_ledgers_open") == 0
    assert value(m_b["bksim_broker_ledger_recoveries"], "bksim_broker_ledger_recoveries_total", result="closed") == 1
    assert value(m_b["bksim_broker_ledger_recoveries"], "bksim_broker_ledger_recoveries_total", result="failed") == 0
    assert value(m_b["bksim_broker_writers_fenced"], "bksim_broker_writers_fenced_total") == 0
    assert "pulsar_in_messages" not in m_a  # no topic layer: no topic families


# -- under-replicated ledgers: the ZooKeeper walk and the route that runs it before a scrape ------------------

class _Tree:
    """A stand-in for kazoo's get_children over the marks of `ledger_ids` (plus a stray name)."""

    def __init__(self, ledger_ids) -> None:
        self.nodes: dict[str, set[str]] = {}
        for ledger_id in ledger_ids:
            parts = underreplicated_path(ledger_id).split("/")
            for i in range(4, len(parts)):
                self.nodes.setdefault("/".join(parts[:i]), set()).add(parts[i])
        self.calls = 0

    def children(self, path: str) -> list[str]:
        self.calls += 1
        if path not in self.nodes:
            raise type("NoNodeError", (Exception,), {})(path)
        return sorted(self.nodes[path]) + (["lock", "zzzz"] if path.endswith("/ledgers") else [])


def test_the_under_replicated_count_walks_the_mark_hierarchy():
    tree = _Tree([1, 2, 70_000, 1 << 40])
    assert count_under_replicated(tree.children) == 4
    assert count_under_replicated(_Tree([]).children) == 0  # no marks: the directory does not exist
    assert count_under_replicated(_Tree(range(100)).children, nodes_max=10) < 100  # bounded: a lower bound


def test_a_bookie_with_autorecovery_exports_the_count_and_refreshes_it_at_most_every_interval():
    tree = _Tree([5, 6, 7])

    async def run(tmp: str):
        engine = BookieEngine(BookieConfig(), disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                              instance_id=str(uuid.uuid4()), journal_dir=f"{tmp}/j", ledger_dir=f"{tmp}/l", log=lambda line: None)
        await engine.start()
        app = web.Application()
        app.add_routes(bookie_metrics_routes(ProcessParts("bookie", Config(), dict(
            engine=engine, server=None, gc=None, zk=SimpleNamespace(get_children=tree.children)))))
        try:
            async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
                texts = []
                for _ in range(2):
                    async with session.get(server.make_url("/metrics")) as r:
                        assert r.status == 200
                        texts.append(await r.text())
                return texts
        finally:
            await engine.close()

    with tempfile.TemporaryDirectory() as tmp:
        first, second = asyncio.run(run(tmp))
    for text in (first, second):
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        assert value(families["auditor_NUM_UNDER_REPLICATED_LEDGERS"], "auditor_NUM_UNDER_REPLICATED_LEDGERS") == 3
    walks = tree.calls
    assert 0 < walks <= 1 + 3 * 4 + 2  # one walk for both scrapes (cached): root, 4 levels per mark, strays
