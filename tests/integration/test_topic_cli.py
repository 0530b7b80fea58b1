"""`bksim tenant|namespace|topic|produce|consume` on real brokers (tests/integration/broker_harness.py).

Commands run in-process through `bksim.cli.main.main(argv)` (the `bksim` command's code, exit status and
output captured) with `--broker` naming both brokers; one runs as a real process for the exit status and the
error line a shell sees.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import uuid

import pytest

from bksim.cli.main import main
from pty_run import assert_ends_clean, frames, run_on_tty

BOOKIES = 3


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env={"BKSIM_TOPIC_MESSAGE_BYTES_MAX": "60000"})
    return ",".join(b.address for b in broker_cluster.brokers)


def bksim(brokers: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([argv[0], *([argv[1]] if argv[0] in ("tenant", "namespace", "topic") else []),
                     "--broker", brokers, *argv[2 if argv[0] in ("tenant", "namespace", "topic") else 1:]])
    return code, out.getvalue(), err.getvalue()


def ok(brokers: str, *argv: str) -> str:
    code, out, err = bksim(brokers, *argv)
    assert code == 0, f"bksim {' '.join(argv)} exited {code}: {err}"
    return out


@pytest.fixture
def ns(brokers):
    tenant = f"cli{uuid.uuid4().hex[:8]}"
    ok(brokers, "tenant", "create", tenant)
    ok(brokers, "namespace", "create", f"{tenant}/ns", "--retention", "-1")
    return f"{tenant}/ns"


def test_tenant_and_namespace_commands(brokers):
    tenant = f"cli{uuid.uuid4().hex[:8]}"
    assert ok(brokers, "tenant", "create", tenant) == f"tenant {tenant} created\n"
    assert tenant in json.loads(ok(brokers, "tenant", "list", "--json"))
    out = ok(brokers, "namespace", "create", f"{tenant}/a", "--retention", "60000", "--retention-bytes", "1000000",
             "--ttl", "5000", "--dedup", "--json")
    assert json.loads(out) == {"namespace": f"{tenant}/a", "retention_ms": 60000, "retention_bytes": 1000000,
                               "ttl_ms": 5000, "dedup": True, "backlog_quotas": {}}
    assert "retention 60000 ms / 1000000 bytes, ttl 5000 ms, dedup on" in ok(brokers, "namespace", "get", f"{tenant}/a")
    assert json.loads(ok(brokers, "namespace", "list", tenant, "--json")) == [f"{tenant}/a"]
    code, _, err = bksim(brokers, "namespace", "create", f"nobody{uuid.uuid4().hex[:6]}/x")
    assert code == 2 and "bksim: error: TENANT_NOT_FOUND: " in err


def test_topic_commands(brokers, ns):
    topic = f"persistent://{ns}/t"
    assert "created (3 partitions)" in ok(brokers, "topic", "create", topic, "--partitions", "3")
    assert json.loads(ok(brokers, "topic", "list", ns, "--json")) == [topic]
    rows = json.loads(ok(brokers, "topic", "lookup", topic, "--json"))
    assert [r["topic"] for r in rows] == [f"{topic}-partition-{i}" for i in range(3)]
    assert all(r["address"] in brokers.split(",") for r in rows)
    ok(brokers, "produce", topic, "-m", "a,b,c", "-k", "k1")
    stats = json.loads(ok(brokers, "topic", "stats", topic))
    assert sum(s["msgInCounter"] for s in stats["partitions"].values()) == 3
    internal = json.loads(ok(brokers, "topic", "stats-internal", topic))
    assert set(internal["partitions"]) == {f"{topic}-partition-{i}" for i in range(3)}
    code, _, err = bksim(brokers, "topic", "create", topic)
    assert code == 2 and "ALREADY_EXISTS" in err
    assert "deleted (3 partitions)" in ok(brokers, "topic", "delete", topic, "--force")
    assert json.loads(ok(brokers, "topic", "list", ns, "--json")) == []


def test_produce_then_consume_like_pulsar_client(brokers, ns):
    topic = f"persistent://{ns}/pc"
    ok(brokers, "topic", "create", topic)
    out = ok(brokers, "produce", topic, "-m", "hello,world", "-m", "third", "-p", "a=1", "-p", "b=2,c=3", "-n", "2",
             "-k", "K")
    assert out.startswith(f"6 messages successfully produced to {topic}")
    out = ok(brokers, "consume", topic, "-s", "sub", "--type", "Shared", "-n", "6", "--position", "earliest",
             "--timeout", "20")
    blocks = out.split("----- got message -----\n")[1:]
    assert [b.strip() for b in blocks] == [f"key:[K], properties:[a=1, b=2, c=3], content:{c}"
                                           for c in ("hello", "world", "third", "hello", "world", "third")]
    # every message was acknowledged: the subscription has nothing left
    code, _, err = bksim(brokers, "consume", topic, "-s", "sub", "--type", "Shared", "-n", "1", "--timeout", "1")
    assert code == 2 and "TIMEOUT" in err and "consumed 0" in err


def test_produce_file_rate_json_and_consume_json_hex(brokers, ns, tmp_path):
    topic = f"persistent://{ns}/files"
    ok(brokers, "topic", "create", topic)
    blob = bytes(range(256))
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    report = json.loads(ok(brokers, "produce", topic, "--file", str(path), "--json"))
    assert (report["produced"], report["failed"]) == (1, 0) and len(report["message_ids"]) == 1
    report = json.loads(ok(brokers, "produce", topic, "-m", "x", "--count", "20", "--rate", "200", "--json"))
    assert report["produced"] == 20 and report["seconds"] >= 19 / 200 * 0.9
    lines = ok(brokers, "consume", topic, "-s", "j", "-n", "21", "--position", "earliest", "--json",
               "--timeout", "20").splitlines()
    rows = [json.loads(line) for line in lines]
    assert "content_base64" in rows[0] and rows[1]["content"] == "x" and len(rows) == 21
    assert rows[0]["message_id"] == report["message_ids"][0].rsplit(":", 0)[0] or rows[0]["redelivery_count"] == 0
    out = ok(brokers, "consume", topic, "-s", "h", "-n", "1", "--position", "earliest", "--hex", "--timeout", "20")
    assert "00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|" in out


def test_produce_shows_progress_on_a_terminal_only(brokers, ns):
    """`produce --count` with stderr on a pseudo-terminal: receipts of the total with rate and ETA, erased at the
    end; nothing drawn with --json."""
    topic = f"persistent://{ns}/progress"
    ok(brokers, "topic", "create", topic)
    status, stdout, terminal = run_on_tty("produce", topic, "-m", "x", "--count", "300", "--rate", "300",
                                          "--broker", brokers)
    assert status == 0 and stdout.startswith(f"300 messages successfully produced to {topic}"), terminal
    drawn = [f for f in frames(terminal) if f.startswith(f"produce {topic}")]
    assert any("/300 messages" in f and "/s" in f and "ETA" in f for f in drawn), terminal
    assert_ends_clean(terminal)
    status, stdout, terminal = run_on_tty("produce", topic, "-m", "x", "--count", "30", "--json", "--broker", brokers)
    assert status == 0 and json.loads(stdout)["produced"] == 30 and terminal == ""


def test_bad_arguments_and_refusals_as_a_shell_sees_them(brokers, ns):
    topic = f"persistent://{ns}/missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    p = subprocess.run([sys.executable, "-m", "bksim.cli.main", "produce", topic, "-m", "x", "--broker", brokers],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and p.stderr.startswith("bksim: error: TOPIC_NOT_FOUND: "), p.stderr
    code, _, err = bksim(brokers, "produce", topic)
    assert code == 2 and "nothing to send" in err
    code, _, err = bksim(brokers, "consume", f"persistent://{ns}/x", "-s", "s", "--type", "Sideways")
    assert code == 2 and "unknown subscription type 'Sideways'" in err
