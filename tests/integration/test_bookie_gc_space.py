"""Garbage collection and compaction give disk space back in real processes (ZooKeeper, bookie processes, a
broker), with small entry logs and GC rounds every few hundred milliseconds:

- a topic with retention 0 under a steady producer and a consumer acknowledging everything: the bookies'
  entry-log directories level off (the curve is printed) while the bytes produced are several times the bound;
- kill -9 of a bookie while it compacts (a `.compacting` file in its entry-log directory): after the restart the
  unfinished file is gone, every entry of the live ledger reads back identical through the broker and from that
  bookie directly, and a later round frees the space;
- a bookie whose disk filled to read-only, with a live ledger interleaved in every entry log of the deleted one:
  after `bksim ledger delete` (the operator's command, through a broker) the forced major compaction copies the
  live ledger out and the bookie registers writable again, the live ledger intact. (test_bookie_gc.py covers a
  disk filled by one ledger, freed by deleting whole logs; this one needs compaction.)

Every process is stopped by pid; every wait is bounded (helpers.wait_until); the producer and the sampler keep
a schedule (their sleeps pace work, they synchronise nothing).
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import uuid

from bksim.adapters.bookie_client import SyncBookieClient
from bksim.client import Client, ClientError, InitialPosition
from bksim.formats import entry_log as log_fmt
from bksim.formats.entry import decode_entry, encode_entry
from bksim.model.status import StatusCode
from helpers import wait_until
from integration.bookie_harness import KEY, BookieProcess, kazoo_client, registration_path
from integration.broker_harness import BrokerConn, BrokerProcess
from integration.test_bookie_gc import logs_by_ledgers
from integration.test_bookie_readonly import ledgers_with_metadata, small_fs, used_fraction  # noqa: F401 - fixture

MiB = 1024 * 1024
PASSWORD = b"gc-space"


def entrylog_dir(bookie: BookieProcess) -> str:
    return os.path.join(bookie.ledger_dir, "entrylogs")


def dir_bytes(path: str) -> int:
    """Bytes of the files in `path` (entry logs and compaction files); a file removed while listed counts 0."""
    total = 0
    for name in os.listdir(path) if os.path.isdir(path) else ():
        try:
            total += os.path.getsize(os.path.join(path, name))
        except FileNotFoundError:
            pass  # maybe: deleted by a GC round meanwhile
    return total


def compaction_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if log_fmt.parse_compaction_file_name(n) is not None)


def gc_env(**overrides: str) -> dict[str, str]:
    env = {"BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(1 * MiB), "BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX": str(2 * MiB),
           "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "300", "BKSIM_BOOKIE_GC_WAIT_TIME_MS": "500",
           "BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS": "1000", "BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS": "2000"}
    env.update(overrides)
    return env


def start_cluster(zk, bookies: list[BookieProcess], broker: BrokerProcess) -> None:
    """Spawn the bookies, wait until the writable registrations are exactly them (other modules' bookies on this
    ZooKeeper are gone, so the broker places ledgers on these only), then start the broker."""
    for b in bookies:
        b.spawn()
    for b in bookies:
        b.wait_registered(zk)
    ids = {b.bookie_id for b in bookies}
    wait_until(lambda: {c for c in zk.get_children("/ledgers/available") if c != "readonly"} == ids, 15.0,
               interval_s=0.05, message=f"writable registrations exactly {sorted(ids)}")
    broker.spawn()
    broker.wait_registered(zk)


def stop_all(processes: list) -> None:
    for p in processes:
        p.cleanup()


# -- a. usage levels off under retention 0 --------------------------------------------------------------------

RUN_S = 36.0
SAMPLE_S = 0.5
MESSAGE_BYTES = 16 * 1024
PRODUCE_RATE = 40  # messages/s: 640 KiB/s onto each bookie (E = Qw = 2)


def test_retention_zero_topic_usage_levels_off(zookeeper, tmp_path):
    env = gc_env()
    bookies = [BookieProcess(zookeeper, tmp_path, name=f"bookie-{i}", env=env) for i in (1, 2)]
    broker = BrokerProcess(zookeeper, tmp_path, env={"BKSIM_TOPIC_LEDGER_ENTRIES_MAX": "100",
                                                     "BKSIM_TOPIC_TRIM_INTERVAL_MS": "500",
                                                     "BKSIM_TOPIC_CURSOR_PERSIST_INTERVAL_MS": "200"})
    zk = kazoo_client(zookeeper)
    try:
        start_cluster(zk, bookies, broker)
        samples, produced, consumed = _produce_consume_and_sample(broker.address, bookies)
        for b in bookies:
            assert b.alive(), f"{b.bookie_id} died:\n{b.log_tail()}"
        assert broker.alive(), broker.log_tail()
        logs = [b.log_text() for b in bookies]
    finally:
        stop_all([broker, *bookies])
        zk.stop()
        zk.close()

    curve = "\n".join(f"{t:6.1f} s  " + "  ".join(f"{n / MiB:6.2f}" for n in sizes) for t, sizes in samples)
    header = "  time   " + "  ".join(f"{b.bookie_id.split(':')[-1]:>6}" for b in bookies) + "  (MiB of entry logs)"
    print(f"\n{header}\n{curve}")
    # bound: one compaction's new log + the log being written + a checkpoint's worth of the write cache
    bound = 2 * int(env["BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX"]) + int(env["BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX"])
    third = RUN_S / 3
    message = (f"produced {produced * MESSAGE_BYTES / MiB:.1f} MiB ({produced} messages, {consumed} consumed), "
               f"bound {bound / MiB:.1f} MiB\n{header}\n{curve}")
    assert produced * MESSAGE_BYTES >= 4 * bound, message
    produced_last_third = produced * MESSAGE_BYTES / 3
    assert produced_last_third > bound, f"too little produced for a store that never frees to fail: {message}"
    assert consumed >= produced - PRODUCE_RATE * 5, message
    for i, b in enumerate(bookies):
        middle = max(s[i] for t, s in samples if third <= t < 2 * third)
        last = max(s[i] for t, s in samples if t >= 2 * third)
        assert last <= middle + bound, f"{b.bookie_id}: usage grows: max {middle / MiB:.2f} MiB in the middle third, " \
                                       f"{last / MiB:.2f} MiB in the last\n{message}"
        assert samples[-1][1][i] < produced * MESSAGE_BYTES / 3, message
        assert "ledger(s) deleted" in logs[i] and "garbage collection (" in logs[i], logs[i][-3000:]


def _produce_consume_and_sample(broker: str, bookies: list[BookieProcess]):
    """Produce at PRODUCE_RATE for RUN_S on a fresh retention-0 topic, consume and acknowledge everything in a
    thread, sample each bookie's entry-log bytes every SAMPLE_S. Returns (samples, produced, consumed)."""
    tenant = f"gc{uuid.uuid4().hex[:8]}"
    topic = f"persistent://{tenant}/ns/steady"
    stop = threading.Event()
    consumed = [0]
    errors: list[str] = []
    payload = os.urandom(MESSAGE_BYTES)
    with Client([broker], operation_timeout_ms=20_000) as client:
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}/ns", retention_ms=0)
        client.create_topic(topic)
        consumer = client.subscribe(topic, "all", initial_position=InitialPosition.Earliest, ack_group_time_ms=0)
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=200,
                                          block_if_queue_full=True)

        def consume() -> None:
            while not stop.is_set() or consumed[0] < produced:
                try:
                    m = consumer.receive(1000)
                except ClientError as e:
                    if stop.is_set():
                        return
                    errors.append(str(e))
                    continue
                consumer.acknowledge(m)
                consumed[0] += 1

        reader = threading.Thread(target=consume, name="gc-space-consumer", daemon=True)
        produced = 0
        reader.start()
        samples: list[tuple[float, list[int]]] = []
        t0 = time.monotonic()
        next_sample = 0.0
        while (now := time.monotonic() - t0) < RUN_S:
            if now >= next_sample:
                samples.append((round(now, 1), [dir_bytes(entrylog_dir(b)) for b in bookies]))
                next_sample += SAMPLE_S
            due = int(now * PRODUCE_RATE) + 1
            while produced < due:
                producer.send_async(payload, None)
                produced += 1
            # the workload's pace (PRODUCE_RATE, SAMPLE_S), not a synchronisation: idle until the next send or sample
            time.sleep(max(0.0, min(due / PRODUCE_RATE, next_sample) - (time.monotonic() - t0)))
        samples.append((round(time.monotonic() - t0, 1), [dir_bytes(entrylog_dir(b)) for b in bookies]))
        producer.flush(30.0)
        stop.set()
        reader.join(30.0)
        assert not reader.is_alive(), "the consumer did not stop"
        producer.close()
        consumer.close()
    return samples, produced, consumed[0]


# -- b. kill -9 during compaction --------------------------------------------------------------------------------

ENTRY_PAYLOAD = 4096
BATCH = 16
BATCHES = 32  # per ledger: 2 MiB each, interleaved batch by batch, so each entry log is about half each


def ledger_payload(ledger_id: int, i: int) -> bytes:
    head = f"L{ledger_id}:{i}|".encode()
    return head + bytes([(ledger_id + i) % 251]) * (ENTRY_PAYLOAD - len(head))


def test_kill9_during_compaction_loses_nothing_and_a_later_round_frees_the_space(zookeeper, tmp_path):
    # the copy runs at 128 KiB/s: compacting a log's ~0.5 MiB of live entries takes seconds
    bookie = BookieProcess(zookeeper, tmp_path, env=gc_env(
        BKSIM_BOOKIE_GC_WAIT_TIME_MS="300", BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS="300",
        BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS="300", BKSIM_BOOKIE_MINOR_COMPACTION_THRESHOLD="0.8",
        BKSIM_BOOKIE_MAJOR_COMPACTION_THRESHOLD="0.8", BKSIM_BOOKIE_COMPACTION_RATE_BYTES_PER_S=str(128 * 1024)))
    broker = BrokerProcess(zookeeper, tmp_path)
    zk = kazoo_client(zookeeper)
    logs = entrylog_dir(bookie)
    try:
        start_cluster(zk, [bookie], broker)
        with BrokerConn(broker.address) as conn:
            doomed = conn.create(1, 1, 1, PASSWORD).ledger_id
            kept = conn.create(1, 1, 1, PASSWORD).ledger_id
            for b in range(BATCHES):
                for ledger_id in (doomed, kept):
                    r = conn.append_once(ledger_id, PASSWORD, [ledger_payload(ledger_id, b * BATCH + j)
                                                               for j in range(BATCH)])
                    assert not r.error and r.first_entry_id == b * BATCH, r
            conn.close_ledger(doomed, PASSWORD)
            conn.close_ledger(kept, PASSWORD)
            expected = {i: ledger_payload(kept, i) for i in range(BATCH * BATCHES)}
            wait_until(lambda: sum(1 for held in logs_by_ledgers(logs).values() if held == {doomed, kept}) >= 3, 20.0,
                       message="at least 3 entry logs holding both ledgers")
            before = dir_bytes(logs)
            conn.client.delete_ledger(doomed, password=PASSWORD)

            compacting = wait_until(lambda: [n for n in compaction_files(logs) if n.endswith(log_fmt.COMPACTING)],
                                    30.0, interval_s=0.01, message="a .compacting file")[0]
            previous_owner = bookie.owner(zk)
            bookie.kill9()
            new_id, old_id, _ = log_fmt.parse_compaction_file_name(compacting)
            assert os.path.exists(os.path.join(logs, compacting)), \
                f"{compacting} finished before the kill: the kill was not during compaction"
            bookie.start(zk, previous_owner)
            wait_until(lambda: f"deleted the unfinished compaction file {compacting}" in bookie.last_start_log(), 10.0,
                       message=f"the start-up log line saying {compacting} was deleted")
            assert not os.path.exists(os.path.join(logs, compacting))

            # every entry of the live ledger: from the bookie itself, and through the broker
            direct = _read_direct(bookie.address, kept, len(expected))
            assert direct == expected, _diff(direct, expected)
            assert conn.read(kept, PASSWORD, 0, BATCH * BATCHES - 1) == expected

            # a later round compacts the old log (and the others): it is gone and the space is given back
            wait_until(lambda: old_id not in logs_by_ledgers(logs) and not compaction_files(logs)
                       and all(held == {kept} for held in logs_by_ledgers(logs).values() if held), 60.0,
                       interval_s=0.1, message=f"entry log {old_id:x} compacted away, no log holding the deleted ledger")
            after = dir_bytes(logs)
            assert after < 0.75 * before, f"{after} bytes of entry logs after compaction, {before} before"
            assert conn.read(kept, PASSWORD, 0, BATCH * BATCHES - 1) == expected
            direct = _read_direct(bookie.address, kept, len(expected))
            assert direct == expected, _diff(direct, expected)
            assert new_id != old_id
    finally:
        stop_all([broker, bookie])
        zk.stop()
        zk.close()


def _read_direct(address: str, ledger_id: int, count: int) -> dict[int, bytes]:
    """The ledger's payloads 0..count-1 as this bookie serves them (digest checked), missing ones left out."""
    client = SyncBookieClient(address)
    out = {}
    try:
        for first in range(0, count, 256):
            ids = list(range(first, min(first + 256, count)))
            for entry_id, r in zip(ids, client.read_entries(ledger_id, ids)):
                if r.status == StatusCode.OK:
                    out[entry_id] = decode_entry(r.entry, ledger_id=ledger_id, entry_id=entry_id).payload
    finally:
        client.close()
    return out


def _ledger_bytes(entrylogs: str) -> dict[int, dict[int, int]]:
    out = {}
    for name in os.listdir(entrylogs):
        log_id = log_fmt.parse_entry_log_file_name(name)
        if log_id is not None:
            try:
                with open(os.path.join(entrylogs, name), "rb") as f:
                    _header, records, _stopped = log_fmt.scan(f.read())
            except FileNotFoundError:
                continue  # deleted by the bookie between the listing and the open
            sizes: dict[int, int] = {}
            for r in records:
                sizes[r.ledger_id] = sizes.get(r.ledger_id, 0) + len(r.entry or b"")
            out[log_id] = sizes
    return dict(sorted(out.items()))


def _diff(got: dict[int, bytes], expected: dict[int, bytes]) -> str:
    missing = sorted(set(expected) - set(got))
    wrong = sorted(i for i in got if got[i] != expected.get(i))
    return f"{len(missing)} missing (first {missing[:10]}), {len(wrong)} different (first {wrong[:10]})"


# -- c. read-only for a full disk, writable again after `bksim ledger delete` + compaction ----------------------

def test_full_bookie_is_writable_again_after_ledger_delete_compacts_the_live_ledger_out(zookeeper, tmp_path,
                                                                                         small_fs):
    """16 MiB tmpfs, threshold 0.5, low-water mark 0.3. Every batch holds 1 entry of the kept ledger for 3 of the
    doomed one, so many entry logs hold both: after the doomed ledger is deleted, those are freed only by
    compaction (forced at the major threshold while the disk is full): none of them may be left."""
    bookie = BookieProcess(zookeeper, tmp_path, journal_dir=os.path.join(small_fs, "journal"),
                           ledger_dir=os.path.join(small_fs, "ledgers"), env={
                               "BKSIM_BOOKIE_DISK_USAGE_THRESHOLD": "0.5",
                               "BKSIM_BOOKIE_DISK_USAGE_LWM_THRESHOLD": "0.3",
                               "BKSIM_BOOKIE_RECOVERY_ADD_RESERVE_BYTES": str(1 * MiB),
                               "BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX": str(2 * MiB),
                               "BKSIM_BOOKIE_JOURNAL_FILE_BYTES_MAX": str(1 * MiB),
                               "BKSIM_BOOKIE_JOURNAL_BACKUPS_MAX": "0",
                               "BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(512 * 1024),
                               "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "200",
                               "BKSIM_BOOKIE_GC_WAIT_TIME_MS": "2000"})
    broker = BrokerProcess(zookeeper, tmp_path)
    zk = kazoo_client(zookeeper)
    logs = entrylog_dir(bookie)
    try:
        start_cluster(zk, [bookie], broker)
        doomed, kept = asyncio.run(ledgers_with_metadata(zk, bookie.bookie_id, 2))
        client = SyncBookieClient(bookie.address)
        expected: dict[int, bytes] = {}
        try:
            # fill until the bookie is read-only: its disk check (every 100 ms) decides, not a fraction seen here
            # (a checkpoint that drops a journal file can take the disk back under the threshold in between)
            n = 0
            while True:
                used = used_fraction(small_fs)
                assert used < 0.9, f"still writable at {used:.2f} used"
                if used >= 0.55:  # over the threshold here: give the bookie's check a moment, write on if not
                    try:
                        wait_until(lambda: zk.exists(registration_path(bookie.bookie_id, True)), 1.0)
                        break
                    except AssertionError:
                        pass
                batch = [(encode_entry(doomed, 3 * n + i, 3 * n + i - 1, 0, b"d" * 16_000), KEY, 0) for i in range(3)]
                data = ledger_payload(kept, n)
                batch.append((encode_entry(kept, n, n - 1, 0, data), KEY, 0))
                result = client.add(batch, batch_id=n)
                if not result.ok:
                    assert set(result.statuses) == {StatusCode.READ_ONLY}, result
                    break
                expected[n] = data
                n += 1
            wait_until(lambda: zk.exists(registration_path(bookie.bookie_id, True)) is not None, 10.0,
                       message="the bookie registered read-only")
            assert len(expected) > 50
            # a checkpoint writes ledger by ledger: some logs hold the doomed ledger only, the others both
            # (the log being written, the highest id, is never compacted)
            before = logs_by_ledgers(logs)
            current = max(before)
            mixed = {log_id for log_id, held in before.items() if held == {doomed, kept} and log_id != current}
            assert len(mixed) >= 3, before

            done = subprocess.run([sys.executable, "-m", "bksim.cli.main", "ledger", "delete", str(doomed),
                                   "--broker", broker.address], capture_output=True, text=True, timeout=60,
                                  env={k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")},
                                  cwd=str(tmp_path))
            assert done.returncode == 0 and f"ledger {doomed} deleted" in done.stdout, done.stdout + done.stderr

            try:
                wait_until(lambda: zk.exists(registration_path(bookie.bookie_id, False)) is not None, 30.0,
                           message="the bookie registered writable again")
            except AssertionError as e:
                raise AssertionError(f"{e}; disk {used_fraction(small_fs):.2f} used, entry logs "
                                     f"{_ledger_bytes(logs)}\n{bookie.log_tail(15)}") from None
            assert used_fraction(small_fs) < 0.3
            # the round logs when it ends; the disk monitor may register the bookie writable before that
            round_line = r"garbage collection \(major\): 1 ledger\(s\) deleted, \d+ entry log\(s\) deleted, (\d+) compacted"
            compacted = wait_until(lambda: re.findall(round_line, bookie.log_text()), 10.0,
                                   message="the log line of the round that deleted the ledger")
            assert int(compacted[0]) >= len(mixed), (compacted, mixed)
            left = logs_by_ledgers(logs)
            assert not mixed & set(left), (mixed, left)
            # the doomed ledger may be left only in the log being written when it was deleted (or a later one a
            # checkpoint opened): never compacted while written
            assert all(log_id >= current for log_id, held in left.items() if doomed in held), \
                (current, _ledger_bytes(logs))
            got = {}
            for first in range(0, len(expected), 256):
                ids = list(range(first, min(first + 256, len(expected))))
                for entry_id, r in zip(ids, client.read_entries(kept, ids)):
                    assert r.status == StatusCode.OK, (entry_id, r.status, r.message)
                    got[entry_id] = decode_entry(r.entry, ledger_id=kept, entry_id=entry_id).payload
            assert got == expected, _diff(got, expected)
            assert client.read_entry(doomed, 0).status == StatusCode.NO_LEDGER
            n = len(expected)
            assert client.add([(encode_entry(kept, n, n - 1, 0, b"after"), KEY, 0)], batch_id=n).ok
        finally:
            client.close()
        assert bookie.terminate() == 0
    finally:
        stop_all([broker, bookie])
        zk.stop()
        zk.close()
