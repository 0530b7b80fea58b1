"""The topic simulation: brokers running the real topic layer (TopicService with ManagedCursor, composed as
`bksim broker run` composes it) over simulated bookies, the simulated network and the in-memory metadata store;
simulated producers and consumers of one topic, driven by one seed, with the faults of its plan; the topic
invariants of PROTOCOL.md §7 (sim.topic_checks) are checked as it runs and at the end.

Owns the world of one run: a SimCluster (bookies, InMemoryMetadataStore, SimNetwork between brokers and bookies),
the brokers (each incarnation: its own metadata session behind a TopicCheckedStore, its own SimBookieTransport
node, LedgerService and TopicService, and every task its code starts), and the clients.

Clients call the topic layer's API directly, below gRPC (what adapters/topic_server.py does with a stream, a
client connection here does with messages on a simulated link): Lookup on any live broker, then on the owner
TopicService.acquire + Topic.add_producer / publish (in arrival order, receipts in order) or Topic.subscribe
with a ConsumerSink, flow permits, acks (individual, cumulative, batch-index), negative acks (redeliver) and
seeks. A link is FIFO with a seeded delay; a lost message breaks the connection (as a broken stream does):
the client looks the topic up again and reconnects, a producer re-sends every Send without a receipt with
the same sequence ids. Subscriptions: one each of Exclusive, Failover, Shared and Key_Shared, created at
"earliest" before the first Send. Delivery features, per seed (TopicPlan, from a stream of their own): delayed
messages (a Send of one message with deliver_at_ms), sticky Key_Shared consumers (hash_ranges), and a reader
(Topic.create_reader: a non-durable cursor from the earliest message, resumed after the last message it read).

Broker processes: every task a broker's code creates is its own (a context variable marks the broker and the
loop's task factory files each task under it), so a crash cancels exactly that process's work; its ledgers
stay open, its session expires `session_timeout_ms` later, and clients take the topic to another broker
(takeover = ManagedLedger.open: recover and fence the last ledger). Faults (TopicPlan.events): broker crash and
restart, broker session expiry while it keeps running (it notices later: TopicService.session_lost, a new
session), ZooKeeper connection loss of one broker (calls fail; writes half of the time after being applied),
bookie crash and restart, a lossy and slow network (bookie links and client links), a clean broker restart
(TopicService.close), a client connection broken, a seek.

Phases: a safety phase of `plan.run_ms` virtual ms with faults; then liveness: every fault healed, every
process running, every producer gets a receipt for every Send, every subscription drains (everything
delivered and acknowledged); then the owner closes cleanly, consumers come back and must get nothing they had
acknowledged; then the end checks (lost = 0, every receipt names its message's position).

Determinism: all randomness comes from streams derived from the seed (plan.rng_for), time is the SimLoop's,
nothing iterates in address or string-hash order: one seed gives one byte-identical trace.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import gc
import json
import traceback
from dataclasses import dataclass, field
from typing import Callable

from bksim.broker.ledgers import LedgerService
from bksim.formats.message import Message, decode_entry, read_header
from bksim.formats.murmur3 import murmur3_32
from bksim.metadata.memory import SessionView
from bksim.metadata.paths import BROKERS_AVAILABLE
from bksim.model.config import BookieConfig, BrokerConfig, TopicConfig
from bksim.model.errors import FormatError, MetadataError, NodeExistsError
from bksim.model.invariants import InvariantError
from bksim.sim import loop as sim_loop
from bksim.sim.bookie_checks import InvariantViolation
from bksim.sim.cluster import BookieSpec, SimCluster
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults
from bksim.sim.network import LinkFaults, SimBookieTransport, SimNetwork
from bksim.sim.plan import bookie_name, broker_name, rng_for
from bksim.sim.topic_checks import TopicCheckedStore, TopicChecks
from bksim.sim.trace import Trace
from bksim.topics import backlog_quota as bq
from bksim.topics.errors import TopicError
from bksim.topics.managed_cursor import ManagedCursor
from bksim.topics.managed_ledger import FINAL as FINAL_STATES
from bksim.topics.names import TopicName
from bksim.topics.positions import MessageId, Position
from bksim.topics.service import TopicService
from bksim.topics.sticky_ranges import HASH_RANGE_SIZE, slot_of
from bksim.topics.subscription import Delivery
from bksim.topics.topic import Policies

TOPIC = "persistent://sim/ns/t"
SUBSCRIPTIONS = {"ex": "Exclusive", "fo": "Failover", "sh": "Shared", "ks": "Key_Shared"}
CONSUMERS_OF = {"Exclusive": 1, "Failover": 2, "Shared": 2, "Key_Shared": 2}
EVENT_WEIGHTS = (("crash_broker", 12), ("expire_broker_session", 8), ("zk_connection_loss", 6),
                 ("crash_bookie", 8), ("lossy_network", 6), ("clean_restart", 5), ("break_connection", 8),
                 ("seek", 8), ("restart_producer", 6))
LIVENESS_MS = 30_000.0   # virtual: producers finish and subscriptions drain within this
QUIET_MS = 400.0       # after the final clean close: consumers reconnect; nothing acknowledged may come back
RPC_TIMEOUT_MS = 3_000.0  # a lookup or an open unanswered this long: the client gives up and tries again
SEND_TIMEOUT_MS = 4_000.0  # a Send without a receipt this long: the producer reconnects (and re-sends)
BACKOFF_MS = (50.0, 200.0)  # a client waits this long (uniform) before looking the topic up again
PROBE_MS = 50.0          # how often the durable mark-deletes and the managed ledgers' invariants are looked at
REGISTER_RETRY_MS = 50.0
IDLE_CRASHES = 2  # liveness: the idle owner crashes this often, producers restart each time
EXTRA_SENDS = 4   # ... and each producer sends this many more after every idle crash but the last
INTERNAL_ERROR = "internal error"

OWNER: contextvars.ContextVar = contextvars.ContextVar("bksim_sim_topic_owner", default=None)


# -- the plan ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TopicFault:
    at_ms: float
    kind: str
    node: str = ""
    duration_ms: float = 0.0
    amount: float = 0.0

    def describe(self) -> str:
        what = {
            "crash_broker": lambda: f"{self.node}, restart after {self.duration_ms:.2f} ms",
            "expire_broker_session": lambda: f"{self.node} (keeps running; notices after {self.duration_ms:.2f} ms)",
            "zk_connection_loss": lambda: f"{self.node} for {self.duration_ms:.2f} ms",
            "crash_bookie": lambda: f"{self.node}, restart after {self.duration_ms:.2f} ms",
            "lossy_network": lambda: f"every link: loss {self.amount:g}, +{self.amount * 200:g} ms jitter for "
                                     f"{self.duration_ms:.2f} ms",
            "clean_restart": lambda: f"the topic's owner closes cleanly, restart after {self.duration_ms:.2f} ms",
            "break_connection": lambda: "a client's connection breaks",
            "seek": lambda: "a subscription seeks back to a position it was delivered",
            "restart_producer": lambda: "a producer process restarts (resumes from the broker's last_sequence_id)",
        }[self.kind]()
        return f"at {self.at_ms:8.2f} ms {self.kind} {what}"


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """Every knob of one topic simulation, drawn from the seed (`from_seed` is a pure function)."""
    seed: int
    bookies: int
    brokers: int
    dedup: bool
    producers: int
    sends_per_producer: int
    batch_max: int              # messages per Send: 1..this (a Send of several is one batch entry)
    producer_window: int        # Sends in flight per producer
    send_gap_ms_max: float
    burst_probability: float    # a Send follows the previous one at once (pipelined), else after a gap
    keys: int
    permits: int                # a consumer's flow permits (granted back as it processes)
    nack_probability: float
    run_ms: float
    link_delay_ms: float        # client <-> broker, one way
    net_delay_ms: float         # broker <-> bookie
    net_jitter_ms: float
    bookie_timeout_ms: float
    session_timeout_ms: float
    ensemble: tuple[int, int, int]
    ledger_entries_max: int
    cursor_persist_interval_ms: int
    dedup_snapshot_entries: int
    dispatch_read_entries_max: int
    disk_latency_ms_max: float
    events: tuple[TopicFault, ...]
    # delivery features (drawn from a stream of their own, so the knobs above keep their values per seed)
    delayed_probability: float  # a Send is one message with a delivery time (deliver_at_ms)
    delay_ms_max: float         # ... now - 50 ms .. now + this (a time already past is delivered at once)
    key_shared_sticky: int      # 0: Key_Shared auto-split; else sticky ranges [0, this - 1] and [this, 65535]
    reader: bool                # a reader (non-durable cursor from the earliest message) follows the topic
    add_requests_per_bookie_max: int  # broker.add_requests_per_bookie_max (0: each loop turn's adds at once)
    # expiry (a stream of its own too)
    ttl_ms: int                 # the namespace's message TTL (0: none): cursors move past older messages
    consumer_hold_ms_max: float  # a consumer's processing time after each batch it acks: 0 .. this
    age_eviction_ms: int        # a message_age backlog quota with consumer_backlog_eviction (0: none)
    producer_quota_bytes: int   # a destination_storage backlog quota that stops producers (0: none) ...
    producer_quota_policy: str  # ... producer_request_hold (Sends wait) or producer_exception (Sends fail)

    @classmethod
    def from_seed(cls, seed: int) -> "TopicPlan":
        r = rng_for(seed, "topic-plan")
        bookies, brokers = r.randint(3, 4), r.randint(2, 3)
        run_ms = r.choice([1_000.0, 2_000.0])
        session_timeout_ms = r.choice([300.0, 600.0])
        events = []
        total = sum(w for _, w in EVENT_WEIGHTS)
        for _ in range(r.choice([0, 2, 3, 5])):
            at = round(r.uniform(0.0, run_ms * 0.9), 2)
            pick, kind = r.uniform(0, total), EVENT_WEIGHTS[-1][0]
            for name, w in EVENT_WEIGHTS:
                if pick < w:
                    kind = name
                    break
                pick -= w
            node = ""
            if kind in ("crash_broker", "expire_broker_session", "zk_connection_loss"):
                node = broker_name(r.randint(1, brokers))
            elif kind == "crash_bookie":
                node = bookie_name(r.randint(1, bookies))
            duration = {"crash_broker": r.uniform(100.0, 800.0), "expire_broker_session": r.uniform(20.0, 400.0),
                        "zk_connection_loss": r.uniform(10.0, session_timeout_ms / 2),
                        "crash_bookie": r.uniform(50.0, 600.0), "lossy_network": r.uniform(50.0, 400.0),
                        "clean_restart": r.uniform(50.0, 400.0)}.get(kind, 0.0)
            events.append(TopicFault(at, kind, node, round(duration, 2),
                                     r.choice([0.01, 0.05]) if kind == "lossy_network" else 0.0))
        events.sort(key=lambda e: e.at_ms)
        return cls(
            seed=seed, bookies=bookies, brokers=brokers, dedup=r.random() < 0.6,
            producers=r.randint(1, 2), sends_per_producer=r.choice([6, 10, 16]), batch_max=r.choice([1, 3]),
            producer_window=r.choice([2, 4, 8]), send_gap_ms_max=r.choice([10.0, 40.0]),
            burst_probability=r.choice([0.3, 0.7]), keys=r.choice([2, 5]),
            permits=r.choice([3, 10]), nack_probability=r.choice([0.0, 0.05, 0.15]), run_ms=run_ms,
            link_delay_ms=r.choice([0.5, 2.0, 25.0]), net_delay_ms=r.choice([0.1, 0.5]),
            net_jitter_ms=r.choice([0.2, 2.0]),
            bookie_timeout_ms=r.choice([50.0, 150.0]), session_timeout_ms=session_timeout_ms,
            ensemble=(3, 2, 2), ledger_entries_max=r.choice([4, 10, 1_000]),
            cursor_persist_interval_ms=r.choice([50, 100, 300]), dedup_snapshot_entries=r.choice([2, 3, 5]),
            dispatch_read_entries_max=r.choice([2, 10]), disk_latency_ms_max=r.choice([0.1, 1.0]),
            events=tuple(events), **_delivery_features(seed), **_expiry_features(seed),
            **_producer_quota(seed))

    def describe(self) -> list[str]:
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "events":
                lines.append(f"events = {len(value)}")
                lines += [f"  {event.describe()}" for event in value]
            else:
                lines.append(f"{f.name} = {value}")
        return lines

    def topic_config(self) -> TopicConfig:
        e, qw, qa = self.ensemble
        return dataclasses.replace(
            TopicConfig(), ensemble_size=e, write_quorum_size=qw, ack_quorum_size=qa,
            ledger_entries_max=self.ledger_entries_max, trim_interval_ms=200,
            dedup_snapshot_entries=self.dedup_snapshot_entries,
            dispatch_read_entries_max=self.dispatch_read_entries_max, failover_switch_delay_ms=30,
            cursor_persist_interval_ms=self.cursor_persist_interval_ms, cursor_ledger_entries_max=8,
            key_shared_replica_points=8, backlog_quota_check_interval_ms=100, backlog_quota_hold_ms_max=400)

    def expiry_ms(self) -> int:
        """The age after which a message may be skipped unseen (0: never): the TTL, or message_age eviction's
        cutoff (the backlog's oldest message is brought down to EVICTION_TARGET of its limit), the shorter."""
        ages = [self.ttl_ms, int(self.age_eviction_ms * bq.EVICTION_TARGET)]
        return min((a for a in ages if a > 0), default=0)

    def bookie_config(self) -> BookieConfig:
        return dataclasses.replace(BookieConfig(), journal_sync_on_loop=False, flush_interval_ms=500)


def _delivery_features(seed: int) -> dict:
    r = rng_for(seed, "topic-plan-features")
    return {"delayed_probability": r.choice([0.0, 0.0, 0.25]), "delay_ms_max": r.choice([20.0, 300.0]),
            "key_shared_sticky": r.choice([0, 0, r.randint(1, HASH_RANGE_SIZE - 1)]),
            "reader": r.random() < 0.4,
            "add_requests_per_bookie_max": rng_for(seed, "topic-plan-add-batching").choice([0, 1, 2])}


def _producer_quota(seed: int) -> dict:
    """In two worlds in seven a destination_storage quota of 300 or 1,000 bytes stops the producers while the
    slowest subscription is behind: their Sends wait (producer_request_hold, at most 400 ms: TIMEOUT) or fail
    (producer_exception), and the producers resend them."""
    r = rng_for(seed, "topic-plan-quota")
    limit = r.choice([0] * 5 + [300, 1_000])
    return {"producer_quota_bytes": limit,
            "producer_quota_policy": r.choice([bq.PRODUCER_REQUEST_HOLD, bq.PRODUCER_EXCEPTION])}


def _expiry_features(seed: int) -> dict:
    """A message TTL in about a third of the worlds, slow consumers (up to 800 ms of processing after each batch)
    in a quarter: a consumer may then ack messages the TTL passed, whose ledger retention may have trimmed
    meanwhile; and in a fifth a message_age backlog quota that evicts the slow subscriptions' backlog."""
    r = rng_for(seed, "topic-plan-expiry")
    ttl_ms = r.choice([100, 250, 500]) if r.random() < 0.35 else 0
    hold_ms_max = r.choice([2.0, 2.0, 2.0, 800.0])
    return {"ttl_ms": ttl_ms, "consumer_hold_ms_max": hold_ms_max,
            "age_eviction_ms": r.choice([150, 400]) if r.random() < 0.2 else 0}


@dataclass(slots=True)
class TopicSimResult:
    seed: int
    plan: TopicPlan
    violation: InvariantViolation | None
    trace: list[str]
    digest: str
    stats: dict[str, int | float] = field(default_factory=dict)
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.violation is None


def run_topic_sim(seed: int, *, plan: TopicPlan | None = None) -> TopicSimResult:
    """Run one seed on a fresh SimLoop; never raises for an invariant violation (it is in the result)."""
    plan = plan or TopicPlan.from_seed(seed)
    try:
        return sim_loop.run(_run_world(plan), seed=seed)
    finally:
        gc.collect()


async def _run_world(plan: TopicPlan) -> TopicSimResult:
    world = TopicWorld(plan)
    loop = asyncio.get_running_loop()
    base_factory = loop.get_task_factory()

    def factory(loop, coro, **kw):  # every task a broker's code starts belongs to that broker process
        task = base_factory(loop, coro, **kw)
        ctx = kw.get("context")
        owner = ctx.get(OWNER) if ctx is not None else OWNER.get()
        if owner is not None:
            owner.tasks.add(task)
            task.add_done_callback(owner.tasks.discard)
        return task
    loop.set_task_factory(factory)
    try:
        await world.run()
    except InvariantViolation as v:
        world.fail(v)
    except Exception as e:  # a bug that escaped (in the topic layer or the simulator)
        world.error = world.error or traceback.format_exc()
        world.fail(InvariantViolation("NothingRaises", f"{type(e).__name__}: {e}"))
    finally:
        world.cluster.abandon()
        loop.set_task_factory(base_factory)
    violation = world.violation or world.checks.violation
    if violation is not None:
        world.trace.add(f"VIOLATION {violation}")
    stats = dict(world.stats)
    stats.update(world.checks.stats)
    stats["net_lost"] = world.network.stats["lost"]
    stats["virtual_ms"] = round(world.clock.monotonic_ms(), 3)
    return TopicSimResult(plan.seed, plan, violation, world.trace.lines, world.trace.digest(), stats, world.error)


# -- brokers -------------------------------------------------------------------------------------------------------
class _Broker:
    """One broker incarnation: its session (behind a TopicCheckedStore), ledger and topic services, tasks."""

    def __init__(self, name: str, incarnation: int) -> None:
        self.name, self.incarnation = name, incarnation
        self.label = f"{name}#{incarnation}"
        self.alive = True
        self.tasks: set[asyncio.Task] = set()
        self.ctx = contextvars.Context()
        self.ctx.run(OWNER.set, self)
        self.conns: list[_Conn] = []
        self.store: TopicCheckedStore | None = None
        self.session: SessionView | None = None
        self.ledgers: LedgerService | None = None
        self.transport: SimBookieTransport | None = None
        self.topics: TopicService | None = None

    def run(self, fn, *args):
        """Call `fn` as this broker's code (tasks it starts are the broker's)."""
        if OWNER.get() is self:
            return fn(*args)
        return self.ctx.run(fn, *args)

    def spawn(self, coro) -> asyncio.Task:
        return self.run(asyncio.get_running_loop().create_task, coro)


class _Conn:
    """A client's connection to one broker incarnation: FIFO both ways with the link's delay; a lost message
    breaks it (the client notices, the broker cleans up its side, each after a delay)."""

    def __init__(self, world: "TopicWorld", broker: _Broker, client: str) -> None:
        self.world, self.broker, self.client = world, broker, client
        self.open = True
        self.last_position: Position | None = None  # of the last receipt on this connection
        self._to_broker_at = 0.0
        self._to_client_at = 0.0
        self.on_client_break: Callable[[str], None] = lambda why: None
        self.on_server_break: Callable[[], None] = lambda: None
        broker.conns.append(self)

    def _at(self, last: float) -> float:
        return max(last, self.world.now() + self.world.link_delay())

    def to_broker(self, fn, *args) -> None:
        if not self.open:
            return
        if self.world.link_lost():
            self.break_("a message to the broker was lost")
            return
        self._to_broker_at = self._at(self._to_broker_at)
        asyncio.get_running_loop().call_at(self._to_broker_at / 1000.0, self._arrive_broker, fn, args)

    def _arrive_broker(self, fn, args) -> None:
        if self.open and self.broker.alive:
            self.broker.run(fn, *args)

    def to_client(self, fn, *args) -> None:
        if not self.open:
            return
        if self.world.link_lost():
            self.break_("a message to the client was lost")
            return
        self._to_client_at = self._at(self._to_client_at)
        asyncio.get_running_loop().call_at(self._to_client_at / 1000.0, self._arrive_client, fn, args)

    def _arrive_client(self, fn, args) -> None:
        if self.open:
            fn(*args)

    def break_(self, why: str) -> None:
        if not self.open:
            return
        self.open = False
        self.world.trace.add(f"conn {self.client} -> {self.broker.label}: broken ({why})")
        if self in self.broker.conns:
            self.broker.conns.remove(self)
        loop = asyncio.get_running_loop()
        loop.call_later(self.world.link_delay() * 4 / 1000.0, self.on_client_break, why)
        loop.call_later(self.world.link_delay() * 4 / 1000.0, self._server_break)

    def _server_break(self) -> None:
        if self.broker.alive:
            self.broker.run(self.on_server_break)


# -- the broker side of client connections (what adapters/topic_server.py does per stream) -------------------------
class _ProducerSide:
    def __init__(self, world: "TopicWorld", broker: _Broker, conn: _Conn, name: str) -> None:
        self.world, self.broker, self.conn, self.name = world, broker, conn, name
        self.topic = None
        self.queue: collections.deque = collections.deque()
        self.wake = asyncio.Event()
        self.writer: asyncio.Task | None = None
        conn.on_server_break = self.close

    async def open(self, ready: Callable, refused: Callable) -> None:
        try:
            topic = await self.broker.topics.acquire(TOPIC)
            _, last = topic.add_producer(self.name, self.broker.name)
        except TopicError as e:
            self.conn.to_client(refused, e)
            self.conn.break_(f"open refused: {e.status.name}")
            return
        if not self.conn.open:
            topic.remove_producer(self.name)
            return
        self.topic = topic
        self.writer = asyncio.get_running_loop().create_task(self._write())
        self.conn.to_client(ready, last)

    def send(self, index: int, messages: list[Message], receipt: Callable) -> None:
        if self.topic is None:
            return
        task = asyncio.get_running_loop().create_task(self.topic.publish(self.name, messages))
        self.queue.append((index, task, receipt))
        self.wake.set()

    async def _write(self) -> None:
        while True:
            while not self.queue:
                self.wake.clear()
                await self.wake.wait()
            index, task, receipt = self.queue.popleft()
            try:
                pos = await task
            except TopicError as e:
                self.world.trace.add(f"{self.broker.label}: producer {self.name} send #{index}: {e}")
                self.conn.break_(f"send failed: {e.status.name}")
                return
            self.conn.to_client(receipt, index, pos)

    def close(self) -> None:
        if self.topic is not None:
            self.topic.remove_producer(self.name)
        if self.writer is not None:
            self.writer.cancel()
        for _, task, _ in self.queue:
            task.add_done_callback(_quiet)


async def _wait_any(events, timeout_ms: float | None) -> None:
    """Until one of `events` is set (or `timeout_ms` passed)."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=None if timeout_ms is None else timeout_ms / 1000.0,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _deliver_at(entry: bytes) -> int:
    try:
        return read_header(entry).deliver_at_ms
    except FormatError:
        return 0


def _quiet(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class _ConsumerSide:
    """The broker side of a consumer connection; also the ConsumerSink the subscription delivers to."""

    def __init__(self, world: "TopicWorld", broker: _Broker, conn: _Conn, client: "_Consumer") -> None:
        self.world, self.broker, self.conn, self.client = world, broker, conn, client
        self.sub = self.consumer = None
        conn.on_server_break = self.close

    async def open(self, ready: Callable, refused: Callable) -> None:
        c = self.client
        try:
            topic = await self.broker.topics.acquire(TOPIC)
            sub, consumer = await topic.subscribe(c.sub, c.sub_type, "earliest", c.name, c.priority, self,
                                                  c.ranges)
        except TopicError as e:
            self.conn.to_client(refused, e)
            self.conn.break_(f"subscribe refused: {e.status.name}")
            return
        self.sub, self.consumer = sub, consumer
        if not self.conn.open:
            sub.remove_consumer(consumer)
            return
        self.conn.to_client(ready)

    # ConsumerSink
    def deliver(self, deliveries: list[Delivery]) -> None:
        if self.client.sub_type in ("Shared", "Key_Shared"):
            now = self.world.clock.wall_ms()
            for d in deliveries:
                at = _deliver_at(d.entry)
                if at:
                    self.world.stats["delayed_deliveries"] += 1
                if at > now:
                    self.world.checks.fail("DelayedNotBeforeItsTime",
                                           f"{self.broker.label} delivered {d.position} to {self.client.name} "
                                           f"({self.client.sub_type}) {at - now} ms before its delivery time")
        seeks = self.world.checks.seeks(self.client.sub)  # the stream it is sent in (a seek starts the next)
        self.conn.to_client(self.client.on_deliveries, self.conn, list(deliveries), seeks)

    def active_changed(self, active: bool) -> None:
        self.conn.to_client(self.client.on_active, active)

    def drop(self, error: TopicError) -> None:
        self.conn.break_(f"dropped: {error.status.name}")

    # requests
    def flow(self, permits: int) -> None:
        if self.sub is not None:
            self.sub.flow(self.consumer, permits)

    def ack(self, ids: list[tuple[Position, int, int]], cumulative: bool) -> None:
        if self.sub is None:
            return
        try:
            self.sub.ack(self.consumer, ids, cumulative)
        except TopicError as e:  # a consumer acks only what it was delivered, as its subscription type allows
            kind = "cumulative ack" if cumulative else "ack"
            self.world.checks.fail("AcksOfDeliveriesAccepted", f"{self.broker.label} refused {self.client.name}'s "
                                                               f"{kind} of {ids}: {e}")

    def redeliver(self, positions: list[Position]) -> None:
        if self.sub is not None:
            self.sub.redeliver(self.consumer, positions)

    async def seek(self, pos: Position) -> None:
        if self.sub is None:
            return
        checks = self.world.checks
        checks.seek_started(self.client.sub, pos)
        try:  # the broker may apply the seek any time until it answers (or dies: cancelled with its tasks)
            await self.sub.seek(pos)
        except TopicError as e:  # it may have been applied all the same: checked as if it was
            self.world.trace.add(f"{self.broker.label}: seek of {self.client.sub} to {pos}: {e.status.name}")
        finally:
            checks.seek_ended(self.client.sub)
        self.world.trace.add(f"{self.broker.label}: {self.client.sub} seeked to {pos}")

    def close(self) -> None:
        if self.sub is not None:
            self.sub.remove_consumer(self.consumer)


class _ReaderSide(_ConsumerSide):
    """The broker side of a reader's connection: a non-durable subscription from the reader's start (the earliest
    message, then after the last message it read), gone with the connection."""

    async def open(self, ready: Callable, refused: Callable) -> None:
        start = self.client.last_read
        try:
            topic = await self.broker.topics.acquire(TOPIC)
            sub, consumer = await topic.create_reader("", self.client.name, self, message_id=start,
                                                      initial_position="earliest", inclusive=False)
        except TopicError as e:
            self.conn.to_client(refused, e)
            self.conn.break_(f"reader refused: {e.status.name}")
            return
        self.topic, self.sub, self.consumer = topic, sub, consumer
        if not self.conn.open:
            self.close()
            return
        self.conn.to_client(ready)

    def close(self) -> None:
        if self.sub is not None:
            asyncio.get_running_loop().create_task(self.topic.remove_consumer(self.sub, self.consumer))


# -- clients -------------------------------------------------------------------------------------------------------
class _Client:
    def __init__(self, world: "TopicWorld", name: str) -> None:
        self.world, self.name = world, name
        self.conn: _Conn | None = None
        self.broken = asyncio.Event()
        self.stopped = False
        self.connects = 0
        self.task: asyncio.Task | None = None
        self.side = None        # the broker side of the open connection
        self.ready_args: tuple = ()  # what the open answered (a producer: its last_sequence_id)

    async def _connect(self, make_side) -> _Conn | None:
        """Lookup on a live broker, then open on the owner; the open connection or None (try again later)."""
        w = self.world
        entry = w.any_live_broker()
        if entry is None:
            return None
        await w.clock.sleep_ms(w.link_delay())
        if not entry.alive:
            return None
        task = entry.spawn(entry.topics.lookup(TOPIC))
        done, _ = await asyncio.wait({task}, timeout=RPC_TIMEOUT_MS / 1000.0)
        if not done or task.cancelled() or task.exception() is not None:
            if done and not task.cancelled():
                w.trace.add(f"{self.name}: lookup on {entry.label}: {task.exception()}")
            else:
                task.add_done_callback(_quiet)
            return None
        owner_id, _, _ = task.result()
        await w.clock.sleep_ms(w.link_delay())
        owner = w.brokers.get(owner_id)
        if owner is None or not owner.alive:
            return None
        conn = _Conn(w, owner, self.name)
        answer = asyncio.get_running_loop().create_future()
        self.broken = asyncio.Event()
        broken = self.broken

        def on_break(why: str) -> None:
            broken.set()
            if not answer.done():
                answer.set_result(None)
        conn.on_client_break = on_break
        side = make_side(owner, conn)
        conn.to_broker(lambda: owner.spawn(side.open(lambda *a: answer.done() or answer.set_result(("ready", a)),
                                                     lambda e: answer.done() or answer.set_result(("refused", e)))))
        try:
            got = await asyncio.wait_for(answer, RPC_TIMEOUT_MS / 1000.0)
        except TimeoutError:
            got = None
        if got is None or got[0] != "ready" or not conn.open:
            if got is not None and got[0] == "refused":
                w.trace.add(f"{self.name}: {owner.label} refused: {got[1]}")
            conn.break_("open failed")
            return None
        self.connects += 1
        w.stats["connects"] += 1
        w.trace.add(f"{self.name}: connected to {owner.label}")
        self.conn = conn
        self.side = side
        self.ready_args = got[1]
        return conn

    async def backoff(self) -> None:
        await self.world.clock.sleep_ms(self.world.workload.uniform(*BACKOFF_MS))


@dataclass(slots=True)
class _Send:
    index: int
    seq: int
    messages: list[Message]
    first_pushed_ms: float = -1.0


class _Producer(_Client):
    def __init__(self, world: "TopicWorld", name: str) -> None:
        super().__init__(world, name)
        self.sends: list[_Send] = []
        self.receipted: set[int] = set()
        self.pushed_on: dict[int, _Conn] = {}
        self._next_seq = 0
        self.restart_pending = False
        self.changed = asyncio.Event()
        self.quota = world.plan.sends_per_producer  # Sends to make in all

    def restart(self, why: str) -> None:
        """The producer process restarts: it forgets its receipts; with dedup on it resumes from the broker's
        last_sequence_id (every Send above it is sent again, as an application resuming from its source does;
        everything at or below it counts as persisted)."""
        self.world.trace.add(f"{self.name}: restarts ({why})")
        self.world.stats["producer_restarts"] += 1
        self.restart_pending = True
        if self.conn is not None:
            self.conn.break_("producer restarts")
        if self.task is None or self.task.done():
            self.task = self.world._spawn(self.world._client_tasks, self.run(), self.name)

    def finished(self) -> bool:
        return not self.restart_pending and len(self.sends) == self.quota and len(self.receipted) == len(self.sends)

    def _make_send(self) -> _Send:
        r, plan = self.world.workload, self.world.plan
        n = r.randint(1, plan.batch_max)
        key = f"k{r.randrange(plan.keys)}"
        deliver_at = 0
        if plan.delayed_probability and self.world.delays.random() < plan.delayed_probability:
            n = 1  # a delayed message is sent alone
            deliver_at = self.world.clock.wall_ms() + round(self.world.delays.uniform(-50.0, plan.delay_ms_max))
            self.world.stats["delayed_sends"] += 1
        msgs = []
        for _ in range(n):
            seq = self._next_seq
            self._next_seq += 1
            msgs.append(Message(f"{self.name}:{seq}".encode(), key, {}, 0, seq, deliver_at))
        send = _Send(len(self.sends), msgs[-1].sequence_id, msgs)
        self.sends.append(send)
        self.world.checks.send_made((self.name, send.seq), tuple((self.name, m.sequence_id) for m in msgs),
                                    self.world.now())
        return send

    def _push(self, conn: _Conn, side: _ProducerSide, send: _Send) -> None:
        self.pushed_on[send.index] = conn
        send.first_pushed_ms = self.world.now()
        conn.to_broker(side.send, send.index, send.messages, self._on_receipt)

    def _on_receipt(self, index: int, pos: Position | None) -> None:
        send = self.sends[index]
        conn = self.pushed_on[index]
        broker = conn.broker.label
        if pos is not None:  # Sends on one connection are written in order: their positions increase
            if conn.last_position is not None and pos <= conn.last_position:
                self.world.checks.fail("PositionsTotallyOrdered", f"{self.name} got receipt #{index} at {pos} from "
                                                                  f"{broker} after one at {conn.last_position}")
            conn.last_position = pos
        self.world.trace.add(f"{self.name}: receipt #{index} seq {send.seq} at {pos if pos else 'duplicate'} "
                             f"from {broker}")
        if index not in self.receipted:
            self.receipted.add(index)
        self.changed.set()
        self.world.checks.receipt((self.name, send.seq), pos, broker)

    async def run(self) -> None:
        w, plan = self.world, self.world.plan
        while not self.finished() and not self.stopped:
            conn = await self._connect(lambda broker, conn: _ProducerSide(w, broker, conn, self.name))
            if conn is None:
                await self.backoff()
                continue
            side = self.side
            if self.restart_pending and plan.dedup:
                self.restart_pending = False
                last = self.ready_args[0]
                w.trace.add(f"{self.name}: resumes after last_sequence_id {last}")
                for send in self.sends:
                    if send.seq <= last:
                        if send.index not in self.receipted:
                            self.receipted.add(send.index)
                            w.checks.receipt((self.name, send.seq), None, f"{conn.broker.label} (last_sequence_id)")
                    else:
                        self.receipted.discard(send.index)
            self.restart_pending = False
            for send in self.sends:  # every Send without a receipt again, in order, same sequence ids
                if send.index not in self.receipted:
                    self._push(conn, side, send)
            while conn.open and not self.finished() and not self.stopped:
                waiting = [s for s in self.sends if s.index not in self.receipted]
                if waiting and w.now() - min(s.first_pushed_ms for s in waiting) > SEND_TIMEOUT_MS:
                    conn.break_("send timeout")
                    break
                if len(self.sends) < self.quota and len(waiting) < plan.producer_window:
                    self._push(conn, side, self._make_send())
                    if w.workload.random() >= plan.burst_probability:
                        await w.clock.sleep_ms(w.workload.uniform(1.0, plan.send_gap_ms_max))
                    continue
                # nothing to send now: wait for a receipt or the connection's end (or the oldest Send's timeout)
                self.changed.clear()
                oldest = min((s.first_pushed_ms for s in waiting), default=w.now())
                await _wait_any((self.changed, self.broken), max(1.0, oldest + SEND_TIMEOUT_MS - w.now() + 1.0))
            if conn.open:
                conn.break_("producer done")
            else:
                await self.backoff()


class _Consumer(_Client):
    def __init__(self, world: "TopicWorld", sub: str, sub_type: str, index: int) -> None:
        super().__init__(world, f"{sub}-c{index}")
        self.sub, self.sub_type, self.priority = sub, sub_type, 0
        self.inbox: collections.deque = collections.deque()
        self.arrived = asyncio.Event()
        self.seek_request: Position | None = None
        self.ranges: list[tuple[int, int]] | None = None  # a sticky Key_Shared consumer's key slots
        split = world.plan.key_shared_sticky
        if sub_type == "Key_Shared" and split:
            self.ranges = [(0, split - 1)] if index == 1 else [(split, HASH_RANGE_SIZE - 1)]

    def on_active(self, active: bool) -> None:
        self.world.trace.add(f"{self.name}: {'active' if active else 'inactive'}")

    def on_deliveries(self, conn: _Conn, deliveries: list[Delivery], seeks: int = 0) -> None:
        w = self.world
        for d in deliveries:
            try:
                header, messages = decode_entry(d.entry)
            except FormatError as e:
                w.checks.fail("EntriesDecode", f"{self.name} got {d.position}: {e}")
                return
            keyed = [((header.producer_name, m.sequence_id), m.key) for m in messages]
            if self.ranges is not None:
                slot = slot_of(murmur3_32(header.sticky_key or ""))
                if not any(a <= slot <= b for a, b in self.ranges):
                    w.checks.fail("StickyRangesHonoured", f"{self.name} (key slots {self.ranges}) got {d.position} "
                                                          f"of key {header.sticky_key!r} in slot {slot}")
            w.checks.delivered(self.sub, self.name, d.position, keyed, d.redelivery_count,
                               delayed=header.deliver_at_ms > 0, seeks=seeks, at_ms=w.now())
            self.inbox.append((conn, d, len(messages)))
        self.arrived.set()

    def _act(self, conn: _Conn, d: Delivery, count: int) -> None:
        w, r = self.world, self.world.workload
        side = self.side
        pos = d.position
        if not w.draining and r.random() < w.plan.nack_probability:
            conn.to_broker(side.redeliver, [pos])
            return
        if count > 1 and r.random() < 0.4:  # batch-index acks, one index per request, in a random order
            indexes = [i for i in range(count) if i not in d.acked_batch_indexes]
            r.shuffle(indexes)
            for i in indexes:
                conn.to_broker(side.ack, [(pos, i, count)], False)
            return
        cumulative = self.sub_type in ("Exclusive", "Failover") and r.random() < 0.3
        conn.to_broker(side.ack, [(pos, -1, 0)], cumulative)

    def _side(self, broker: _Broker, conn: _Conn) -> _ConsumerSide:
        return _ConsumerSide(self.world, broker, conn, self)

    def _take(self, conn: _Conn, item: tuple) -> int:
        """Process one delivery of the inbox if it came on `conn`; the permits it frees."""
        got_conn, d, count = item
        if got_conn is not conn:
            return 0
        self._act(conn, d, count)
        return count

    async def run(self) -> None:
        w = self.world
        while not self.stopped:
            conn = await self._connect(self._side)
            if conn is None:
                await self.backoff()
                continue
            side = self.side
            conn.to_broker(side.flow, w.plan.permits)
            self.inbox.clear()
            while conn.open and not self.stopped:
                if self.seek_request is not None:
                    target, self.seek_request = self.seek_request, None
                    conn.to_broker(lambda: conn.broker.spawn(side.seek(target)))
                granted = 0
                while self.inbox:
                    granted += self._take(conn, self.inbox.popleft())
                if granted:
                    conn.to_broker(side.flow, granted)
                    await w.clock.sleep_ms(w.workload.uniform(0.0, w.plan.consumer_hold_ms_max))  # processing time
                    continue
                self.arrived.clear()
                await _wait_any((self.arrived, self.broken), None)
            if conn.open:
                conn.break_("consumer stops")
            else:
                await self.backoff()


class _Reader(_Consumer):
    """A reader (as bksim.client.Reader): from the earliest message; after a reconnect from the last message it
    read (exclusive), so it reads every message once, in order, skipping only what retention trimmed."""

    def __init__(self, world: "TopicWorld") -> None:
        super().__init__(world, "reader", "Exclusive", 0)
        self.name = "reader"
        self.last_read: MessageId | None = None

    def on_deliveries(self, conn: _Conn, deliveries: list[Delivery], seeks: int = 0) -> None:
        self.inbox.extend((conn, d) for d in deliveries)
        self.arrived.set()

    def _side(self, broker: _Broker, conn: _Conn) -> _ReaderSide:
        return _ReaderSide(self.world, broker, conn, self)

    def _take(self, conn: _Conn, item: tuple) -> int:
        """What the application gets of one delivery (if it came on `conn`); the permits it frees."""
        got_conn, d = item
        if got_conn is not conn:
            return 0
        try:
            header, messages = decode_entry(d.entry)
        except FormatError as e:
            self.world.checks.fail("EntriesDecode", f"reader got {d.position}: {e}")
            return 1
        indexes = [i for i in range(len(messages)) if i not in d.acked_batch_indexes]
        read = [(i, (header.producer_name, messages[i].sequence_id)) for i in indexes]
        self.world.checks.reader_read(d.position, read)
        if indexes:
            last = indexes[-1] if header.is_batch else -1
            self.last_read = MessageId(d.position.ledger, d.position.entry, -1, last)
        return len(messages)


# -- the world -----------------------------------------------------------------------------------------------------
class TopicWorld:
    def __init__(self, plan: TopicPlan) -> None:
        self.plan = plan
        seed = plan.seed
        self.workload = rng_for(seed, "topic-workload")
        self.faults = rng_for(seed, "topic-faults")
        self.delays = rng_for(seed, "topic-delayed")
        self._links = rng_for(seed, "topic-links")
        self.network = SimNetwork(rng_for(seed, "topic-net"), LinkFaults(delay_ms=plan.net_delay_ms,
                                                                              jitter_ms=plan.net_jitter_ms),
                                  log=self._log)
        disk = DiskFaults(latency_ms_min=0.0, latency_ms_max=plan.disk_latency_ms_max)
        specs = [BookieSpec(bookie_name(i), plan.bookie_config(), disk, KvFaults(unsynced_keep_probability=0.5))
                 for i in range(1, plan.bookies + 1)]
        self.cluster = SimCluster(specs, network=self.network, rng=lambda part: rng_for(seed, f"topic-{part}"),
                                  log=self._log, session_timeout_ms=plan.session_timeout_ms, reregister_ms=10.0)
        self.clock = self.cluster.clock
        self.trace = Trace(self.clock.monotonic_ms)
        self.topic_name = TopicName.parse(TOPIC)
        self.checks = TopicChecks(self.topic_name.managed_ledger_path, SUBSCRIPTIONS, plan.dedup, self.trace.add,
                                  lambda v: self._violated.set(), expiry_ms=plan.expiry_ms())
        self.checks.on_trim = self._trimmed
        self.topic_config = plan.topic_config()
        self.broker_config = BrokerConfig(bookie_timeout_ms=int(plan.bookie_timeout_ms),
                                          speculative_read_ms=max(1, int(plan.bookie_timeout_ms // 3)),
                                          add_requests_per_bookie_max=plan.add_requests_per_bookie_max)
        self.brokers: dict[str, _Broker] = {}
        self._incarnations: dict[str, int] = {}
        self.producers: list[_Producer] = []
        self.consumers: list[_Consumer] = []
        self.reader: _Reader | None = None
        self._client_tasks: set[asyncio.Task] = set()
        self._fault_tasks: set[asyncio.Task] = set()
        self._timers: list[asyncio.TimerHandle] = []
        self._violated = asyncio.Event()
        self.link_loss = 0.0
        self.link_jitter_ms = 0.0
        self.draining = False
        self.liveness = False
        self.violation: InvariantViolation | None = None
        self.error = ""
        self.stats: dict[str, int | float] = {k: 0 for k in (
            "broker_crashes", "session_expiries", "zk_losses", "bookie_crashes", "clean_restarts", "seeks",
            "connects", "faults_fired", "faults_skipped", "producer_restarts", "delayed_sends",
            "delayed_deliveries")}

    # -- basics -------------------------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.monotonic_ms()

    def _log(self, line: str) -> None:
        self.trace.add(line)

    def link_delay(self) -> float:
        return self.plan.link_delay_ms + self._links.uniform(0.0, self.plan.link_delay_ms + self.link_jitter_ms)

    def link_lost(self) -> bool:
        return self.link_loss > 0 and self._links.random() < self.link_loss

    def fail(self, v: InvariantViolation) -> None:
        if self.violation is None:
            self.violation = v
        self._violated.set()

    def _check(self) -> None:
        if self.violation is None and self.checks.violation is not None:
            self.violation = self.checks.violation
        if self.violation is not None:
            raise self.violation
        for bookie in self.cluster.bookies.values():
            if bookie.handler_errors:
                raise InvariantViolation("EngineNeverRaises", bookie.handler_errors[0])
            if bookie.storage_failures:
                raise InvariantViolation("StorageFailsOnlyUnderFaults", bookie.storage_failures[0])

    def _spawn(self, owner: set, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._guarded(coro), name=name)
        owner.add(task)
        task.add_done_callback(owner.discard)
        task.add_done_callback(lambda t: coro.close())  # a task cancelled before it started never ran `coro`
        return task

    async def _guarded(self, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except InvariantViolation as v:
            self.fail(v)
        except Exception as e:
            self.error = self.error or traceback.format_exc()
            self.fail(InvariantViolation("NothingRaises", f"{type(e).__name__}: {e}"))

    def any_live_broker(self) -> _Broker | None:
        live = [b for _, b in sorted(self.brokers.items()) if b.alive]
        return self.workload.choice(live) if live else None

    def owner(self) -> tuple[_Broker, object] | None:
        """(broker, topic) of the live broker serving the topic now, if one does."""
        for _, b in sorted(self.brokers.items()):
            if b.alive:
                topic = b.topics.topics.get(str(self.topic_name))
                if topic is not None and topic.fenced is None:
                    return b, topic
        return None

    # -- brokers ------------------------------------------------------------------------------------------------
    def _broker_log(self, label: str, line: str) -> None:
        self.trace.add(f"{label}: {line}")
        if INTERNAL_ERROR in line:
            self.fail(InvariantViolation("BrokerNeverRaises", f"{label}: {line}"))

    def _start_broker(self, name: str) -> _Broker:
        n = self._incarnations[name] = self._incarnations.get(name, 0) + 1
        broker = _Broker(name, n)
        label = broker.label
        broker.session = self.cluster.store.session(label)
        broker.store = TopicCheckedStore(broker.session, self.checks, label, rng_for(self.plan.seed, f"zk-{label}"))
        self.network.set_up(name, True)
        broker.transport = SimBookieTransport(self.network, name, self.cluster.bookies, self.plan.bookie_timeout_ms)
        log = lambda line: self._broker_log(label, line)  # noqa: E731
        broker.ledgers = LedgerService(store=broker.store, transport=broker.transport,
                                       rng=rng_for(self.plan.seed, f"topic-{label}"), clock=self.clock,
                                       config=self.broker_config, log=log)
        store, ledgers, clock, config = broker.store, broker.ledgers, self.clock, self.topic_config

        async def open_cursor(ml, topic_name, subscription, initial_position, on_fenced):  # as broker_cmd does
            return await ManagedCursor.open(layout=ml, path=topic_name.cursor_path(subscription), name=subscription,
                                            store=store, ledgers=ledgers, clock=clock, config=config,
                                            initial_position=initial_position, log=log, on_fenced=on_fenced)
        broker.topics = TopicService(store=store, ledgers=ledgers, clock=clock, broker_id=name,
                                     address=f"{name}:6650", open_cursor_factory=open_cursor, config=config,
                                     broker_config=self.broker_config, log=log, instance=label)
        self.brokers[name] = broker
        broker.run(broker.topics.start)
        broker.spawn(self._register(broker))
        self._log(f"start {label}")
        return broker

    async def _register(self, broker: _Broker) -> None:
        data = json.dumps({"host": broker.name, "port": 6650}).encode()
        while broker.alive:
            try:
                await broker.store.create(f"{BROKERS_AVAILABLE}/{broker.name}", data, ephemeral=True,
                                          make_parents=True)
                return
            except NodeExistsError:
                pass  # the previous incarnation's node, until its session expires
            except MetadataError as e:
                self.trace.add(f"{broker.label}: registration: {e}")
            await self.clock.sleep_ms(REGISTER_RETRY_MS)

    async def _stop_broker(self, broker: _Broker, why: str, *, clean: bool = False) -> None:
        """The process ends: a clean stop closes the topic service first (final cursor state, ledgers closed,
        ownership released); a crash does not. Every task of the process is cancelled, every connection to it
        breaks, its session expires `session_timeout_ms` later (at once after a clean stop)."""
        if not broker.alive:
            return
        self._log(f"{'STOP' if clean else 'CRASH'} {broker.label} ({why})")
        if clean:
            owned = broker.topics.topics.get(str(self.topic_name))
            await broker.spawn(broker.topics.close())
            if owned is not None:
                unclean = []
                for name, sub in sorted(owned.subscriptions.items()):
                    if not sub.durable:
                        continue  # a reader's: gone with the close
                    acked = {p for p in self.checks.subs[name].positions if sub.cursor.is_acked(p)}
                    # only a cursor whose close persisted its whole state binds the next owner (a close may fail:
                    # a metadata or ledger error, the session lost meanwhile, an earlier step of the topic's close)
                    self.checks.clean_close(name, acked, persisted=sub.cursor.closed_cleanly)
                    if not sub.cursor.closed_cleanly:
                        unclean.append(name)
                self._log(f"{broker.label}: closed the topic "
                          f"{'cleanly' if not unclean else 'but not cleanly: cursors ' + ', '.join(unclean)}")
        broker.alive = False
        for _ in range(5):
            tasks = sorted(broker.tasks, key=lambda t: t.sim_seq)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.network.set_up(broker.name, False)
        await broker.ledgers.close(close_ledgers=False)
        await broker.transport.close()
        for conn in list(broker.conns):
            conn.break_(f"{broker.label} stopped")
        session, store = broker.session, self.cluster.store

        def expire() -> None:
            if store.is_alive(session):
                store.expire(session)
                self._log(f"metadata: session {session.name} expired (process gone)")
        if clean:
            expire()
        else:
            asyncio.get_running_loop().call_later(self.plan.session_timeout_ms / 1000.0, expire)

    # -- the run ------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        plan = self.plan
        self.trace.note(f"bksim sim --world topics: {plan.bookies} bookies, {plan.brokers} brokers (TopicService), "
                        f"topic {TOPIC}, subscriptions {SUBSCRIPTIONS}")
        for line in plan.describe():
            self.trace.note(line)
        await self.cluster.start_all()
        for i in range(1, plan.brokers + 1):
            self._start_broker(broker_name(i))
        await self._setup()
        for name, sub_type in SUBSCRIPTIONS.items():
            for i in range(CONSUMERS_OF[sub_type]):
                self.consumers.append(_Consumer(self, name, sub_type, i + 1))
        for i in range(plan.producers):
            self.producers.append(_Producer(self, f"p{i + 1}"))
        clients = self.consumers + self.producers
        if plan.reader:
            self.reader = _Reader(self)
            self.checks.reader = True
            clients.append(self.reader)
        for client in clients:
            client.task = self._spawn(self._client_tasks, client.run(), client.name)
        loop = asyncio.get_running_loop()
        for event in plan.events:
            self._timers.append(loop.call_at(event.at_ms / 1000.0 + self._t0 / 1000.0, self._fire, event))
        prober = self._spawn(self._fault_tasks, self._probe(), "probe")
        try:
            try:
                await asyncio.wait_for(self._violated.wait(), plan.run_ms / 1000.0)
            except TimeoutError:
                pass
            self._check()
            await self._liveness_phase()
            self._check()
        finally:
            prober.cancel()
            for client in self.consumers + self.producers + ([self.reader] if self.reader else []):
                client.stopped = True
            for task in sorted(self._client_tasks, key=lambda t: t.sim_seq):
                task.cancel()
        self.trace.add("PASS")

    async def _setup(self) -> None:
        """Tenant, namespace (dedup, TTL and backlog quota per the plan, retention 0: ledgers are trimmed once
        consumed), the topic, and its four durable subscriptions at "earliest" (before the first Send)."""
        first = self.brokers[broker_name(1)]
        topics = first.topics

        class _Nobody:
            def deliver(self, deliveries) -> None: ...
            def active_changed(self, active) -> None: ...
            def drop(self, error) -> None: ...

        async def setup() -> None:
            await topics.create_tenant("sim")
            await topics.create_namespace("sim/ns", Policies(retention_ms=0, ttl_ms=self.plan.ttl_ms,
                                                             dedup=self.plan.dedup))
            if self.plan.age_eviction_ms:
                await topics.set_backlog_quota("sim/ns", bq.BacklogQuota(bq.MESSAGE_AGE, self.plan.age_eviction_ms,
                                                                         bq.CONSUMER_BACKLOG_EVICTION))
            if self.plan.producer_quota_bytes:
                await topics.set_backlog_quota("sim/ns", bq.BacklogQuota(
                    bq.DESTINATION_STORAGE, self.plan.producer_quota_bytes, self.plan.producer_quota_policy))
            await topics.create_topic(TOPIC, 0)
            topic = await topics.acquire(TOPIC)
            for name, sub_type in SUBSCRIPTIONS.items():
                sub, consumer = await topic.subscribe(name, sub_type, "earliest", "setup", 0, _Nobody())
                sub.remove_consumer(consumer)
        await first.spawn(setup())
        self._t0 = self.now()
        self._log("setup done: topic created and served by broker-1, subscriptions created")

    async def _probe(self) -> None:
        """Every PROBE_MS: each live broker's managed ledger keeps its invariants; at most one broker with a live
        session serves the topic (a broker whose session expired may not know yet: it is fenced by the ledger);
        and no subscription's persisted mark-delete, on the broker that wrote the managed-ledger list last (the
        owner: a takeover is a CAS of that list), went below what was durable before."""
        while True:
            await self.clock.sleep_ms(PROBE_MS)
            serving = []
            for _, b in sorted(self.brokers.items()):
                if not b.alive:
                    continue
                topic = b.topics.topics.get(str(self.topic_name))
                if topic is None:
                    continue
                try:
                    topic.ml.check_invariants()
                except InvariantError as e:
                    self.fail(InvariantViolation(e.invariant, f"{b.label}: {e}"))
                if topic.fenced is None and topic.ml.state not in FINAL_STATES \
                        and self.cluster.store.is_alive(b.session):
                    serving.append(b.label)
                if b.label == self.checks.ml_writer and topic.fenced is None:
                    for name, sub in sorted(topic.subscriptions.items()):
                        self.checks.persisted_mark_delete(name, sub.cursor.persisted_mark_delete, b.label)
                        self.checks.mark_delete_seen(name, sub.cursor.mark_delete, self.now())
            if len(serving) > 1:
                self.checks.fail("OneOwnerAtATime", f"brokers {serving} (each with a live session) serve {TOPIC}")

    def _trimmed(self, label: str, trimmed: list[tuple[int, int]]) -> None:
        """`label` wrote a managed-ledger list without the ledgers `trimmed` ((id, entries), each holding entries):
        every cursor of its topic (the dedup cursor too) must have persisted a mark-delete at or past their last
        entry, or a crash would bring that cursor back into a deleted ledger."""
        broker = next((b for b in self.brokers.values() if b.label == label and b.alive), None)
        topic = broker.topics.topics.get(str(self.topic_name)) if broker is not None else None
        if topic is None:
            return
        for name, cursor in sorted(topic.stats_internal()["cursors"].items()):
            if cursor.get("durable") is False:
                continue  # a reader holds nothing back (retention ignores it)
            persisted = Position.parse(cursor["persistentMarkDeletePosition"])
            for lid, entries in trimmed:
                if Position(lid, entries - 1) > persisted:
                    self.checks.fail("TrimBelowPersistedMarkDelete",
                                     f"{label} trimmed ledger {lid} ({entries} entries) while cursor {name} had "
                                     f"persisted mark-delete {persisted} (in memory {cursor['markDeletePosition']})")
                    return

    # -- faults -------------------------------------------------------------------------------------------------
    def _later(self, ms: float, callback, *args) -> None:
        self._timers.append(asyncio.get_running_loop().call_later(ms / 1000.0, callback, *args))

    def _fire(self, event: TopicFault) -> None:
        if not self.liveness:
            self._spawn(self._fault_tasks, self._apply(event), f"fault {event.kind}")

    def _skip(self, why: str) -> None:
        self.stats["faults_skipped"] += 1
        self._log(f"  skipped: {why}")

    async def _apply(self, event: TopicFault) -> None:
        kind = event.kind
        self.stats["faults_fired"] += 1
        self._log(f"FAULT {event.describe()}")
        if kind == "crash_broker":
            broker = self.brokers[event.node]
            if not broker.alive:
                return self._skip("already down")
            self.stats["broker_crashes"] += 1
            await self._stop_broker(broker, "crash")
            self._later(event.duration_ms, self._restart_broker, event.node)
        elif kind == "clean_restart":
            found = self.owner()
            if found is None or not self.cluster.store.is_alive(found[0].session) or found[0].store.connection_lost:
                return self._skip("no owner with a working session")
            self.stats["clean_restarts"] += 1
            await self._stop_broker(found[0], "clean restart", clean=True)
            self._later(event.duration_ms, self._restart_broker, found[0].name)
        elif kind == "expire_broker_session":
            broker = self.brokers[event.node]
            if not broker.alive or not self.cluster.store.is_alive(broker.session):
                return self._skip("broker down")
            self.stats["session_expiries"] += 1
            self.cluster.store.expire(broker.session)
            self._log(f"metadata: SESSION EXPIRED {broker.session.name}; {broker.label} keeps running")
            self._later(event.duration_ms, self._renew_session, broker)
        elif kind == "zk_connection_loss":
            broker = self.brokers[event.node]
            if not broker.alive or broker.store.connection_lost:
                return self._skip("broker down or already disconnected")
            self.stats["zk_losses"] += 1
            broker.store.connection_lost = True
            self._later(event.duration_ms, self._reconnect_zk, broker)
        elif kind == "crash_bookie":
            bookie = self.cluster.bookies[event.node]
            if not bookie.alive:
                return self._skip("already down")
            self.stats["bookie_crashes"] += 1
            bookie.crash(self.faults)
            self._later(event.duration_ms, self._restart_bookie, event.node)
        elif kind == "lossy_network":
            self.network.set_default(loss=event.amount, jitter_ms=event.amount * 200)
            self.link_loss, self.link_jitter_ms = event.amount, event.amount * 200
            self._later(event.duration_ms, self._heal_network)
        elif kind == "break_connection":
            clients = self.consumers + self.producers + ([self.reader] if self.reader else [])
            open_ = [c for c in clients if c.conn is not None and c.conn.open]
            if not open_:
                return self._skip("no open connection")
            self.faults.choice(open_).conn.break_("fault")
        elif kind == "restart_producer":
            self.faults.choice(self.producers).restart("fault")
        elif kind == "seek":
            choices = [c for c in self.consumers if c.conn is not None and c.conn.open
                       and self.checks.subs[c.sub].positions]
            if not choices:
                return self._skip("no connected consumer with deliveries")
            consumer = self.faults.choice(choices)
            target = self.faults.choice(sorted(self.checks.subs[consumer.sub].positions))
            self.stats["seeks"] += 1
            self._log(f"  {consumer.name} seeks {consumer.sub} to {target}")
            consumer.seek_request = target
            consumer.arrived.set()
        else:
            raise AssertionError(kind)

    def _heal_network(self) -> None:
        self.network.set_default(loss=0.0, jitter_ms=self.plan.net_jitter_ms)
        self.link_loss, self.link_jitter_ms = 0.0, 0.0

    def _reconnect_zk(self, broker: _Broker) -> None:
        broker.store.connection_lost = False
        self._log(f"{broker.label}: ZooKeeper connection back")

    def _restart_bookie(self, name: str) -> None:
        bookie = self.cluster.bookies[name]
        if not bookie.alive and not self.liveness:
            self._spawn(self._fault_tasks, bookie.start(self.faults, 0.0), f"restart {name}")

    def _restart_broker(self, name: str) -> None:
        if self.liveness or self.brokers[name].alive:
            return
        self._start_broker(name)

    def _renew_session(self, broker: _Broker) -> None:
        """The broker notices its session expired (as RenewingZkMetadataStore does): a new session, every topic
        fenced here (TopicService.session_lost), registered again. The new session is bound in the same step as
        session_lost stops every topic, as the product's on_new_session runs before the renewed store serves
        anything: no one (the probe included) sees the broker with a live session and a topic its expired session
        owned still served."""
        if not broker.alive or self.cluster.store.is_alive(broker.session):
            return

        async def renew() -> None:
            if self.cluster.store.is_alive(broker.session):
                return  # renewed meanwhile
            broker.session = self.cluster.store.session(f"{broker.label}/s{self.stats['session_expiries']}")
            broker.store.session = broker.session
            self._log(f"{broker.label}: noticed the session expiry: new session {broker.session.name}")
            await broker.topics.session_lost()
            await self._register(broker)
        broker.spawn(renew())

    # -- liveness and the end -----------------------------------------------------------------------------------
    async def _liveness_phase(self) -> None:
        self.liveness = True
        self.trace.add("liveness phase: faults healed; producers finish; subscriptions drain")
        for timer in self._timers:
            timer.cancel()
        self.network.heal()
        self._heal_network()
        deadline = self.now() + LIVENESS_MS
        if self._fault_tasks - {t for t in self._fault_tasks if t.get_name() == "probe"}:
            await asyncio.wait([t for t in self._fault_tasks if t.get_name() != "probe"], timeout=5.0)
        for name, bookie in self.cluster.bookies.items():
            if not bookie.alive:
                await bookie.start()
        for name in sorted(self.brokers):
            broker = self.brokers[name]
            broker.store.connection_lost = False
            if not broker.alive:
                self._start_broker(name)
            elif not self.cluster.store.is_alive(broker.session):
                self._renew_session(broker)
        await self._producers_finish(deadline)
        for round_ in range(IDLE_CRASHES):
            # the topic is idle and every cursor has persisted: the owner crashes; what the next owner loads is
            # exactly what was made durable, and every producer restarts and resumes from its last_sequence_id
            # there (then, but for the last round, sends a few more)
            await self.clock.sleep_ms(2.0 * self.plan.cursor_persist_interval_ms + PROBE_MS)
            found = self.owner()
            if found is not None:
                self.trace.add(f"idle: {found[0].label} crashes; producers restart")
                self.stats["broker_crashes"] += 1
                await self._stop_broker(found[0], "crash of the idle owner")
                self._start_broker(found[0].name)
            for producer in self.producers:
                if round_ < IDLE_CRASHES - 1:
                    producer.quota += EXTRA_SENDS
                producer.restart("liveness phase")
            await self._producers_finish(deadline)
        self.draining = True
        while not self._drained():
            self._check()
            if self.now() > deadline:
                missing = {s: len(self.checks.missing(s)) for s in sorted(SUBSCRIPTIONS)}
                found = self.owner()
                backlog = {n: s.cursor.backlog() for n, s in sorted(found[1].subscriptions.items())} if found else None
                behind = len(self.checks.reader_behind())
                raise InvariantViolation("SubscriptionsDrain", f"{LIVENESS_MS:g} virtual ms into the liveness phase: "
                                         f"messages with a receipt not delivered {missing}, backlog on the owner "
                                         f"{backlog}" + (f", messages the reader has not read {behind}"
                                                         if self.reader else ""))
            await self.clock.sleep_ms(20.0)
        self._check()
        found = self.owner()
        self.trace.add(f"drained; {found[0].label} closes the topic cleanly; consumers come back")
        await self._stop_broker(found[0], "final clean close", clean=True)
        self._start_broker(found[0].name)
        await self.clock.sleep_ms(QUIET_MS)
        self._check()
        self.checks.final()
        self._check()

    async def _producers_finish(self, deadline: float) -> None:
        while not all(p.finished() for p in self.producers):
            self._check()
            if self.now() > deadline:
                raise InvariantViolation("ProducersFinish", f"Sends without a receipt {LIVENESS_MS:g} virtual ms into "
                                         f"the liveness phase: " + ", ".join(
                                             f"{p.name} {len(p.sends) - len(p.receipted)}" for p in self.producers))
            await self.clock.sleep_ms(20.0)

    def _drained(self) -> bool:
        if any(self.checks.missing(s) for s in SUBSCRIPTIONS) or self.checks.reader_behind():
            return False
        found = self.owner()
        if found is None:
            return False
        subs = found[1].subscriptions
        return all(n in subs and subs[n].cursor.backlog() == 0 for n in SUBSCRIPTIONS)
