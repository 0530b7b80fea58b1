"""The audit's corpus from a real cluster run, and the seeded damage the tests plant in copies of it.

`run_cluster(zookeeper, base)`: real ZooKeeper (the session's), four `bksim bookie run` processes (journals
rolled at 64 KiB, checkpoints every 200 ms, every journal below the mark moved to `journal-archive/`, so the
whole history stays on disk) and two `bksim broker run` processes, driven through the brokers' gRPC API:

    ledger A  E3 Qw3 Qa2: 300 appends, closed
    ledger B  E3 Qw2 Qa2: appends; kill -9 of a bookie of its ensemble at 150 (ensemble change), 400 in all, closed
    ledger C  E3 Qw3 Qa2: appends through broker 1; kill -9 of broker 1 at 150; broker 2 recovers it (fence,
              read forward, write back, CLOSED)

then SIGTERM for what still runs, and `bksim metadata export`. The session's ZooKeeper also holds other test
modules' ledgers (whose bookies may have reused our ports), so the snapshot the tests audit keeps only A, B, C.

`Corpus` views a copy of the bookies' journal directories (records with their ledger, entry, flags) and the
`plant_*` functions damage it, each returning what the audit must then report (`Planted`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from bksim.formats import entry as entry_fmt
from bksim.formats import journal as jfmt
from bksim.model.status import FLAG_RECOVERY_ADD
from integration.bookie_harness import BookieProcess
from integration.broker_harness import PAYLOAD_BYTES_MAX, BrokerCluster, BrokerConn, payload, stream_appends

PASSWORD = b"audit-corpus"
BOOKIE_ENV = {
    "BKSIM_BOOKIE_JOURNAL_FILE_BYTES_MAX": str(64 * 1024),
    "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "200",
    "BKSIM_BOOKIE_JOURNAL_BACKUPS_MAX": "0",
}
# the test brokers take payloads of at most broker_harness.PAYLOAD_BYTES_MAX; the topic layer's bound must fit
BROKER_ENV = {"BKSIM_TOPIC_MESSAGE_BYTES_MAX": str(PAYLOAD_BYTES_MAX)}
EXPORT_TIMEOUT_S = 60.0


@dataclass
class ClusterRun:
    base: str
    bookies: list[BookieProcess]
    ledgers: dict[str, int]  # "A" | "B" | "C" -> ledger id
    metadata: dict[int, dict]  # ledger id -> LedgerInfo fields the tests need
    acked: dict[int, dict[int, bytes]]  # ledger id -> entry id -> payload acknowledged by the brokers
    snapshot_all: str  # bksim metadata export of the whole ZooKeeper
    snapshot: str  # the same, only A, B and C
    victim: str  # the bookie killed with -9

    def journal_dirs(self) -> list[str]:
        return [os.path.dirname(b.journal_dir) for b in self.bookies]  # journal/ and journal-archive/ below

    def ledger_dirs(self) -> list[str]:
        return [b.ledger_dir for b in self.bookies]


def run_cluster(zookeeper, base: str) -> ClusterRun:
    cluster = BrokerCluster(zookeeper, base)
    try:
        for i in range(1, 5):
            home = os.path.join(base, f"bookie-{i}")
            env = dict(BOOKIE_ENV, BKSIM_BOOKIE_JOURNAL_ARCHIVE_DIR=os.path.join(home, "journal-archive"))
            bookie = BookieProcess(zookeeper, base, name=f"bookie-{i}", env=env)
            cluster.bookies.append(bookie)
            bookie.spawn()
        for bookie in cluster.bookies:
            bookie.wait_registered(cluster.zk)  # alive and registered, so settle() starts no bookie of its own
        cluster.settle(4)
        first, second = cluster.start_brokers(2, env=BROKER_ENV)
        ledgers, acked = {}, {}
        with BrokerConn(first.address) as c1, BrokerConn(second.address) as c2:
            a = c1.create(3, 3, 2, PASSWORD).ledger_id
            run = stream_appends(c1, a, PASSWORD, target=100, total=300)
            assert run.error is None, run.error
            c1.close_ledger(a, PASSWORD)
            ledgers["A"], acked[a] = a, run.acked

            info = c1.create(3, 2, 2, PASSWORD)
            b = info.ledger_id
            victim = cluster.bookie(info.segments[0].ensemble[1])
            run = stream_appends(c1, b, PASSWORD, target=150, on_target=victim.kill9, total=400)
            assert run.error is None, f"{run.error}\n{first.log_tail()}"
            assert len(c1.metadata(b).segments) == 2, "the kill should have changed the ensemble"
            c1.close_ledger(b, PASSWORD)
            ledgers["B"], acked[b] = b, run.acked
            cluster.settle(3)  # the victim's registration gone: ledger C is placed on live bookies only

            c = c1.create(3, 3, 2, PASSWORD).ledger_id
            run = stream_appends(c1, c, PASSWORD, target=150, on_target=first.kill9, until_error=True)
            recovered, _ = c2.open(c, PASSWORD, recover=True)
            assert recovered.state == "CLOSED" and recovered.last_entry_id >= run.max_acked
            ledgers["C"], acked[c] = c, run.acked
            metadata = {}
            for name, ledger_id in ledgers.items():
                md = c2.metadata(ledger_id)
                metadata[ledger_id] = {"last_entry_id": md.last_entry_id, "write_quorum": md.write_quorum_size,
                                       "ack_quorum": md.ack_quorum_size, "state": md.state,
                                       "segments": [(s.first_entry_id, list(s.ensemble)) for s in md.segments]}
                assert md.state == "CLOSED", (name, md)
        for process in [*cluster.brokers, *cluster.bookies]:
            if process.alive():
                process.cleanup()  # SIGTERM, bounded wait: a clean stop (bookies checkpoint)
        snapshot_all = os.path.join(base, "snapshot-all.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
        done = subprocess.run([sys.executable, "-m", "bksim.cli.main", "metadata", "export", "--out", snapshot_all,
                               "--zookeeper", zookeeper.connect], capture_output=True, text=True, env=env,
                              timeout=EXPORT_TIMEOUT_S, cwd=base)
        assert done.returncode == 0, done.stderr
        with open(snapshot_all) as f:
            doc = json.load(f)
        doc["ledgers"] = [entry for entry in doc["ledgers"] if entry["ledger_id"] in set(ledgers.values())]
        snapshot = os.path.join(base, "snapshot.json")
        with open(snapshot, "w") as f:
            json.dump(doc, f)
        return ClusterRun(base, list(cluster.bookies), ledgers, metadata, acked, snapshot_all, snapshot,
                          victim.bookie_id)
    finally:
        cluster.cleanup()


# -- a copy of the journals, and damage planted in it ----------------------------------------------------

@dataclass(frozen=True)
class Record:
    bookie: str
    path: str
    journal_id: int
    newest: bool  # in the bookie's newest journal
    last: bool  # the last record of its file
    last_group: bool  # in the last group write of its file (damage there reads as a torn group write)
    offset: int
    end: int
    type: jfmt.RecordType
    flags: int
    ledger: int | None
    entry: int | None
    lac: int | None
    body: bytes
    group: int  # offset of the GROUP frame of its group write (version 1: the record's own offset)


@dataclass(frozen=True)
class Planted:
    rule: str
    ledger: int | None
    entry: int | None
    bookie: str
    path: str


class Corpus:
    """A copy of every bookie's journal directories (journal/ and journal-archive/, with their COOKIEs)."""

    def __init__(self, run: ClusterRun, root: str) -> None:
        self.run = run
        self.root = root
        self.bookie_roots = {}
        for bookie in run.bookies:
            home = os.path.dirname(bookie.journal_dir)
            target = os.path.join(root, os.path.basename(home))
            for sub in ("journal", "journal-archive"):
                if os.path.isdir(os.path.join(home, sub)):
                    shutil.copytree(os.path.join(home, sub), os.path.join(target, sub))
            self.bookie_roots[bookie.bookie_id] = target

    def records(self, bookie: str) -> list[Record]:
        files = []
        for sub in ("journal", "journal-archive"):
            directory = os.path.join(self.bookie_roots[bookie], sub)
            for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                journal_id = jfmt.parse_journal_file_name(name)
                if journal_id is not None:
                    files.append((journal_id, os.path.join(directory, name)))
        files.sort()
        out = []
        for journal_id, path in files:
            with open(path, "rb") as f:
                data = f.read()
            if len(data) < jfmt.FILE_HEADER_BYTES:  # maybe: created by the bookie killed -9 before its header landed
                continue
            records = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=True, skip_corruption=True).records
            for i, r in enumerate(records):
                ledger = entry = lac = None
                if r.type == jfmt.RecordType.ENTRY:
                    ledger, entry, lac = entry_fmt.IDS.unpack_from(r.body)
                elif r.type in (jfmt.RecordType.FENCE, jfmt.RecordType.MASTER_KEY, jfmt.RecordType.EXPLICIT_LAC):
                    (ledger,) = jfmt.LEDGER_ID.unpack_from(r.body)
                out.append(Record(bookie, path, journal_id, journal_id == files[-1][0], i == len(records) - 1,
                                  r.group == records[-1].group, r.offset, r.end, r.type, r.flags, ledger, entry,
                                  lac, r.body, r.group))
        return out

    def newest_journal(self, bookie: str) -> str:
        """The path of the bookie's newest journal with a whole header (it may hold no record yet). A shorter file
        is what a bookie killed -9 while creating a journal leaves (replay removes it, `records` skips it): a
        record planted there would make a journal without a header, not the planted fault."""
        found = []
        for sub in ("journal", "journal-archive"):
            directory = os.path.join(self.bookie_roots[bookie], sub)
            for name in os.listdir(directory) if os.path.isdir(directory) else []:
                path = os.path.join(directory, name)
                if jfmt.parse_journal_file_name(name) is not None and os.path.getsize(path) >= jfmt.FILE_HEADER_BYTES:
                    found.append((jfmt.parse_journal_file_name(name), path))
        return max(found)[1]

    def entries(self, bookie: str, ledger: int) -> list[Record]:
        return [r for r in self.records(bookie) if r.type == jfmt.RecordType.ENTRY and r.ledger == ledger]

    def copies(self, ledger: int, entry: int) -> list[Record]:
        return [r for b in self.bookie_roots for r in self.entries(b, ledger) if r.entry == entry]


def _rewrite(path: str, start: int, end: int, data: bytes) -> None:
    with open(path, "rb") as f:
        content = f.read()
    with open(path, "wb") as f:
        f.write(content[:start] + data + content[end:])


def plant_flipped_byte(corpus: Corpus, ledger: int, bookie: str) -> Planted:
    """A payload byte of a mid-file entry record flipped: its CRC fails, valid records follow. Never in the last
    group write of a file: replay cannot tell damage there from a group write torn by a crash (both fail the
    group's CRC with nothing after it), so the audit rightly calls that a torn tail."""
    candidates = [r for r in corpus.entries(bookie, ledger) if not r.last_group and not r.flags]
    r = candidates[len(candidates) // 2]
    with open(r.path, "rb") as f:
        f.seek(r.end - 1)
        byte = f.read(1)
    _rewrite(r.path, r.end - 1, r.end, bytes([byte[0] ^ 0x5A]))
    return Planted("journal_crc_failure", None, None, bookie, r.path)


def plant_torn_tail(corpus: Corpus, bookie: str, ledger: int, last_entry_id: int) -> Planted:
    """The bookie's newest journal ends in the middle of a record: a crash tore the last group it was writing
    (an entry never acknowledged: its sync had not returned)."""
    newest = corpus.newest_journal(bookie)
    entry_id = last_entry_id + 3
    torn = jfmt.entry_record(entry_fmt.encode_entry(ledger, entry_id, last_entry_id, 10**6, payload(ledger, entry_id)), 0)
    with open(newest, "ab") as f:
        f.write(torn[:len(torn) // 2])
    return Planted("torn_tail", None, None, bookie, newest)


def plant_garbage(corpus: Corpus, bookie: str) -> Planted:
    """64 bytes that are no record inserted between two records in the middle of a journal (never inside the
    file's last group write, where they would read as a torn group: see plant_flipped_byte)."""
    records = [r for r in corpus.records(bookie) if not r.last_group]
    r = records[len(records) // 3]
    garbage = bytes((37 * i + 11) % 251 + 1 for i in range(64))
    _rewrite(r.path, r.offset, r.offset, garbage)
    return Planted("journal_garbage", None, None, bookie, r.path)


def _mid_file_copy(corpus: Corpus, ledger: int, entry: int, holders: int | None = None) -> tuple[int, Record]:
    """The first entry at or after `entry` with a copy outside its file's last group write (and, with `holders`,
    exactly that many copies on as many bookies), and that copy.

    Rewriting a record changes its group's CRC: in a file's last group that reads as a group torn by a crash
    (replay and the audit drop it), so the planted damage would vanish with the group; where a copy lands
    depends on the run's timing, and so does which entries an ensemble change sent to a third bookie."""
    for e in range(entry, entry + 1000):
        copies = corpus.copies(ledger, e)
        if not copies:
            break
        if holders is not None and (len(copies) != holders or len({c.bookie for c in copies}) != holders):
            continue
        for r in copies:
            if not r.last_group:
                return e, r
    raise AssertionError(f"no copy of ledger {ledger} from entry {entry} on lies outside a file's last group"
                         + (f" with {holders} copies" if holders is not None else ""))


def plant_removed_copy(corpus: Corpus, ledger: int, entry: int) -> Planted:
    """One of the two copies (Qw = Qa = 2) of an entry (`entry` or the next one with a copy outside a last
    group write) cut out of its journal, its group write framed again without it (length and CRC), as if that
    bookie had never written it: one holder left, the rest of the file reads as before. (Cut without the new
    frame, the group's old length would run into the next group and misframe it: a last group of the file
    lost with it.)"""
    entry, r = _mid_file_copy(corpus, ledger, entry, holders=2)
    copies = corpus.copies(ledger, entry)
    assert len({c.bookie for c in copies}) == 2 and len(copies) == 2, copies
    cut_record(r.path, r)
    return Planted("below_ack_quorum", ledger, entry, "", "")


def cut_record(path: str, r) -> None:
    """Remove record `r` (offset, end, group: a Record or a formats.journal.JournalRecord) from the journal at
    `path`, its group write framed again without it."""
    if r.group == r.offset:  # version 1: records are not framed in groups
        _rewrite(path, r.offset, r.end, b"")
        return
    with open(path, "rb") as f:
        data = f.read()
    start = r.group + jfmt.RECORD_PREFIX_BYTES + jfmt.GROUP_BODY.size  # the group's first record
    length, _crc = jfmt.GROUP_BODY.unpack_from(data, r.group + jfmt.RECORD_PREFIX_BYTES)
    records = data[start:r.offset] + data[r.end:start + length]
    _rewrite(path, r.group, start + length, jfmt.group_record([records]) + records)


def plant_divergent_copy(corpus: Corpus, ledger: int, entry: int) -> Planted:
    """One copy of an entry (`entry` or the next one with a copy outside a last group write) replaced by an
    entry with the same ids and a different payload (a valid digest and a valid record CRC: only the other
    copies disagree)."""
    entry, r = _mid_file_copy(corpus, ledger, entry)
    lid, eid, lac, length, _ = entry_fmt.HEADER.unpack_from(r.body)
    data = bytearray(r.body[entry_fmt.HEADER_BYTES:])
    data[len(data) // 2] ^= 0x01
    forged = entry_fmt.encode_entry(lid, eid, lac, length, bytes(data))
    _rewrite(r.path, r.offset, r.end, jfmt.entry_record(forged, r.flags))
    return Planted("divergence", ledger, entry, "", "")


def plant_add_after_fence(corpus: Corpus, ledger: int, last_entry_id: int) -> Planted:
    """A normal (not RECOVERY_ADD) add of a new entry appended after a bookie journaled the ledger's fence."""
    fenced = next(b for b in sorted(corpus.bookie_roots) if any(r.type == jfmt.RecordType.FENCE and r.ledger == ledger
                                                                for r in corpus.records(b)))
    newest = corpus.newest_journal(fenced)
    entry_id = last_entry_id + 5
    forged = entry_fmt.encode_entry(ledger, entry_id, last_entry_id, 10**6, payload(ledger, entry_id))
    with open(newest, "ab") as f:
        f.write(framed(jfmt.entry_record(forged, 0)))
    return Planted("write_after_fence", ledger, entry_id, fenced, newest)


def plant_entry_past_end(corpus: Corpus, ledger: int, last_entry_id: int, bookie: str) -> Planted:
    """An entry above the closed ledger's last_entry_id (a fenced writer's late add): benign."""
    newest = corpus.newest_journal(bookie)
    entry_id = last_entry_id + 1
    late = entry_fmt.encode_entry(ledger, entry_id, last_entry_id, 10**6, payload(ledger, entry_id))
    with open(newest, "ab") as f:
        f.write(framed(jfmt.entry_record(late, 0)))
    return Planted("above_last_entry", ledger, entry_id, bookie, newest)


def framed(record: bytes) -> bytes:
    """A record in a group write of its own, as the bookie appends it."""
    return jfmt.group_record([record]) + record


def is_recovery_add(r: Record) -> bool:
    return bool(r.flags & FLAG_RECOVERY_ADD)
