"""One bookie file -> FileResult: its integrity findings and its records, per ledger, as columnar blocks.

The records come from the project's own parsers, the ones the bookie uses: `formats.journal.scan_journal`
(the bookie's replay rules for the torn last group) and `scan_records` (record by record) and `formats.entry_log.scan`; entries are read with
`formats.entry.HEADER` and their digest recomputed as `formats.entry` defines it. Nothing here knows the
metadata: whether a digest must match (digest type) is decided by the rules.

Journal integrity, per file (see findings.RULES for the names):
- the header: unreadable is `journal_bad_header`, except a short or all-zero header of the bookie's newest
  journal (`torn_header`, benign: replay removes the file); another cluster's instance id is
  `journal_foreign_instance` (its records are not used);
- a framed record that fails its CRC (or type) with valid records after it: `journal_crc_failure`;
- bytes that are no record with valid records after them: `journal_garbage`. After any damage the scan
  resynchronises on the next offset where a valid record starts (searching at most RESYNC_BYTES_MAX bytes),
  so records after the damage still count. In a version 1 journal this also catches what replay would call a
  torn tail when valid records follow it (replay would truncate acknowledged records: a violation);
- the torn last group (version 2: replay's own group rule, `scan_journal`, says where it starts; version 1:
  damage running to the end of the file): in the bookie's newest journal it is `torn_tail` (benign; never
  acknowledged, whatever valid records its pages hold) unless the bookie's checkpoint mark lies beyond its
  start (`torn_tail_below_checkpoint`); a torn-looking tail of an older journal is benign only when the whole
  journal lies below the checkpoint mark (replay has moved past it); anything else is `journal_corrupt_tail`.
  GROUP frames are not records of the report.

Blocks hold, per ledger and in file order: entry id, piggybacked LAC, ledger length, payload bytes, the
digest computed over the entry (header and payload: the content's identity, whatever the digest type), the
stored digest, flags and file offset; plus the offsets of FENCE and MASTER_KEY records and (offset, lac) of
EXPLICIT_LAC records. Arrays pickle as raw bytes, so Spark moves a block cheaply.
"""
from __future__ import annotations

import re
import struct
import sys
from array import array
from dataclasses import dataclass, field

from bksim.formats import entry as entry_fmt
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt
from bksim.formats.crc import crc32c
from bksim.model.errors import FormatError, JournalCorruptError

from bksim.audit.findings import Finding

JOURNAL = "journal"
ENTRYLOG = "entrylog"

# After damage the scan looks for the next valid record at most this far (a bound on the work one damaged
# region can cost: each candidate offset is probed).
RESYNC_BYTES_MAX = 64 * 1024 * 1024
# A candidate record longer than this is not probed (no bksim entry is larger: entry_bytes_max is 5 MiB by
# default and at most the frame size), which keeps probing random bytes cheap.
RECORD_BYTES_MAX = 16 * 1024 * 1024

_LENGTH = struct.Struct(">I")
_ENTRY_IDS = struct.Struct(">qq")
_NONZERO = re.compile(rb"[^\x00]")
_OFFSET = re.compile(r"offset (\d+)")
_FOLLOWED = re.compile(r"followed by a valid record at offset (\d+)")


@dataclass(frozen=True, slots=True)
class FileTask:
    """One file to parse and what the plan knows about it (inputs.py decides)."""
    path: str  # as reported (a local absolute path, or the URI of another file system)
    uri: str  # what the reader opens
    bookie: str
    kind: str  # JOURNAL | ENTRYLOG
    file_id: int  # journal id or entry log id
    size: int = 0
    newest: bool = False  # journal: the highest journal id of its bookie (its tail may be torn)
    below_mark: bool = False  # journal: entirely below the bookie's checkpoint mark (replay moved past it)
    mark_offset: int = -1  # journal: the checkpoint mark's offset when the mark lies in this journal
    instance_id: str | None = None  # the cluster instance the bookie's cookie names (None: unknown)


class Block:
    """Records of one ledger in one file, columnar and in file order."""

    __slots__ = ("ids", "lacs", "ledger_lengths", "entry_bytes", "digests", "stored", "flags", "offsets",
                 "fences", "explicit_lacs", "master_keys")

    def __init__(self) -> None:
        self.ids = array("q")
        self.lacs = array("q")
        self.ledger_lengths = array("q")
        self.entry_bytes = array("q")  # header and payload
        self.digests = array("I")  # crc32c over the entry's 32 header bytes then its payload
        self.stored = array("I")  # the digest field as stored
        self.flags = b""
        self.offsets = array("q")
        self.fences: list[int] = []  # offsets of FENCE records
        self.explicit_lacs: list[tuple[int, int]] = []  # (offset, lac) of EXPLICIT_LAC records
        self.master_keys: list[int] = []  # offsets of MASTER_KEY records

    def __getstate__(self):
        return tuple(getattr(self, name) for name in Block.__slots__)

    def __setstate__(self, state) -> None:
        for name, value in zip(Block.__slots__, state):
            setattr(self, name, value)

    @classmethod
    def of_entries(cls, bodies: list[bytes], flags: bytes, offsets: list[int]) -> "Block":
        """The columns of well-formed entries (each at least the header long) of one ledger. Each header field
        is cut out of every entry and converted in one go (no Python object per field)."""
        block = cls()
        block.ids, block.lacs, block.ledger_lengths, block.stored = header_columns(bodies)
        block.entry_bytes = array("q", map(len, bodies))
        block.digests = array("I", [crc32c(b[entry_fmt.HEADER_BYTES:], crc32c(b[:32])) for b in bodies])
        block.flags = flags
        block.offsets = array("q", offsets)
        return block

    @property
    def payload_bytes(self) -> int:
        return sum(self.entry_bytes) - entry_fmt.HEADER_BYTES * len(self.entry_bytes)

    def __len__(self) -> int:
        return len(self.ids)


assert array("q").itemsize == 8 and array("I").itemsize == 4
_SWAP = sys.byteorder == "little"  # entries are big-endian


def header_columns(bodies: list[bytes]) -> tuple[array, array, array, array]:
    """(entry ids, LACs, ledger lengths, stored digests) of entries (each at least HEADER_BYTES long), read
    with array conversions over their joined 36-byte headers instead of one struct tuple per entry.

    Header k starts at byte 36k of the joined buffer, so its int64 fields are 8-aligned when k is even; for odd
    k they are, in the buffer shifted by 4 bytes. Over pairs of headers (72 bytes = 9 int64), field f (entry id
    1, LAC 2, ledger length 3) of the even header is int64 9p + f, of the odd one 9p + 4 + f in the shifted
    buffer; the digest is uint32 9k + 8."""
    n = len(bodies)
    header_bytes = entry_fmt.HEADER_BYTES
    joined = b"".join([b[:header_bytes] for b in bodies])
    words = array("I")
    words.frombytes(joined)
    even, odd = array("q"), array("q")
    even.frombytes(joined[:len(joined) // 8 * 8])
    odd.frombytes(joined[4:4 + (len(joined) - 4) // 8 * 8])
    if _SWAP:
        for column in (words, even, odd):
            column.byteswap()
    fields = []
    for index in (1, 2, 3):
        column = array("q", bytes(8 * n))
        column[0::2] = even[index::9][:(n + 1) // 2]
        column[1::2] = odd[index + 4::9][:n // 2]
        fields.append(column)
    return fields[0], fields[1], fields[2], words[8::9]


@dataclass(slots=True)
class FileResult:
    task: FileTask
    size: int
    records: int = 0  # valid records (journal) or entries (entry log)
    counts: dict[str, int] = field(default_factory=dict)  # valid records by type name
    payload_bytes: int = 0  # entry payload bytes of valid records
    findings: list[Finding] = field(default_factory=list)
    blocks: dict[int, Block] = field(default_factory=dict)  # ledger id -> its records in this file
    usable: bool = True  # False: the file's records are not used (unreadable header, foreign instance)

    def summary(self) -> dict:
        """What the report says about the file (no records)."""
        t = self.task
        return {"file": t.path, "bookie": t.bookie, "kind": t.kind, "file_id": t.file_id, "bytes": self.size,
                "records": self.records, "counts": dict(sorted(self.counts.items())),
                "payload_bytes": self.payload_bytes, "ledgers": len(self.blocks), "usable": self.usable,
                "newest": t.newest}


def parse_file(task: FileTask, data: bytes) -> FileResult:
    """Parse one journal or entry log (its whole bytes)."""
    if task.kind == JOURNAL:
        return parse_journal(task, data)
    if task.kind == ENTRYLOG:
        return parse_entry_log(task, data)
    raise ValueError(f"unknown file kind {task.kind!r} for {task.path}")


# -- journals ----------------------------------------------------------------------------------------------

def parse_journal(task: FileTask, data: bytes) -> FileResult:
    result = FileResult(task, len(data))
    found = result.findings
    try:
        instance = jfmt.decode_file_header(data)
    except FormatError as e:
        if task.newest and (len(data) < jfmt.FILE_HEADER_BYTES or data.count(0) == len(data)):
            # maybe: a crash between creating the newest journal and syncing its header (nothing acknowledged)
            found.append(_at(task, "torn_header", 0, f"{len(data)} bytes, header unreadable ({e}); replay "
                                                      f"removes this file"))
        else:
            found.append(_at(task, "journal_bad_header", 0, str(e)))
        result.usable = False
        return result
    if task.instance_id is not None and not _same_instance(instance, task.instance_id):
        found.append(_at(task, "journal_foreign_instance", 0, f"journal of cluster instance {instance}, the "
                                                              f"bookie's cookie names {task.instance_id}"))
        result.usable = False
        return result
    records = _scan(task, data, found)
    _collect(result, records)
    return result


def _same_instance(a: str, b: str) -> bool:
    try:
        return jfmt.same_instance(a, b)
    except FormatError:
        return a == b


def _at(task: FileTask, rule: str, offset: int, detail: str, ledger: int | None = None) -> Finding:
    return Finding(rule, ledger=ledger, bookie=task.bookie, file=task.path, offset=offset, detail=detail)


def _scan(task: FileTask, data: bytes, found: list[Finding]) -> list[jfmt.JournalRecord]:
    """Every valid record of the file, damage reported into `found` (see the module docstring).

    Version 2 journals: replay's own group rule (`scan_journal`) says where the torn last group of the newest
    journal starts; the records before it are searched record by record for damage, as in version 1 files.
    When that scan skipped nothing, every byte before its end is complete groups of valid records: they are
    its records, and the record-level search (which would find no damage there) starts at its end."""
    if jfmt.file_version(data) == 1:
        return _scan_records(task, data, found, task.newest, None)
    group = jfmt.RecordType.GROUP
    would_tear = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, True, skip_corruption=True, name=task.path)
    tear_at = would_tear.end if would_tear.torn is not None else None  # if this file were the newest
    cut = tear_at is not None and (task.newest or task.below_mark)  # replay truncates it, or moved past it
    if not would_tear.skipped:
        records = would_tear.records
        if tear_at is not None and not cut:  # the torn-looking tail of an older journal: searched as damage
            records += [r for r in _scan_records(task, data, found, False, tear_at, tear_at) if r.type is not group]
    else:
        records = [r for r in _scan_records(task, data[:tear_at] if cut else data, found, False, tear_at)
                   if r.type is not group]
    if cut:
        found.append(_torn_tail(task, tear_at, len(data), would_tear.torn) if task.newest else
                     _torn_below_mark(task, tear_at, len(data)))
    return records


def _scan_records(task: FileTask, data: bytes, found: list[Finding], newest: bool,
                  tear_at: int | None, start: int = jfmt.FILE_HEADER_BYTES) -> list[jfmt.JournalRecord]:
    """The record-level search from `start` (a record boundary): `newest` applies version 1's torn-tail rule;
    `tear_at` (version 2) is where the group rule would start a torn tail if the file were the newest journal."""
    out: list[jfmt.JournalRecord] = []
    size = len(data)
    pos = start
    while pos < size:
        scan = jfmt.scan_records(data, pos, newest, skip_corruption=True, name=task.path)
        out.extend(scan.records)
        stop = None  # where the scan gave up on the rest of the file
        for problem in scan.skipped:
            why = problem[len(task.path) + len(": corruption: "):]
            at = int(_OFFSET.search(why).group(1))
            followed = _FOLLOWED.search(why)
            if followed is not None:
                found.append(_at(task, "journal_crc_failure", at,
                                 f"{why.split(', followed by')[0]}{_claims(data, at)}; next valid record at "
                                 f"offset {followed.group(1)}"))
            else:
                stop = at
        if scan.torn is not None:
            torn_at = scan.end
            resume = _resync(data, torn_at + 1)
            if resume is not None:  # what replay would truncate as a torn tail has valid records after it
                found.append(_at(task, "journal_garbage", torn_at, f"{resume - torn_at} bytes that are no record "
                                 f"({scan.torn}), then valid records from offset {resume} (replay would "
                                 f"truncate them)"))
                pos = resume
                continue
            found.append(_torn_tail(task, torn_at, size, scan.torn))
            break
        if stop is None:
            break
        resume = _resync(data, stop + 1)
        if resume is not None:
            found.append(_at(task, "journal_garbage", stop, f"{resume - stop} bytes that are no record"
                             f"{_claims(data, stop)}, then valid records from offset {resume}"))
            pos = resume
            continue
        found.append(_damaged_tail(task, data, stop, newest, tear_at))
        break
    return out


def _torn_tail(task: FileTask, at: int, size: int, why: str) -> Finding:
    if task.mark_offset > at:
        return _at(task, "torn_tail_below_checkpoint", at, f"{why}; {size - at} bytes from offset {at}, but the "
                                                           f"checkpoint mark is at offset {task.mark_offset}")
    return _at(task, "torn_tail", at, f"{why}; {size - at} bytes not replayed (newest journal)")


def _torn_below_mark(task: FileTask, at: int, size: int) -> Finding:
    return _at(task, "torn_tail", at, f"{size - at} bytes torn at the end of a journal entirely below the "
                                      f"checkpoint mark (replay moved past it)")


def _damaged_tail(task: FileTask, data: bytes, at: int, newest: bool, tear_at: int | None) -> Finding:
    """Damage from `at` to the end of the file, with nothing valid after it."""
    size = len(data)
    tear_like = False
    if tear_at is not None:  # version 2: inside what the group rule would call the torn last group
        tear_like = not task.newest and at >= tear_at
    elif not newest:  # would replay call it torn if this were the newest journal?
        try:
            tear_like = jfmt.scan_records(data, at, True).torn is not None
        except JournalCorruptError:
            tear_like = False
    if tear_like and task.below_mark:
        return _torn_below_mark(task, at, size)
    what = "a torn-looking tail in a journal that is not the bookie's newest" if tear_like else \
        f"{size - at} bytes that are no record{_claims(data, at)}, to the end of the file"
    return _at(task, "journal_corrupt_tail", at, what)


def _claims(data: bytes, at: int) -> str:
    """What a damaged record at `at` says it is, if its frame is readable (for the reader of the report)."""
    if len(data) - at < jfmt.RECORD_PREFIX_BYTES + _ENTRY_IDS.size:
        return ""
    length, _crc, rtype, _flags = jfmt.RECORD_PREFIX.unpack_from(data, at)
    if rtype != jfmt.RecordType.ENTRY or length < jfmt.LENGTH_MIN + _ENTRY_IDS.size:
        return ""
    ledger_id, entry_id = _ENTRY_IDS.unpack_from(data, at + jfmt.RECORD_PREFIX_BYTES)
    return f" (the record claims ledger {ledger_id} entry {entry_id})"


def _valid_record_at(data: bytes, at: int) -> bool:
    if len(data) - at < jfmt.RECORD_PREFIX_BYTES:
        return False
    (length,) = _LENGTH.unpack_from(data, at)
    if length < jfmt.LENGTH_MIN or length > RECORD_BYTES_MAX or at + 4 + length > len(data):
        return False
    try:
        return len(jfmt.scan_records(data[at:at + 4 + length], 0, False).records) == 1
    except JournalCorruptError:
        return False


def _resync(data: bytes, start: int) -> int | None:
    """The first offset >= start where a valid record begins (searching RESYNC_BYTES_MAX bytes), or None."""
    end = min(len(data), start + RESYNC_BYTES_MAX)
    at = start
    while at < end:
        if data[at] == 0 and data[at:at + 4] == b"\0\0\0\0":  # a zero length is never a record: skip the run
            nonzero = _NONZERO.search(data, at, end)
            if nonzero is None:
                return None
            at = max(nonzero.start() - 3, at + 1)
            continue
        if _valid_record_at(data, at):
            return at
        at += 1
    return None


def _collect(result: FileResult, records: list[jfmt.JournalRecord]) -> None:
    """Sort the valid records into per-ledger blocks."""
    task = result.task
    entry_type, fence_type = jfmt.RecordType.ENTRY, jfmt.RecordType.FENCE
    entries = [r for r in records if r.type is entry_type]
    others = [r for r in records if r.type is not entry_type] if len(entries) < len(records) else []
    blocks = {}
    for ledger_id, (members, bodies) in _group(result, entries, [r.body for r in entries]).items():
        block = _make_block(result, members, bodies, bytes([r.flags for r in members]))
        if block is not None:
            blocks[ledger_id] = block
    counts = {"ENTRY": sum(len(b) for b in blocks.values())} if blocks else {}
    for rec in others:
        name = rec.type.name
        counts[name] = counts.get(name, 0) + 1
        if rec.type is jfmt.RecordType.PADDING:
            continue
        body = rec.body
        try:
            if rec.type is fence_type:
                (ledger_id,) = jfmt.LEDGER_ID.unpack(body)
            elif rec.type is jfmt.RecordType.EXPLICIT_LAC:
                ledger_id, lac = jfmt.LEDGER_LAC.unpack(body)
            else:  # MASTER_KEY
                (ledger_id,) = jfmt.LEDGER_ID.unpack_from(body)
        except struct.error:
            result.findings.append(_at(task, "entry_malformed", rec.offset, f"{name} body of {len(body)} bytes"))
            continue
        block = blocks.get(ledger_id)
        if block is None:
            block = blocks[ledger_id] = Block()
        if rec.type is fence_type:
            block.fences.append(rec.offset)
        elif rec.type is jfmt.RecordType.EXPLICIT_LAC:
            block.explicit_lacs.append((rec.offset, lac))
        else:
            block.master_keys.append(rec.offset)
    result.records = len(records)
    result.counts = counts
    result.payload_bytes = sum(b.payload_bytes for b in blocks.values())
    result.blocks = blocks


def _group(result: FileResult, items: list, bodies: list[bytes]) -> dict[int, tuple[list, list[bytes]]]:
    """(items, their entry bytes) per ledger id, in file order; malformed entries reported and left out."""
    header_bytes = entry_fmt.HEADER_BYTES
    if bodies and min(map(len, bodies)) < header_bytes:
        keep = []
        for item, body in zip(items, bodies):
            if len(body) < header_bytes:
                result.findings.append(_at(result.task, "entry_malformed", item.offset, f"entry of {len(body)} "
                                           f"bytes is shorter than the {header_bytes}-byte entry header"))
            else:
                keep.append((item, body))
        items, bodies = [i for i, _ in keep], [b for _, b in keep]
    by_key: dict[bytes, tuple[list, list[bytes]]] = {}
    for item, body in zip(items, bodies):
        key = body[:8]
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = ([], [])
        group[0].append(item)
        group[1].append(body)
    groups = {}
    for key, group in by_key.items():
        ledger_id = int.from_bytes(key, "big", signed=True)
        if ledger_id < 0:
            for member in group[0]:
                result.findings.append(_at(result.task, "entry_malformed", member.offset,
                                           f"entry names ledger {ledger_id}"))
            continue
        groups[ledger_id] = group
    return groups


def _make_block(result: FileResult, members: list, bodies: list[bytes], flags: bytes) -> Block | None:
    """The block of one ledger's well-framed entries; entries with a negative id are reported and left out."""
    block = Block.of_entries(bodies, flags, [m.offset for m in members])
    if min(block.ids) >= 0:
        return block
    keep = []
    for i, entry_id in enumerate(block.ids):
        if entry_id < 0:
            result.findings.append(_at(result.task, "entry_malformed", members[i].offset,
                                       f"entry names entry {entry_id}"))
        else:
            keep.append(i)
    if not keep:
        return None
    return _make_block(result, [members[i] for i in keep], [bodies[i] for i in keep], bytes(flags[i] for i in keep))


# -- entry logs --------------------------------------------------------------------------------------------

def parse_entry_log(task: FileTask, data: bytes) -> FileResult:
    result = FileResult(task, len(data))
    try:
        header, records, why = log_fmt.scan(data)
    except FormatError as e:
        if len(data) < log_fmt.HEADER_BYTES or data.count(0) == len(data):
            # maybe: a log created at a start whose header was never synced
            result.findings.append(_at(task, "entrylog_open_tail", 0, f"{len(data)} bytes, header unreadable: {e}"))
        else:
            result.findings.append(_at(task, "entrylog_bad_header", 0, str(e)))
        result.usable = False
        return result
    if why is not None:
        at = int(_OFFSET.search(why).group(1))
        if header.ledger_map_offset == 0:
            result.findings.append(_at(task, "entrylog_open_tail", at, f"{why} (log without a ledger map: open "
                                                                       f"when the bookie stopped)"))
        else:
            result.findings.append(_at(task, "entrylog_damaged", at, why))
    entries = [r for r in records if r.entry is not None]  # not the ledger map
    result.blocks = {}
    for ledger_id, (members, bodies) in _group(result, entries, [r.entry for r in entries]).items():
        block = _make_block(result, members, bodies, bytes(len(members)))
        if block is not None:
            result.blocks[ledger_id] = block
    result.records = sum(len(b) for b in result.blocks.values())
    result.counts = {"ENTRY": result.records} if result.records else {}
    result.payload_bytes = sum(b.payload_bytes for b in result.blocks.values())
    return result


# -- rows for the records DataFrame ------------------------------------------------------------------------

RECORD_COLUMNS = (("bookie", "string"), ("file", "string"), ("source", "string"), ("offset", "long"),
                  ("type", "string"), ("flags", "int"), ("ledger", "long"), ("entry", "long"), ("lac", "long"),
                  ("length", "long"), ("ledger_length", "long"), ("digest", "long"), ("digest_stored", "long"))


def record_rows(result: FileResult):
    """One tuple per valid record (RECORD_COLUMNS): entries with their piggybacked LAC, payload length
    (`length`), ledger length and digests; FENCE / EXPLICIT_LAC / MASTER_KEY with their ledger."""
    task = result.task
    bookie, path, source = task.bookie, task.path, task.kind
    for ledger_id, block in result.blocks.items():
        header_bytes = entry_fmt.HEADER_BYTES
        for entry_id, lac, ledger_length, size, digest, stored, flags, offset in zip(
                block.ids, block.lacs, block.ledger_lengths, block.entry_bytes, block.digests, block.stored,
                block.flags, block.offsets):
            yield (bookie, path, source, offset, "ENTRY", flags, ledger_id, entry_id, lac, size - header_bytes,
                   ledger_length, digest, stored)
    yield from other_rows(result)


def other_rows(result: FileResult):
    """The RECORD_COLUMNS tuples of the records that are not entries (FENCE, EXPLICIT_LAC, MASTER_KEY)."""
    task = result.task
    bookie, path, source = task.bookie, task.path, task.kind
    for ledger_id, block in result.blocks.items():
        for offset in block.fences:
            yield (bookie, path, source, offset, "FENCE", 0, ledger_id, None, None, None, None, None, None)
        for offset, lac in block.explicit_lacs:
            yield (bookie, path, source, offset, "EXPLICIT_LAC", 0, ledger_id, None, lac, None, None, None, None)
        for offset in block.master_keys:
            yield (bookie, path, source, offset, "MASTER_KEY", 0, ledger_id, None, None, None, None, None, None)


# the columns of a block as arrays, in the order block_rows gives them (the Spark driver zips them into rows;
# "entry_bytes" becomes the payload "length")
BLOCK_ARRAYS = ("offset", "flags", "entry", "lac", "entry_bytes", "ledger_length", "digest", "digest_stored")


def block_rows(result: FileResult):
    """One tuple per (file, ledger) with entries: bookie, file, source, ledger, then the BLOCK_ARRAYS as lists.
    Moving a block's columns as lists costs the JVM far less than one row per entry."""
    task = result.task
    for ledger_id, block in result.blocks.items():
        if len(block):
            yield (task.bookie, task.path, task.kind, ledger_id, block.offsets.tolist(), list(block.flags),
                   block.ids.tolist(), block.lacs.tolist(), block.entry_bytes.tolist(), block.ledger_lengths.tolist(),
                   block.digests.tolist(), block.stored.tolist())
