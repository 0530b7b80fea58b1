"""The autorecovery world: the ledger world (sim.ledger_scenario) plus the auditor and the replication workers
(autorecovery/, the same code as `bksim autorecovery run`), with bookies lost for good.

Owns, over a LedgerWorld of the same seed (its LedgerPlan unchanged; the autorecovery knobs are an
AutorecoveryPlan drawn from a stream of their own):
- the autorecovery nodes: each a process with one metadata session, one SimBookieTransport node, a LedgerService
  (recovery of open ledgers past their grace, placement), one Auditor candidate and its ReplicationWorkers, each
  on the SimClock with a seeded rng. A node whose session expires (its auditor's run raises SessionExpiredError)
  restarts on a new session: a new vote, a new election;
- the cookies of the bookies (what `bksim bookie format` writes: the auditor's known bookies);
- its faults: a bookie lost for good in the safety phase (crashed, never restarted); a node that dies at its next
  RECOVERY_ADD (mid-copy: its locks and vote die with its session a session timeout later); the session of the
  node whose vote leads expires (a re-election); a lock a worker holds is deleted under it (two workers may copy
  one ledger); and, in some seeds, a second bookie lost for good once every ledger is CLOSED, which destroys the
  entries whose every replica was on the two.

Ledgers here have Qa >= 2 when a bookie is lost for good (an acknowledged entry survives one loss) and
E < the bookies that stay, so a spare bookie exists for every replacement.

Phases: the ledger world's safety and liveness phases (every ledger CLOSED, the lost bookies stay down), then
the settle phase: every node runs again, and the world runs on (bounded by SETTLE_MS virtual) while a check of
all ledgers, asked for as an operator does and started after the last repairable mark went, still finds
something; then every node stops and the final audit runs.

Invariants (besides the ledger world's; the metadata ones in sim.ledger_checks):
- ReplacementHoldsItsEntries / ReplicatorOnlyReplacesBookies: checked at each metadata write by a worker;
- AutorecoveryConverges: the settle phase ends with no mark other than lost ones, within SETTLE_MS;
- ClosedLedgersFullyReplicated: every CLOSED ledger whose entries all survive has, for every entry, Qw copies
  on the bookies of its final metadata's write set (read from the engines directly), identical (NoLogDivergence);
- LostLedgerIsReported: a ledger with an entry no bookie of its write set holds is marked, with lost entries
  counted (never "repaired" into metadata naming bookies without the entry); LostOnlyWhenNoReplicaSurvives: a
  mark that says lost names a ledger that really is.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import json

from bksim.autorecovery.auditor import Auditor
from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.autorecovery.worker import ReplicationWorker
from bksim.broker.ledgers import LedgerService
from bksim.metadata import paths
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.memory import SessionView
from bksim.model.config import MiB, AutoRecoveryConfig
from bksim.model.errors import NoNodeError, SessionExpiredError
from bksim.model.status import FLAG_RECOVERY_ADD
from bksim.model.status import StatusCode as S
from bksim.sim import loop as sim_loop
from bksim.sim.bookie_checks import InvariantViolation
from bksim.sim.ledger_checks import CheckedStore
from bksim.sim.ledger_scenario import LedgerSimResult, LedgerWorld, run_world
from bksim.sim.network import SimBookieTransport
from bksim.sim.plan import AutorecoveryPlan, FaultEvent, LedgerPlan, autorecovery_name, rng_for

SETTLE_MS = 60_000.0  # virtual: autorecovery must have repaired every repairable ledger within this
SETTLE_POLL_MS = 50.0
LOSE_WAIT_MS = 1_000  # a bookie lost while it restarts dies once its start-up ends (polled each virtual ms)
AUTORECOVERY_CONFIG = dataclasses.replace(
    AutoRecoveryConfig(), periodic_bookie_check_interval_ms=1_000, periodic_check_interval_ms=2_000,
    rereplication_bytes_per_s_max=8 * MiB, worker_backoff_ms=100, lost_ledger_retry_ms=500)


def run_autorecovery_sim(seed: int, *, plan: LedgerPlan | None = None,
                         autorecovery: AutorecoveryPlan | None = None) -> LedgerSimResult:
    """Run one seed of the autorecovery world on a fresh SimLoop; never raises for a violation."""
    plan = plan or LedgerPlan.from_seed(seed)
    autorecovery = autorecovery or AutorecoveryPlan.from_seed(seed, plan)
    try:
        return sim_loop.run(run_world(lambda: AutorecoveryWorld(plan, autorecovery)), seed=seed)
    finally:
        gc.collect()


class _WorkerTransport:
    """A worker's view of its node's BookieTransport, where the mid-copy faults strike: at the first
    RECOVERY_ADD after they were armed, the node dies (`crash`) or the worker's lock is deleted (`lose_locks`).
    The add itself is sent either way (it may or may not reach the bookie)."""

    def __init__(self, inner: SimBookieTransport, node: "_Node", world: "AutorecoveryWorld",
                 marks: UnderReplicationMarks) -> None:
        self._inner, self._node, self._world, self._marks = inner, node, world, marks

    async def add(self, bookie, entries):
        entries = list(entries)
        if any(flags & FLAG_RECOVERY_ADD for _, _, flags in entries):
            if self._node.crash_armed:
                self._node.crash_armed = False
                self._world._crash_node_now(self._node)
            elif self._world.lock_loss_armed and self._marks.held():
                self._world.lock_loss_armed = False
                self._world._lose_locks(self._node, self._marks.held())
        return await self._inner.add(bookie, entries)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@dataclasses.dataclass(eq=False)
class _Node:
    name: str
    incarnation: int
    session: SessionView
    transport: SimBookieTransport
    service: LedgerService
    auditor: Auditor
    workers: list[ReplicationWorker]
    worker_marks: list[UnderReplicationMarks]
    stop: asyncio.Event
    restart_ms: float = 0.0
    tasks: set = dataclasses.field(default_factory=set)
    alive: bool = True
    crash_armed: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}#{self.incarnation}"


class AutorecoveryWorld(LedgerWorld):
    def __init__(self, plan: LedgerPlan, autorecovery: AutorecoveryPlan) -> None:
        super().__init__(plan)
        self.ar = autorecovery
        self.ar_faults = rng_for(plan.seed, "autorecovery-faults")
        self.ar_config = dataclasses.replace(
            AUTORECOVERY_CONFIG, bookie_check_interval_ms=autorecovery.bookie_check_interval_ms,
            lost_bookie_recovery_delay_ms=autorecovery.lost_bookie_recovery_delay_ms,
            open_ledger_rereplication_grace_ms=autorecovery.open_ledger_rereplication_grace_ms,
            read_batch_entries=autorecovery.read_batch_entries)
        self.nodes: dict[str, _Node] = {}
        self._node_incarnations: dict[str, int] = {}
        self._nodes_stopped = False  # the end: no node restarts any more
        self.lock_loss_armed = False  # the next worker to send a RECOVERY_ADD loses its lock
        self._lost: list[str] = []  # bookies lost for good, in the order they went
        self._root_marks = UnderReplicationMarks(self.cluster.store, self.clock)
        self.stats.update({k: 0 for k in ("bookies_lost", "node_crashes", "auditor_expiries", "locks_lost",
                                          "lost_ledgers", "settle_ms", "worker_recoveries",
                                          "entries_copied")})

    # -- the world -------------------------------------------------------------------------------------------
    def _ledger_shape(self, r) -> tuple[int, int, int]:
        stays = self.plan.bookies - (1 if self.ar.lost_bookie else 0) - (1 if self.ar.second_lost_bookie else 0)
        low = 2 if self.ar.lost_bookie else 1
        e = r.randint(low, min(5, stays - 1))  # a spare bookie stays for every replacement
        qw = r.randint(low, e)
        return e, qw, r.randint(low, qw)

    def _restartable(self, bookie: str) -> bool:
        return bookie not in self._lost

    async def run(self) -> None:
        for line in self.ar.describe():
            self.trace.note(line)
        await super().run()

    async def _safety_and_liveness(self) -> None:
        for bookie in sorted(self.cluster.bookies):  # the cookies `bksim bookie format` writes
            await self.cluster.store.create(paths.cookie_path(bookie), json.dumps({"bookie_id": bookie}).encode())
        for i in range(1, self.ar.nodes + 1):
            self._start_node(autorecovery_name(i))
        loop = asyncio.get_running_loop()
        if self.ar.lost_bookie:
            self._timers.append(loop.call_at(self.ar.lose_bookie_at_ms / 1000.0, self._fire,
                                             FaultEvent(self.ar.lose_bookie_at_ms, "lose_bookie", 0.0,
                                                        (self.ar.lost_bookie,))))
        for event in self.ar.events:
            self._timers.append(loop.call_at(event.at_ms / 1000.0, self._fire, event))
        await super()._safety_and_liveness()

    # -- nodes ------------------------------------------------------------------------------------------------
    def _start_node(self, name: str) -> _Node:
        n = self._node_incarnations[name] = self._node_incarnations.get(name, 0) + 1
        label = f"{name}#{n}"
        session = self.cluster.store.session(label)
        self.network.set_up(name, True)
        transport = SimBookieTransport(self.network, name, self.cluster.bookies, self.plan.bookie_timeout_ms,
                                       observer=self.checks.bookie_answered)
        service = LedgerService(store=CheckedStore(session, self.checks, f"{label} recovery"), transport=transport,
                                rng=rng_for(self.plan.seed, f"autorecovery-{label}"), clock=self.clock,
                                config=self.broker_config, log=lambda line: self._broker_log(label, line))
        auditor = Auditor(CheckedStore(session, self.checks, f"{label} auditor"), transport,
                          UnderReplicationMarks(session, self.clock), self.clock, self.ar_config, label,
                          log=lambda line: self._log(f"{label}: {line}"))
        node = _Node(name, n, session, transport, service, auditor, [], [], asyncio.Event())
        for i in range(1, self.ar.workers_per_node + 1):
            store = CheckedStore(session, self.checks, f"{label} worker-{i}", replicator=True)
            marks = UnderReplicationMarks(store, self.clock)
            node.worker_marks.append(marks)
            node.workers.append(ReplicationWorker(
                store=store, transport=_WorkerTransport(transport, node, self, marks), ledgers=service, marks=marks, clock=self.clock,
                rng=rng_for(self.plan.seed, f"autorecovery-{label}-worker-{i}"), config=self.ar_config,
                owner_id=f"{label}/worker-{i}", log=lambda line: self._log(f"{label}: {line}")))
        self.nodes[name] = node
        self._log(f"start {label}: auditor candidate and {len(node.workers)} replication workers")
        self._spawn(node.tasks, self._run_auditor(node), f"auditor {label}")
        for worker in node.workers:
            self._spawn(node.tasks, worker.run(node.stop), f"worker {worker.owner_id}")
        return node

    async def _run_auditor(self, node: _Node) -> None:
        try:
            await node.auditor.run(node.stop)
        except SessionExpiredError:
            self._log(f"{node.label}: auditor session expired: the node restarts on a new session")
            self._spawn(self._fault_tasks, self._restart_node(node, 0.0), f"restart {node.label}")

    async def _stop_node(self, node: _Node, why: str) -> None:
        if not node.alive:
            return
        self._log(f"{'CRASH' if why else 'stop'} {node.label}{f' ({why})' if why else ''}")
        node.alive = False
        node.stop.set()
        if why:
            self.network.set_up(node.name, False)
        current = asyncio.current_task()
        tasks = [t for t in sorted(node.tasks, key=lambda t: t.sim_seq) if t is not current]
        for task in tasks if why else ():
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await node.service.close(close_ledgers=False)
        await node.transport.close()
        session, store = node.session, self.cluster.store
        if not why:
            if store.is_alive(session):
                store.expire(session)  # a clean stop closes the session
            return

        def expire() -> None:
            if store.is_alive(session):
                removed = store.expire(session)
                self._log(f"metadata: session {session.name} expired (process gone), removed {removed}")
        asyncio.get_running_loop().call_later(self.plan.session_timeout_ms / 1000.0, expire)

    async def _restart_node(self, node: _Node, after_ms: float) -> None:
        await self._stop_node(node, "its session expired" if after_ms == 0.0 else "crash")
        if after_ms:
            await self.clock.sleep_ms(after_ms)
        if not self._nodes_stopped and self.nodes[node.name] is node:
            self._start_node(node.name)

    def _crash_node_now(self, node: _Node) -> None:
        self.stats["node_crashes"] += 1
        self._spawn(self._fault_tasks, self._restart_node(node, node.restart_ms), f"crash {node.label}")

    # -- faults -----------------------------------------------------------------------------------------------
    async def _apply(self, event: FaultEvent) -> None:
        kind = event.kind
        if kind not in ("lose_bookie", "crash_autorecovery", "expire_auditor_session", "lose_lock"):
            return await super()._apply(event)
        self.stats["faults_fired"] += 1
        self._log(f"FAULT {event.describe() if kind != 'lose_bookie' else f'lose_bookie {event.nodes[0]}'}")
        if kind == "lose_bookie":
            self._lose(event.nodes[0])
        elif kind == "crash_autorecovery":
            node = self.nodes[event.nodes[0]]
            if not node.alive:
                return self._skip(event, "node down")
            node.crash_armed, node.restart_ms = True, max(1.0, event.duration_ms)
            self._log(f"  {node.label} dies at its next RECOVERY_ADD")
        elif kind == "expire_auditor_session":
            leaders = [n for _, n in sorted(self.nodes.items()) if n.alive and n.auditor.leading
                       and self.cluster.store.is_alive(n.session)]
            if not leaders:
                return self._skip(event, "no auditor elected")
            self.stats["auditor_expiries"] += 1
            removed = self.cluster.store.expire(leaders[0].session)
            self._log(f"metadata: SESSION EXPIRED {leaders[0].session.name} (the auditor), removed {removed}")
        else:
            self.lock_loss_armed = True
            self._log("  the next worker to copy loses its lock")

    def _lose_locks(self, node: _Node, ledger_ids: list[int]) -> None:
        async def delete() -> None:
            for ledger_id in ledger_ids:
                try:
                    await self.cluster.store.delete(paths.underreplication_lock_path(ledger_id))
                except NoNodeError:
                    continue
                self.stats["locks_lost"] += 1
                self._log(f"{node.label}: the lock of ledger {ledger_id} is deleted under its worker (mid-copy)")
        self._spawn(self._fault_tasks, delete(), "lose locks")

    def _lose(self, name: str) -> None:
        bookie = self.cluster.bookies[name]
        self._lost.append(name)
        self.stats["bookies_lost"] += 1
        self._log(f"  {name} is lost for good (never restarts)")
        if bookie.alive:
            bookie.crash(self.ar_faults)
        else:  # down already, maybe in the middle of a restart (its replay): it dies when that ends
            self._spawn(self._fault_tasks, self._crash_when_started(bookie), f"lose {name}")

    async def _crash_when_started(self, bookie) -> None:
        for _ in range(LOSE_WAIT_MS):
            if bookie.alive:
                bookie.crash(self.ar_faults)
                return
            await self.clock.sleep_ms(1.0)

    # -- settle and the final audit -----------------------------------------------------------------------------
    async def _before_audit(self) -> None:
        if self.ar.second_lost_bookie and self.ar.second_lost_bookie not in self._lost:
            self._log(f"FAULT lose_bookie {self.ar.second_lost_bookie} (every ledger is CLOSED)")
            self._lose(self.ar.second_lost_bookie)
        for name in sorted(self.nodes):
            node = self.nodes[name]
            node.crash_armed = self.lock_loss_armed = False  # faults are over
            if not node.alive or not self.cluster.store.is_alive(node.session):
                await self._stop_node(node, "restarts for the settle phase")
                self._start_node(name)
        self.trace.add("settle phase: autorecovery runs on until a check of all ledgers finds nothing to repair")
        started = self._now()
        deadline = started + SETTLE_MS
        # the lost bookies' registrations die with their sessions; the auditor sees them lost after its delay
        while self._now() < deadline and any([await self.cluster.store.exists(paths.bookie_path(b)) is not None
                                              for b in self._lost]):
            await self.clock.sleep_ms(SETTLE_POLL_MS)
        await self.clock.sleep_ms(self.ar_config.lost_bookie_recovery_delay_ms
                                  + 2 * self.ar_config.bookie_check_interval_ms)
        settled = False
        while self._now() < deadline and not settled:
            self._check()
            await self.nodes[sorted(self.nodes)[0]].auditor.trigger_check_all()
            while self._now() < deadline and await self._check_all_requested():
                await self.clock.sleep_ms(SETTLE_POLL_MS)
            marks = await self._root_marks.list()
            settled = all(m.lost_entries > 0 for m in marks)
            while self._now() < deadline and any(m.lost_entries == 0 for m in marks):
                await self.clock.sleep_ms(SETTLE_POLL_MS)
                marks = await self._root_marks.list()
        self.stats["settle_ms"] = round(self._now() - started, 3)
        self._nodes_stopped = True
        for name in sorted(self.nodes):
            await self._stop_node(self.nodes[name], "")
        self._check()
        for node in self.nodes.values():
            for worker in node.workers:
                stats = worker.statistics()
                self.stats["worker_recoveries"] += stats["recovered"]
                self.stats["entries_copied"] += stats["entries_copied"]
        if not settled:
            marks = await self._root_marks.list()
            raise InvariantViolation("AutorecoveryConverges", f"{SETTLE_MS:g} virtual ms after every ledger closed "
                                     f"and every fault healed, marks remain: "
                                     f"{[(m.ledger_id, list(m.missing), m.lost_entries) for m in marks][:5]}")
        self._beyond_repair = {lid for lid in sorted(self.checks.ledgers) if await self._check_replicas(lid)}

    async def _check_all_requested(self) -> bool:
        try:
            data, _ = await self.cluster.store.get(paths.CHECK_ALL_LEDGERS_CTIME)
        except NoNodeError:
            return True
        return data == b"0"

    async def _check_replicas(self, lid: int) -> bool:
        """The end state of one CLOSED ledger on the engines; True if it is beyond repair (and reported so)."""
        metadata, _ = self.checks.metadata[lid]
        assert metadata.state is LedgerState.CLOSED
        mark = await self._root_marks.get(lid)
        short: list[tuple[int, list[str]]] = []
        dead: list[int] = []
        for entry_id in range(metadata.last_entry_id + 1):
            copies: dict[str, bytes] = {}
            for bookie in metadata.write_set(entry_id):
                host = self.cluster.bookies[bookie]
                if host.alive:
                    status, data, _, _ = await host.engine.read_entry(lid, entry_id)
                    if status is S.OK:
                        copies[bookie] = data
            if len(set(copies.values())) > 1:
                raise InvariantViolation("NoLogDivergence", f"ledger {lid} entry {entry_id} has different bytes on "
                                         f"{sorted(copies)} after autorecovery")
            if not copies:
                dead.append(entry_id)
            elif len(copies) < metadata.write_quorum_size:
                short.append((entry_id, sorted(copies)))
        if dead:
            if mark is None or mark.lost_entries <= 0:
                raise InvariantViolation("LostLedgerIsReported", f"ledger {lid}: entries {dead[:5]} have no copy on "
                                         f"any bookie of their write sets, but its mark is "
                                         f"{'gone' if mark is None else 'not lost'}")
            self.stats["lost_ledgers"] += 1
            self._log(f"ledger {lid}: beyond repair ({len(dead)} entries without a copy), reported lost: "
                      f"{mark.note}")
            return True
        if mark is not None:
            raise InvariantViolation("LostOnlyWhenNoReplicaSurvives" if mark.lost_entries else
                                     "AutorecoveryConverges", f"ledger {lid} still marked ({list(mark.missing)}, "
                                     f"lost entries {mark.lost_entries}: {mark.note}) though every entry has a copy")
        if short:
            entry_id, holders = short[0]
            raise InvariantViolation("ClosedLedgersFullyReplicated", f"ledger {lid} entry {entry_id} is on {holders} "
                                     f"of its write set {metadata.write_set(entry_id)} after autorecovery settled "
                                     f"(Qw={metadata.write_quorum_size}); {len(short)} entries short")
        return False

    async def _audit(self, lid: int) -> None:
        if lid in self._beyond_repair:
            return  # checked above: reported lost
        await super()._audit(lid)
