"""`bksim bookie format` with real ZooKeeper and a real bookie process: every refusal (exit 2, nothing changed),
then the re-initialisation: directories emptied, cookie deleted, the next `bookie run` is a new bookie with the
same id (cookie incarnation 2) that no longer has what the old one stored.

The directory helpers and the refusals that need no process run in-process on the session's ZooKeeper.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from bksim.adapters import bookie_cookies, registration
from bksim.adapters.bookie_client import BookieClient
from bksim.bookie import cookie as cookies
from bksim.cli import bookie_cmd
from bksim.cli import config as cfgload
from bksim.model.status import StatusCode
from integration.bookie_harness import BookieProcess, registration_path
from integration.test_bookie_identity import add_some

CLI_TIMEOUT_S = 60.0


def run_format(bookie: BookieProcess, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", "bookie", "format", *flags],
                          env=bookie.environment(), cwd=bookie.base_dir, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def listing(*dirs: str) -> dict[str, list[str]]:
    return {d: sorted(os.listdir(d)) if os.path.isdir(d) else [] for d in dirs}


def zk_cookie(zk, bookie_id: str):
    stat = zk.exists(f"/ledgers/cookies/{bookie_id}")
    return cookies.decode(zk.get(f"/ledgers/cookies/{bookie_id}")[0]) if stat else None


def test_format_refuses_then_reinitialises_the_bookie_as_a_new_one(zookeeper, zk, bookies, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    old_ledger = bookie_cookies.draw_ledger_id(zk)  # a ledger id as the broker gets one, from the id generator
    add_some(bookie, old_ledger)
    dirs = (bookie.journal_dir, bookie.ledger_dir)
    before = listing(*dirs)
    assert "COOKIE" in before[bookie.journal_dir] and zk_cookie(zk, bookie.bookie_id).incarnation == 1

    running = run_format(bookie, "--force", "--delete-cookie")
    assert running.returncode == 2, running
    assert f"bksim: error: bookie {bookie.bookie_id} is registered as running " \
           f"({registration_path(bookie.bookie_id)}, pid {bookie.pid}" in running.stderr
    assert "stop it before formatting" in running.stderr
    assert listing(*dirs) == before and zk_cookie(zk, bookie.bookie_id) is not None

    assert bookie.terminate() == 0
    before = listing(*dirs)
    unforced = run_format(bookie, "--delete-cookie")
    assert unforced.returncode == 2, unforced
    assert f"journal directory {bookie.journal_dir} holds " in unforced.stderr
    assert "deletes them only with --force" in unforced.stderr
    assert listing(*dirs) == before and zk_cookie(zk, bookie.bookie_id).incarnation == 1

    kept = run_format(bookie, "--force")  # no --delete-cookie: emptied, but the bookie must still refuse
    assert kept.returncode == 0, kept
    assert f"journal directory {bookie.journal_dir}: removed " in kept.stdout
    assert "ZooKeeper still holds /ledgers/cookies/" in kept.stdout and "pass --delete-cookie" in kept.stdout
    assert listing(*dirs) == {d: [] for d in dirs}
    bookie.spawn()
    assert bookie.wait_exit() == 2
    assert "has no cookie but ZooKeeper has one" in bookie.last_start_log()

    done = run_format(bookie, "--delete-cookie", "--json")  # the directories are empty: no --force needed
    assert done.returncode == 0, done
    out = json.loads(done.stdout)
    assert (out["cookie_deleted"], out["zookeeper_cookie_kept"], out["incarnation"]) == (True, False, 2)
    limbo_max = out["limbo_ledger_id_max"]  # drawn from the id generator after the old ledger's id
    assert limbo_max > old_ledger, out
    assert f"limbo: ledgers with ids <= {limbo_max} (the ledger-id generator now) may predate this format" in \
        done.stdout + "\n".join(out["lines"])
    assert [d["removed"] for d in out["directories"]] == [False, False]
    assert zk_cookie(zk, bookie.bookie_id) is None
    for d in dirs:
        assert os.listdir(d) == ["COOKIE"]
        with open(os.path.join(d, "COOKIE"), "rb") as f:
            written = cookies.decode(f.read())
        assert (written.incarnation, written.limbo_ledger_id_max) == (2, limbo_max)

    bookie.start(zk)
    assert "new bookie (incarnation 2)" in bookie.last_start_log()
    assert f"limbo: ledgers with ids <= {limbo_max} may predate" in bookie.last_start_log()
    assert zk_cookie(zk, bookie.bookie_id) == written  # ZooKeeper records the same limbo bound

    async def read(ledger_id: int):
        async with BookieClient(bookie.address) as client:
            return (await client.read_entry(ledger_id, 0)).status, (await client.read_lac(ledger_id)).status
    # the old incarnation's entries are gone, and the new one does not deny them: its "no" could truncate a ledger
    assert asyncio.run(read(old_ledger)) == (StatusCode.UNKNOWN_STATE, StatusCode.UNKNOWN_STATE)
    # a ledger created after the format (a larger id) is answered normally
    assert asyncio.run(read(limbo_max + 1)) == (StatusCode.NO_LEDGER, StatusCode.NO_LEDGER)


def config_for(zookeeper, tmp_path, port: int = 3999, archive: bool = False):
    home = tmp_path / "b"
    env = {"BKSIM_ZOOKEEPER_HOST": zookeeper.host, "BKSIM_ZOOKEEPER_PORT": str(zookeeper.port),
           "BKSIM_CLUSTER_RUN_DIR": str(tmp_path), "BKSIM_BOOKIE_PORT": str(port),
           "BKSIM_BOOKIE_JOURNAL_DIR": str(home / "journal"), "BKSIM_BOOKIE_LEDGER_DIR": str(home / "ledgers")}
    if archive:
        env["BKSIM_BOOKIE_JOURNAL_ARCHIVE_DIR"] = str(home / "archive")
    return bookie_cmd.resolve(cfgload.load(None, env))


def test_format_never_touches_another_bookies_directory(zookeeper, zk, tmp_path):
    config = config_for(zookeeper, tmp_path, port=3998)
    b = config.bookie
    os.makedirs(b.ledger_dir)
    theirs = cookies.Cookie("127.0.0.1:4000", "inst", "/x/journal", b.ledger_dir)
    with open(cookies.cookie_path(b.ledger_dir), "wb") as f:
        f.write(cookies.encode(theirs))
    with pytest.raises(bookie_cookies.BookieFormatError,
                       match=f"ledger directory {b.ledger_dir} holds the cookie of bookie 127.0.0.1:4000, not of "
                             f"bookie {b.bookie_id}"):
        bookie_cookies.format_bookie(zk, config, force=True, delete_cookie=True)
    assert os.listdir(b.ledger_dir) == ["COOKIE"]


def test_format_empties_the_journal_archive_and_counts_incarnations_from_zookeeper(zookeeper, zk, tmp_path):
    config = config_for(zookeeper, tmp_path, port=3997, archive=True)
    b = config.bookie
    instance = registration.ensure_layout(zk)  # the session's cluster (created here if no test did before)
    zk.create(f"/ledgers/cookies/{b.bookie_id}",
              cookies.encode(cookies.Cookie(b.bookie_id, instance, b.journal_dir, b.ledger_dir, incarnation=3)))
    os.makedirs(os.path.join(b.journal_archive_dir, "sub"))
    with open(os.path.join(b.journal_archive_dir, "0000000000000001.txn"), "wb") as f:
        f.write(b"x" * 50)
    with open(os.path.join(b.journal_archive_dir, "sub", "y"), "wb") as f:
        f.write(b"y" * 7)
    os.makedirs(os.path.join(b.journal_archive_dir, "lost+found"))  # a file system's own: left alone
    with pytest.raises(bookie_cookies.BookieFormatError, match=f"journal archive directory {b.journal_archive_dir} "
                                                           f"holds 2 files, 57 bytes"):
        bookie_cookies.format_bookie(zk, config, force=False, delete_cookie=True)
    out = bookie_cookies.format_bookie(zk, config, force=True, delete_cookie=True)
    assert [(d["role"], d["files"], d["bytes"], d["removed"]) for d in out["directories"]] == [
        ("journal directory", 0, 0, False), ("ledger directory", 0, 0, False),
        ("journal archive directory", 2, 57, True)]
    assert os.listdir(b.journal_archive_dir) == ["lost+found"]
    assert out["incarnation"] == 4 and zk_cookie(zk, b.bookie_id) is None
    assert f"ZooKeeper: deleted /ledgers/cookies/{b.bookie_id} (incarnation 3)" in out["lines"]
    with open(cookies.cookie_path(b.journal_dir), "rb") as f:
        assert cookies.decode(f.read()) == cookies.Cookie(b.bookie_id, instance, b.journal_dir, b.ledger_dir,
                                                          incarnation=4, limbo_ledger_id_max=out["limbo_ledger_id_max"])
    assert out["limbo_ledger_id_max"] >= 0
