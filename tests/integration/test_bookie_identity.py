"""Cookies with real processes: a bookie whose directories were wiped or swapped refuses to start and says why.

Also: a bookie whose ZooKeeper session expires (SIGSTOP longer than the session timeout) re-registers
by itself when it runs again.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.bookie import cookie as cookies
from bksim.formats.entry import encode_entry
from integration.bookie_harness import KEY, BookieProcess, registration_path
from helpers import wait_until


def add_some(bookie: BookieProcess, ledger: int) -> None:
    async def scenario():
        async with BookieClient(bookie.address) as client:
            stream = client.add_stream()
            result = await stream.add(0, [(encode_entry(ledger, i, i - 1, 0, b"data"), KEY, 0) for i in range(10)])
            await stream.close()
            assert result.ok, result
    asyncio.run(scenario())


def test_first_start_writes_cookies_everywhere(zookeeper, zk, bookies, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    data, _ = zk.get(f"/ledgers/cookies/{bookie.bookie_id}")
    in_zk = cookies.decode(data)
    instance_id = zk.get("/ledgers/INSTANCEID")[0].decode()
    assert in_zk == cookies.Cookie(bookie.bookie_id, instance_id, bookie.journal_dir, bookie.ledger_dir)
    for d in (bookie.journal_dir, bookie.ledger_dir):
        with open(os.path.join(d, "COOKIE"), "rb") as f:
            assert cookies.decode(f.read()) == in_zk
    registered = json.loads(zk.get(registration_path(bookie.bookie_id))[0])
    assert registered == {"bookie_id": bookie.bookie_id, "host": "127.0.0.1", "port": bookie.port,
                          "state": "writable", "pid": bookie.pid}


@pytest.mark.parametrize("wiped", ["ledger", "journal"])
def test_wiped_directory_refuses_to_start(zookeeper, zk, bookies, tmp_path, wiped):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    add_some(bookie, 201)
    assert bookie.terminate() == 0
    victim = bookie.ledger_dir if wiped == "ledger" else bookie.journal_dir
    shutil.rmtree(victim)

    bookie.spawn()
    assert bookie.wait_exit() == 2
    log = bookie.last_start_log()
    assert f"{wiped} directory {victim} has no cookie but ZooKeeper has one for bookie {bookie.bookie_id}" in log
    assert "wiped or replaced" in log
    assert zk.exists(registration_path(bookie.bookie_id)) is None
    assert "gRPC server listening" not in log


def test_swapped_directories_refuse_to_start(zookeeper, zk, bookies, tmp_path):
    a = BookieProcess(zookeeper, tmp_path, name="a")
    b = BookieProcess(zookeeper, tmp_path, name="b")
    bookies.extend([a, b])
    for bookie, ledger in ((a, 211), (b, 212)):
        bookie.start(zk)
        add_some(bookie, ledger)
        assert bookie.terminate() == 0

    # a restarted with b's ledger directory (and its own journal)
    swapped = BookieProcess(zookeeper, tmp_path, name="a", port=a.port, journal_dir=a.journal_dir,
                            ledger_dir=b.ledger_dir)
    bookies.append(swapped)
    swapped.spawn()
    assert swapped.wait_exit() == 2
    log = swapped.last_start_log()
    assert f"ledger directory {b.ledger_dir} holds the cookie of bookie {b.bookie_id}, not of bookie {a.bookie_id}" in log
    assert zk.exists(registration_path(a.bookie_id)) is None

    # both restarted on their own directories are fine (nothing was changed by the refused start)
    for bookie in (a, b):
        bookie.start(zk)
        assert bookie.alive()


def test_session_expiry_re_registers(zookeeper, zk, bookies, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    owner = bookie.start(zk)
    os.kill(bookie.pid, signal.SIGSTOP)
    try:
        # the server expires the frozen bookie's session (timeout 2 s) and deletes its ephemeral node
        wait_until(lambda: zk.exists(registration_path(bookie.bookie_id)) is None, 15.0,
                   message="the stopped bookie's registration to expire")
    finally:
        os.kill(bookie.pid, signal.SIGCONT)
    new_owner = bookie.wait_registered(zk, previous_owner=owner)
    assert new_owner != owner
    wait_until(lambda: "re-registered at /ledgers/available/" in bookie.last_start_log(), 5.0,
               message="the re-registration log line")
    add_some(bookie, 221)  # still serving


def test_port_in_use_refuses_with_a_clear_message(zookeeper, zk, bookies, tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        bookie = BookieProcess(zookeeper, tmp_path, port=holder.getsockname()[1])
        bookies.append(bookie)
        bookie.spawn()
        assert bookie.wait_exit() == 2
    log = bookie.last_start_log()
    assert f"cannot listen on 127.0.0.1:{bookie.port}" in log
    assert "storage closed" in log  # the engine that had started was closed cleanly
    assert zk.exists(registration_path(bookie.bookie_id)) is None


def test_bookie_list_shows_registered_bookies_with_their_info(zookeeper, zk, bookies, tmp_path):
    import subprocess
    import sys

    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    bookie.start(zk)
    # a registration whose bookie is not reachable is listed, marked unreachable
    ghost = "127.0.0.1:1"
    zk.create(registration_path(ghost, read_only=True),
              json.dumps({"bookie_id": ghost, "host": "127.0.0.1", "port": 1, "state": "read-only"}).encode(),
              ephemeral=True)
    try:
        env = bookie.environment()
        argv = [sys.executable, "-m", "bksim.cli.main", "bookie", "list"]
        as_json = subprocess.run(argv + ["--json"], env=env, cwd=bookie.base_dir, capture_output=True, text=True,
                                 timeout=30)
        as_table = subprocess.run(argv, env=env, cwd=bookie.base_dir, capture_output=True, text=True, timeout=30)
    finally:
        zk.delete(registration_path(ghost, read_only=True))
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    mine = [r for r in listed["writable"] if r["bookie_id"] == bookie.bookie_id]
    assert len(mine) == 1 and mine[0]["port"] == bookie.port
    assert mine[0]["info"]["state"] == "writable" and mine[0]["info"]["bookie_id"] == bookie.bookie_id
    ghosts = [r for r in listed["readonly"] if r["bookie_id"] == ghost]
    assert len(ghosts) == 1 and ghosts[0]["info"] is None and "UNAVAILABLE" in ghosts[0]["error"]
    assert as_table.returncode == 0, as_table.stderr
    assert bookie.bookie_id in as_table.stdout and "unreachable" in as_table.stdout
    assert "writable" in as_table.stdout.splitlines()[-1]
