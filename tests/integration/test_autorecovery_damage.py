"""Damaged copies found by the check of all ledgers and repaired, on real processes: a private ZooKeeper, five
`bksim bookie run` processes with autorecovery on and one broker (the fixtures and helpers of
test_autorecovery.py, with a lost-bookie delay longer than the module, so a bookie stopped for a moment is never
counted lost: only the check of all ledgers can find what it lost).

- A flipped byte in a closed ledger's entry in one bookie's flushed entry log (stopped with SIGTERM: its write
  cache goes to the entry log; the byte flipped; restarted): the bookie still lists the entry, so the listing
  check marks nothing; `check-all --verify-percentage 100` reads the copies, finds that one and marks that
  bookie; the workers replace it in the segment.
- A truncated journal: a bookie that checkpoints rarely is killed -9 right after a ledger's entries reached
  it, its journal is cut inside one of its last records, and its restart replays what is left: the listing
  check marks exactly the entries the cut removed on that bookie, and they are repaired.
- A bookie wiped and re-formatted (`bksim bookie format --delete-cookie --force`): a new incarnation in limbo
  for the old ledgers (UNKNOWN_STATE); the check marks every copy it had, and they are repaired.

After each repair every entry of the ledger reads back identical from the Qw bookies of its write set, asked
directly, and at the end a check verifying every copy marks nothing. Every wait is bounded; nothing sleeps to
synchronise.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from bksim.chaos import disk, wipe
from bksim.metadata.paths import ledger_path
from helpers import wait_until
from integration.test_autorecovery import (CLI_TIMEOUT_S, ENV, cli, live_bookies, local_cluster, marks, metadata,
                                           replica_problems, settle, write_ledgers)

ENV_DAMAGE = {**ENV, "BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS": "600000"}
SLOW_CHECKPOINTS = {"BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "600000"}  # its entries stay in its journal only
REPAIR_TIMEOUT_S = 45.0
LEDGER_TRIES_MAX = 10  # ledgers written until one's ensemble names a wanted bookie (E=3 of 5: 60% each)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("autorecovery-damage"))
    with local_cluster(run_dir, run_dir, 5, ENV_DAMAGE, bookie_env={0: SLOW_CHECKPOINTS}) as c:
        yield c


def ledger_naming(cluster, bookie_id: str, entries: int) -> int:
    """A closed ledger whose ensemble names `bookie_id` (and, with only 5 bookies, leaves 2 spares)."""
    for _ in range(LEDGER_TRIES_MAX):
        (lid,) = write_ledgers(cluster, 1, entries)
        if bookie_id in metadata(cluster, lid).segments[0].ensemble:
            return lid
    raise AssertionError(f"no ledger of {LEDGER_TRIES_MAX} named {bookie_id}")


def check_all(cluster, percentage: int) -> dict:
    done = cli(cluster, "autorecovery", "check-all", "--verify-percentage", str(percentage), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def wait_repaired(cluster, ledger_id: int, bookie_id: str) -> None:
    """Until the ledger's metadata no longer names `bookie_id`, no mark is left, and every entry is on the Qw
    bookies of its write set with identical bytes."""
    def done():
        return bookie_id not in metadata(cluster, ledger_id).segments[0].ensemble and not marks(cluster)
    try:
        wait_until(done, REPAIR_TIMEOUT_S, interval_s=0.2,
                   message=f"autorecovery to replace {bookie_id} in ledger {ledger_id} and remove every mark")
    except AssertionError as e:
        raise AssertionError(f"{e}\nmarks: {marks(cluster)}\n{cluster.logs(15)}") from None
    assert replica_problems(cluster, ledger_id) == []


def node_of(cluster, bookie_id: str):
    return next(b for b in cluster.bookies if b.node_id == bookie_id)


def test_a_flipped_byte_in_an_entry_log_is_found_by_verification_and_the_copy_replaced(cluster):
    settle(cluster)
    lid = ledger_naming(cluster, cluster.bookies[1].node_id, 300)
    victim = cluster.bookies[1]
    cluster.stop(victim)  # SIGTERM: its write cache goes to its entry log
    what, flip = disk.flip_entry_log_byte(victim.ledger_dir, random.Random(lid), lambda ledger, _: ledger == lid)
    assert flip is not None, what
    cluster.start([victim])
    settle(cluster)

    listing_only = check_all(cluster, 0)  # the bookie lists the entry: a listing cannot tell
    assert str(lid) not in listing_only["marked"] and listing_only["copies_verified"] == 0, listing_only
    report = check_all(cluster, 100)
    # the flipped entry, on that bookie only: one damaged payload byte fails that entry's reads and no other's,
    # and it is a damaged copy the bookie still listed
    assert list(report["marked"]) == [str(lid)] and list(report["marked"][str(lid)]) == [victim.node_id], report
    assert report["damaged"] == report["marked"] and report["marked"][str(lid)][victim.node_id] == 1, report
    assert report["errors"] == [] and report["copies_verified"] >= 300, report
    wait_repaired(cluster, lid, victim.node_id)


def test_a_truncated_journal_loses_copies_the_check_finds_and_the_workers_restore(cluster):
    settle(cluster)
    victim = cluster.bookies[0]  # checkpoints every 10 minutes: the ledger's copies are in its journal only
    lid = ledger_naming(cluster, victim.node_id, 200)
    cluster.kill9(victim)
    what, removed = disk.truncate_journal(victim.journal_dir, random.Random(lid))
    lost = sorted(entry_id for ledger, entry_id in removed if ledger == lid)
    assert lost, (what, removed)
    cluster.start([victim])
    settle(cluster)

    report = check_all(cluster, 0)  # the listing finds a truncated journal: no entry read
    assert report["marked"].get(str(lid)) == {victim.node_id: len(lost)}, (what, report)
    wait_repaired(cluster, lid, victim.node_id)


def test_a_wiped_and_reformatted_bookie_is_found_and_its_copies_restored(cluster):
    settle(cluster)
    victim = cluster.bookies[2]
    lid = ledger_naming(cluster, victim.node_id, 200)
    md = metadata(cluster, lid)
    held = sum(1 for entry_id in range(md.last_entry_id + 1) if victim.node_id in md.write_set(entry_id))
    cluster.stop(victim)
    wiped = wipe.wipe_bookie(victim.home)
    formatted = subprocess.run([sys.executable, "-m", "bksim.cli.main", "bookie", "format", "--delete-cookie",
                                "--force", "--json"], env=victim.env, cwd=cluster.cwd, capture_output=True,
                               text=True, timeout=CLI_TIMEOUT_S)
    assert formatted.returncode == 0, wiped + formatted.stdout + formatted.stderr
    assert json.loads(formatted.stdout)["incarnation"] == 2, formatted.stdout
    cluster.start([victim])
    settle(cluster)
    assert os.path.isdir(victim.journal_dir) and victim in live_bookies(cluster)

    report = check_all(cluster, 0)
    assert report["marked"].get(str(lid)) == {victim.node_id: held}, report
    wait_repaired(cluster, lid, victim.node_id)
    # every copy the metadata names now, of every ledger of this module, verifies
    done = cli(cluster, "autorecovery", "check-all", "--verify-percentage", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check of all ledgers (verifying 100% of the entries): " in done.stdout, done.stdout
    ensembles = {lid: metadata(cluster, lid).segments for lid in range(40) if cluster.zk.exists(ledger_path(lid))}
    assert " 0 not judged; 0 marked under-replicated" in done.stdout, \
        f"{done.stdout}\n{[(b.name, b.node_id) for b in cluster.bookies]}\n{ensembles}\n{cluster.logs(30)}"
