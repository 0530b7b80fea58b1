"""The bookie simulation: one bookie's storage engine (the real BookieEngine, unchanged) on a simulated disk,
key-value store and clock, driven by one seed, with crashes, torn tails, latencies and bit flips.

Owns the world of one run (SimDisk + SimKvRegistry + SimClock on a SimLoop), the workload (clients adding
batches over a few ledgers, RECOVERY_ADDs, fencing reads, explicit LACs, reads, checkpoints), the fault
schedule (a crash at random moments, also during start-up; bit flips of checkpointed entries) and the
checks of bookie_checks after every answer, after every restart and at the end.

Phases: a safety phase of `plan.steps` steps with faults; then a liveness phase without: every operation
still in flight must finish, a full audit, a clean stop (whose restart must replay no journal record) and
a last audit.

Determinism: everything is drawn from random streams derived from the seed (plan.rng_for); there is no
wall clock and no iteration in address or string-hash order; so the same seed gives a byte-identical trace.
"""
from __future__ import annotations

import asyncio
import collections
import os
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

from bksim.bookie.engine import BookieEngine
from bksim.bookie.lastmark import LASTMARK_FILE, decode_lastmark
from bksim.formats import entry_log as log_fmt
from bksim.formats import index as index_fmt
from bksim.formats.entry import parse_ids
from bksim.model.errors import FormatError
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S
from bksim.sim import loop as sim_loop
from bksim.sim.bookie_checks import BookieHistory, InvariantViolation, LedgerHistory
from bksim.sim.clock import SimClock
from bksim.sim.disk import SimDisk
from bksim.sim.kv import SimKvRegistry
from bksim.sim.plan import (OP_WEIGHTS, START_CRASH_DELAY_MS_MAX, START_CRASHES_MAX, START_TIMEOUT_MS, BookiePlan,
                            rng_for)
from bksim.sim.trace import Trace

JOURNAL_DIR = "/bookie/journal"
LEDGER_DIR = "/bookie/ledgers"
ARCHIVE_DIR = "/bookie/journal-archive"
LOCATIONS_KV = os.path.join(LEDGER_DIR, "index", "locations")  # where BookieEngine.start opens it
OP_TIMEOUT_MS = 60_000.0  # virtual: an operation not answered by then is a liveness failure
STORAGE_FAILURES = ("checkpoint failed", "journal FAILED")  # engine log lines that mean storage broke
FENCED_ADD_PROBABILITY = 0.1  # a normal add goes to a fenced ledger (the old writer keeps trying)


@dataclass(slots=True)
class SimResult:
    seed: int
    plan: BookiePlan
    violation: InvariantViolation | None
    trace: list[str]
    digest: str
    stats: dict[str, int | float] = field(default_factory=dict)
    error: str = ""  # the traceback of an exception that escaped (kept out of the trace)
    tolerated: list[str] = field(default_factory=list)  # violations of known engine issues, when tolerated

    @property
    def passed(self) -> bool:
        return self.violation is None


def run_bookie_sim(seed: int, steps: int | None = None, *, tolerated: frozenset[str] = frozenset(),
                   plan: BookiePlan | None = None) -> SimResult:
    """Run one seed on a fresh SimLoop; never raises for an invariant violation (it is in the result).

    `tolerated`: invariant names (known engine issues) recorded as TOLERATED instead of ending the run."""
    plan = plan or (BookiePlan.from_seed(seed) if steps is None else BookiePlan.from_seed(seed, steps))
    return sim_loop.run(_run(plan, tolerated), seed=seed)


async def _run(plan: BookiePlan, tolerated: frozenset[str],
               make_world: Callable[[], "BookieWorld"] | None = None) -> SimResult:
    world = make_world() if make_world is not None else BookieWorld(plan, tolerated)
    try:
        await world.run()
        world.raise_violation()
    except InvariantViolation as v:
        world.violation = world.violation or v
    except Exception as e:  # a bug in the engine (or the simulator) that escaped an operation
        world.violation = world.violation or InvariantViolation("EngineNeverRaises", f"{type(e).__name__}: {e}")
        world.error = traceback.format_exc()
    finally:
        world.abandon()
    if world.violation is not None:
        world.trace.add(f"VIOLATION {world.violation}")
    world.stats["acked_entries"] = world.history.acked_entries
    world.stats["tolerated"] = len(world.history.tolerated_seen)
    world.stats["virtual_ms"] = round(world.clock.monotonic_ms(), 3)
    return SimResult(plan.seed, plan, world.violation, world.trace.lines, world.trace.digest(), world.stats,
                     world.error, [str(v) for v in world.history.tolerated_seen])


@dataclass(frozen=True, slots=True)
class _Op:
    """One client operation: what it is, which bookie incarnation it went to, and when it was submitted."""
    op_id: int
    label: str
    engine: BookieEngine
    submitted: int  # history tick


class BookieWorld:
    op_weights = OP_WEIGHTS  # the workload mix (a world built on this one adds its operations)

    def __init__(self, plan: BookiePlan, tolerated: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        self.clock = SimClock()
        self.trace = Trace(self.clock.monotonic_ms)
        self.workload = rng_for(plan.seed, "workload")
        self.faults = rng_for(plan.seed, "faults")
        self.device = SimDisk(plan.disk, rng_for(plan.seed, "disk"))  # the device: crash, inspection, faults
        self.disk = self.device  # the current process's handle (a new one at every start)
        self.kv = SimKvRegistry(plan.kv, rng_for(plan.seed, "kv"))
        self.config = plan.bookie_config(ARCHIVE_DIR)
        self.instance_id = str(uuid.UUID(int=rng_for(plan.seed, "identity").getrandbits(128)))
        self.history = BookieHistory(tolerated, lambda v: self.trace.add(f"TOLERATED (known engine issue) {v}"))
        self.engine: BookieEngine | None = None
        self.incarnation = 0
        self.alive = False
        self.stopping = False  # a clean stop (engine.close()) is in progress
        self.inflight: dict[int, asyncio.Task] = {}
        self._answered: set[int] = set()
        self._audit_answers: collections.Counter[str] = collections.Counter()  # statuses of audit reads
        self._room = asyncio.Event()
        self._next_op = 0
        self._open_ledgers: list[int] = []
        self._next_ledger_id = 1
        self.violation: InvariantViolation | None = None
        self.error = ""
        self.stats: dict[str, int | float] = {k: 0 for k in (
            "ops", "acked_entries", "crashes", "start_crashes", "torn_tails", "fences_acked", "explicit_lacs_acked",
            "bit_flips", "explicit_checkpoints", "replayed_records", "read_only_flips", "tolerated")}

    # -- the run -----------------------------------------------------------------------------------------
    async def run(self) -> None:
        for line in self._header():
            self.trace.note(line)
        for _ in range(self.plan.ledgers):
            self._open_ledger()
        await self._start(crashes_allowed=False)
        for step in range(self.plan.steps):
            self.raise_violation()
            await self._restart_if_crashed()
            if self.faults.random() < self.plan.crash_probability:
                await self._crash_and_restart(f"step {step}")
                continue
            if self.faults.random() < self.plan.bit_flip_probability:
                self._flip_bit()
            await self._wait_for_room()
            await self._restart_if_crashed()
            self._update_disk_usage()
            self._submit_random_op()
            await self.clock.sleep_ms(self.workload.uniform(0.0, self.plan.step_gap_ms_max))
            self._check_lastmark("step")
        await self._restart_if_crashed()
        self.trace.add("liveness phase: no more faults")
        self._liveness_begins()
        await self._drain()
        await self._before_final_audit()
        await self._audit("end of run")
        if await self._stop_cleanly():
            await self._start(crashes_allowed=False)
            replayed = self.engine.replay_report.records
            if replayed:
                self._violate("CleanStopReplaysNothing", f"bookie#{self.incarnation} replayed {replayed} journal "
                              f"records after a clean stop (close() checkpoints everything)")
        else:
            await self._start(crashes_allowed=False)
        await self._audit("after a clean restart")
        await self._stop_cleanly()
        self.raise_violation()
        self.trace.add("PASS" if not self.history.tolerated_seen else
                       f"PASS with {len(self.history.tolerated_seen)} tolerated violations of known engine issues")

    # hooks for a world built on this one (no-ops here: they draw nothing, so this world's traces stay as they are)
    def _header(self) -> list[str]:
        return ["bksim sim: one bookie (BookieEngine) on SimDisk + SimKeyValueStore + SimClock", *self.plan.describe()]

    async def _restart_if_crashed(self) -> None:
        """Between steps: restart a bookie that crashed inside an operation (here crashes come from the driver)."""

    def _liveness_begins(self) -> None:
        """The faults stop (before the drain)."""

    async def _before_final_audit(self) -> None:
        """Every operation answered; the end-of-run audit comes next."""

    def raise_violation(self) -> None:
        if self.violation is not None:
            raise self.violation

    def _violate(self, invariant: str, detail: str) -> None:
        """Raise (or, for a tolerated known issue, record) a violation found in the driver."""
        self.history.violate(invariant, detail)

    def _fail(self, invariant: str, detail: str) -> None:
        """A violation found in a client task: the driver raises it at its next step."""
        try:
            self.history.violate(invariant, detail)
        except InvariantViolation as v:
            if self.violation is None:
                self.violation = v

    def abandon(self) -> None:
        """End of run (also after a violation): stop the engine without touching the disk."""
        if self.engine is not None and self.alive:
            self.alive = False
            self.engine.abandon()

    # -- engine lifecycle --------------------------------------------------------------------------------
    def _new_engine(self) -> BookieEngine:
        self.incarnation += 1
        n = self.incarnation
        self.disk = self.device.reopen()
        return BookieEngine(self.config, disk=self.disk, clock=self.clock, open_kv=self.kv.open_kv,
                            instance_id=self.instance_id, journal_dir=JOURNAL_DIR, ledger_dir=LEDGER_DIR,
                            log=lambda message: self._engine_log(n, message), fault_hook=self._fault_hook(n))

    def _fault_hook(self, incarnation: int) -> Callable[[str], None] | None:
        """The engine's fault hook for this incarnation (none here: crashes come from the driver)."""
        return None

    def _engine_log(self, n: int, message: str) -> None:
        self.trace.add(f"bookie#{n}: {message}")
        if n == self.incarnation and self.alive and message.startswith(STORAGE_FAILURES):
            if self.stopping:
                self._fail("CleanStopSucceeds", f"bookie#{n} logged during close(): {message}")
            else:
                self._fail("StorageFailsOnlyUnderFaults", f"bookie#{n} (not crashed, no I/O error injected) "
                           f"logged: {message}")

    async def _start(self, crashes_allowed: bool) -> None:
        for attempt in range(START_CRASHES_MAX + 1):
            engine = self._new_engine()
            self.engine, self.alive = engine, True
            self.history.new_incarnation()
            self.trace.add(f"start bookie#{self.incarnation}")
            task = asyncio.get_running_loop().create_task(engine.start(), name=f"start-{self.incarnation}")
            if crashes_allowed and attempt < START_CRASHES_MAX and \
                    self.faults.random() < self.plan.start_crash_probability:
                delay_ms = self.faults.uniform(0.0, START_CRASH_DELAY_MS_MAX)
                try:
                    await asyncio.wait_for(asyncio.shield(task), delay_ms / 1000.0)
                except TimeoutError:
                    self.stats["start_crashes"] += 1
                    self._crash(f"during start-up of bookie#{self.incarnation}")
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    continue
                except Exception:
                    pass  # the start failed by itself: reported below
            try:
                await asyncio.wait_for(task, START_TIMEOUT_MS / 1000.0)
            except Exception as e:
                raise InvariantViolation("RestartsAfterAnyCrash", f"bookie#{self.incarnation} failed to start: "
                                         f"{type(e).__name__}: {e}") from None
            report = engine.replay_report
            self.stats["replayed_records"] += report.records
            self.stats["torn_tails"] += len(report.torn)
            return
        raise AssertionError("unreachable: the last start attempt is never crashed")

    def _crash(self, where: str) -> None:
        """Power loss now: disk and key-value store keep only what is durable; the engine's memory is gone;
        every client operation in flight has an unknown outcome."""
        self.stats["crashes"] += 1
        self.trace.add(f"CRASH {where}")
        for line in self.device.crash(self.faults) + self.kv.crash(self.faults):
            self.trace.add(f"  lost: {line}")
        self.alive = False
        self.engine.abandon()
        for op_id in sorted(self.inflight):
            self.inflight.pop(op_id).cancel()
            if op_id not in self._answered:
                self.trace.add(f"op#{op_id} outcome unknown (crash)")
        self._room.set()
        self._check_lastmark("after crash")

    async def _crash_and_restart(self, where: str) -> None:
        self._crash(where)
        await self._start(crashes_allowed=True)
        await self._audit(f"after restart of bookie#{self.incarnation}")

    async def _stop_cleanly(self) -> bool:
        """engine.close(); True if it succeeded. When it raises (a tolerated known issue), the process exits
        without its final checkpoint: no power loss, the page cache survives."""
        self.trace.add(f"clean stop of bookie#{self.incarnation}")
        self.stopping = True
        try:
            await self.engine.close()
            return True
        except Exception as e:
            self._violate("CleanStopSucceeds", f"bookie#{self.incarnation} close() raised {type(e).__name__}: {e}")
            self.engine.abandon()
            self.disk.exit_process()
            return False
        finally:
            self.stopping = False
            self.alive = False

    # -- client operations -------------------------------------------------------------------------------
    def _open_ledger(self) -> LedgerHistory:
        lid = self._next_ledger_id
        self._next_ledger_id += 1
        self._open_ledgers.append(lid)
        return self.history.ledger(lid, bytes([lid % 256]) * 32)

    def _any_ledger(self) -> LedgerHistory:
        return self.history.ledgers[self.workload.randrange(1, self._next_ledger_id)]

    def _fenced_ledgers(self) -> list[LedgerHistory]:
        return [h for _, h in sorted(self.history.ledgers.items()) if h.ledger_id not in self._open_ledgers]

    def _submit_random_op(self) -> None:
        r = self.workload
        total = sum(w for _, w in self.op_weights)
        pick = r.uniform(0.0, total)
        for name, weight in self.op_weights:
            pick -= weight
            if pick <= 0:
                break
        getattr(self, f"_submit_{name}")()

    def _submit(self, what: str, coro_fn: Callable[[_Op], Coroutine[Any, Any, None]]) -> None:
        self._next_op += 1
        op = _Op(self._next_op, f"op#{self._next_op} {what}", self.engine, self.history.next_tick())
        self.stats["ops"] += 1
        self.trace.add(op.label)
        task = asyncio.get_running_loop().create_task(self._client(op, coro_fn), name=op.label)
        self.inflight[op.op_id] = task
        task.add_done_callback(lambda t: self._done(op.op_id))

    def _done(self, op_id: int) -> None:
        self.inflight.pop(op_id, None)
        self._room.set()

    def _stale(self, op: _Op) -> bool:
        """The answer comes from a bookie incarnation that crashed since: its outcome stays unknown."""
        return op.engine is not self.engine or not self.alive

    def _answer(self, op: _Op, text: str) -> bool:
        """Trace an answer (audit reads are summed up per ledger instead); False (and nothing to record) if
        it comes from a crashed incarnation."""
        if self._stale(op):
            return False
        if op.op_id:
            self._answered.add(op.op_id)
            self.trace.add(f"{op.label} -> {text}")
        else:
            self._audit_answers[text.split(" ", 1)[0]] += 1
        return True

    async def _client(self, op: _Op, coro_fn: Callable[[_Op], Coroutine[Any, Any, None]]) -> None:
        try:  # the operation's coroutine is made here: a task cancelled before it ran leaves none unawaited
            await asyncio.wait_for(coro_fn(op), OP_TIMEOUT_MS / 1000.0)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self._stale(op):
                return  # maybe: the crash reached the operation as an I/O error (ProcessCrashed)
            if isinstance(e, InvariantViolation):
                if self.violation is None:
                    self.violation = e
            elif isinstance(e, TimeoutError):
                self._fail("OperationsAreAnswered", f"{op.label}: no answer after {OP_TIMEOUT_MS} virtual ms")
            else:
                self._fail("EngineNeverRaises", f"{op.label}: {type(e).__name__}: {e}")

    async def _wait_for_room(self) -> None:
        while len(self.inflight) >= self.plan.inflight_ops_max:
            self._room.clear()
            await self._room.wait()

    async def _drain(self) -> None:
        deadline = self.clock.monotonic_ms() + OP_TIMEOUT_MS * 2
        while self.inflight and self.clock.monotonic_ms() < deadline:
            self._room.clear()
            try:
                await asyncio.wait_for(self._room.wait(), OP_TIMEOUT_MS / 1000.0)
            except TimeoutError:
                pass
        self.raise_violation()
        if self.inflight:
            self._violate("OperationsAreAnswered", f"{len(self.inflight)} operations still in flight in the "
                          f"liveness phase: {sorted(self.inflight)}")

    def _payload(self) -> bytes:
        return self.workload.randbytes(self.workload.randint(0, self.plan.payload_bytes_max))

    def _submit_add(self) -> None:
        fenced = self._fenced_ledgers()
        if fenced and self.workload.random() < FENCED_ADD_PROBABILITY:
            ledger = self.workload.choice(fenced)
        else:
            ledger = self.history.ledgers[self.workload.choice(self._open_ledgers)]
        ids = [self.history.generate(ledger, self._payload())
               for _ in range(self.workload.randint(1, self.plan.batch_entries_max))]
        self._submit_adds(ledger, ids, recovery=False)

    def _submit_recovery_add(self) -> None:
        """A recovery write-back: entries the ledger already has (same bytes), and maybe a few new ones."""
        fenced = self._fenced_ledgers()
        ledger = self.workload.choice(fenced) if fenced else self._any_ledger()
        n = self.workload.randint(1, self.plan.batch_entries_max)
        known = sorted(ledger.entries)
        ids = sorted(self.workload.sample(known, min(n, len(known)))) if known else []
        ids += [self.history.generate(ledger, self._payload()) for _ in range(self.workload.randint(0, 2))]
        if ids:
            self._submit_adds(ledger, ids, recovery=True)

    def _submit_adds(self, ledger: LedgerHistory, ids: list[int], recovery: bool) -> None:
        flags = FLAG_RECOVERY_ADD if recovery else 0
        items = [(ledger.entries[i], ledger.master_key, flags) for i in ids]
        for entry, _, _ in items:
            self.history.sent_lac(ledger, parse_ids(entry)[2])

        async def add(op: _Op) -> None:
            statuses, message = await op.engine.add_entries(items)
            tick = self.history.next_tick()
            if self._answer(op, ",".join(s.name for s in statuses) + (f" ({message})" if message else "")):
                for entry_id, status in zip(ids, statuses):
                    self.history.add_answered(ledger, entry_id, recovery, status, op.submitted, tick)
        kind = "recovery-add" if recovery else "add"
        self._submit(f"{kind} {ledger.ledger_id}:{','.join(map(str, ids))}", add)

    def _submit_fence(self) -> None:
        ledger = self.history.ledgers[self.workload.choice(self._open_ledgers)]
        self._open_ledgers.remove(ledger.ledger_id)
        self._open_ledger()  # the writer's ledger was fenced: a new writer opens the next ledger

        async def fence(op: _Op) -> None:
            status, data, lac, message = await op.engine.read_entry(ledger.ledger_id, -1, fence=True,
                                                                    master_key=ledger.master_key)
            tick = self.history.next_tick()
            if not self._answer(op, f"{status.name} {len(data)} bytes lac={lac}"
                                    + (f" ({message})" if message else "")):
                return
            if status in (S.OK, S.NO_ENTRY):
                self.stats["fences_acked"] += 1
                self.history.fence_acknowledged(ledger, tick)
            self.history.check_read(ledger, -1, op.submitted, status, data, lac, op.label)
        self._submit(f"fence {ledger.ledger_id}", fence)

    def _submit_write_lac(self) -> None:
        ledger = self.history.ledgers[self.workload.choice(self._open_ledgers)]
        lac = ledger.highest_acked
        if lac < 0:
            return self._submit_read_lac()
        self.history.sent_lac(ledger, lac)

        async def write_lac(op: _Op) -> None:
            status, message = await op.engine.write_lac(ledger.ledger_id, lac, ledger.master_key)
            tick = self.history.next_tick()
            if self._answer(op, status.name + (f" ({message})" if message else "")) and status is S.OK:
                self.stats["explicit_lacs_acked"] += 1
                self.history.explicit_lac_acknowledged(ledger, lac, tick)
        self._submit(f"write-lac {ledger.ledger_id} lac={lac}", write_lac)

    def _submit_read(self) -> None:
        ledger = self._any_ledger()
        entry_id = self.workload.randint(-1, ledger.next_entry_id)
        self._submit(f"read {ledger.ledger_id}:{entry_id}", self._reader(ledger, entry_id))

    def _reader(self, ledger: LedgerHistory, entry_id: int) -> Callable[[_Op], Coroutine[Any, Any, None]]:
        async def read(op: _Op) -> None:
            status, data, lac, message = await op.engine.read_entry(ledger.ledger_id, entry_id)
            self.history.next_tick()
            if self._answer(op, f"{status.name} {len(data)} bytes lac={lac}"):
                self.history.check_read(ledger, entry_id, op.submitted, status, data, lac, op.label)
        return read

    def _submit_read_lac(self) -> None:
        ledger = self._any_ledger()
        self._submit(f"read-lac {ledger.ledger_id}", self._lac_reader(ledger))

    def _lac_reader(self, ledger: LedgerHistory) -> Callable[[_Op], Coroutine[Any, Any, None]]:
        async def read_lac(op: _Op) -> None:
            status, lac, last, message = await op.engine.read_lac(ledger.ledger_id)
            self.history.next_tick()
            if self._answer(op, f"{status.name} lac={lac} last={last}"):
                self.history.check_lac_answer(ledger, op.submitted, status, lac, last, op.label)
        return read_lac

    def _submit_checkpoint(self) -> None:
        async def checkpoint(op: _Op) -> None:
            await op.engine.checkpoint()
            if self._answer(op, "done"):
                self.stats["explicit_checkpoints"] += 1
        self._submit("checkpoint", checkpoint)

    # -- checks and faults outside the workload ----------------------------------------------------------
    async def _audit(self, where: str) -> None:
        """Every ledger: ReadLac, every acknowledged entry read back, and an acknowledged fence probed."""
        self.trace.add(f"audit {where}")
        self.raise_violation()
        for lid, ledger in sorted(self.history.ledgers.items()):
            op = _Op(0, f"audit {where}: ledger {lid}", self.engine, self.history.next_tick())
            await self._lac_reader(ledger)(op)
            lac_answer = self._audit_answers
            self._audit_answers = collections.Counter()
            for entry_id in sorted(ledger.acked_at):
                await self._reader(ledger, entry_id)(
                    _Op(0, f"{op.label} entry {entry_id}", self.engine, op.submitted))
            self.trace.add(f"{op.label}: ReadLac {'/'.join(sorted(lac_answer))}, {len(ledger.acked_at)} "
                           f"acknowledged entries read back: " + ", ".join(
                               f"{status} {n}" for status, n in sorted(self._audit_answers.items())))
            self._audit_answers = collections.Counter()
            if self._probes_fence(ledger):
                probe = self.history.generate(ledger, b"probe")
                self.history.sent_lac(ledger, parse_ids(ledger.entries[probe])[2])
                submitted = self.history.next_tick()
                statuses, _ = await self.engine.add_entries([(ledger.entries[probe], ledger.master_key, 0)])
                self.trace.add(f"{op.label}: normal add {lid}:{probe} to the fenced ledger -> {statuses[0].name}")
                if statuses[0] is not S.FENCED and not (statuses[0] is S.READ_ONLY and self.engine.read_only):
                    self._violate("AcknowledgedFenceHolds", f"{op.label}: a normal add to ledger {lid}, whose "
                                  f"fence was acknowledged, answered {statuses[0].name}")
                # tolerated: an OK probe is an acknowledged entry like any other
                self.history.add_answered(ledger, probe, False, statuses[0], submitted, self.history.next_tick())
        self.raise_violation()

    def _probes_fence(self, ledger: LedgerHistory) -> bool:
        """Whether the audit checks that a normal add to this ledger is refused (its fence was acknowledged)."""
        return ledger.fence_acked_at is not None

    def _check_lastmark(self, where: str) -> None:
        data = self.device.durable_bytes(os.path.join(LEDGER_DIR, LASTMARK_FILE))
        if data is None:
            return
        try:
            mark = decode_lastmark(data)
        except FormatError as e:
            return self._violate("LastmarkMonotonic", f"{where}: the durable lastmark is unreadable: {e}")
        self.history.check_lastmark((mark.journal_id, mark.offset), where)

    def _update_disk_usage(self) -> None:
        total, free = self.disk.usage(LEDGER_DIR)
        if self.engine.set_disk_usage(total, free):
            self.stats["read_only_flips"] += 1
            self.trace.add(f"disk {total - free} of {total} bytes used: bookie is "
                           f"{'read-only' if self.engine.read_only else 'writable'}")

    def _flip_bit(self) -> None:
        """Bit rot in the entry-log record of an acknowledged, checkpointed entry (its durable location)."""
        candidates = [(lid, e) for lid, h in sorted(self.history.ledgers.items()) for e in sorted(h.acked_at)]
        if not candidates:
            return
        lid, entry_id = self.faults.choice(candidates)
        value = self.kv.durable_get(LOCATIONS_KV, index_fmt.location_key(lid, entry_id))
        if value is None:
            return  # not checkpointed yet: it lives in the journal and the write cache
        location = index_fmt.decode_location(value)
        path = os.path.join(LEDGER_DIR, "entrylogs", log_fmt.entry_log_file_name(location.log_id))
        durable = self.device.durable_bytes(path)
        end = location.offset + 4 + location.length
        if durable is None or len(durable) < end:
            return
        offset = self.faults.randrange(location.offset, end)
        bit = self.faults.randrange(8)
        self.device.flip_bit(path, offset, bit)
        self.history.ledgers[lid].damaged.add(entry_id)
        self.stats["bit_flips"] += 1
        self.trace.add(f"BIT FLIP {lid}:{entry_id} in {path} at byte {offset} (record byte "
                       f"{offset - location.offset}) bit {bit}")
