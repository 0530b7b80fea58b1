"""Autorecovery on real processes: a private ZooKeeper, five `bksim bookie run` processes with autorecovery on
(each runs an auditor candidate and a replication worker; no lost-bookie delay, short intervals through
BKSIM_AUTORECOVERY_* variables) and one `bksim broker run`, all from the local-cluster launcher.

- Decommission refuses a registered bookie and an unknown id: exit 2, a clear error, nothing changed.
- `bksim autorecovery check-all` is run by the elected auditor.
- With autorecovery disabled a mark stays and nothing is copied (a decommission bounded to a few seconds gives
  up and keeps the cookie); once enabled the workers replace the stopped bookie in every ledger, and the
  decommission then deletes its cookie.
- A bookie killed -9 for good: every closed ledger's metadata stops naming it, and every entry is on the Qw
  bookies of its segment's write set with identical bytes, asked directly; then a second bookie that shared
  write sets with the first is killed for good: every acknowledged entry still reads back through the broker
  (without the repair, the entries whose write set was those two bookies would have had no copy left); once
  that one is replaced too, the journal audit (`bksim audit --local` over every bookie's journals and entry
  logs, the dead ones' included) is clean and counts every entry of these ledgers on Qw bookies.
- An OPEN ledger loses a bookie: with its writer appending, the writer's own ensemble change replaces it in a
  new segment, the workers copy the earlier segment while the writer goes on, and the writer's close keeps
  the workers' replacement; an idle writer's ledger is left to it for the open-ledger grace, then recovered
  (fenced, closed) and copied. Every acknowledged entry reads back.
- The auditor (found from the election votes, whichever bookie it is) killed -9: another candidate becomes the
  auditor and marks the dead one's ledger (as wide as the cluster, so no worker can repair it); deleted, a
  worker removes its mark.
- A bookie stopped (SIGSTOP) until its sessions expire votes again on a new session once it runs again.
- `bksim autorecovery run` alone votes, and on SIGTERM stops within its bounds and closes its session.
- A replication worker killed -9 mid-copy (a `bksim autorecovery run` held to a low copy rate, on a cluster of
  its own whose bookies run no autorecovery): the metadata still names the lost bookie, the lock dies with the
  worker's session, another worker finishes, and the replacement's partial copies are identical to the rest.

Every test leaves the module's cluster with no mark and with every closed ledger fully replicated, and brings
it back to the bookies it needs, so the tests run in any order. A private ZooKeeper: the session's holds the
cookies of every other module's stopped bookies, which an auditor rightly counts as lost, and their ledgers
would keep the workers busy. Every wait is bounded; nothing sleeps to synchronise.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoNodeError

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.broker_client import BrokerCallError
from bksim.adapters.clock import SystemClock
from bksim.adapters.local_cluster import LocalCluster, Node
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.autorecovery.auditor import required_entries
from bksim.autorecovery.marks import Mark, UnderReplicationMarks, decode_mark
from bksim.chaos.replicas import read_all
from bksim.gen import broker_pb2
from bksim.metadata import ledger_metadata
from bksim.metadata.ledger_manager import list_ledger_ids
from bksim.metadata.paths import (AUDITOR_ELECTION, AVAILABLE, CHECK_ALL_LEDGERS_CTIME, READONLY_CHILD,
                                  SEQUENCE_DIGITS, cookie_path, ledger_path, underreplicated_path,
                                  underreplication_lock_path)
from bksim.model.status import StatusCode
from helpers import wait_until
from integration.broker_harness import BrokerConn, check_ledger_contents, payload, stream_appends
from pty_run import assert_ends_clean, frames, run_on_tty

PASSWORD = b"autorecovery"
SESSION_TIMEOUT_MS = 2000
OPEN_LEDGER_GRACE_MS = 2000
ENV = {
    "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_AUTORECOVERY_ENABLED": "true",
    "BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS": "0",
    "BKSIM_AUTORECOVERY_BOOKIE_CHECK_INTERVAL_MS": "200",
    "BKSIM_AUTORECOVERY_WORKER_BACKOFF_MS": "300",
    "BKSIM_AUTORECOVERY_OPEN_LEDGER_REREPLICATION_GRACE_MS": str(OPEN_LEDGER_GRACE_MS),
}
REPAIR_TIMEOUT_S = 90.0
GONE_TIMEOUT_S = 3 * SESSION_TIMEOUT_MS / 1000 + 5  # a killed bookie's registration expires with its session
CLI_TIMEOUT_S = 60.0
DAEMON_EXIT_S = 2.0 + 2 * SESSION_TIMEOUT_MS / 1000 + 5  # its loops' stop, its session's close, with room
BOOKIES = 5  # the module cluster's bookies; a test that loses some starts new ones first
# the worker killed mid-copy: ~2,000 entries of ~400 bytes to copy at 32 KiB/s take ~25 s, so the copy is
# still running when the test sees the replacement hold some of them; the other worker copies at full speed
VICTIM_BYTES_PER_S = 32 * 1024
MID_COPY_LEDGER_ENTRIES = 3000
APPEND_BATCH = 20


@contextlib.contextmanager
def local_cluster(run_dir: str, cwd: str, bookies: int, child_env: dict[str, str],
                  bookie_env: dict[int, dict[str, str]] | None = None):
    """A private ZooKeeper, `bookies` bookies and one broker from the local-cluster launcher, with `zk` (a kazoo
    session of the test's); `bookie_env`: extra environment of bookie i (0-based); everything stopped by pid at
    the end."""
    c = LocalCluster(run_dir, inherit_bksim_env=False, cwd=cwd, child_env=child_env)
    try:
        c.start_zookeeper(tick_time_ms=200, heap_mb=128)
        for i in range(bookies):
            c.add_bookie(env=(bookie_env or {}).get(i))
        c.add_broker()
        c.start(c.nodes, serving=True)
        c.zk = c.kazoo()
        yield c
    finally:
        if getattr(c, "zk", None) is not None:
            c.zk.stop()
            c.zk.close()
        c.stop_all(bookie_grace_s=10, broker_grace_s=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("autorecovery"))
    with local_cluster(run_dir, run_dir, BOOKIES, ENV) as c:
        yield c


@pytest.fixture
def workerless(tmp_path):
    """Four bookies whose processes run no autorecovery and a broker, on a ZooKeeper of their own: only the
    `bksim autorecovery run` processes a test starts (`daemon`) audit and copy."""
    with local_cluster(str(tmp_path / "workerless"), str(tmp_path), 4,
                       {**ENV, "BKSIM_AUTORECOVERY_ENABLED": "false"}) as c:
        yield c


# -- helpers ---------------------------------------------------------------------------------------------------

def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], env=cluster.base_env(), cwd=cluster.cwd,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


@contextlib.contextmanager
def daemon(cluster: LocalCluster, owner_id: str, env: dict[str, str] | None = None):
    """`bksim autorecovery run --id owner_id` (its log in <run_dir>/<owner_id>.log) until the block ends: then
    SIGTERM by pid, SIGKILL past its bounds (a test may have killed it already)."""
    log_path = os.path.join(cluster.run_dir, f"{owner_id}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", "autorecovery", "run", "--id", owner_id],
                                env={**cluster.base_env(), **(env or {})}, cwd=cluster.cwd,
                                stdout=subprocess.DEVNULL, stderr=log)
    proc.log_path = log_path
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(DAEMON_EXIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def read_log(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def metadata(cluster, ledger_id: int) -> ledger_metadata.LedgerMetadata:
    data, _ = cluster.zk.get(ledger_path(ledger_id))
    return ledger_metadata.decode(data)


def marks(cluster) -> list:
    async def listing():
        store = ZkMetadataStore(cluster.zk)
        try:
            return await UnderReplicationMarks(store, SystemClock()).list()
        finally:
            store.close()
    return asyncio.run(listing())


def ledger_ids(cluster) -> list[int]:
    async def listing():
        store = ZkMetadataStore(cluster.zk)
        try:
            return sorted(await list_ledger_ids(store))
        finally:
            store.close()
    return asyncio.run(listing())


def mark_of(cluster, ledger_id: int) -> Mark | None:
    try:
        data, stat = cluster.zk.get(underreplicated_path(ledger_id))
    except NoNodeError:
        return None
    return decode_mark(ledger_id, data, stat.version)


def lock_owner(cluster, ledger_id: int) -> str | None:
    try:
        return cluster.zk.get(underreplication_lock_path(ledger_id))[0].decode()
    except NoNodeError:
        return None


def named(cluster, ledgers, bookie_id: str) -> list[int]:
    return [lid for lid in ledgers if any(bookie_id in s.ensemble for s in metadata(cluster, lid).segments)]


def live_bookies(cluster) -> list:
    return [b for b in cluster.bookies if b.alive()]


def bookie(cluster, bookie_id: str) -> Node:
    return next(b for b in cluster.bookies if b.node_id == bookie_id)


def writable(cluster) -> set[str]:
    return {c for c in cluster.zk.get_children(AVAILABLE) if c != READONLY_CHILD}


def settle(cluster) -> None:
    """Wait until the writable registrations are exactly the live bookies (a killed one's lingers)."""
    live = {b.node_id for b in live_bookies(cluster)}
    wait_until(lambda: writable(cluster) == live, GONE_TIMEOUT_S, interval_s=0.05,
               message=f"writable registrations to be exactly the live bookies {sorted(live)}")


def ensure_live(cluster, count: int) -> None:
    """Start new bookies until `count` run (a killed one stays dead), then settle."""
    added = [cluster.add_bookie() for _ in range(count - len(live_bookies(cluster)))]
    if added:
        cluster.start(added, serving=True)
    settle(cluster)


def write_ledgers(cluster, count: int, entries: int, ensemble: int = 3) -> dict[int, dict[int, bytes]]:
    """`count` closed E=`ensemble` Qw=2 Qa=2 ledgers of at least `entries` entries: {ledger id: acknowledged
    {entry id: payload}}."""
    out = {}
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        for _ in range(count):
            lid = conn.create(ensemble, 2, 2, PASSWORD).ledger_id
            run = stream_appends(conn, lid, PASSWORD, batch=50, window=8, target=entries, total=entries)
            # the stream may have more in flight when `entries` are acknowledged: all of them count
            assert run.error is None and sorted(run.acked) == list(range(len(run.acked))), run.error
            closed = conn.close_ledger(lid, PASSWORD)
            assert closed.last_entry_id == len(run.acked) - 1, closed
            out[lid] = run.acked
    return out


def wait_repaired(cluster, ledgers, bookie_id: str, on_poll=lambda: None) -> None:
    """Until no ledger's metadata names `bookie_id` and no mark is left (bounded); `on_poll()` runs first on
    every look."""
    def done():
        on_poll()
        return not named(cluster, ledgers, bookie_id) and not marks(cluster)
    try:
        wait_until(done, REPAIR_TIMEOUT_S, interval_s=0.2,
                   message=f"autorecovery to replace {bookie_id} in every ledger and remove every mark")
    except AssertionError as e:
        raise AssertionError(f"{e}\nstill naming it: {named(cluster, ledgers, bookie_id)}; marks: {marks(cluster)}"
                             f"\n{cluster.logs(15)}") from None


def votes(cluster) -> list[tuple[str, str]]:
    """(vote name, owner id) of every vote, lowest (the auditor's) first."""
    names = sorted(cluster.zk.get_children(AUDITOR_ELECTION), key=lambda n: int(n[-SEQUENCE_DIGITS:]))
    out = []
    for name in names:
        try:
            out.append((name, cluster.zk.get(f"{AUDITOR_ELECTION}/{name}")[0].decode()))
        except NoNodeError:
            continue  # its session ended since the listing
    return out


def vote_owners(cluster) -> list[str]:
    return [owner for _, owner in votes(cluster)]


def elected(cluster) -> str | None:
    """The auditor as the election znodes say: the owner of the lowest vote."""
    owners = vote_owners(cluster)
    return owners[0] if owners else None


def replica_problems(cluster, ledger_id: int) -> list[str]:
    """Entries of a CLOSED ledger not held, with identical bytes, by every bookie of their write set."""
    md = metadata(cluster, ledger_id)
    assert md.is_closed, md
    wanted: dict[str, list[int]] = {}
    for entry_id in range(md.last_entry_id + 1):
        for b in md.write_set(entry_id):
            wanted.setdefault(b, []).append(entry_id)
    held = {b: asyncio.run(read_all(b, ledger_id, ids)) for b, ids in wanted.items()}
    problems = []
    for entry_id in range(md.last_entry_id + 1):
        copies = {b: held[b][entry_id] for b in md.write_set(entry_id)}
        bad = {b: s.name for b, (s, _) in copies.items() if s is not StatusCode.OK}
        if bad:
            problems.append(f"ledger {ledger_id} entry {entry_id}: {bad}")
        elif len({data for _, data in copies.values()}) != 1:
            problems.append(f"ledger {ledger_id} entry {entry_id}: the copies differ on {sorted(copies)}")
    return problems[:10]


def held_ids(address: str, ledger_id: int) -> set[int]:
    """The entry ids of the ledger the bookie lists (ListEntries, every page); none for NO_LEDGER."""
    async def listing() -> set[int]:
        ids: set[int] = set()
        async with BookieClient(address) as client:
            first = 0
            while True:
                page = await client.list_entries(ledger_id, first)
                if page.status is StatusCode.NO_LEDGER:
                    return ids
                assert page.status is StatusCode.OK, page
                for low, high in page.ranges:
                    ids.update(range(low, high + 1))
                if page.next_entry < 0:
                    return ids
                first = page.next_entry
    return asyncio.run(listing())


class Appender:
    """One writer's appends to an OPEN ledger through the broker, one AppendRequest at a time, each payload the
    one for its append index; `acked` = what the responses acknowledged."""

    def __init__(self, conn: BrokerConn, ledger_id: int) -> None:
        self.conn = conn
        self.ledger_id = ledger_id
        self.acked: dict[int, bytes] = {}

    def append(self, count: int) -> str | None:
        """Append `count` entries: None when acknowledged, else how the broker refused (then this writer
        stops: the batch's outcome is unknown)."""
        first = len(self.acked)
        payloads = [payload(self.ledger_id, first + i) for i in range(count)]
        try:
            response = self.conn.append_once(self.ledger_id, PASSWORD, payloads)
        except BrokerCallError as e:
            return f"{e.status}: {e}"
        if response.error:
            return broker_pb2.LedgerStatus.Name(response.error)
        assert (response.first_entry_id, response.count) == (first, count), response
        self.acked.update((first + i, data) for i, data in enumerate(payloads))
        return None


def read_back(cluster, ledgers: dict[int, dict[int, bytes]]) -> None:
    """Every acknowledged entry of each CLOSED ledger reads back through the broker, and nothing else."""
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        for lid, acked in ledgers.items():
            last = metadata(cluster, lid).last_entry_id
            assert check_ledger_contents(lid, conn.read(lid, PASSWORD, 0, last), last, acked) == []


def audit(cluster, out_dir: str) -> dict:
    """`bksim audit --local` over every bookie's journals and entry logs under the run directory, the dead ones'
    too, against the metadata in ZooKeeper now: its report.json (asserting a clean exit)."""
    zookeeper = f"{cluster.zookeeper.host}:{cluster.zookeeper.port}"
    done = cli(cluster, "audit", "--journals", cluster.run_dir, "--entrylogs", cluster.run_dir,
               "--zookeeper", zookeeper, "--out", out_dir, "--local", "--quiet", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout)["verdict"] == "clean", done.stdout
    with open(os.path.join(out_dir, "report.json"), encoding="utf-8") as f:
        return json.load(f)


# -- tests ---------------------------------------------------------------------------------------------------------

def test_decommission_refuses_a_registered_and_an_unknown_bookie(cluster):
    settle(cluster)
    live = live_bookies(cluster)[0].node_id
    before = cluster.zk.get(cookie_path(live))
    refused = cli(cluster, "bookie", "decommission", live, "--timeout-s", "5")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"bookie {live} is registered (writable): stop it first" in refused.stderr, refused.stderr
    unknown = cli(cluster, "bookie", "decommission", "127.0.0.1:9", "--timeout-s", "5")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "unknown bookie 127.0.0.1:9: no cookie" in unknown.stderr, unknown.stderr
    assert cluster.zk.get(cookie_path(live)) == before and marks(cluster) == []

    bookie_ids = {b.node_id for b in live_bookies(cluster)}  # a killed one's vote lives as long as its session
    wait_until(lambda: sorted(vote_owners(cluster)) == sorted(bookie_ids), GONE_TIMEOUT_S + 10,
               message=f"exactly the live bookies {sorted(bookie_ids)} to vote")
    status = cli(cluster, "autorecovery", "status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["auditor"] == elected(cluster) and doc["auditor"] in bookie_ids, doc
    assert set(doc["candidates"]) == bookie_ids, doc
    # the bookies killed by other tests and not decommissioned keep their cookies: known, not registered
    dead = {b.node_id for b in cluster.bookies if not b.alive() and cluster.zk.exists(cookie_path(b.node_id))}
    assert doc["disabled"] is False and doc["marks"] == [] and set(doc["bookies"]["missing"]) == dead, doc


def test_check_all_from_the_command_line_is_run_by_the_elected_auditor(cluster):
    wait_until(lambda: vote_owners(cluster), 30, interval_s=0.1, message="an auditor to be elected")
    requested_ms = int(time.time() * 1000)
    done = cli(cluster, "autorecovery", "check-all")
    assert done.returncode == 0, done.stderr
    assert "check of all ledgers requested: the auditor 127.0.0.1:" in done.stdout, done.stdout

    def ran_since() -> bool:  # the auditor records when the check it ran started (0 = asked for, not yet run)
        return int(cluster.zk.get(CHECK_ALL_LEDGERS_CTIME)[0]) >= requested_ms
    wait_until(ran_since, 30, interval_s=0.1, message="the auditor to run the requested check of all ledgers")


def test_check_all_here_and_decommission_show_progress_on_a_terminal(cluster):
    write_ledgers(cluster, 2, 5)
    status, stdout, terminal = run_on_tty("autorecovery", "check-all", "--verify-percentage", "0", cwd=cluster.cwd,
                                          **{k: v for k, v in cluster.base_env().items() if k.startswith("BKSIM_")})
    assert status == 0 and stdout.startswith("check of all ledgers (verifying 0% of the entries): "), terminal
    ledgers = int(re.search(r": (\d+) ledgers, ", stdout).group(1))
    assert any(f"/{ledgers} ledgers" in f for f in frames(terminal) if f.startswith("check of all ledgers")), terminal
    assert_ends_clean(terminal)
    status, stdout, terminal = run_on_tty("bookie", "decommission", "127.0.0.1:1", cwd=cluster.cwd,
                                          **{k: v for k, v in cluster.base_env().items() if k.startswith("BKSIM_")})
    assert (status, stdout) == (2, "") and any(f.startswith("decommission 127.0.0.1:1") for f in frames(terminal))
    last = terminal.rstrip("\n").rsplit("\n", 1)[-1].split("\r")[-1]  # the line erased, then the error alone
    assert last.startswith("bksim: error: unknown bookie 127.0.0.1:1"), terminal


def test_disable_keeps_marks_unrepaired_enable_resumes_and_decommission_deletes_the_cookie(cluster):
    ensure_live(cluster, 4)  # E=3 and one loss: a spare bookie to copy to
    ledgers = write_ledgers(cluster, 2, 300)
    assert cli(cluster, "autorecovery", "disable").returncode == 0
    assert json.loads(cli(cluster, "autorecovery", "status", "--json").stdout)["disabled"] is True
    gone = next(b for b in cluster.bookies if b.node_id in metadata(cluster, min(ledgers)).segments[0].ensemble)
    cluster.kill9(gone)
    settle(cluster)

    waited = cli(cluster, "bookie", "decommission", gone.node_id, "--timeout-s", "3")
    assert waited.returncode == 2, waited.stdout + waited.stderr
    assert "autorecovery is disabled" in waited.stdout and "not decommissioned within 3 s" in waited.stderr, \
        waited.stdout + waited.stderr
    # marked: every ledger that names it, this test's and those of the tests that ran before
    naming = named(cluster, ledger_ids(cluster), gone.node_id)
    assert named(cluster, ledgers, gone.node_id) and sorted(m.ledger_id for m in marks(cluster)) == naming, \
        (naming, marks(cluster))
    assert all(m.missing == (gone.node_id,) for m in marks(cluster)), marks(cluster)
    assert cluster.zk.exists(cookie_path(gone.node_id)) is not None
    listed = json.loads(cli(cluster, "autorecovery", "list-underreplicated", "--json").stdout)
    assert [r["ledger_id"] for r in listed] == naming and all(r["claimed_by"] is None for r in listed), listed
    table = cli(cluster, "autorecovery", "list-underreplicated").stdout
    assert all(f"{lid:>8}  {gone.node_id}" in table for lid in naming), table
    text = cli(cluster, "autorecovery", "status").stdout
    missing = next(line for line in text.splitlines() if line.startswith("bookies:")).partition("missing: ")[2]
    assert "autorecovery: DISABLED" in text and gone.node_id in missing.split(", "), text

    assert cli(cluster, "autorecovery", "enable").returncode == 0
    wait_repaired(cluster, naming, gone.node_id)
    done = cli(cluster, "bookie", "decommission", gone.node_id, "--timeout-s", "30", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert cluster.zk.exists(cookie_path(gone.node_id)) is None
    assert json.loads(done.stdout.splitlines()[-1])["bookie"] == gone.node_id
    for lid in ledgers:
        assert replica_problems(cluster, lid) == []


def test_a_bookie_lost_for_good_is_replaced_everywhere_and_a_second_loss_loses_nothing(cluster, tmp_path):
    ensure_live(cluster, BOOKIES)
    ledgers = write_ledgers(cluster, 6, 500)
    ensembles = {lid: metadata(cluster, lid).segments[0].ensemble for lid in ledgers}
    counts = {b.node_id: sum(b.node_id in e for e in ensembles.values()) for b in live_bookies(cluster)}
    first = max(counts, key=lambda b: (counts[b], b))
    # the second loss: the bookie that shares the most ledgers with the first, so some entries were on those two only
    shared = {b: sum(first in e and b in e for e in ensembles.values()) for b in counts if b != first}
    second = max(shared, key=lambda b: (shared[b], b))
    only_those_two = [(lid, i) for lid, acked in ledgers.items() for i in acked
                      if set(metadata(cluster, lid).write_set(i)) == {first, second}]
    assert only_those_two, "no entry had its only copies on the two bookies this test loses"

    cluster.kill9(cluster.node(next(b.name for b in cluster.bookies if b.node_id == first)))
    wait_repaired(cluster, ledgers, first)
    for lid in ledgers:
        assert replica_problems(cluster, lid) == []
    replicas = cli(cluster, "ledger", "replicas", str(min(ledgers)), "--json")
    assert replicas.returncode == 0, replicas.stderr
    rows = [r for s in json.loads(replicas.stdout)["segments"] for r in s["replicas"]]
    assert rows and all(r["status"] == "OK" and r["missing"] == 0 and r["holds_count"] >= r["should_hold"] > 0
                        for r in rows), rows
    text = cli(cluster, "ledger", "replicas", str(min(ledgers))).stdout
    assert f"ledger {min(ledgers)}: CLOSED E=3 Qw=2 Qa=2" in text and first not in text, text

    cluster.kill9(bookie(cluster, second))
    read_back(cluster, ledgers)

    # the second loss repaired too (three bookies left: E=3 ledgers that named it have one spare), the journal
    # audit over every bookie's files, the two dead ones' included, finds every entry on Qw bookies of its
    # segment, with no violation and nothing under-replicated or unverifiable
    wait_repaired(cluster, ledgers, second)
    report = audit(cluster, str(tmp_path / "audit"))
    totals = report["totals"]
    assert (totals["violations"], totals["under_replicated_entries"], totals["unverifiable_entries"]) == (0, 0, 0), \
        (totals, report["reported"][:5], report["warnings"][:5])
    assert {first, second} <= {b["bookie"] for b in report["inputs"]["bookies"]}, report["inputs"]["bookies"]
    results = {r["ledger"]: r for r in report["ledgers"]}
    for lid, acked in ledgers.items():
        result = results[lid]
        assert result["state"] == "CLOSED" and result["last_entry_id"] == len(acked) - 1, result
        # histogram: {holders among the segment's ensemble: entries}; every entry on exactly Qw = 2
        assert result["histogram"] == {"2": len(acked)} and result["rule_counts"] == {}, result


def test_the_auditor_killed_is_followed_by_another_that_marks_its_ledgers(cluster):
    ensure_live(cluster, 4)  # three left after the loss: a spare for the other E=3 ledgers that name the auditor
    live = {b.node_id for b in live_bookies(cluster)}  # a killed bookie's vote lives as long as its session
    old = wait_until(lambda: (current := elected(cluster)) in live and current, GONE_TIMEOUT_S + 10, interval_s=0.1,
                     message=f"one of the live bookies {sorted(live)} to own the lowest vote")
    # E = every live bookie: the auditor's among them, and no spare to replace it once it is gone, so the new
    # auditor's mark stays (until the ledger is deleted at the end of this test)
    (lid,) = write_ledgers(cluster, 1, 100, ensemble=len(live))
    assert old in metadata(cluster, lid).segments[0].ensemble and elected(cluster) == old
    cluster.kill9(bookie(cluster, old))
    live.discard(old)
    new = wait_until(lambda: (current := elected(cluster)) in live and current, GONE_TIMEOUT_S + 10, interval_s=0.1,
                     message=f"a live bookie of {sorted(live)} to own the lowest vote after {old} was killed")
    wait_until(lambda: any(m.ledger_id == lid and old in m.missing for m in marks(cluster)), 30, interval_s=0.2,
               message=f"the new auditor {new} to mark ledger {lid}, which names {old}")
    status = json.loads(cli(cluster, "autorecovery", "status", "--json").stdout)
    assert status["auditor"] == new, status
    # a ledger as wide as the cluster was would keep a mark whenever a later test loses a bookie: deleted, and a
    # worker removes its mark (the ledger is gone); the other ledgers that named the auditor are repaired
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        conn.client.delete_ledger(lid, password=PASSWORD)
    wait_repaired(cluster, ledger_ids(cluster), old)


def test_a_bookie_whose_session_expired_votes_again_on_a_new_session(cluster):
    frozen = live_bookies(cluster)[0]
    wait_until(lambda: frozen.node_id in vote_owners(cluster), 30, interval_s=0.1,
               message=f"{frozen.node_id} to vote")
    cluster.pause(frozen)  # SIGSTOP: its ZooKeeper sessions expire, its vote with them
    try:
        wait_until(lambda: frozen.node_id not in vote_owners(cluster), GONE_TIMEOUT_S + 10, interval_s=0.1,
                   message=f"the vote of the stopped bookie {frozen.node_id} to expire with its session")
    finally:
        cluster.resume(frozen)
    wait_until(lambda: frozen.node_id in vote_owners(cluster), 30, interval_s=0.1,
               message=f"{frozen.node_id} to vote again on a new session")
    # (whether its auditor met the expiry as an error or its store had already bound the new session, it voted)
    assert frozen.alive()


def test_autorecovery_run_alone_votes_and_stops_cleanly_on_sigterm(cluster):
    alone = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", "autorecovery", "run", "--id", "standalone"],
                             env=cluster.base_env(), cwd=cluster.cwd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "standalone" in vote_owners(cluster), 30, interval_s=0.1,
                   message="the standalone daemon's vote")
        alone.terminate()
        _, err = alone.communicate(timeout=DAEMON_EXIT_S)
    finally:
        if alone.poll() is None:
            alone.kill()
            alone.wait(10)
    assert alone.returncode == 0, err
    assert "autorecovery: stopped; its ZooKeeper session is closed" in err and err.rstrip().endswith("bye"), err
    assert "standalone" not in vote_owners(cluster)


def test_an_open_ledger_is_repaired_by_its_writer_or_after_the_grace_and_the_writers_close_keeps_the_repair(cluster):
    ensure_live(cluster, BOOKIES)  # E=3 and one loss: spares for the writer's ensemble change and for the copies
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        writing = Appender(conn, conn.create(3, 2, 2, PASSWORD).ledger_id)
        idle = Appender(conn, conn.create(3, 2, 2, PASSWORD).ledger_id)
        for w in (writing, idle):
            for _ in range(10):
                assert w.append(APPEND_BATCH) is None
        # two ensembles of three among five bookies share at least one
        lost = sorted(set(metadata(cluster, writing.ledger_id).segments[0].ensemble)
                      & set(metadata(cluster, idle.ledger_id).segments[0].ensemble))[0]
        cluster.kill9(bookie(cluster, lost))

        # the writer goes on appending: its first add to the dead bookie fails, and its own ensemble change
        # replaces it in a new segment; the earlier segment, a closed range now, is the workers' to copy while
        # the writer goes on (their CAS and the writer's metadata updates meet on the same znode)
        seen: list[tuple[float, float, str]] = []  # the idle ledger: (wall ms before, after the read, state)
        marked: list[Mark] = []

        def look() -> None:
            before = time.time() * 1000
            state = metadata(cluster, idle.ledger_id).state.name
            seen.append((before, time.time() * 1000, state))
            if not marked and (mark := mark_of(cluster, idle.ledger_id)) is not None:
                marked.append(mark)

        def writer_appends_until_the_workers_replaced_it() -> bool:
            refused = writing.append(APPEND_BATCH)
            assert refused is None, f"the writer's append was refused: {refused}\n{cluster.logs(15)}"
            look()
            return not named(cluster, [writing.ledger_id], lost)
        wait_until(writer_appends_until_the_workers_replaced_it, REPAIR_TIMEOUT_S, interval_s=0.05,
                   message=f"the workers to replace {lost} in the first segment of the OPEN ledger "
                           f"{writing.ledger_id} while its writer appends")
        during = metadata(cluster, writing.ledger_id)
        assert during.state.name == "OPEN" and len(during.segments) >= 2, during
        # the writer's metadata is older than the workers' CAS: it still appends, and its close merges
        for _ in range(5):
            assert writing.append(APPEND_BATCH) is None
        closed = conn.close_ledger(writing.ledger_id, PASSWORD)
        assert closed.last_entry_id == len(writing.acked) - 1, closed
        final = metadata(cluster, writing.ledger_id)
        assert final.is_closed and not any(lost in s.ensemble for s in final.segments), final

        # the idle writer's ledger: its last segment names the dead bookie, so the workers leave it to its writer
        # for the open-ledger grace after the mark, then recover it (fence, close) and copy
        wait_repaired(cluster, [idle.ledger_id], lost, on_poll=look)
        assert marked, f"ledger {idle.ledger_id} was repaired without a mark being seen"
        ctime_ms = marked[0].ctime_ms
        early = [(after - ctime_ms, state) for _, after, state in seen
                 if after < ctime_ms + OPEN_LEDGER_GRACE_MS and state != "OPEN"]
        assert not early, f"ledger {idle.ledger_id} left OPEN within the grace (ms after its mark, state): {early}"
        # and the worker that recovered it says how long after the mark it did (the looks above may be sparse)
        ages = [int(age) for node in cluster.bookies
                for age in re.findall(rf"ledger {idle.ledger_id}: OPEN (\d+) ms after its mark: recovered",
                                      read_log(node.log_path))]
        assert len(ages) == 1 and ages[0] > OPEN_LEDGER_GRACE_MS, ages
        recovered = metadata(cluster, idle.ledger_id)
        assert recovered.is_closed and recovered.last_entry_id == len(idle.acked) - 1, recovered
        assert idle.append(APPEND_BATCH) is not None, "the recovered ledger took an append from its old writer"
    for w in (writing, idle):
        assert replica_problems(cluster, w.ledger_id) == []
    read_back(cluster, {w.ledger_id: w.acked for w in (writing, idle)})


def test_a_worker_killed_mid_copy_frees_its_ledger_for_another_that_finishes(workerless):
    c = workerless
    ((lid, acked),) = write_ledgers(c, 1, MID_COPY_LEDGER_ENTRIES).items()
    md = metadata(c, lid)
    ensemble = md.segments[0].ensemble
    lost = ensemble[0]
    # four bookies, E=3: once one is lost the fourth is the only bookie a worker can copy to
    (spare,) = {b.node_id for b in c.bookies} - set(ensemble)
    must_hold = required_entries(0, md.last_entry_id, 0, md.ensemble_size, md.write_quorum_size)

    with daemon(c, "victim", {"BKSIM_AUTORECOVERY_REREPLICATION_BYTES_PER_S_MAX": str(VICTIM_BYTES_PER_S)}) as victim:
        c.kill9(bookie(c, lost))  # the victim, the only auditor, marks the ledger; its worker claims it

        def mid_copy() -> bool:
            return lock_owner(c, lid) == "victim" and 0 < len(held_ids(spare, lid)) < must_hold
        wait_until(mid_copy, REPAIR_TIMEOUT_S, interval_s=0.05,
                   message=f"the victim to hold the lock of ledger {lid} with {spare} holding some but not all "
                           f"of the {must_hold} entries {lost} held")
        victim.kill()  # SIGKILL, by pid
        victim.wait(10)
        log = read_log(victim.log_path)
    assert f"ledger {lid}: replicated" not in log and "replaced by" not in log, log[-3000:]
    # the metadata names a replacement only once it holds every entry: it still names the lost bookie
    assert metadata(c, lid).segments[0].ensemble == ensemble
    assert [(m.ledger_id, m.missing) for m in marks(c)] == [(lid, (lost,))]
    # the lock was an ephemeral node of the victim's session: it goes when ZooKeeper ends the session
    wait_until(lambda: lock_owner(c, lid) is None, GONE_TIMEOUT_S, interval_s=0.05,
               message=f"the killed worker's lock of ledger {lid} to go with its session")
    partial = sorted(held_ids(spare, lid))
    assert 0 < len(partial) < must_hold, (len(partial), must_hold)
    # the partial copies are the survivors' bytes (the replacement's own checks aside, nothing reads them yet)
    got = asyncio.run(read_all(spare, lid, partial))
    survivor = {e: next(b for b in md.write_set(e) if b != lost) for e in partial}
    for source in set(survivor.values()):
        ids = [e for e in partial if survivor[e] == source]
        theirs = asyncio.run(read_all(source, lid, ids))
        assert all(got[e] == theirs[e] and got[e][0] is StatusCode.OK for e in ids), source

    with daemon(c, "rescuer") as rescuer:
        wait_repaired(c, [lid], lost)
    log = read_log(rescuer.log_path)
    assert f"autorecovery worker rescuer: ledger {lid}: replicated" in log, log[-3000:]
    # the only spare is chosen again: its partial copies and the rescuer's are the one replica, identical to
    # the others, entry by entry
    assert metadata(c, lid).segments[0].ensemble == tuple(spare if b == lost else b for b in ensemble)
    assert replica_problems(c, lid) == []
    read_back(c, {lid: acked})
