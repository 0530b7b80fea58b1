"""What a chaos run sees of autorecovery (PROTOCOL.md §6): the marks, which closed ledgers still name a bookie,
the wait for full replication, and the copies themselves asked of each bookie.

- `ReplicaWatch(cluster)`: a kazoo session of its own on the cluster's ZooKeeper (closed by `close()`).
- `pending(lost)`: the marks left on CLOSED (or deleted) ledgers, and the CLOSED ledgers whose metadata still
  names a bookie of `lost`: both empty = every closed ledger fully replicated (an OPEN ledger is its writer's:
  its mark waits for the close, or for the workers' open-ledger grace, which a run does not wait for).
- `wait_replicated(lost, since, timeout_s)`: polls `pending` until empty (bounded); returns the seconds from
  `since` (the loss, on the monotonic clock) to the first poll that found it done, or None.
- `replica_problems(ledger_ids)`: every entry of each CLOSED ledger read from every bookie of its write set
  (ReadEntries, no broker): an entry missing on one, or copies that differ, is a problem.
- `read_all(address, ledger_id, ids)`: ReadEntries of `ids` from one bookie, in batches of READ_BATCH (ids a full
  answer left out asked again): {entry id: (status, bytes)}; a bookie that cannot be reached answers
  UNKNOWN_STATE for every id it did not answer (what the chaos checks and tests/integration ask bookies directly).
- `request_check_all(node, cwd)`: the operator's `bksim autorecovery check-all` with a bookie's configuration;
  `wait_check_all_ran(requested_ms, timeout_s)`: until the auditor has run a check of all ledgers that started
  after the request (it records the start in /ledgers/underreplication/checkallledgersctime once the check is
  done, so its marks are in place).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.clock import SystemClock
from bksim.adapters.local_cluster import LocalCluster, Node
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.autorecovery.marks import Mark, UnderReplicationMarks
from bksim.metadata.ledger_manager import list_ledger_ids, read_ledger_metadata
from bksim.metadata.paths import CHECK_ALL_LEDGERS_CTIME
from bksim.model.errors import NoNodeError
from bksim.model.status import StatusCode
from bksim.security.tls import ChannelSecurity

POLL_S = 0.25
READ_BATCH = 256
CHECK_ALL_TIMEOUT_S = 60.0
PROBLEMS_MAX = 20


class ReplicaWatch:
    def __init__(self, cluster: LocalCluster) -> None:
        self.zk = cluster.kazoo()
        self.tls = cluster.tls  # a TLS cluster's bookies are read over TLS with its client certificate

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def __enter__(self) -> "ReplicaWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def _pending(self, lost: set[str]) -> tuple[list[Mark], list[int]]:
        store = ZkMetadataStore(self.zk)
        naming: list[int] = []
        try:
            closed: dict[int, bool] = {}
            for ledger_id in await list_ledger_ids(store):
                try:
                    md, _ = await read_ledger_metadata(store, ledger_id)
                except NoNodeError:
                    continue
                closed[ledger_id] = md.is_closed
                if md.is_closed and any(b in s.ensemble for s in md.segments for b in lost):
                    naming.append(ledger_id)
            marks = [m for m in await UnderReplicationMarks(store, SystemClock()).list()
                     if closed.get(m.ledger_id, True)]
            return marks, naming
        finally:
            store.close()

    def pending(self, lost: set[str]) -> tuple[list[Mark], list[int]]:
        """(the marks left on CLOSED or deleted ledgers, the CLOSED ledgers still naming a bookie of `lost`)."""
        return asyncio.run(self._pending(lost))

    def wait_replicated(self, lost: set[str], since: float, timeout_s: float) -> tuple[float | None, str]:
        """(seconds from `since` to full replication or None past `timeout_s`, what was left at the end)."""
        deadline = time.monotonic() + timeout_s
        while True:
            marks, naming = self.pending(lost)
            if not marks and not naming:
                return time.monotonic() - since, ""
            if time.monotonic() >= deadline:
                left = ", ".join(f"{m.ledger_id} missing {'+'.join(m.missing)}"
                                 + (f" ({m.lost_entries} lost: {m.note})" if m.lost_entries else "")
                                 for m in marks[:10])
                return None, f"marks: [{left}]; closed ledgers naming {sorted(lost)}: {naming[:10]}"
            time.sleep(POLL_S)  # polling ZooKeeper: the next look at the marks and the metadata

    def wait_check_all_ran(self, requested_ms: int, timeout_s: float) -> float | None:
        """Seconds until a check of all ledgers started at or after `requested_ms` (wall) has been run, or None."""
        started = time.monotonic()
        while True:
            stat = self.zk.exists(CHECK_ALL_LEDGERS_CTIME)
            if stat is not None:
                try:
                    if int(self.zk.get(CHECK_ALL_LEDGERS_CTIME)[0]) >= requested_ms:
                        return time.monotonic() - started
                except ValueError:
                    pass
            if time.monotonic() - started >= timeout_s:
                return None
            time.sleep(POLL_S)  # polling ZooKeeper: the auditor records the check when it is done

    async def _problems(self, ledger_ids: list[int]) -> list[str]:
        store = ZkMetadataStore(self.zk)
        problems: list[str] = []
        try:
            for ledger_id in ledger_ids:
                try:
                    md, _ = await read_ledger_metadata(store, ledger_id)
                except NoNodeError:
                    continue
                if not md.is_closed:
                    problems.append(f"ledger {ledger_id} is not CLOSED")
                    continue
                wanted: dict[str, list[int]] = {}
                for entry_id in range(md.last_entry_id + 1):
                    for bookie in md.write_set(entry_id):
                        wanted.setdefault(bookie, []).append(entry_id)
                held = {b: await read_all(b, ledger_id, ids, self.tls) for b, ids in wanted.items()}
                for entry_id in range(md.last_entry_id + 1):
                    copies = {b: held[b].get(entry_id, (StatusCode.NO_ENTRY, b"")) for b in md.write_set(entry_id)}
                    bad = {b: s.name for b, (s, _) in copies.items() if s is not StatusCode.OK}
                    if bad:
                        problems.append(f"ledger {ledger_id} entry {entry_id}: {bad}")
                    elif len({data for _, data in copies.values()}) != 1:
                        problems.append(f"ledger {ledger_id} entry {entry_id}: the copies differ on {sorted(copies)}")
                if len(problems) >= PROBLEMS_MAX:
                    break
        finally:
            store.close()
        return problems[:PROBLEMS_MAX]

    def replica_problems(self, ledger_ids: list[int]) -> list[str]:
        """Entries of the CLOSED ledgers not held with identical bytes by every bookie of their write set."""
        return asyncio.run(self._problems(ledger_ids))


async def read_all(address: str, ledger_id: int, ids: list[int],
                   tls: ChannelSecurity | None = None) -> dict[int, tuple[StatusCode, bytes]]:
    """{entry id: (status, bytes)} for every id, asked of the bookie at `address` (the module docstring)."""
    got: dict[int, tuple[StatusCode, bytes]] = {}
    try:
        async with BookieClient(address, tls=tls) as client:
            pending = list(ids)
            while pending:
                batch, pending = pending[:READ_BATCH], pending[READ_BATCH:]
                results = await client.read_entries(ledger_id, batch)
                for entry_id, r in zip(batch, results):
                    if r.status is StatusCode.TOO_MANY_REQUESTS:  # the answer was full: ask again
                        pending.append(entry_id)
                    else:
                        got[entry_id] = (r.status, r.entry)
    except Exception as e:  # noqa: BLE001 - an unreachable replica holds nothing as far as the check goes
        return {i: (StatusCode.UNKNOWN_STATE, repr(e).encode()) for i in ids if i not in got} | got
    return got


def request_check_all(node: Node, cwd: str) -> tuple[int, str]:
    """`bksim autorecovery check-all` with `node`'s configuration (its environment): (wall ms just before the
    request, what it printed)."""
    requested_ms = int(time.time() * 1000)
    argv = [sys.executable, "-m", "bksim.cli.main", "autorecovery", "check-all"]
    done = subprocess.run(argv, cwd=cwd, env=node.env, capture_output=True, text=True, timeout=CHECK_ALL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"bksim autorecovery check-all failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout)[-400:]}")
    return requested_ms, " ".join(done.stdout.split())[:200]
