"""Disk faults done to a stopped (or, for disk-full, a running) bookie's files by the chaos runner.

- `tear_journal`: append to the newest journal a prefix of a copy of its last record: the next group write,
  cut short by the crash. It was never synced, so never acknowledged: nothing acknowledged is removed, and
  replay must truncate it (and say so).
- `truncate_journal`: cut the newest journal at a random byte inside one of its last records: a disk that lost the
  tail of what the bookie had synced. Replay then drops the whole group write the cut lands in (the torn last
  group) and every later one, so the copies of all their records are gone from this bookie (their entries
  keep their other replicas); the audit must report exactly those lost copies, and reads must not miss them.
  Returns the (ledger, entry) ids of the ADD records removed.
- `flip_entry_log_byte`: flip one payload byte of one stored entry in an entry log (the journal copy stays
  intact): the bookie still serves the entry, its digest no longer matches, so a reader must fail over to
  another replica and never report the entry missing.
- `fill_disk` / `drain_disk`: a balloon file that fills (or frees) the file system of a ledger directory
  up to a target fraction, so the bookie's own disk checker sees it full.

Every function reads and writes only under the directory it is given and says in one line what it did.
"""
from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass

from bksim.formats import entry_log
from bksim.formats.entry import HEADER_BYTES as ENTRY_HEADER_BYTES
from bksim.formats.journal import FILE_HEADER_BYTES, RecordType, parse_journal_file_name, scan_journal
from bksim.model.errors import FormatError
TRUNCATE_RECORDS_MAX = 3  # truncate_journal cuts inside one of the last this many records
BALLOON = "chaos-balloon"
BALLOON_CHUNK = 1 << 20
ENTRY_IDS = struct.Struct(">qq")  # an ENTRY record's body starts with the entry's ledger and entry ids


def _newest_journal(journal_dir: str) -> str | None:
    names = sorted(n for n in os.listdir(journal_dir) if parse_journal_file_name(n) is not None) \
        if os.path.isdir(journal_dir) else []
    return os.path.join(journal_dir, names[-1]) if names else None


def tear_journal(journal_dir: str, rng: random.Random) -> str:
    """Append a prefix of a copy of the newest journal's last record (a group write cut short by the crash)."""
    path = _newest_journal(journal_dir)
    if path is None:
        return f"no journal file in {journal_dir} to tear"
    with open(path, "rb") as f:
        data = f.read()
    scan = scan_journal(data, FILE_HEADER_BYTES, newest=True)
    if not scan.records:
        return f"{path}: no record to copy (left as it is)"
    last = scan.records[-1]
    cut = rng.randint(1, last.end - last.offset - 1)
    with open(path, "ab") as f:
        f.write(data[last.offset:last.offset + cut])
    return f"tore {os.path.basename(path)}: appended {cut} of a {last.end - last.offset}-byte record at offset {len(data)}"


def truncate_journal(journal_dir: str, rng: random.Random) -> tuple[str, set[tuple[int, int]]]:
    """Cut the newest journal at a random byte inside one of its last TRUNCATE_RECORDS_MAX records."""
    path = _newest_journal(journal_dir)
    if path is None:
        return f"no journal file in {journal_dir} to truncate", set()
    with open(path, "rb") as f:
        data = f.read()
    records = scan_journal(data, FILE_HEADER_BYTES, newest=True).records
    if not records:
        return f"{path}: no record to cut (left as it is)", set()
    victim = rng.choice(records[-TRUNCATE_RECORDS_MAX:])
    cut = rng.randint(victim.offset + 1, victim.end - 1)  # inside a record, never at a boundary: replay sees it torn
    gone = [r for r in records if r.group >= victim.group]  # replay truncates from the cut group's start
    removed = {ENTRY_IDS.unpack_from(r.body) for r in gone if r.type is RecordType.ENTRY and len(r.body) >= ENTRY_IDS.size}
    with open(path, "r+b") as f:
        f.truncate(cut)
        os.fsync(f.fileno())
    return (f"truncated {os.path.basename(path)} at byte {cut} of {len(data)} "
            f"({len(gone)} record(s) of the cut group and after it, {len(removed)} entry copies)", removed)


@dataclass(frozen=True)
class Flip:
    ledger_id: int
    entry_id: int
    path: str
    offset: int  # of the flipped byte in the file
    original: bytes  # the whole stored entry before the flip
    corrupted: bytes


def flip_entry_log_byte(ledger_dir: str, rng: random.Random, pick) -> tuple[str, Flip | None]:
    """Flip one payload byte of a stored entry for which `pick(ledger_id, entry_id)` is true."""
    log_dir = os.path.join(ledger_dir, "entrylogs")
    names = sorted(n for n in os.listdir(log_dir) if entry_log.parse_entry_log_file_name(n) is not None) \
        if os.path.isdir(log_dir) else []
    candidates = []
    for name in names:
        path = os.path.join(log_dir, name)
        with open(path, "rb") as f:
            data = f.read()
        try:
            _, records, _ = entry_log.scan(data)
        except FormatError:  # an unreadable header: not a candidate file
            continue
        candidates += [(path, r) for r in records
                       if r.entry is not None and len(r.entry) > ENTRY_HEADER_BYTES and pick(r.ledger_id, r.entry_id)]
    if not candidates:
        return f"no stored entry to flip in {log_dir} ({len(names)} entry log(s))", None
    path, record = rng.choice(candidates)
    at = rng.randrange(ENTRY_HEADER_BYTES, len(record.entry))
    offset = record.offset + 4 + at  # 4: the record's length prefix
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))
        os.fsync(f.fileno())
    corrupted = bytearray(record.entry)
    corrupted[at] ^= 0xFF
    return (f"flipped byte {at} of entry {record.ledger_id}:{record.entry_id} in {os.path.basename(path)} "
            f"(file offset {offset})", Flip(record.ledger_id, record.entry_id, path, offset, record.entry,
                                            bytes(corrupted)))


def fill_disk(path: str, used_fraction: float) -> str:
    """Grow the balloon under `path` until the file system is `used_fraction` full."""
    st = os.statvfs(path)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    want = int(total * used_fraction) - (total - free)
    if want <= 0:
        return f"{path}: already {1 - free / total:.1%} used"
    balloon = os.path.join(path, BALLOON)
    with open(balloon, "ab") as f:
        left = want
        while left > 0:
            n = min(left, BALLOON_CHUNK)
            f.write(b"\0" * n)
            left -= n
        f.flush()
        os.fsync(f.fileno())
    st = os.statvfs(path)
    return f"balloon of {want >> 20} MiB: file system {1 - st.f_bavail / st.f_blocks:.1%} used ({total >> 20} MiB)"


def drain_disk(path: str) -> str:
    balloon = os.path.join(path, BALLOON)
    size = os.path.getsize(balloon) if os.path.exists(balloon) else 0
    if size:
        os.remove(balloon)
    st = os.statvfs(path)
    return f"removed the {size >> 20} MiB balloon: file system {1 - st.f_bavail / st.f_blocks:.1%} used"
