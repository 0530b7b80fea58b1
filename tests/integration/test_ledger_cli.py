"""`bksim ledger ...` on a real cluster: ZooKeeper, 3 bookies and 2 brokers started by `bksim cluster up`
(one cluster for the module, stopped by `bksim cluster down`).

Most commands run in-process through `bksim.cli.main.main(argv)` (the same code as the `bksim` command, with
its exit status and its stdout/stderr captured) because a Python start-up per command would make the module
slow; one test runs the real `python -m bksim.cli.main` for exit statuses as a shell sees them. Without
`--broker` the commands find the broker in ZooKeeper (the first registered: broker-1), which also created
every ledger, so it is their writer.
"""
from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys

import pytest

from bksim.adapters import processes
from bksim.cli import cluster_cmd
from bksim.cli.ledger_cmd import PASSWORD_ENV, make_payload
from bksim.cli.main import main
from helpers import free_port
from pty_run import assert_ends_clean, frames, run_on_pipes, run_on_tty

BOOKIES = 3
BROKERS = 2


def _clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`bksim cluster up` with BOOKIES bookies and BROKERS brokers on free ports; yields a dict with the config
    path, the broker addresses and the `up` output; `cluster down` at the end (asserted)."""
    base = tmp_path_factory.mktemp("ledger-cli")
    config = base / "bksim.toml"
    config.write_text(f"""
[cluster]
run_dir = "{base / 'run'}"
bookies = {BOOKIES}
bookie_port_base = {free_port(count=BOOKIES)}
brokers = {BROKERS}
broker_port_base = {free_port(count=BROKERS)}
bookie_http_port_base = {free_port(count=BOOKIES)}
broker_http_port_base = {free_port(count=BROKERS)}
start_timeout_ms = 30000
[zookeeper]
port = {free_port()}
tick_time_ms = 200
session_timeout_ms = 2000
heap_mb = 64
[bookie]
shutdown_grace_ms = 2000
write_cache_throttle_ms_max = 1000
[broker]
shutdown_grace_ms = 2000
bookie_timeout_ms = 2000
""")
    cfg = cluster_cmd.loader.load(str(config), env={})
    run = base / "run"

    def bksim(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bksim.cli.main", "--config", str(config), *args],
                              env=_clean_env(), capture_output=True, text=True, timeout=120)

    up = bksim("cluster", "up")
    try:
        logs = "".join(processes.tail(str(p)) for p in sorted((run / "logs").glob("*.log")))
        assert up.returncode == 0, up.stdout + up.stderr + logs
        brokers = [f"127.0.0.1:{cfg.cluster.broker_port_base + i}" for i in range(BROKERS)]
        yield {"config": str(config), "brokers": brokers, "up": up.stdout, "bksim": bksim, "run": run}
    finally:
        down = bksim("cluster", "down")
        assert down.returncode == 0, down.stdout + down.stderr


def cli(cluster, *argv: str, password: str | None = None) -> tuple[int, str, str]:
    """Run `bksim --config <cluster> <argv>` in-process: (exit status, stdout, stderr). `password` goes into
    $BKSIM_LEDGER_PASSWORD for the call (None: unset); other BKSIM_ variables are hidden."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_clean_env({PASSWORD_ENV: password} if password is not None else {}))
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(["--config", cluster["config"], *argv])
            except SystemExit as e:  # argparse
                rc = e.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return rc, out.getvalue(), err.getvalue()


def ok_json(cluster, *argv: str, password: str | None = None):
    rc, out, err = cli(cluster, *argv, "--json", password=password)
    assert rc == 0, f"bksim {' '.join(argv)} exited {rc}: {err}"
    return json.loads(out)


def read_rows(cluster, *argv: str, password: str | None = None) -> list[dict]:
    """`bksim ledger read ... --json`: one JSON object per entry and line, in entry order."""
    rc, out, err = cli(cluster, "ledger", "read", *argv, "--json", password=password)
    assert rc == 0, f"bksim ledger read {' '.join(argv)} exited {rc}: {err}"
    return [json.loads(line) for line in out.splitlines()]


def refused(cluster, *argv: str, password: str | None = None) -> str:
    """Run a command that must fail with a broker status: exit 2, nothing on stdout, one error line."""
    rc, out, err = cli(cluster, *argv, password=password)
    assert rc == 2, f"bksim {' '.join(argv)} exited {rc}: {out} {err}"
    assert out == "", out
    assert err.startswith("bksim: error: ") and err.count("\n") == 1, err
    return err


def create(cluster, e: int = 3, qw: int = 3, qa: int = 2, password: str | None = None) -> int:
    md = ok_json(cluster, "ledger", "create", "--ensemble", str(e), "--write-quorum", str(qw),
                 "--ack-quorum", str(qa), password=password)
    return md["ledger_id"]


# -- the life of a ledger --------------------------------------------------------------------------------------

def test_cluster_up_prints_endpoints_and_a_first_command(cluster):
    for i, address in enumerate(cluster["brokers"], start=1):
        assert f"broker-{i}: registered and SERVING" in cluster["up"]
        assert f"broker-{i}   {address}" in cluster["up"]
    hint = next(line for line in cluster["up"].splitlines() if line.startswith("try: "))
    command = hint.removeprefix("try: ").split("   (then")[0]
    assert command.endswith(f" ledger create --ensemble 3 --write-quorum 3 --ack-quorum 2 --config {cluster['config']}")
    # the hint works as printed, from where `cluster up` ran, whether or not a venv is activated
    created = subprocess.run(shlex.split(command), env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert created.returncode == 0 and created.stdout.startswith("ledger "), created.stdout + created.stderr
    status = json.loads(cluster["bksim"]("cluster", "status", "--json").stdout)
    assert [(r["name"], r["alive"], r["registered"]) for r in status["processes"] if r["name"].startswith("broker")] \
        == [("broker-1", True, "yes"), ("broker-2", True, "yes")]


def test_create_write_read_close_metadata_list_delete(cluster):
    md = ok_json(cluster, "ledger", "create", "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2")
    ledger_id = md["ledger_id"]
    assert (md["state"], md["ensemble_size"], md["write_quorum_size"], md["ack_quorum_size"]) == ("OPEN", 3, 3, 2)
    assert md["broker"] == cluster["brokers"][0]  # the first registered broker
    assert len(md["segments"]) == 1 and md["segments"][0]["first_entry_id"] == 0
    assert len(set(md["segments"][0]["ensemble"])) == 3
    assert "password" not in json.dumps(md)

    wrote = ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "250", "--size", "100", "--batch", "32")
    assert (wrote["entries"], wrote["first_entry_id"], wrote["last_entry_id"]) == (250, 0, 249)
    assert wrote["last_add_confirmed"] == 249 and wrote["bytes"] == 25_000 and wrote["batch"] == 32
    more = ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "5", "--size", "10")
    assert (more["first_entry_id"], more["last_entry_id"]) == (250, 254)  # ids continue

    read = read_rows(cluster, str(ledger_id), "--payload")
    assert [e["entry_id"] for e in read] == list(range(255)) and {e["ledger_id"] for e in read} == {ledger_id}
    for e in read:
        expected = make_payload(e["entry_id"], 100) if e["entry_id"] < 250 else make_payload(e["entry_id"] - 250, 10)
        assert base64.b64decode(e["payload"]) == expected and e["size"] == len(expected), e
    part = read_rows(cluster, str(ledger_id), "--from", "10", "--to", "19")
    assert [e["entry_id"] for e in part] == list(range(10, 20))
    assert part[0]["preview"].startswith("00000010 abcdef") and sum(e["size"] for e in part) == 1000
    assert "payload" not in part[0]

    rc, out, _ = cli(cluster, "ledger", "read", str(ledger_id), "--from", "248", "--to", "250")  # human table
    assert rc == 0
    assert out.splitlines()[0].split() == ["ENTRY", "SIZE", "PREVIEW"]
    assert out.splitlines()[1].split()[:3] == ["248", "100", "00000248"]
    assert out.splitlines()[3].split()[:3] == ["250", "10", "00000000"]
    assert out.splitlines()[-1] == "3 entries, 210 bytes (ids 248..250)"

    closed = ok_json(cluster, "ledger", "close", str(ledger_id))
    assert (closed["state"], closed["last_entry_id"], closed["length"]) == ("CLOSED", 254, 25_050)
    assert ok_json(cluster, "ledger", "close", str(ledger_id)) == closed  # closing again: the same metadata
    assert ok_json(cluster, "ledger", "metadata", str(ledger_id)) == closed
    rc, out, _ = cli(cluster, "ledger", "metadata", str(ledger_id))
    assert rc == 0 and "state           CLOSED" in out and "last entry      254" in out
    # a closed ledger reads the same from any broker
    other = read_rows(cluster, str(ledger_id), "--broker", cluster["brokers"][1])
    assert len(other) == 255 and sum(e["size"] for e in other) == 25_050

    listing = ok_json(cluster, "ledger", "list")
    assert ledger_id in listing["ledger_ids"]
    assert [d for d in listing["ledgers"] if d["ledger_id"] == ledger_id] == [closed]
    rc, out, _ = cli(cluster, "ledger", "list")
    assert rc == 0 and any(line.split()[:2] == [str(ledger_id), "CLOSED"] for line in out.splitlines())

    assert ok_json(cluster, "ledger", "delete", str(ledger_id)) == {"ledger_id": ledger_id, "deleted": True}
    err = refused(cluster, "ledger", "metadata", str(ledger_id))
    assert err == f"bksim: error: NO_SUCH_LEDGER: ledger {ledger_id} does not exist\n"
    assert ledger_id not in ok_json(cluster, "ledger", "list")["ledger_ids"]


def test_recover_an_open_ledger_from_another_broker(cluster):
    """broker-1 writes; `ledger recover` on broker-2 fences it and closes the ledger with every acknowledged
    entry; broker-1's next append is refused as FENCED."""
    ledger_id = create(cluster, 3, 3, 2)
    wrote = ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "40", "--size", "50")
    assert wrote["last_entry_id"] == 39
    assert ok_json(cluster, "ledger", "metadata", str(ledger_id))["state"] == "OPEN"

    recovered = ok_json(cluster, "ledger", "recover", str(ledger_id), "--broker", cluster["brokers"][1])
    assert (recovered["state"], recovered["last_entry_id"], recovered["length"]) == ("CLOSED", 39, 2000)
    assert recovered["last_add_confirmed"] == 39
    read = read_rows(cluster, str(ledger_id), "--payload", "--broker", cluster["brokers"][1])
    assert [base64.b64decode(e["payload"]) for e in read] == [make_payload(i, 50) for i in range(40)]

    err = refused(cluster, "ledger", "write", str(ledger_id), "--count", "1", "--size", "50")
    assert err.startswith(f"bksim: error: FENCED: ledger {ledger_id}: "), err
    assert ok_json(cluster, "ledger", "metadata", str(ledger_id))["last_entry_id"] == 39  # nothing changed
    again = ok_json(cluster, "ledger", "recover", str(ledger_id))  # recovering a closed ledger: nothing to do
    assert (again["state"], again["last_entry_id"]) == ("CLOSED", 39)


# -- refusals -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("e,qw,qa", [(2, 3, 2), (3, 2, 3)], ids=["E<Qw", "Qa>Qw"])
def test_bad_quorum_sizes_are_bad_requests(cluster, e, qw, qa):
    err = refused(cluster, "ledger", "create", "--ensemble", str(e), "--write-quorum", str(qw),
                  "--ack-quorum", str(qa))
    assert err == (f"bksim: error: BAD_REQUEST: need ensemble >= write quorum >= ack quorum >= 1, "
                   f"got E={e} Qw={qw} Qa={qa}\n")


def test_wrong_password_is_unauthorized(cluster, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret-value\n")
    rc, out, err = cli(cluster, "ledger", "create", "-e", "2", "-w", "2", "-a", "2", "--password-file", str(secret),
                       "--json")
    assert rc == 0, err
    ledger_id = json.loads(out)["ledger_id"]
    assert "s3cret" not in out + err
    rc, out, err = cli(cluster, "ledger", "write", str(ledger_id), "-n", "3", "-s", "8", "--json",
                       password="s3cret-value")  # the environment variable holds the same password
    assert rc == 0 and json.loads(out)["entries"] == 3, err

    for password in ("wrong", None):  # a wrong password; no password at all (empty)
        for argv in (("read", str(ledger_id)), ("write", str(ledger_id), "-n", "1", "-s", "8"),
                     ("close", str(ledger_id)), ("recover", str(ledger_id)), ("delete", str(ledger_id))):
            err = refused(cluster, "ledger", *argv, password=password)
            assert err == f"bksim: error: UNAUTHORIZED: wrong password for ledger {ledger_id}\n", (argv, err)
    # nothing was done by the refused calls
    md = ok_json(cluster, "ledger", "metadata", str(ledger_id))
    assert md["state"] == "OPEN"
    assert len(read_rows(cluster, str(ledger_id), "--password-file", str(secret))) == 3


def test_reading_past_the_lac_is_refused(cluster):
    ledger_id = create(cluster)
    ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "5", "--size", "16")
    err = refused(cluster, "ledger", "read", str(ledger_id), "--from", "0", "--to", "10")
    assert err == f"bksim: error: READ_BEYOND_LAC: ledger {ledger_id}: entry 10 is above the last confirmed entry 4\n"
    assert len(read_rows(cluster, str(ledger_id), "--to", "4")) == 5  # up to the LAC is fine
    # a reader on the other broker sees the same bound (the LAC from the bookies)
    err = refused(cluster, "ledger", "read", str(ledger_id), "--to", "5", "--broker", cluster["brokers"][1])
    assert err.startswith("bksim: error: READ_BEYOND_LAC: "), err


def test_appending_to_a_closed_ledger_is_refused(cluster):
    ledger_id = create(cluster)
    ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "3", "--size", "16")
    closed = ok_json(cluster, "ledger", "close", str(ledger_id))
    err = refused(cluster, "ledger", "write", str(ledger_id), "--count", "1", "--size", "16")
    assert err == f"bksim: error: LEDGER_CLOSED: ledger {ledger_id} is closed\n", err
    assert ok_json(cluster, "ledger", "metadata", str(ledger_id)) == closed  # nothing appended
    assert len(read_rows(cluster, str(ledger_id))) == 3


def test_open_ledger_is_written_only_by_its_creator(cluster):
    ledger_id = create(cluster)
    err = refused(cluster, "ledger", "write", str(ledger_id), "-n", "1", "-s", "1", "--broker", cluster["brokers"][1])
    assert err.startswith(f"bksim: error: NOT_WRITER: this broker does not write ledger {ledger_id}"), err
    err = refused(cluster, "ledger", "close", str(ledger_id), "--broker", cluster["brokers"][1])
    assert "NOT_WRITER" in err and "recovery" in err, err


def test_errors_as_a_shell_sees_them(cluster, tmp_path):
    """The real `bksim` process: exit status 2 and the message on stderr; an unreachable broker names the
    address and how it was chosen."""
    bksim = cluster["bksim"]
    r = bksim("ledger", "create", "--ensemble", "1", "--write-quorum", "2", "--ack-quorum", "1")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("bksim: error: BAD_REQUEST: need ensemble >= write quorum"), r.stderr
    r = bksim("ledger", "metadata", "999999999")
    assert (r.returncode, r.stderr) == (2, "bksim: error: NO_SUCH_LEDGER: ledger 999999999 does not exist\n")
    dead = f"127.0.0.1:{free_port()}"
    r = bksim("ledger", "list", "--broker", dead)
    assert r.returncode == 2 and r.stderr.startswith(f"bksim: error: UNAVAILABLE: broker {dead}: "), r.stderr
    assert "--broker" in r.stderr and "bksim cluster up" in r.stderr


def test_write_and_read_show_progress_on_a_terminal_only(cluster):
    """`ledger write` and `ledger read` with stderr on a pseudo-terminal: a status line with the entries done of
    the total, the rate and the ETA, erased at the end; stdout is what a pipe gets; with stderr on a pipe (or
    --json) no line is drawn."""
    ledger = create(cluster)
    config = ("--config", cluster["config"])
    status, stdout, terminal = run_on_tty(*config, "ledger", "write", str(ledger), "--count", "4000", "--size",
                                          "100", "--batch", "5", "--window", "2")
    assert status == 0 and f"ledger {ledger}: appended 4000 entries" in stdout, terminal
    drawn = [f for f in frames(terminal) if f.startswith(f"ledger write {ledger}")]
    assert any("/4,000 entries" in f and "/s" in f and "ETA" in f for f in drawn), terminal
    assert_ends_clean(terminal)
    status, stdout, terminal = run_on_tty(*config, "ledger", "read", str(ledger), "--to", "3999")
    assert status == 0 and stdout.endswith("4000 entries, 400000 bytes (ids 0..3999)\n"), terminal
    assert any("/4,000 entries" in f for f in frames(terminal) if f.startswith(f"ledger read {ledger}")), terminal
    assert_ends_clean(terminal)
    piped = run_on_pipes(*config, "ledger", "read", str(ledger), "--to", "3999")
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, stdout, "")
    status, stdout, terminal = run_on_tty(*config, "ledger", "read", str(ledger), "--from", "3990", "--json")
    assert status == 0 and len(stdout.splitlines()) == 10 and terminal == ""


def test_argument_errors(cluster, tmp_path):
    missing = tmp_path / "nope"
    rc, out, err = cli(cluster, "ledger", "read", "1", "--password-file", str(missing))
    assert (rc, out, err) == (2, "", f"bksim: error: cannot read password file {missing}: No such file or directory\n")
    rc, out, err = cli(cluster, "ledger", "write", "1", "--count", "0", "--size", "1")  # argparse: exit 2 too
    assert rc == 2 and "argument --count/-n: must be >= 1, got 0" in err
    rc, out, err = cli(cluster, "ledger", "create", "-e", "1", "-w", "1", "-a", "1", "--custom", "novalue")
    assert (rc, err) == (2, "bksim: error: --custom 'novalue': expected KEY=VALUE\n")


def test_without_zookeeper_the_default_broker_address_is_used(tmp_path):
    """ZooKeeper unreachable: the command falls back to <broker.host>:<broker_port_base> and says so."""
    base = free_port()
    config = tmp_path / "bksim.toml"
    config.write_text(f"[cluster]\nbroker_port_base = {base}\n[zookeeper]\nport = {free_port()}\n")
    rc, out, err = cli({"config": str(config)}, "ledger", "list")
    assert rc == 2 and out == ""
    assert err.startswith(f"bksim: error: UNAVAILABLE: broker 127.0.0.1:{base}: "), err
    assert "not reachable; using the default broker address" in err


# -- manners: pipes and partial writes ------------------------------------------------------------------------

@pytest.mark.parametrize("json_lines", [False, True], ids=["table", "json"])
def test_a_closed_pipe_ends_the_command_quietly(cluster, json_lines):
    """`bksim ledger read ID | head -1`: the reader goes away after one line; the real process stops with
    status 141 (128 + SIGPIPE) and writes nothing to stderr (no BrokenPipeError traceback). The output is far
    larger than the pipe's buffer, so the command is still writing when the pipe closes."""
    ledger_id = create(cluster)
    ok_json(cluster, "ledger", "write", str(ledger_id), "--count", "5000", "--size", "16", "--batch", "500")
    argv = [sys.executable, "-m", "bksim.cli.main", "--config", cluster["config"], "ledger", "read", str(ledger_id)]
    proc = subprocess.Popen(argv + (["--json"] if json_lines else []), env=_clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            processes.kill9(proc.pid)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if json_lines:
        assert json.loads(first)["entry_id"] == 0
    else:
        assert first.split() == [b"ENTRY", b"SIZE", b"PREVIEW"]
    assert (status, err) == (141, ""), err


def _bookie_pid(cluster, bookie_id: str) -> int:
    """The pid of the cluster's bookie with this id (its slot from the port, its pid file)."""
    cfg = cluster_cmd.loader.load(cluster["config"], env={})
    slot = int(bookie_id.rsplit(":", 1)[1]) - cfg.cluster.bookie_port_base + 1
    pid = processes.read_pid(str(cluster["run"] / "pids" / f"bookie-{slot}.pid"))
    assert pid and processes.is_alive(pid), bookie_id
    return pid


def test_a_write_failing_part_way_reports_what_was_acknowledged(cluster):
    """Two ledgers E=3 Qw=1 Qa=1 over all three bookies: entry e lives on ensemble index e mod 3 alone. One
    bookie X is killed -9; it stands at index >= 1 in both ensembles (two of three bookies do in each, so one
    bookie does in both). A write with one entry per request and one request in flight then has the entries
    before X's index acknowledged and fails on X's: no bookie is left to replace it (NOT_ENOUGH_BOOKIES). The
    command exits 2 with the error on stderr and reports the acknowledged entries and the LAC (--json: the
    object; otherwise a line); recovery after X is back finds every one of them."""
    ledgers = [ok_json(cluster, "ledger", "create", "-e", "3", "-w", "1", "-a", "1") for _ in range(2)]
    ensembles = [md["segments"][0]["ensemble"] for md in ledgers]
    victim = next(b for b in ensembles[0][1:] if b in ensembles[1][1:])
    acked = [ensemble.index(victim) for ensemble in ensembles]  # entries 0..index-1 avoid the victim
    assert processes.kill9(_bookie_pid(cluster, victim))
    try:
        first, second = (str(md["ledger_id"]) for md in ledgers)
        write = ("--count", "10", "--size", "20", "--batch", "1", "--window", "1")
        rc, out, err = cli(cluster, "ledger", "write", first, *write, "--json")
        assert rc == 2 and err.startswith("bksim: error: NOT_ENOUGH_BOOKIES: "), (rc, out, err)
        report = json.loads(out)
        assert (report["entries"], report["first_entry_id"], report["last_entry_id"], report["last_add_confirmed"]) \
            == (acked[0], 0, acked[0] - 1, acked[0] - 1), report
        assert report["requested"] == 10 and report["bytes"] == 20 * acked[0]
        assert report["error"]["status"] == "NOT_ENOUGH_BOOKIES" and report["error"]["message"] in err

        rc, out, err = cli(cluster, "ledger", "write", second, *write)
        assert rc == 2 and err.startswith("bksim: error: NOT_ENOUGH_BOOKIES: ") and err.count("\n") == 1, err
        assert out == (f"ledger {second}: {acked[1]} of 10 entries acknowledged (ids 0..{acked[1] - 1}, durable) "
                       f"before the write failed; LAC {acked[1] - 1}\n")
    finally:
        up = cluster["bksim"]("cluster", "up")  # restarts the killed bookie and waits for its registration
        assert up.returncode == 0, up.stdout + up.stderr
    for md, n in zip(ledgers, acked):
        recovered = ok_json(cluster, "ledger", "recover", str(md["ledger_id"]), "--broker", cluster["brokers"][1])
        assert recovered["state"] == "CLOSED" and recovered["last_entry_id"] >= n - 1, recovered
        rows = read_rows(cluster, str(md["ledger_id"]), "--to", str(n - 1), "--payload",
                         "--broker", cluster["brokers"][1])
        assert [base64.b64decode(r["payload"]) for r in rows] == [make_payload(i, 20) for i in range(n)]
