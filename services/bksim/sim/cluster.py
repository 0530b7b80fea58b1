"""A simulated cluster: N bookie processes (each the real BookieEngine on its own SimDisk and SimKeyValueStore),
one InMemoryMetadataStore standing in for ZooKeeper, and the SimNetwork between them.

Owns the bookie processes' life cycle and their registrations:
- start: the real start-up (journal replay from the checkpoint mark, checkpoint), optionally crashed during
  start-up (seeded, at most START_CRASHES_MAX times in a row), then an ephemeral registration node
  /ledgers/available/<bookie id> in a metadata session of this incarnation;
- crash: power loss (the disk and key-value store keep only what is durable, plus seeded torn tails), the
  engine's memory and every request handler are gone, the network node is down; the incarnation's metadata
  session is expired by "ZooKeeper" `session_timeout_ms` of virtual time later, which removes its
  registration node. A restart before that registers only once the old node has vanished (as a real bookie
  waits for the dead process's node);
- expire_session: a metadata session expiry of a live bookie: its node vanishes, and the bookie opens a new
  session and registers again `reregister_ms` later (as the real registration does by itself);
- stop: a clean close (journal drained, checkpoint), deregistration;
- wipe_and_format: the operator's re-initialisation of a stopped bookie (`bksim bookie format --force
  --delete-cookie` after its disks were lost): new, empty devices; the next start is a new bookie with the same id.

Invariants: every random draw comes from the rngs given (the disks', the kv stores', the `faults` rng); a
request handler of an incarnation never outlives it (spawn); an answer is served only by a running engine.
Engine log lines that mean storage broke while no crash was injected are collected in `storage_failures`;
exceptions escaping a request handler in `handler_errors` (a scenario turns both into violations).
"""
from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

from bksim.bookie.engine import BookieEngine
from bksim.bookie.requests import AddAdmission
from bksim.metadata import paths
from bksim.metadata.memory import InMemoryMetadataStore, SessionView
from bksim.model.config import BookieConfig
from bksim.model.errors import NodeExistsError, SessionExpiredError
from bksim.sim.bookie_checks import InvariantViolation
from bksim.sim.bookie_scenario import ARCHIVE_DIR, JOURNAL_DIR, LEDGER_DIR, STORAGE_FAILURES
from bksim.sim.clock import SimClock
from bksim.sim.disk import DiskFaults, SimDisk
from bksim.sim.kv import KvFaults, SimKvRegistry
from bksim.sim.network import SimNetwork
from bksim.sim.plan import START_CRASH_DELAY_MS_MAX, START_CRASHES_MAX, START_TIMEOUT_MS

CLUSTER_INSTANCE_ID = "00000000-0000-4000-8000-000000000001"


@dataclass(frozen=True, slots=True)
class BookieSpec:
    """How one simulated bookie is built."""
    bookie_id: str
    config: BookieConfig
    disk: DiskFaults
    kv: KvFaults


class SimBookie:
    """One bookie process over its own simulated devices; survives crashes (new incarnations)."""

    def __init__(self, spec: BookieSpec, *, clock: SimClock, store: InMemoryMetadataStore, network: SimNetwork,
                 rng: Callable[[str], random.Random], log: Callable[[str], None], session_timeout_ms: float,
                 reregister_ms: float) -> None:
        self.spec = spec
        self.bookie_id = spec.bookie_id
        self._clock, self._store, self._network, self._log = clock, store, network, log
        self._session_timeout_ms, self._reregister_ms = session_timeout_ms, reregister_ms
        self._rng = rng
        self.device = SimDisk(spec.disk, rng("disk"))
        self.kv = SimKvRegistry(spec.kv, rng("kv"))
        self.incarnation = 0
        self.formats = 0  # how often the bookie was wiped and formatted
        self.limbo_ledger_id_max = -1  # the bound its last format recorded (bookie/cookie.py "Limbo")
        self.engine: BookieEngine | None = None
        self.add_admission = AddAdmission(spec.config, spec.bookie_id)  # the add bounds of the current incarnation
        self.alive = False  # the engine is started and serving
        self.stopping = False
        self.session: SessionView | None = None  # the current incarnation's metadata session
        self.registered = False
        self._handlers: set[asyncio.Task] = set()
        self.storage_failures: list[str] = []
        self.handler_errors: list[str] = []
        self.stats = {"starts": 0, "crashes": 0, "start_crashes": 0, "replayed_records": 0, "torn_tails": 0,
                      "session_expiries": 0}
        network.set_up(self.bookie_id, False)

    # -- BookieHost (sim.network) --------------------------------------------------------------------------
    def serving(self) -> BookieEngine | None:
        return self.engine if self.alive else None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._handlers.add(task)
        task.add_done_callback(self._handler_done)
        return task

    def _handler_done(self, task: asyncio.Task) -> None:
        self._handlers.discard(task)
        if not task.cancelled() and task.exception() is not None and self.alive:
            e = task.exception()
            self.handler_errors.append(f"{self.bookie_id}#{self.incarnation} {task.get_name()}: "
                                       f"{type(e).__name__}: {e}")

    # -- life cycle ----------------------------------------------------------------------------------------
    def _new_engine(self) -> BookieEngine:
        self.incarnation += 1
        n = self.incarnation
        self.add_admission = AddAdmission(self.spec.config, self.bookie_id)
        disk = self.device.reopen()
        return BookieEngine(self.spec.config, disk=disk, clock=self._clock, open_kv=self.kv.open_kv,
                            instance_id=CLUSTER_INSTANCE_ID, journal_dir=JOURNAL_DIR, ledger_dir=LEDGER_DIR,
                            log=lambda message: self._engine_log(n, message),
                            limbo_ledger_id_max=self.limbo_ledger_id_max)

    def _engine_log(self, n: int, message: str) -> None:
        self._log(f"{self.bookie_id}#{n}: {message}")
        if n == self.incarnation and self.alive and message.startswith(STORAGE_FAILURES):
            self.storage_failures.append(f"{self.bookie_id}#{n}{' (during close)' if self.stopping else ''}: "
                                         f"{message}")

    async def start(self, crash_rng: random.Random | None = None, start_crash_probability: float = 0.0) -> None:
        """Start a new incarnation (real replay); with `crash_rng`, maybe crash it during start-up first.
        Raises InvariantViolation("RestartsAfterAnyCrash") if the engine cannot start."""
        assert not self.alive, f"{self.bookie_id} is already running"
        for attempt in range(START_CRASHES_MAX + 1):
            engine = self._new_engine()
            self.engine = engine
            self._log(f"start {self.bookie_id}#{self.incarnation}")
            task = asyncio.get_running_loop().create_task(engine.start(), name=f"start {self.bookie_id}")
            if crash_rng is not None and attempt < START_CRASHES_MAX and \
                    crash_rng.random() < start_crash_probability:
                delay_ms = crash_rng.uniform(0.0, START_CRASH_DELAY_MS_MAX)
                try:
                    await asyncio.wait_for(asyncio.shield(task), delay_ms / 1000.0)
                except TimeoutError:
                    self.stats["start_crashes"] += 1
                    self._power_loss(f"during start-up of {self.bookie_id}#{self.incarnation}", crash_rng)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    continue
                except Exception:
                    pass  # the start failed by itself: reported below
            try:
                await asyncio.wait_for(task, START_TIMEOUT_MS / 1000.0)
            except Exception as e:
                raise InvariantViolation("RestartsAfterAnyCrash", f"{self.bookie_id}#{self.incarnation} failed to "
                                         f"start: {type(e).__name__}: {e}") from None
            self.stats["starts"] += 1
            self.stats["replayed_records"] += engine.replay_report.records
            self.stats["torn_tails"] += len(engine.replay_report.torn)
            self.alive = True
            self._network.set_up(self.bookie_id, True)
            self.session = self._store.session(f"{self.bookie_id}#{self.incarnation}")
            self.registered = False
            self._try_register()
            return
        raise AssertionError("unreachable: the last start attempt is never crashed")

    def crash(self, rng: random.Random) -> None:
        """Power loss now (see the module docstring)."""
        assert self.alive, f"{self.bookie_id} is not running"
        self._power_loss(f"{self.bookie_id}#{self.incarnation}", rng)

    def _power_loss(self, what: str, rng: random.Random) -> None:
        self.stats["crashes"] += 1
        self._log(f"CRASH {what}")
        for line in self.device.crash(rng) + self.kv.crash(rng):
            self._log(f"  lost: {line}")
        self.alive = False
        self._network.set_up(self.bookie_id, False)
        self.engine.abandon()
        for task in sorted(self._handlers, key=lambda t: t.sim_seq):
            task.cancel()
        session, self.session, self.registered = self.session, None, False
        if session is not None and self._store.is_alive(session):
            asyncio.get_running_loop().call_later(self._session_timeout_ms / 1000.0, self._expire_dead, session)

    def _expire_dead(self, session: SessionView) -> None:
        """ZooKeeper notices the dead process's session timed out."""
        if not self._store.is_alive(session):
            return
        removed = self._store.expire(session)
        self._log(f"metadata: session {session.name} expired (process gone), removed {removed}")
        self._try_register()

    async def stop(self) -> None:
        """Clean stop: deregister, close the engine (journal drained, checkpoint). Raises what close() raises."""
        assert self.alive
        self._log(f"clean stop of {self.bookie_id}#{self.incarnation}")
        session, self.session, self.registered = self.session, None, False
        if session is not None and self._store.is_alive(session):
            self._store.expire(session)  # closing the session removes its ephemeral node
        self.stopping = True
        try:
            await self.engine.close()
        finally:
            self.stopping = False
            self.alive = False
            self._network.set_up(self.bookie_id, False)
            for task in sorted(self._handlers, key=lambda t: t.sim_seq):
                task.cancel()

    def wipe_and_format(self, limbo_ledger_id_max: int) -> None:
        """The stopped bookie's disks are lost and the operator formats it: it starts next on new, empty devices
        (their rngs are streams of their own, so the rest of the world draws what it drew before), with the limbo
        bound the format drew from the ledger-id generator (`bksim bookie format` records it in the cookie)."""
        assert not self.alive, f"{self.bookie_id} must be stopped before it is formatted"
        self.formats += 1
        self.limbo_ledger_id_max = limbo_ledger_id_max
        self.device = SimDisk(self.spec.disk, self._rng(f"disk-format-{self.formats}"))
        self.kv = SimKvRegistry(self.spec.kv, self._rng(f"kv-format-{self.formats}"))
        self._log(f"FORMAT {self.bookie_id}: directories wiped, a new bookie with the same id starts next; "
                  f"ledgers <= {limbo_ledger_id_max} are in limbo")

    # -- registration ----------------------------------------------------------------------------------------
    def expire_session(self) -> None:
        """A metadata session expiry of the running bookie: its node vanishes; it re-registers later."""
        if not self.alive or self.session is None:
            return
        self.stats["session_expiries"] += 1
        session, self.session, self.registered = self.session, None, False
        removed = self._store.expire(session)
        self._log(f"metadata: SESSION EXPIRED {session.name}, removed {removed}")
        incarnation = self.incarnation

        def reopen() -> None:
            if self.alive and self.incarnation == incarnation and self.session is None:
                self.session = self._store.session(f"{self.bookie_id}#{self.incarnation}")
                self._try_register()
        asyncio.get_running_loop().call_later(self._reregister_ms / 1000.0, reopen)

    def _try_register(self) -> None:
        """Create /ledgers/available/<id> (in a task: the store's calls are async) unless a node of an earlier
        incarnation is still there (then the expiry of that session calls this again)."""
        if self.alive and not self.registered and self.session is not None:
            asyncio.get_running_loop().create_task(self._register(self.session), name=f"register {self.bookie_id}")

    async def _register(self, session: SessionView) -> None:
        if not self.alive or self.registered or self.session is not session:
            return
        path = paths.bookie_path(self.bookie_id)
        data = json.dumps({"bookie_id": self.bookie_id, "state": "writable",
                           "incarnation": self.incarnation}, sort_keys=True).encode()
        try:
            await session.create(path, data, ephemeral=True)
        except NodeExistsError:
            self._log(f"{self.bookie_id}#{self.incarnation}: registration waits: {path} still held by an "
                      f"earlier session")
            return
        except SessionExpiredError:
            return  # expired meanwhile: expire_session() opens the next session
        self.registered = True
        self._log(f"{self.bookie_id}#{self.incarnation}: registered {path}")


class SimCluster:
    """The bookies (by id, in a fixed order), the metadata store and the network of one simulated world."""

    def __init__(self, specs: list[BookieSpec], *, network: SimNetwork, rng: Callable[[str], random.Random],
                 log: Callable[[str], None], session_timeout_ms: float = 200.0, reregister_ms: float = 20.0,
                 clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self.network = network
        self.store = InMemoryMetadataStore()
        self._log = log
        self.bookies: dict[str, SimBookie] = {}
        for spec in specs:
            self.bookies[spec.bookie_id] = SimBookie(
                spec, clock=self.clock, store=self.store, network=network,
                rng=lambda part, b=spec.bookie_id: rng(f"{b}:{part}"), log=log,
                session_timeout_ms=session_timeout_ms, reregister_ms=reregister_ms)

    async def start_all(self) -> None:
        """Create the layout of `bksim cluster init` (PROTOCOL.md §3), then start every bookie (registered once
        the loop runs their registration tasks)."""
        for path in (paths.LEDGERS_ROOT, paths.AVAILABLE, paths.READONLY, paths.COOKIES):
            await self.store.create(path)
        await self.store.create(paths.INSTANCEID, CLUSTER_INSTANCE_ID.encode())
        for bookie in self.bookies.values():
            await bookie.start()
        await asyncio.sleep(0)

    async def registered(self) -> list[str]:
        """Bookie ids with a writable registration node now (what a broker sees), sorted."""
        return [name for name in await self.store.children(paths.AVAILABLE) if name != paths.READONLY_CHILD]

    def abandon(self) -> None:
        """End of run: stop every engine without touching the disks."""
        for bookie in self.bookies.values():
            if bookie.alive:
                bookie.alive = False
                bookie.engine.abandon()
                for task in sorted(bookie._handlers, key=lambda t: t.sim_seq):
                    task.cancel()
