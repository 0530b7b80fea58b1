"""Real `bksim bookie run` processes for integration tests, and the workload helpers they share.

`BookieProcess` is one bookie of the local-cluster launcher (adapters.local_cluster, `launcher()` below: on
the session's ZooKeeper, configuration only through BKSIM_ environment variables, cwd the test's tmp dir so
no deploy/bksim.toml is read; the id is the bookie's default, host:port) and waits for observable conditions
with deadlines: the ZooKeeper registration owned by a new session, the process exit. Nothing here sleeps to
synchronise.
"""
from __future__ import annotations

import asyncio
import collections
import os
import random
from dataclasses import dataclass, field

from kazoo.client import KazooClient

from bksim.adapters import processes
from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.local_cluster import LocalCluster
from bksim.formats.entry import encode_entry, master_key
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode
from helpers import wait_until, wait_until_async

SESSION_TIMEOUT_MS = 2000  # with the fixture's 200 ms tick: a killed bookie's node expires in ~2 s
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
MARKER = "bksim.cli.main bookie run"
PASSWORD = b"secret"
KEY = master_key(PASSWORD)


def launcher(zookeeper, run_dir: str) -> LocalCluster:
    """The local-cluster launcher for test processes under `run_dir` on the session's ZooKeeper: children get
    none of this process's BKSIM_ variables, run in `run_dir`, and have a session timeout of SESSION_TIMEOUT_MS.
    Their bookies run without autorecovery: the session's ZooKeeper keeps the cookies of every module's stopped
    bookies, which an auditor counts as lost (tests/integration/test_autorecovery.py runs it on its own
    ZooKeeper)."""
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir,
                           child_env={"BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
                                      "BKSIM_AUTORECOVERY_ENABLED": "false"})
    cluster.attach_zookeeper(zookeeper)
    return cluster


class BookieProcess:
    """One bookie process with fixed directories (<base_dir>/<name>/journal, ledgers); can be started, killed
    and restarted."""

    def __init__(self, zookeeper, base_dir: str, name: str = "bookie", env: dict[str, str] | None = None,
                 journal_dir: str | None = None, ledger_dir: str | None = None, port: int | None = None) -> None:
        self.zookeeper = zookeeper
        self.launcher = launcher(zookeeper, str(base_dir))
        overrides = {"BKSIM_BOOKIE_HOST": None, "BKSIM_BOOKIE_BOOKIE_ID": None,  # the default id: host:port
                     "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000", "BKSIM_BOOKIE_DISK_CHECK_INTERVAL_MS": "100"}
        if journal_dir:
            overrides["BKSIM_BOOKIE_JOURNAL_DIR"] = journal_dir
        if ledger_dir:
            overrides["BKSIM_BOOKIE_LEDGER_DIR"] = ledger_dir
        overrides.update(env or {})
        self.node = self.launcher.add_bookie(port, env=overrides, name=name)
        self.base_dir = self.node.home
        os.makedirs(self.base_dir, exist_ok=True)
        self.port = self.node.port
        self.bookie_id = self.node.node_id
        self.address = self.bookie_id
        self.journal_dir = self.node.journal_dir
        self.ledger_dir = self.node.ledger_dir
        self.log_path = self.node.log_path
        self._popen = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.node.pid

    def environment(self) -> dict[str, str]:
        return dict(self.node.env)

    # -- life cycle --------------------------------------------------------------------------------------

    def spawn(self) -> int:
        """Start the process (does not wait for anything)."""
        self.starts += 1
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(f"\n===== start #{self.starts} =====\n")
        pid = self.launcher.spawn(self.node)
        self._popen = processes._children.get(pid)  # kept for the exit code (see report: exit_code(pid))
        return pid

    def start(self, zk: KazooClient, previous_owner: int | None = None) -> int:
        """Spawn and wait until registered by a session other than `previous_owner`; returns the new owner."""
        self.spawn()
        return self.wait_registered(zk, previous_owner)

    def wait_registered(self, zk: KazooClient, previous_owner: int | None = None, read_only: bool = False,
                        timeout_s: float = START_TIMEOUT_S) -> int:
        path = registration_path(self.bookie_id, read_only)

        def registered():
            if not self.alive():
                raise AssertionError(f"bookie exited with {self.exit_code()} during start-up:\n{self.log_tail()}")
            stat = zk.exists(path)
            return stat is not None and stat.ephemeralOwner != previous_owner and stat.ephemeralOwner

        try:
            return wait_until(registered, timeout_s, interval_s=0.05, message=f"{path} registered")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- bookie log ---\n{self.log_tail()}") from None

    def owner(self, zk: KazooClient, read_only: bool = False) -> int | None:
        stat = zk.exists(registration_path(self.bookie_id, read_only))
        return stat.ephemeralOwner if stat is not None else None

    def alive(self) -> bool:
        return processes.is_alive(self.pid, MARKER)

    def kill9(self) -> None:
        assert processes.kill9(self.pid, timeout_s=10.0, expect_in_cmdline=MARKER), f"pid {self.pid} survived SIGKILL"

    def terminate(self) -> int | None:
        """SIGTERM and wait (bounded) for the exit; returns the exit code."""
        assert processes.terminate(self.pid, MARKER), f"bookie pid {self.pid} not running:\n{self.log_tail()}"
        assert processes.wait_exit(self.pid, STOP_TIMEOUT_S), f"bookie did not exit after SIGTERM:\n{self.log_tail()}"
        return self.exit_code()

    def wait_exit(self, timeout_s: float = START_TIMEOUT_S) -> int | None:
        assert processes.wait_exit(self.pid, timeout_s), f"bookie still running:\n{self.log_tail()}"
        return self.exit_code()

    def exit_code(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def cleanup(self) -> None:
        if self.pid is not None and self.alive():
            self.launcher.stop(self.node, STOP_TIMEOUT_S)

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_tail(self, lines: int = 40) -> str:
        return processes.tail(self.log_path, lines)

    def last_start_log(self) -> str:
        return self.log_text().rsplit("===== start #", 1)[-1]


def registration_path(bookie_id: str, read_only: bool = False) -> str:
    return f"/ledgers/available/{'readonly/' if read_only else ''}{bookie_id}"


def kazoo_client(zookeeper) -> KazooClient:
    import logging
    client = KazooClient(hosts=zookeeper.connect, timeout=5.0, logger=logging.getLogger("tests.kazoo"))
    client.start(timeout=10.0)
    return client


# -- workload ------------------------------------------------------------------------------------------

@dataclass
class Workload:
    """Entries for a few interleaved ledgers with varied, deterministic payloads; remembers what was acked."""

    ledgers: tuple[int, ...]
    seed: int = 1
    payload_bytes_max: int = 3000
    next_entry: dict[int, int] = field(default_factory=dict)
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        for ledger in self.ledgers:
            self.next_entry.setdefault(ledger, 0)

    def batch(self, size: int) -> list[tuple[bytes, bytes, int]]:
        out = []
        for _ in range(size):
            ledger = self._rng.choice(self.ledgers)
            entry_id = self.next_entry[ledger]
            self.next_entry[ledger] = entry_id + 1
            payload = self._rng.randbytes(self._rng.randint(0, self.payload_bytes_max))
            out.append((encode_entry(ledger, entry_id, entry_id - 1, 0, payload), KEY, 0))
        return out

    def record(self, entries, statuses) -> int:
        n = 0
        for (entry, _, _), status in zip(entries, statuses):
            if status == StatusCode.OK:
                ledger, entry_id = int.from_bytes(entry[:8], "big", signed=True), int.from_bytes(entry[8:16], "big", signed=True)
                self.acked[(ledger, entry_id)] = entry
                n += 1
        return n


async def stream_until(client: BookieClient, workload: Workload, acked_target: int, batch_size: int,
                       window_max: int = 16, on_target=None) -> int:
    """Pipeline batches until `acked_target` entries are acknowledged, then call `on_target()` (e.g. kill -9)
    and collect every answer that still arrived. Returns the number of acknowledged entries.

    Before `on_target` every answer must be OK; after it, an unanswered batch has an unknown outcome.
    """
    stream = client.add_stream(window_max=window_max, response_timeout_s=10.0)
    inflight: collections.deque = collections.deque()
    fired = False
    batch_id = 0
    try:
        while True:
            if not fired and len(workload.acked) >= acked_target:
                fired = True
                if on_target is not None:
                    on_target()
            if not fired and len(inflight) < window_max:
                entries = workload.batch(batch_size)
                inflight.append((await stream.send(batch_id, entries), entries))
                batch_id += 1
                continue
            if not inflight:
                break
            future, entries = inflight.popleft()
            try:
                result = await stream.result(future)
            except BookieUnreachable:
                if fired:
                    break  # answers are in order: nothing later was answered either
                raise
            if not fired:
                assert all(s == StatusCode.OK for s in result.statuses), result
            workload.record(entries, result.statuses)
    finally:
        await stream.close(timeout_s=2.0)
    return len(workload.acked)


async def read_back(client: BookieClient, expected: dict[tuple[int, int], bytes], concurrency: int = 64) -> list[str]:
    """Read every expected entry; return a list of problems (empty = all identical)."""
    problems: list[str] = []
    keys = sorted(expected)
    for i in range(0, len(keys), concurrency):
        chunk = keys[i:i + concurrency]
        results = await asyncio.gather(*(client.read_entry(l, e) for l, e in chunk))
        for (l, e), r in zip(chunk, results):
            if r.status != StatusCode.OK:
                problems.append(f"{l}:{e} -> {r.status.name} {r.message}")
            elif r.entry != expected[(l, e)]:
                problems.append(f"{l}:{e} -> different bytes ({len(r.entry)} vs {len(expected[(l, e)])})")
    return problems


async def wait_serving(address: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until the bookie's gRPC health check says SERVING (bounded)."""
    async with BookieClient(address, deadline_s=1.0) as client:
        async def serving() -> bool:
            try:
                return await client.health() == "SERVING"
            except BookieUnreachable:
                return False
        await wait_until_async(serving, timeout_s, interval_s=0.05, message=f"bookie {address} SERVING")
