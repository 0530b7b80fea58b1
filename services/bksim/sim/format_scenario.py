"""The wiped-and-formatted bookie in the simulator: recovery must not truncate what a re-initialised bookie lost.

One seeded run of the real broker layer (LedgerService) and the real BookieEngine over the simulated network,
disks and metadata store:

    two bookies; broker-1 creates a ledger with E=Qw=Qa=2 and appends `entries` entries, every one acknowledged
    -> broker-1 dies (the ledger stays OPEN) -> bookie-2 dies, its disks are lost and it is formatted the way
    `bksim bookie format --force --delete-cookie` does it (the limbo bound drawn from the ledger-id generator)
    -> bookie-2 starts again as a new bookie with the same id -> broker-2 recovers the ledger and reads it back.

Every acknowledged entry is still on bookie-1, so the recovered ledger must end at or above the highest
acknowledged entry and read back byte for byte. The seed drives the network jitter, so the answers of the two
bookies arrive in a different order from seed to seed (the formatted bookie, holding nothing, tends to answer
first). With Qw = Qa one explicit negative proves an entry absent (PROTOCOL.md §4), so a formatted bookie that
answered NO_ENTRY / NO_LEDGER for the ledgers of its earlier incarnation would end the ledger early.

Determinism: the randomness comes from streams of the seed (plan.rng_for), time is the SimLoop's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
from dataclasses import dataclass, field

from bksim.broker.ledgers import LedgerService
from bksim.metadata.ledger_manager import allocate_ledger_id
from bksim.model.config import BookieConfig, BrokerConfig
from bksim.model.errors import LedgerError
from bksim.sim import loop as sim_loop
from bksim.sim.cluster import BookieSpec, SimCluster
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults
from bksim.sim.network import LinkFaults, SimBookieTransport, SimNetwork
from bksim.sim.plan import bookie_name, broker_name, rng_for
from bksim.sim.trace import Trace

ENTRIES_DEFAULT = 300
APPENDS_INFLIGHT_MAX = 32  # the writer's unacknowledged appends
SESSION_TIMEOUT_MS = 50.0
BOOKIE_TIMEOUT_MS = 100.0
PASSWORD = b"format-scenario"


@dataclass(slots=True)
class FormatRunResult:
    seed: int
    ledger_id: int
    acked_max: int  # the highest acknowledged entry id (every entry up to it was acknowledged)
    last_entry_id: int | None  # where recovery closed the ledger (None: recovery failed)
    recovery_error: str
    read_back: int  # entries 0..last_entry_id read back through broker-2 with the appended bytes
    read_error: str
    limbo_ledger_id_max: int
    formatted_answer: str  # the formatted bookie's answer, after the recovery, to a read of entry 0
    trace: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """What went wrong (empty: every acknowledged entry survived the format)."""
        out = []
        if self.last_entry_id is None:
            out.append(f"recovery of ledger {self.ledger_id} failed: {self.recovery_error}")
        elif self.last_entry_id < self.acked_max:
            out.append(f"ledger {self.ledger_id} CLOSED at {self.last_entry_id} below the acknowledged entry "
                       f"{self.acked_max}: {self.acked_max - self.last_entry_id} acknowledged entries lost")
        if self.read_error:
            out.append(f"read back: {self.read_error}")
        return out


def run_format_scenario(seed: int, entries: int = ENTRIES_DEFAULT) -> FormatRunResult:
    """Run the scenario of the module docstring for one seed on a fresh SimLoop."""
    try:
        return sim_loop.run(_run(seed, entries), seed=seed)
    finally:
        gc.collect()


async def _run(seed: int, entries: int) -> FormatRunResult:
    jitter_ms = rng_for(seed, "format-plan").choice([0.0, 0.3, 2.0])
    network = SimNetwork(rng_for(seed, "format-net"), LinkFaults(delay_ms=0.2, jitter_ms=jitter_ms))
    config = dataclasses.replace(BookieConfig(), journal_sync_on_loop=False)
    disk = DiskFaults(latency_ms_min=0.0, latency_ms_max=0.2)
    specs = [BookieSpec(bookie_name(i), config, disk, KvFaults()) for i in (1, 2)]
    cluster = SimCluster(specs, network=network, rng=lambda part: rng_for(seed, f"format-{part}"),
                         log=lambda line: None, session_timeout_ms=SESSION_TIMEOUT_MS)
    trace = Trace(cluster.clock.monotonic_ms)
    try:
        return await _scenario(seed, entries, cluster, network, trace)
    finally:
        cluster.abandon()


def _broker(name: str, seed: int, cluster: SimCluster, network: SimNetwork, trace: Trace) -> LedgerService:
    network.set_up(name, True)
    transport = SimBookieTransport(network, name, cluster.bookies, BOOKIE_TIMEOUT_MS)
    return LedgerService(store=cluster.store.session(name), transport=transport, rng=rng_for(seed, f"format-{name}"),
                         clock=cluster.clock, config=BrokerConfig(bookie_timeout_ms=int(BOOKIE_TIMEOUT_MS)),
                         log=lambda line: trace.add(f"{name}: {line}"))


async def _scenario(seed: int, entries: int, cluster: SimCluster, network: SimNetwork,
                    trace: Trace) -> FormatRunResult:
    await cluster.start_all()
    await cluster.clock.sleep_ms(1.0)  # the bookies' registration tasks run
    writer = _broker(broker_name(1), seed, cluster, network, trace)
    handle = await writer.create_ledger(2, 2, 2, password=PASSWORD)
    ledger_id = handle.ledger_id
    payloads = rng_for(seed, "format-payloads")
    appended: dict[int, bytes] = {}
    pending: list[asyncio.Future] = []
    for _ in range(entries):
        if len(pending) >= APPENDS_INFLIGHT_MAX:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending = [f for f in pending if not f.done()]
        data = payloads.randbytes(100)
        pending.append(handle.append(data))
        appended[handle.writer.last_add_pushed] = data
    await asyncio.gather(*pending)
    acked_max = handle.last_add_confirmed
    trace.add(f"ledger {ledger_id}: {entries} entries acknowledged (LAC {acked_max})")

    network.set_up(broker_name(1), False)  # the writer dies: the ledger stays OPEN
    await writer.close(close_ledgers=False)
    await writer.transport.close()
    wiped = cluster.bookies[bookie_name(2)]
    wiped.crash(rng_for(seed, "format-crash"))
    await cluster.clock.sleep_ms(2 * SESSION_TIMEOUT_MS)  # its registration expires (format refuses before)
    limbo_max = await allocate_ledger_id(cluster.store)  # what `bksim bookie format` records in the cookie
    wiped.wipe_and_format(limbo_max)
    await wiped.start()
    await cluster.clock.sleep_ms(1.0)

    recoverer = _broker(broker_name(2), seed, cluster, network, trace)
    last_entry_id, recovery_error = None, ""
    try:
        metadata = await recoverer.recover_ledger(ledger_id, password=PASSWORD)
        last_entry_id = metadata.last_entry_id
    except LedgerError as e:
        recovery_error = str(e)
    read_back, read_error = 0, ""
    if last_entry_id is not None and last_entry_id >= 0:
        try:
            async for entry in recoverer.read_entries(ledger_id, 0, last_entry_id, password=PASSWORD):
                if entry.payload != appended.get(entry.entry_id):
                    read_error = f"entry {entry.entry_id} reads back with other bytes"
                    break
                read_back += 1
        except LedgerError as e:
            read_error = str(e)
    await recoverer.close(close_ledgers=False)
    formatted_answer = (await wiped.engine.read_entry(ledger_id, 0))[0].name
    return FormatRunResult(seed, ledger_id, acked_max, last_entry_id, recovery_error, read_back, read_error,
                           limbo_max, formatted_answer, trace.lines)
