"""The broker's /dashboard in a real headless Chromium (Debian's `chromium`, driven by its own `--dump-dom` and
`--screenshot`): three bookies and one broker with an HTTP port; three topics get messages, their
subscriptions acknowledge some out of order (ack holes) and leave the rest unacked (backlog). The page, once its
script has polled /dashboard/api/state, must show the same numbers as the broker's topic stats over gRPC
(messages in, backlog, mark-delete, acked ranges) and as its JSON (bookie states, ledger LACs); the screenshot
is kept under the test's tmp dir (its path printed) and must be a real PNG of some size.

Bounds: Chromium runs with a 5 s virtual-time budget and a 40 s wall bound; every wait is a wait_until; traffic
goes to 127.0.0.1 only.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
import uuid
from html.parser import HTMLParser

import pytest

from bksim.adapters.ports import free_port
from bksim.client import Client, InitialPosition, SubscriptionType
from bksim.metadata.paths import BROKERS_AVAILABLE
from helpers import wait_until

BOOKIES = 3
TOPICS = 3
MESSAGES = 60
CHROMIUM_TIMEOUT_S = 40
PNG_BYTES_MIN = 20_000  # a blank 1400x1000 page compresses to a few KiB; the drawn dashboard is far larger


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "Debian's chromium is not installed: run `make browser-deps`"
    return path


def run_chromium(profile: str, *args: str) -> subprocess.CompletedProcess:
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--window-size=1400,1000", "--virtual-time-budget=5000", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False)


class DataAttributes(HTMLParser):
    """Every element's data-* attributes, by the element's first data-* key (data-topic, data-cursor, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_kind: dict[str, dict[str, dict[str, str]]] = {}
        self.ids: dict[str, dict[str, str]] = {}

    def handle_starttag(self, tag, attrs) -> None:
        data = {k[5:]: v or "" for k, v in attrs if k.startswith("data-")}
        if data:
            kind = next(iter(data))
            self.by_kind.setdefault(kind, {})[data[kind]] = data
        for k, v in attrs:
            if k == "id":
                self.ids[v] = data


def get_json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{url}: HTTP {e.code}: {e.read()[:2000]!r}") from None


@pytest.fixture(scope="module")
def dashboard_broker(broker_cluster):
    broker_cluster.settle(BOOKIES)
    http_port = free_port()
    broker, = broker_cluster.start_brokers(1, env={"BKSIM_BROKER_HTTP_PORT": str(http_port)})
    # topics go to registered brokers: wait until a killed broker of an earlier module is gone
    wait_until(lambda: broker_cluster.zk.get_children(BROKERS_AVAILABLE) == [broker.broker_id], 30,
               message="this module's broker to be the only one registered")
    return broker_cluster, broker, http_port


def test_dashboard_shows_the_brokers_numbers(dashboard_broker, tmp_path):
    cluster, broker, http_port = dashboard_broker
    base = f"http://127.0.0.1:{http_port}"
    tenant = f"d{uuid.uuid4().hex[:6]}"
    topics = [f"persistent://{tenant}/ns/orders-{i}" for i in range(TOPICS)]
    expected_backlog = {}
    with Client([broker.address], operation_timeout_ms=20_000) as client:
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}/ns", retention_ms=-1)
        for k, topic in enumerate(topics):
            client.create_topic(topic)
            consumer = client.subscribe(topic, "audit", SubscriptionType.Shared, consumer_name="c",
                                        initial_position=InitialPosition.Earliest, ack_group_time_ms=0)
            producer = client.create_producer(topic, batching_enabled=False)
            count = MESSAGES + 20 * k
            for i in range(count):
                producer.send_async(f"{topic} {i}".encode(), None)
            producer.flush()
            got = []
            wait_until(lambda: got.append(consumer.receive(2000)) or len(got) >= count, 30,
                       message=f"{count} messages of {topic} received")
            # ack the first 10, then every third: mark-delete stops at 9, holes between the acked ones
            acked = [m for i, m in enumerate(got) if i < 10 or i % 3 == 0]
            for m in acked:
                consumer.acknowledge(m)
            expected_backlog[topic] = count - len(acked)
        for topic in topics:
            wait_until(lambda: client.topic_stats(topic)["subscriptions"]["audit"]["msgBacklog"]
                       == expected_backlog[topic], 20, message=f"{topic}'s acks to reach the broker")
        stats = {t: client.topic_stats(t) for t in topics}
        internal = {t: client.topic_stats_internal(t) for t in topics}

        state = get_json(f"{base}/dashboard/api/state")
        assert {b["id"] for b in state["bookies"]["items"]} == {b.bookie_id for b in cluster.live_bookies()}
        page = run_chromium(str(tmp_path / "profile-dom"), "--dump-dom", f"{base}/dashboard")
        assert page.returncode == 0, page.stderr[-2000:]
        dom = DataAttributes()
        dom.feed(page.stdout)
        assert int(dom.ids["updated"]["polls"]) >= 1, "the page's script never got the JSON"

        for topic in topics:
            row = dom.by_kind["topic"][topic]
            assert int(row["msg-in"]) == stats[topic]["msgInCounter"] == MESSAGES + 20 * topics.index(topic)
            assert int(row["backlog"]) == stats[topic]["backlogSize"] == expected_backlog[topic]
            cursor = dom.by_kind["cursor"][f"{topic}|audit"]
            c = internal[topic]["cursors"]["audit"]
            assert cursor["mark-delete"] == c["markDeletePosition"]
            assert cursor["mark-delete"].endswith(":9"), cursor  # the first ten acked, the 11th not
            assert int(cursor["backlog"]) == stats[topic]["subscriptions"]["audit"]["msgBacklog"]
            assert int(cursor["ranges"]) == c["totalNonContiguousDeletedMessagesRange"] > 0
            assert int(cursor["holes"]) == expected_backlog[topic] > 0
        for b in state["bookies"]["items"]:
            assert dom.by_kind["bookie"][b["id"]]["state"] == b["state"] == "writable"
        assert len(dom.by_kind["bookie"]) == BOOKIES
        page_ledgers = dom.by_kind["ledger"]
        for ledger in state["ledgers"]["items"]:
            assert int(page_ledgers[str(ledger["id"])]["lac"]) == ledger["lac"]
        topic_ledgers = {lid for t in internal.values() for lid in (x["ledgerId"] for x in t["ledgers"])}
        assert {int(k) for k in page_ledgers} <= topic_ledgers and page_ledgers
        assert dom.by_kind["broker"][broker.broker_id]["topic-count"] == str(TOPICS)

        shot = tmp_path / "dashboard.png"
        r = run_chromium(str(tmp_path / "profile-shot"), f"--screenshot={shot}", f"{base}/dashboard")
        assert r.returncode == 0, r.stderr[-2000:]
        print(f"dashboard screenshot: {shot}")
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > PNG_BYTES_MIN, len(data)

