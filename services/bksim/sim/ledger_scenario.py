"""The ledger simulation: brokers (the real broker layer, broker/ledgers.py) write, read and recover ledgers on
bookies (the real BookieEngine on simulated disks) over the simulated network and metadata store, driven by
one seed, with the faults of its plan; the invariants of PROTOCOL.md §7 are checked as it runs and at the end.

Owns the world of one run: a SimCluster (bookies, InMemoryMetadataStore, SimNetwork), the brokers (each
incarnation: its own metadata session wrapped in a CheckedStore, its own SimBookieTransport node, its own
LedgerService), the workload (writers that create ledgers with random E/Qw/Qa, append, close and roll over
to a new ledger; readers on other brokers that read up to the LAC) and the fault plan (LedgerPlan.events:
partitions symmetric and one-way, a slow bookie, a lossy/duplicating/reordering network, bookie crashes and
restarts through journal replay, bookie and broker session expiry, broker crashes with takeover of their
ledgers by another broker, a second broker recovering a ledger while its writer still writes, two brokers
recovering the same ledger at once: CAS conflicts come from those).

Phases: a safety phase of `plan.run_ms` virtual ms with faults; then a liveness phase: the network heals,
every bookie and broker runs again, every writer finishes, every ledger whose writer died is closed by
recovery (bounded retries), and a final audit reads every ledger back through a broker and inspects every
bookie engine directly (AllAckedEntriesAreReadable, AllCommittedEntriesReachAckQuorum, NoLogDivergence,
NoOutOfOrderEntries, NoDivergenceBetweenClientAndMetaData). The checks of sim.ledger_checks run on every
acknowledgement, metadata write, bookie answer and read; after every step of the loop, every live writer and
running recovery of every broker checks its own invariants (check_invariants(): a broken one is a violation
named after it).

Determinism: all randomness comes from streams derived from the seed (plan.rng_for), time is the SimLoop's,
nothing iterates in address or string-hash order: one seed gives one byte-identical trace.
"""
from __future__ import annotations

import asyncio
import gc
import traceback
from dataclasses import dataclass, field
from typing import Callable

from bksim.broker.handle import LedgerHandle
from bksim.broker.ledgers import LedgerService
from bksim.ledger.recovery import LedgerRecovery
from bksim.ledger.writer import LedgerWriter
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.memory import SessionView
from bksim.model.config import BrokerConfig
from bksim.model.errors import LedgerError
from bksim.model.invariants import InvariantError
from bksim.model.status import StatusCode as S
from bksim.sim import loop as sim_loop
from bksim.sim.bookie_checks import InvariantViolation
from bksim.sim.cluster import BookieSpec, SimCluster
from bksim.sim.kv import KvFaults
from bksim.sim.ledger_checks import CheckedStore, LedgerChecks, WriterRecord
from bksim.sim.network import LinkFaults, SimBookieTransport, SimNetwork
from bksim.sim.plan import FaultEvent, LedgerPlan, bookie_name, broker_name, rng_for
from bksim.sim.trace import Trace

LIVENESS_MS = 30_000.0  # virtual: writers must finish, every ledger must close within this
RECOVERY_ATTEMPTS_MAX = 10  # liveness: recoveries of one ledger before "it never closes" is a violation
RECOVERY_RETRY_MS = 50.0
CREATE_ATTEMPTS_MAX = 5  # a writer's create_ledger attempts (NOT_ENOUGH_BOOKIES while bookies are down)
CREATE_RETRY_MS = 20.0
READ_BACK_MAX = 5  # a reader reads the last few entries up to the LAC
LAST_LEDGER_APPENDS_MAX = 100_000  # the last ledger of the budget takes appends until the safety phase ends
REREGISTER_MS = 10.0  # a bookie re-registers this long after its session expired
INTERNAL_ERROR = "internal error"  # a broker log line with this means an exception escaped the broker layer


@dataclass(slots=True)
class LedgerSimResult:
    seed: int
    plan: LedgerPlan
    violation: InvariantViolation | None
    trace: list[str]
    digest: str
    stats: dict[str, int | float] = field(default_factory=dict)
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.violation is None


def run_ledger_sim(seed: int, *, plan: LedgerPlan | None = None) -> LedgerSimResult:
    """Run one seed on a fresh SimLoop; never raises for an invariant violation (it is in the result)."""
    plan = plan or LedgerPlan.from_seed(seed)
    try:
        return sim_loop.run(run_world(lambda: LedgerWorld(plan)), seed=seed)
    finally:
        gc.collect()  # a run leaves cycles (loop, tasks, engines): freed now, not in a long pause seeds later


async def run_world(make_world: "Callable[[], LedgerWorld]") -> LedgerSimResult:
    """Build the world on the running loop, run it, and gather its result (a violation is in the result)."""
    world = make_world()
    plan = world.plan
    try:
        await world.run()
    except InvariantViolation as v:
        world.violation = world.violation or v
    except Exception as e:  # a bug that escaped (in the broker layer, the engine or the simulator)
        world.violation = world.violation or InvariantViolation("NothingRaises", f"{type(e).__name__}: {e}")
        world.error = traceback.format_exc()
    finally:
        world.cluster.abandon()
    if world.violation is None and world.checks.violation is not None:
        world.violation = world.checks.violation
    if world.violation is not None:
        world.trace.add(f"VIOLATION {world.violation}")
    stats = world.stats
    stats.update(world.checks.stats)
    for bookie in world.cluster.bookies.values():
        for key in ("crashes", "start_crashes", "replayed_records", "torn_tails", "session_expiries"):
            stats[f"bookie_{key}"] = stats.get(f"bookie_{key}", 0) + bookie.stats[key]
    stats["net_lost"] = world.network.stats["lost"]
    stats["net_duplicated"] = world.network.stats["duplicated"]
    stats["virtual_ms"] = round(world.clock.monotonic_ms(), 3)
    return LedgerSimResult(plan.seed, plan, world.violation, world.trace.lines, world.trace.digest(), stats,
                           world.error)


class _Broker:
    """One broker incarnation: metadata session, transport node, ledger service, and its tasks."""

    def __init__(self, name: str, incarnation: int, session: SessionView, service: LedgerService,
                 transport: SimBookieTransport) -> None:
        self.name, self.incarnation = name, incarnation
        self.label = f"{name}#{incarnation}"
        self.session, self.service, self.transport = session, service, transport
        self.alive = True
        self.tasks: set[asyncio.Task] = set()


class LedgerWorld:
    def __init__(self, plan: LedgerPlan) -> None:
        self.plan = plan
        seed = plan.seed
        self.workload = rng_for(seed, "ledger-workload")
        self.faults = rng_for(seed, "ledger-faults")
        self.network = SimNetwork(rng_for(seed, "ledger-net"),
                                  LinkFaults(delay_ms=plan.net_delay_ms, jitter_ms=plan.net_jitter_ms),
                                  log=self._net_log)
        config = plan.bookie_config()
        specs = [BookieSpec(bookie_name(i), config, plan.disk_for(i), KvFaults(unsynced_keep_probability=0.5))
                 for i in range(1, plan.bookies + 1)]
        self.cluster = SimCluster(specs, network=self.network, rng=lambda part: rng_for(seed, f"ledger-{part}"),
                                  log=self._log, session_timeout_ms=plan.session_timeout_ms,
                                  reregister_ms=REREGISTER_MS)
        self.clock = self.cluster.clock
        self.trace = Trace(self.clock.monotonic_ms)
        self.checks = LedgerChecks(self.trace.add, lambda v: self._violated.set())
        self.broker_config = BrokerConfig(bookie_timeout_ms=int(plan.bookie_timeout_ms),
                                          speculative_read_ms=max(1, int(plan.speculative_read_ms)),
                                          add_requests_per_bookie_max=plan.add_requests_per_bookie_max)
        self.brokers: dict[str, _Broker] = {}
        self._incarnations: dict[str, int] = {}
        self._writer_of: dict[int, str] = {}  # ledger id -> broker (name) whose writer created it
        self._ledgers_created = 0
        self._slots: set[asyncio.Task] = set()  # writer slots (each creates, fills and closes ledgers in turn)
        self._fault_tasks: set[asyncio.Task] = set()
        self._timers: list[asyncio.TimerHandle] = []
        self._violated = asyncio.Event()
        # writer or recovery -> its events at its last invariant check
        self._machine_events: dict[LedgerWriter | LedgerRecovery, object] = {}
        self._liveness = False
        self.violation: InvariantViolation | None = None
        self.error = ""
        self.stats: dict[str, int | float] = {k: 0 for k in (
            "ledgers", "recoveries_ok", "recoveries_failed", "reads", "broker_crashes", "takeovers",
            "writer_failures", "faults_fired", "faults_skipped")}

    # -- logging ----------------------------------------------------------------------------------------------
    def _log(self, line: str) -> None:
        self.trace.add(line)

    def _net_log(self, line: str) -> None:
        self.trace.add(line)

    def _broker_log(self, label: str, line: str) -> None:
        self.trace.add(f"{label}: {line}")
        if INTERNAL_ERROR in line:
            self._fail(InvariantViolation("BrokerNeverRaises", f"{label}: {line}"))

    def _fail(self, violation: InvariantViolation) -> None:
        if self.violation is None:
            self.violation = violation
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

    def _check_machines(self) -> None:
        """After every loop step: the invariants of every live writer and running recovery that took an event
        since its last check (the first broken one is the run's violation; nothing is checked after it)."""
        if self.violation is not None:
            return
        checked = self._machine_events
        try:
            for broker in self.brokers.values():
                if not broker.alive:
                    continue
                service = broker.service
                for handle in service.open_handles:
                    writer = handle.writer
                    if checked.get(writer) != writer.events:
                        writer.check_invariants()
                        checked[writer] = writer.events
                for recovery in service.running_recoveries:
                    events = (recovery.events, recovery.writer.events if recovery.writer is not None else -1)
                    if checked.get(recovery) != events:
                        recovery.check_invariants()
                        checked[recovery] = events
        except InvariantError as e:
            self._fail(InvariantViolation(e.invariant, f"{broker.label}: {e}"))

    def _spawn(self, owner: set[asyncio.Task], coro, name: str) -> asyncio.Task:
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
            self._fail(v)
        except Exception as e:
            self.error = self.error or traceback.format_exc()
            self._fail(InvariantViolation("NothingRaises", f"{type(e).__name__}: {e}"))

    def _now(self) -> float:
        return self.clock.monotonic_ms()

    # -- the run ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.trace.note(f"bksim sim --world ledger: {self.plan.bookies} bookies (BookieEngine on SimDisk), "
                        f"{self.plan.brokers} brokers (LedgerService), SimNetwork, InMemoryMetadataStore")
        for line in self.plan.describe():
            self.trace.note(line)
        await self.cluster.start_all()
        for i in range(1, self.plan.brokers + 1):
            self._start_broker(broker_name(i))
        names = sorted(self.brokers)
        for i in range(self.plan.ledgers_initial):
            self._start_slot(self.brokers[names[i % len(names)]])
        loop = asyncio.get_running_loop()
        for event in self.plan.events:
            self._timers.append(loop.call_at(event.at_ms / 1000.0, self._fire, event))
        if isinstance(loop, sim_loop.SimLoop):
            loop.after_step = self._check_machines
        try:
            await self._safety_and_liveness()
        finally:
            if isinstance(loop, sim_loop.SimLoop):
                loop.after_step = None

    async def _safety_and_liveness(self) -> None:
        try:
            await asyncio.wait_for(self._violated.wait(), self.plan.run_ms / 1000.0)
        except TimeoutError:
            pass
        self._check()
        await self._liveness_phase()
        self._check()
        self.trace.add("PASS")

    # -- brokers -----------------------------------------------------------------------------------------------
    def _start_broker(self, name: str) -> _Broker:
        n = self._incarnations[name] = self._incarnations.get(name, 0) + 1
        label = f"{name}#{n}"
        session = self.cluster.store.session(label)
        store = CheckedStore(session, self.checks, label)
        self.network.set_up(name, True)
        transport = SimBookieTransport(self.network, name, self.cluster.bookies, self.plan.bookie_timeout_ms,
                                       observer=self.checks.bookie_answered)
        service = LedgerService(store=store, transport=transport, rng=rng_for(self.plan.seed, f"ledger-{label}"),
                                clock=self.clock, config=self.broker_config,
                                log=lambda line: self._broker_log(label, line))
        broker = self.brokers[name] = _Broker(name, n, session, service, transport)
        self._log(f"start {label}")
        return broker

    async def _stop_broker(self, broker: _Broker, why: str) -> None:
        """The broker process dies: its tasks stop, its ledgers stay OPEN (pending appends fail)."""
        if not broker.alive:
            return
        self._log(f"CRASH {broker.label} ({why})")
        broker.alive = False
        self.network.set_up(broker.name, False)
        for task in sorted(broker.tasks, key=lambda t: t.sim_seq):
            task.cancel()
        await broker.service.close(close_ledgers=False)
        await broker.transport.close()
        session = broker.session
        store = self.cluster.store

        def expire() -> None:
            if store.is_alive(session):
                store.expire(session)
                self._log(f"metadata: session {session.name} expired (process gone)")
        asyncio.get_running_loop().call_later(self.plan.session_timeout_ms / 1000.0, expire)

    def _live_broker(self, preferred: str | None = None, avoid: str | None = None) -> _Broker | None:
        if preferred is not None and self.brokers[preferred].alive:
            return self.brokers[preferred]
        live = [b for name, b in sorted(self.brokers.items()) if b.alive and name != avoid]
        return self.faults.choice(live) if live else None

    # -- writers -----------------------------------------------------------------------------------------------
    def _start_slot(self, broker: _Broker) -> None:
        self._spawn(broker.tasks, self._slot(broker), f"slot {broker.label}")

    async def _slot(self, broker: _Broker) -> None:
        """Create a ledger, fill it, close it; roll over to the next while the budget and the safety phase last."""
        task = asyncio.current_task()
        self._slots.add(task)
        try:
            while broker.alive and self._ledgers_created < self.plan.ledgers_max and not self._liveness:
                handle = await self._create(broker)
                if handle is None:
                    return
                await self._fill(broker, handle)
        finally:
            self._slots.discard(task)

    async def _create(self, broker: _Broker) -> LedgerHandle | None:
        e, qw, qa = self._ledger_shape(self.workload)
        self._ledgers_created += 1
        password = f"pw-{self._ledgers_created}".encode()
        for attempt in range(CREATE_ATTEMPTS_MAX):
            try:
                handle = await broker.service.create_ledger(e, qw, qa, password=password)
            except LedgerError as err:
                self._log(f"{broker.label}: create E={e} Qw={qw} Qa={qa} failed: {err}")
                await self.clock.sleep_ms(CREATE_RETRY_MS)
                continue
            self.stats["ledgers"] += 1
            lid = handle.ledger_id
            metadata, _ = self.checks.metadata[lid]
            self.checks.new_ledger(metadata, lid, password)
            self._writer_of[lid] = broker.name
            self._log(f"{broker.label}: writes ledger {lid} E={e} Qw={qw} Qa={qa} on {list(metadata.ensemble)}")
            return handle
        return None

    def _ledger_shape(self, r) -> tuple[int, int, int]:
        """(E, Qw, Qa) of the next ledger, drawn from the workload rng."""
        e = r.randint(1, min(5, self.plan.bookies))
        qw = r.randint(1, e)
        return e, qw, r.randint(1, qw)

    async def _fill(self, broker: _Broker, handle: LedgerHandle) -> None:
        r = self.workload
        lid = handle.ledger_id
        writer = self.checks.new_writer(
            lid, broker.label, ensemble=lambda: handle.writer.ensemble, lap=lambda: handle.writer.last_add_pushed,
            lac=lambda: handle.writer.last_add_confirmed, live=lambda: broker.alive and handle.error is None)
        pending: list[asyncio.Future] = []
        last_ledger = self._ledgers_created >= self.plan.ledgers_max
        quota = LAST_LEDGER_APPENDS_MAX if last_ledger else r.randint(1, self.plan.entries_per_ledger_max)
        for _ in range(quota):
            pending = [f for f in pending if not f.done()]
            if len(pending) >= self.plan.writer_inflight_max:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not broker.alive or handle.error is not None or self._liveness and (last_ledger or r.random() < 0.5):
                break
            payload = r.randbytes(r.randint(1, max(1, self.plan.payload_bytes_max)))
            try:
                future = handle.append(payload)
            except LedgerError as e:
                self._log(f"{broker.label}: ledger {lid} append refused: {e}")
                break
            entry_id = handle.writer.last_add_pushed
            self.checks.appended(writer, entry_id, payload)
            self.trace.add(f"{broker.label}: L{lid} append {entry_id} ({len(payload)} bytes)")
            future.add_done_callback(lambda f, e=entry_id: self._append_done(writer, e, f))
            pending.append(future)
            if r.random() < self.plan.read_probability:
                reader = self._live_broker(avoid=broker.name)
                if reader is not None:
                    self._spawn(reader.tasks, self._read(reader, lid), f"read {reader.label} L{lid}")
            await self.clock.sleep_ms(r.uniform(0.0, self.plan.append_gap_ms_max))
        if not broker.alive:
            return
        if handle.error is not None:
            self.stats["writer_failures"] += 1
            self._log(f"{broker.label}: ledger {lid} writer failed: {handle.error}")
            return
        try:
            metadata = await handle.close()
            self._log(f"{broker.label}: closed ledger {lid} at {metadata.last_entry_id}")
        except LedgerError as e:
            self.stats["writer_failures"] += 1
            self._log(f"{broker.label}: close of ledger {lid} failed: {e}")

    def _append_done(self, writer: WriterRecord, entry_id: int, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        if future.exception() is not None:
            return  # the handle logs its failure once; the outcome of the entry is unknown
        self.trace.add(f"L{writer.ledger_id} ack {entry_id} (writer #{writer.writer_no})")
        try:
            self.checks.acknowledged(writer, entry_id)
        except InvariantViolation:
            pass  # recorded

    # -- readers and recoveries ------------------------------------------------------------------------------
    async def _read(self, broker: _Broker, lid: int) -> None:
        self.stats["reads"] += 1
        password = self.checks.ledgers[lid].password
        who = f"{broker.label} reader"
        try:
            lac = await broker.service.read_lac(lid, password=password)
            self.checks.lac_read(lid, lac, who)
            first = max(0, lac - self.workload.randint(0, READ_BACK_MAX))
            got = []
            async for entry in broker.service.read_entries(lid, first, -1, password=password):
                self.checks.entry_read(lid, entry.entry_id, entry.payload, who)
                got.append(entry.entry_id)
            self._log(f"{who}: ledger {lid} LAC {lac}, read {got[:1]}..{got[-1:]}")
        except LedgerError as e:
            self._log(f"{who}: ledger {lid}: {e}")

    async def _recover(self, broker: _Broker, lid: int, why: str) -> bool:
        self._log(f"{broker.label}: recover ledger {lid} ({why})")
        try:
            metadata = await broker.service.open_ledger(lid, password=self.checks.ledgers[lid].password,
                                                        recover=True)
        except LedgerError as e:
            self.stats["recoveries_failed"] += 1
            self._log(f"{broker.label}: recovery of ledger {lid} failed: {e}")
            return False
        self.stats["recoveries_ok"] += 1
        self._log(f"{broker.label}: ledger {lid} recovered: CLOSED at {metadata.last_entry_id}")
        return True

    def _open_ledgers(self) -> list[int]:
        return [lid for lid in sorted(self.checks.ledgers)
                if self.checks.metadata[lid][0].state is not LedgerState.CLOSED]

    # -- faults ------------------------------------------------------------------------------------------------
    def _later(self, ms: float, callback, *args) -> None:
        self._timers.append(asyncio.get_running_loop().call_later(ms / 1000.0, callback, *args))

    def _fire(self, event: FaultEvent) -> None:
        if self._liveness:
            return
        self._spawn(self._fault_tasks, self._apply(event), f"fault {event.kind}")

    async def _apply(self, event: FaultEvent) -> None:
        kind, nodes = event.kind, event.nodes
        net = self.network
        self.stats["faults_fired"] += 1
        self._log(f"FAULT {event.describe()}")
        if kind == "partition":
            net.partition(nodes[0], nodes[1], one_way=event.one_way)
            self._later(event.duration_ms, net.heal_partition, nodes[0], nodes[1])
        elif kind == "slow_bookie":
            net.slow(nodes[0], event.amount)
            self._later(event.duration_ms, net.slow, nodes[0], 0.0)
        elif kind == "lossy_network":
            net.set_default(loss=event.amount, duplicate=event.duplicate, reorder=event.reorder)
            self._later(event.duration_ms, lambda: net.set_default(loss=0.0, duplicate=0.0, reorder=False))
        elif kind == "crash_bookie":
            bookie = self.cluster.bookies[nodes[0]]
            if not bookie.alive:
                return self._skip(event, "already down")
            bookie.crash(self.faults)
            self._later(event.duration_ms, self._restart_bookie, nodes[0])
        elif kind == "expire_bookie_session":
            self.cluster.bookies[nodes[0]].expire_session()
        elif kind == "crash_broker":
            if not self.brokers[nodes[0]].alive:
                return self._skip(event, "already down")
            await self._crash_broker(nodes[0], nodes[1], event.then_ms, event.duration_ms)
        elif kind == "recover":
            broker = self.brokers[nodes[0]]
            candidates = [lid for lid in self._open_ledgers() if self._writer_of.get(lid) != broker.name]
            if not broker.alive or not candidates:
                return self._skip(event, "broker down" if not broker.alive else "no open ledger of another broker")
            lid = self.faults.choice(candidates)
            self._spawn(broker.tasks, self._recover(broker, lid, "while its writer may still write"),
                        f"recover {lid}")
        elif kind == "double_recovery":
            candidates = self._open_ledgers()
            brokers = [self.brokers[n] for n in nodes if self.brokers[n].alive]
            if not candidates or not brokers:
                return self._skip(event, "no open ledger" if not candidates else "brokers down")
            lid = self.faults.choice(candidates)
            if event.duration_ms:
                ensemble = self.checks.metadata[lid][0].ensemble
                up = [b for b in ensemble if self.cluster.bookies[b].alive]
                if up:
                    victim = self.faults.choice(up)
                    self._log(f"  {victim} (in ledger {lid}'s ensemble) crashes before the recoveries")
                    self.cluster.bookies[victim].crash(self.faults)
                    self._later(event.duration_ms, self._restart_bookie, victim)
            for broker in brokers:
                self._spawn(broker.tasks, self._recover(broker, lid, "concurrent recoveries"), f"recover {lid}")
            if event.then_ms and self.brokers[nodes[1]].alive:
                self._later(event.then_ms, self._crash_later, nodes[1], nodes[0], event.then_ms)
        elif kind == "expire_broker_session":
            broker = self.brokers[nodes[0]]
            if not broker.alive or not self.cluster.store.is_alive(broker.session):
                return self._skip(event, "broker down")
            self.cluster.store.expire(broker.session)
            self._log(f"metadata: SESSION EXPIRED {broker.session.name}: its metadata calls fail until it restarts")
            self._later(self.plan.session_timeout_ms / 2, self._restart_broker, broker.name, broker.incarnation)
        else:
            raise AssertionError(kind)

    async def _crash_broker(self, name: str, successor: str, takeover_ms: float, restart_ms: float) -> None:
        """`name` dies; `successor` (or another live broker) recovers its open ledgers `takeover_ms` later; `name`
        restarts `restart_ms` later."""
        broker = self.brokers[name]
        self.stats["broker_crashes"] += 1
        orphans = [lid for lid in self._open_ledgers() if self._writer_of.get(lid) == broker.name]
        await self._stop_broker(broker, "crash")
        self._later(takeover_ms, self._takeover, successor, orphans)
        self._later(restart_ms, self._restart_broker, name)

    def _crash_later(self, name: str, successor: str, restart_ms: float) -> None:
        if self._liveness or not self.brokers[name].alive:
            return
        self._spawn(self._fault_tasks, self._crash_broker(name, successor, 0.0, restart_ms), f"crash {name}")

    def _skip(self, event: FaultEvent, why: str) -> None:
        self.stats["faults_skipped"] += 1
        self._log(f"  skipped: {why}")

    def _restart_bookie(self, name: str) -> None:
        bookie = self.cluster.bookies[name]
        if not bookie.alive and not self._liveness and self._restartable(name):
            self._spawn(self._fault_tasks, bookie.start(self.faults, self.plan.start_crash_probability),
                        f"restart {name}")

    def _restartable(self, bookie: str) -> bool:
        """Whether a crashed bookie comes back (every one does here; a world with permanent losses says no)."""
        return True

    def _restart_broker(self, name: str, incarnation: int | None = None) -> None:
        """Restart `name` (if `incarnation` is given, only if that incarnation is still the current one)."""
        if self._liveness:
            return

        async def restart() -> None:
            broker = self.brokers[name]
            if incarnation is not None:
                if broker.incarnation != incarnation or not broker.alive:
                    return
                await self._stop_broker(broker, "restarts after its session expired")
            elif broker.alive:
                return
            if self._liveness:
                return
            self._start_slot(self._start_broker(name))
        self._spawn(self._fault_tasks, restart(), f"restart {name}")

    def _takeover(self, name: str, orphans: list[int]) -> None:
        if self._liveness:
            return
        broker = self._live_broker(preferred=name)
        if broker is None:
            return
        self.stats["takeovers"] += 1
        for lid in orphans:
            if self.checks.metadata[lid][0].state is not LedgerState.CLOSED:
                self._spawn(broker.tasks, self._recover(broker, lid, "takeover of a crashed broker's ledger"),
                            f"takeover {lid}")

    # -- liveness and the final audit -----------------------------------------------------------------------------
    async def _liveness_phase(self) -> None:
        self._liveness = True
        self.trace.add("liveness phase: faults healed; every writer finishes; every ledger gets closed")
        for timer in self._timers:
            timer.cancel()
        self.network.heal()
        deadline = self._now() + LIVENESS_MS
        if self._fault_tasks:
            await asyncio.wait(list(self._fault_tasks), timeout=LIVENESS_MS / 1000.0)
        for name, bookie in self.cluster.bookies.items():
            if not bookie.alive and self._restartable(name):
                await bookie.start()
        for name in sorted(self.brokers):
            broker = self.brokers[name]
            if not broker.alive:
                self._start_broker(name)
            elif not self.cluster.store.is_alive(broker.session):
                await self._stop_broker(broker, "restarts after its session expired")
                self._start_broker(name)
        self._check()
        if self._slots:
            await asyncio.wait(list(self._slots), timeout=max(0.0, deadline - self._now()) / 1000.0)
        if self._slots:
            raise InvariantViolation("WritersFinish", f"{len(self._slots)} writers still writing "
                                     f"{LIVENESS_MS:g} virtual ms into the liveness phase (an append or a close "
                                     f"never answered)")
        others = [t for b in self.brokers.values() for t in b.tasks]
        if others:
            await asyncio.wait(others, timeout=max(0.0, deadline - self._now()) / 1000.0)
        self._check()
        for lid in sorted(self.checks.ledgers):
            await self._close_by_recovery(lid)
            self._check()
        await self._before_audit()
        self._check()
        for lid in sorted(self.checks.ledgers):
            await self._audit(lid)
            self._check()

    async def _before_audit(self) -> None:
        """Every ledger is CLOSED and every fault healed: what else must happen before the final audit."""

    async def _close_by_recovery(self, lid: int) -> None:
        brokers = [b for _, b in sorted(self.brokers.items())]
        for attempt in range(RECOVERY_ATTEMPTS_MAX):
            if self.checks.metadata[lid][0].state is LedgerState.CLOSED:
                return
            await self._recover(brokers[attempt % len(brokers)], lid, "liveness: its writer is gone")
            if self.checks.metadata[lid][0].state is not LedgerState.CLOSED:
                await self.clock.sleep_ms(RECOVERY_RETRY_MS)
        if self.checks.metadata[lid][0].state is not LedgerState.CLOSED:
            raise InvariantViolation("EveryLedgerGetsClosed", f"ledger {lid} still "
                                     f"{self.checks.metadata[lid][0].state.name} after {RECOVERY_ATTEMPTS_MAX} "
                                     f"recoveries with every fault healed")

    async def _audit(self, lid: int) -> None:
        """Read the closed ledger back through a broker, and inspect every bookie engine directly."""
        record = self.checks.ledgers[lid]
        metadata, _ = self.checks.metadata[lid]
        last = metadata.last_entry_id
        if record.highest_acked > last:
            raise InvariantViolation("NoDivergenceBetweenClientAndMetaData", f"ledger {lid} CLOSED at {last} but "
                                     f"entry {record.highest_acked} was acknowledged")
        expected_length = sum(len(record.appended.get(i, b"")) for i in range(last + 1))
        if any(i not in record.appended for i in range(last + 1)) or metadata.length != expected_length:
            raise InvariantViolation("NoDivergenceBetweenClientAndMetaData", f"ledger {lid} CLOSED at {last} "
                                     f"length {metadata.length}, but the writer appended entries "
                                     f"{sorted(record.appended)[:3]}.. of length {expected_length} up to there")
        broker = self.brokers[sorted(self.brokers)[0]]
        got: list[int] = []
        if last >= 0:
            try:
                async for entry in broker.service.read_entries(lid, 0, last, password=record.password):
                    self.checks.entry_read(lid, entry.entry_id, entry.payload, "audit")
                    got.append(entry.entry_id)
            except LedgerError as e:
                raise InvariantViolation("AllAckedEntriesAreReadable", f"ledger {lid} (CLOSED at {last}, every "
                                         f"fault healed) read back entries {got[:1]}..{got[-1:]}, then: {e}") from None
        if got != list(range(last + 1)):
            raise InvariantViolation("AllAckedEntriesAreReadable", f"ledger {lid}: read back {len(got)} entries, "
                                     f"expected 0..{last}")
        for entry_id in range(last + 1):
            copies: dict[str, bytes] = {}
            for name, bookie in self.cluster.bookies.items():
                if not bookie.alive:
                    continue  # lost for good (a world with permanent losses): nothing can be read there
                status, data, _, _ = await bookie.engine.read_entry(lid, entry_id)
                if status is S.OK:
                    copies[name] = data
            if len(set(copies.values())) > 1:
                raise InvariantViolation("NoLogDivergence", f"ledger {lid} entry {entry_id} (<= last_entry_id {last}) "
                                         f"has different bytes on {sorted(copies)}")
            write_set = metadata.write_set(entry_id)
            holders = [b for b in write_set if b in copies]
            if len(holders) < metadata.ack_quorum_size:
                raise InvariantViolation("AllCommittedEntriesReachAckQuorum", f"ledger {lid} entry {entry_id} "
                                         f"(<= last_entry_id {last}) is on {holders} of its write set {write_set}, "
                                         f"fewer than Qa={metadata.ack_quorum_size}")
        self.trace.add(f"audit ledger {lid}: CLOSED at {last} length {metadata.length}, {len(record.acked)} "
                       f"acknowledged, {len(got)} read back, every entry on >= Qa={metadata.ack_quorum_size} of its "
                       f"write set, replicas identical")
