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
  (without the repair, the entries whose write set was those two bookies would have had no copy left).
- The auditor killed -9: another candidate becomes the auditor and marks the dead one's ledger.
- A bookie stopped (SIGSTOP) until its sessions expire votes again on a new session once it runs again.
- `bksim autorecovery run` alone votes, and on SIGTERM stops within its bounds and closes its session.

A private ZooKeeper: the session's holds the cookies of every other module's stopped bookies, which an auditor
rightly counts as lost, and their ledgers would keep the workers busy. Every wait is bounded; nothing sleeps to
synchronise.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoNodeError

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.clock import SystemClock
from bksim.adapters.local_cluster import LocalCluster
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.metadata import ledger_metadata
from bksim.metadata.paths import (AUDITOR_ELECTION, AVAILABLE, CHECK_ALL_LEDGERS_CTIME, READONLY_CHILD, cookie_path,
                                  ledger_path)
from bksim.model.status import StatusCode
from helpers import wait_until
from integration.broker_harness import BrokerConn, check_ledger_contents, stream_appends

PASSWORD = b"autorecovery"
SESSION_TIMEOUT_MS = 2000
ENV = {
    "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_AUTORECOVERY_ENABLED": "true",
    "BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS": "0",
    "BKSIM_AUTORECOVERY_BOOKIE_CHECK_INTERVAL_MS": "200",
    "BKSIM_AUTORECOVERY_WORKER_BACKOFF_MS": "300",
    "BKSIM_AUTORECOVERY_OPEN_LEDGER_REREPLICATION_GRACE_MS": "2000",
}
REPAIR_TIMEOUT_S = 90.0
GONE_TIMEOUT_S = 3 * SESSION_TIMEOUT_MS / 1000 + 5  # a killed bookie's registration expires with its session
READ_BATCH = 256
CLI_TIMEOUT_S = 60.0
DAEMON_EXIT_S = 2.0 + 2 * SESSION_TIMEOUT_MS / 1000 + 5  # its loops' stop, its session's close, with room


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("autorecovery"))
    c = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir, child_env=ENV)
    try:
        c.start_zookeeper(tick_time_ms=200, heap_mb=128)
        for _ in range(5):
            c.add_bookie()
        c.add_broker()
        c.start(c.nodes, serving=True)
        c.zk = c.kazoo()
        yield c
    finally:
        if getattr(c, "zk", None) is not None:
            c.zk.stop()
            c.zk.close()
        c.stop_all(bookie_grace_s=10, broker_grace_s=10)


# -- helpers ---------------------------------------------------------------------------------------------------

def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], env=cluster.base_env(), cwd=cluster.cwd,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


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


def named(cluster, ledgers, bookie_id: str) -> list[int]:
    return [lid for lid in ledgers if any(bookie_id in s.ensemble for s in metadata(cluster, lid).segments)]


def live_bookies(cluster) -> list:
    return [b for b in cluster.bookies if b.alive()]


def writable(cluster) -> set[str]:
    return {c for c in cluster.zk.get_children(AVAILABLE) if c != READONLY_CHILD}


def settle(cluster) -> None:
    """Wait until the writable registrations are exactly the live bookies (a killed one's lingers)."""
    live = {b.node_id for b in live_bookies(cluster)}
    wait_until(lambda: writable(cluster) == live, GONE_TIMEOUT_S, interval_s=0.05,
               message=f"writable registrations to be exactly the live bookies {sorted(live)}")


def write_ledgers(cluster, count: int, entries: int) -> dict[int, dict[int, bytes]]:
    """`count` closed E=3 Qw=2 Qa=2 ledgers of at least `entries` entries: {ledger id: acknowledged {entry id:
    payload}}."""
    out = {}
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        for _ in range(count):
            lid = conn.create(3, 2, 2, PASSWORD).ledger_id
            run = stream_appends(conn, lid, PASSWORD, batch=50, window=8, target=entries, total=entries)
            # the stream may have more in flight when `entries` are acknowledged: all of them count
            assert run.error is None and sorted(run.acked) == list(range(len(run.acked))), run.error
            closed = conn.close_ledger(lid, PASSWORD)
            assert closed.last_entry_id == len(run.acked) - 1, closed
            out[lid] = run.acked
    return out


def wait_repaired(cluster, ledgers, bookie_id: str) -> None:
    """Until no ledger's metadata names `bookie_id` and no mark is left (bounded)."""
    def done():
        return not named(cluster, ledgers, bookie_id) and not marks(cluster)
    try:
        wait_until(done, REPAIR_TIMEOUT_S, interval_s=0.2,
                   message=f"autorecovery to replace {bookie_id} in every ledger and remove every mark")
    except AssertionError as e:
        raise AssertionError(f"{e}\nstill naming it: {named(cluster, ledgers, bookie_id)}; marks: {marks(cluster)}"
                             f"\n{cluster.logs(15)}") from None


def vote_owners(cluster) -> list[str]:
    owners = []
    for name in cluster.zk.get_children(AUDITOR_ELECTION):
        try:
            owners.append(cluster.zk.get(f"{AUDITOR_ELECTION}/{name}")[0].decode())
        except NoNodeError:
            continue  # its session ended since the listing
    return owners


async def _read_all(address: str, ledger_id: int, ids: list[int]) -> dict[int, tuple[StatusCode, bytes]]:
    got: dict[int, tuple[StatusCode, bytes]] = {}
    async with BookieClient(address) as client:
        pending = list(ids)
        while pending:
            batch, pending = pending[:READ_BATCH], pending[READ_BATCH:]
            results = await client.read_entries(ledger_id, batch)
            for entry_id, r in zip(batch, results):
                if r.status is StatusCode.TOO_MANY_REQUESTS:  # the answer was full: ask again
                    pending.append(entry_id)
                else:
                    got[entry_id] = (r.status, r.entry)
    return got


def replica_problems(cluster, ledger_id: int) -> list[str]:
    """Entries of a CLOSED ledger not held, with identical bytes, by every bookie of their write set."""
    md = metadata(cluster, ledger_id)
    assert md.is_closed, md
    wanted: dict[str, list[int]] = {}
    for entry_id in range(md.last_entry_id + 1):
        for bookie in md.write_set(entry_id):
            wanted.setdefault(bookie, []).append(entry_id)
    held = {b: asyncio.run(_read_all(b, ledger_id, ids)) for b, ids in wanted.items()}
    problems = []
    for entry_id in range(md.last_entry_id + 1):
        copies = {b: held[b][entry_id] for b in md.write_set(entry_id)}
        bad = {b: s.name for b, (s, _) in copies.items() if s is not StatusCode.OK}
        if bad:
            problems.append(f"ledger {ledger_id} entry {entry_id}: {bad}")
        elif len({data for _, data in copies.values()}) != 1:
            problems.append(f"ledger {ledger_id} entry {entry_id}: the copies differ on {sorted(copies)}")
    return problems[:10]


# -- tests ---------------------------------------------------------------------------------------------------------

def test_decommission_refuses_a_registered_and_an_unknown_bookie(cluster):
    live = cluster.bookies[0].node_id
    before = cluster.zk.get(cookie_path(live))
    refused = cli(cluster, "bookie", "decommission", live, "--timeout-s", "5")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"bookie {live} is registered (writable): stop it first" in refused.stderr, refused.stderr
    unknown = cli(cluster, "bookie", "decommission", "127.0.0.1:9", "--timeout-s", "5")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "unknown bookie 127.0.0.1:9: no cookie" in unknown.stderr, unknown.stderr
    assert cluster.zk.get(cookie_path(live)) == before and marks(cluster) == []

    wait_until(lambda: len(cluster.zk.get_children(AUDITOR_ELECTION)) == len(cluster.bookies), 30,
               message="every bookie's autorecovery daemon to vote")
    status = cli(cluster, "autorecovery", "status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    bookie_ids = {b.node_id for b in cluster.bookies}
    assert doc["auditor"] in bookie_ids and set(doc["candidates"]) == bookie_ids, doc
    assert doc["disabled"] is False and doc["marks"] == [] and doc["bookies"]["missing"] == [], doc


def test_check_all_from_the_command_line_is_run_by_the_elected_auditor(cluster):
    wait_until(lambda: vote_owners(cluster), 30, interval_s=0.1, message="an auditor to be elected")
    requested_ms = int(time.time() * 1000)
    done = cli(cluster, "autorecovery", "check-all")
    assert done.returncode == 0, done.stderr
    assert "check of all ledgers requested: the auditor 127.0.0.1:" in done.stdout, done.stdout

    def ran_since() -> bool:  # the auditor records when the check it ran started (0 = asked for, not yet run)
        return int(cluster.zk.get(CHECK_ALL_LEDGERS_CTIME)[0]) >= requested_ms
    wait_until(ran_since, 30, interval_s=0.1, message="the auditor to run the requested check of all ledgers")


def test_disable_keeps_marks_unrepaired_enable_resumes_and_decommission_deletes_the_cookie(cluster):
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
    naming = named(cluster, ledgers, gone.node_id)
    assert naming and sorted(m.ledger_id for m in marks(cluster)) == naming, (naming, marks(cluster))
    assert all(m.missing == (gone.node_id,) for m in marks(cluster)), marks(cluster)
    assert cluster.zk.exists(cookie_path(gone.node_id)) is not None
    listed = json.loads(cli(cluster, "autorecovery", "list-underreplicated", "--json").stdout)
    assert [r["ledger_id"] for r in listed] == naming and all(r["claimed_by"] is None for r in listed), listed
    table = cli(cluster, "autorecovery", "list-underreplicated").stdout
    assert all(f"{lid:>8}  {gone.node_id}" in table for lid in naming), table
    text = cli(cluster, "autorecovery", "status").stdout
    assert "autorecovery: DISABLED" in text and f"missing: {gone.node_id}" in text, text

    assert cli(cluster, "autorecovery", "enable").returncode == 0
    wait_repaired(cluster, ledgers, gone.node_id)
    done = cli(cluster, "bookie", "decommission", gone.node_id, "--timeout-s", "30", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert cluster.zk.exists(cookie_path(gone.node_id)) is None
    assert json.loads(done.stdout.splitlines()[-1])["bookie"] == gone.node_id
    for lid in ledgers:
        assert replica_problems(cluster, lid) == []


def test_a_bookie_lost_for_good_is_replaced_everywhere_and_a_second_loss_loses_nothing(cluster):
    while len(live_bookies(cluster)) < 5:  # back to five after the previous test's decommission
        cluster.start([cluster.add_bookie()])
    settle(cluster)
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

    cluster.kill9(cluster.node(next(b.name for b in cluster.bookies if b.node_id == second)))
    with BrokerConn(cluster.brokers[0].node_id) as conn:
        for lid, acked in ledgers.items():
            last = metadata(cluster, lid).last_entry_id
            assert check_ledger_contents(lid, conn.read(lid, PASSWORD, 0, last), last, acked) == []



def test_the_auditor_killed_is_followed_by_another_that_marks_its_ledgers(cluster):
    def auditor():
        done = cli(cluster, "autorecovery", "status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["auditor"]
    settle(cluster)
    (lid,) = write_ledgers(cluster, 1, 100)  # E=3 on the three live bookies: the auditor's among them
    before = {b.node_id for b in live_bookies(cluster)}  # a killed bookie's vote lives as long as its session
    old = wait_until(lambda: (current := auditor()) in before and current, GONE_TIMEOUT_S, interval_s=0.2,
                     message=f"one of the live bookies {sorted(before)} to be the auditor")
    assert old in metadata(cluster, lid).segments[0].ensemble
    cluster.kill9(next(b for b in live_bookies(cluster) if b.node_id == old))
    live = {b.node_id for b in live_bookies(cluster)}
    wait_until(lambda: auditor() in live, GONE_TIMEOUT_S + 10, interval_s=0.2,
               message=f"a live bookie of {sorted(live)} to become the auditor after {old} was killed")
    # two live bookies, both in the ledger's ensemble: no replacement, so the new auditor's mark stays
    wait_until(lambda: any(m.ledger_id == lid and old in m.missing for m in marks(cluster)), 30, interval_s=0.2,
               message=f"the new auditor to mark ledger {lid}, which names {old}")


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
    daemon = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", "autorecovery", "run", "--id", "standalone"],
                              env=cluster.base_env(), cwd=cluster.cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "standalone" in vote_owners(cluster), 30, interval_s=0.1, message="the standalone daemon's vote")
        daemon.terminate()
        _, err = daemon.communicate(timeout=DAEMON_EXIT_S)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
    assert daemon.returncode == 0, err
    assert "autorecovery: stopped; its ZooKeeper session is closed" in err and err.rstrip().endswith("bye"), err
    assert "standalone" not in vote_owners(cluster)
