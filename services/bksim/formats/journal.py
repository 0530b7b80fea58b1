"""Journal file, group and record format (PROTOCOL.md §2.2), and the scanners that replay, dump and audit share.

File ``<16 hex id>.txn``:  header = magic b"BKJN" | version BE4 | instance id (16 bytes, UUID) | 8 zero bytes
Record:  length BE4 (of everything after it) | crc32c(type ‖ flags ‖ body) BE4 | type 1 | flags 1 | body

Bodies: ENTRY = entry bytes (formats.entry); MASTER_KEY = ledger id BE8 ‖ key; FENCE = ledger id BE8;
EXPLICIT_LAC = ledger id BE8 ‖ lac BE8; PADDING = zeros (never written by bksim, accepted on read);
GROUP = length BE4 ‖ crc32c BE4 of the records that follow it in the same group write.
The scanners check a record's frame and CRC; `check_body` checks that its body has the size its type needs
(replay calls it before unpacking a body: a record whose CRC holds but whose body does not fit is corruption).

Version 2 (written): every group write (the bytes one fsync acknowledges) starts with a GROUP record that
frames it, so replay knows exactly where the last group begins. Version 1 (read only): records back to back.

Torn last group (`scan_journal`, ``newest=True``). A crash can tear only the group being written to the
newest file, and its pages may reach the disk in any order: zeros, then valid records; a cut anywhere. So:
- a group whose frame is valid and whose bytes match its CRC is replayed (a bad record inside it is corruption);
- a group whose frame is valid but whose bytes run past the end of the file or fail its CRC is the torn last
  group if nothing but zeros follows its declared end; otherwise it is corruption (damage before the last group);
- where no valid frame starts, the rest is the torn last group (its first page never landed) unless a valid
  GROUP record starts anywhere after it: then a later group exists, and this is corruption;
- zeros after the last complete group (blocks allocated, never written) are a torn tail too.
In an older file any of this is corruption. A torn tail ends the scan at its first byte (`end`), which replay
truncates. `skip_corruption` skips damaged groups (loudly) but keeps the records in them that pass their own
CRC, and goes on at the next group.

`JournalScan` is `scan_journal` a batch of whole groups at a time, with the same checks and outcome: replay applies
each batch and drops it before the next is parsed, so a journal's records are never all held at once.

Version 1 files keep their rules (`scan_records`): a short header, a length running past the end, an all-zero
remainder, or a CRC mismatch that no valid record follows is a torn tail; anything else is corruption.
`scan_records` is also the record-level view the audit uses to locate damage inside any file.
"""
from __future__ import annotations

import dataclasses
import enum
import struct
import uuid
from dataclasses import dataclass
from typing import Iterator

from bksim.formats.crc import crc32c
from bksim.formats.entry import HEADER_BYTES as ENTRY_HEADER_BYTES
from bksim.model.errors import FormatError, JournalCorruptError

MAGIC = b"BKJN"
VERSION = 2  # written
VERSIONS_READ = (1, 2)
FILE_HEADER = struct.Struct(">4sI16s8x")
FILE_HEADER_BYTES = FILE_HEADER.size  # 32
RECORD_PREFIX = struct.Struct(">IIBB")  # length, crc, type, flags
RECORD_PREFIX_BYTES = RECORD_PREFIX.size  # 10
LENGTH_MIN = RECORD_PREFIX_BYTES - 4  # crc + type + flags
LEDGER_ID = struct.Struct(">q")
LEDGER_LAC = struct.Struct(">qq")
GROUP_BODY = struct.Struct(">II")  # length of the group's records, their crc32c
GROUP_RECORD_BYTES = RECORD_PREFIX_BYTES + GROUP_BODY.size
_GROUP_LENGTH_FIELD = struct.pack(">I", GROUP_RECORD_BYTES - 4)  # how every GROUP record starts
_GROUP_RECORD = struct.Struct(">IIBBII")  # a GROUP record whole: its prefix, then its body
_CRC_FROM = 8  # a record's CRC covers its bytes from the type on (type ‖ flags ‖ body)


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    PADDING = 5
    GROUP = 6


_TYPES = {t.value: t for t in RecordType}  # a dict lookup costs far less than calling the enum
# crc32c(type ‖ flags) for every known type and any flags: where a record's CRC over its body starts
_SEEDS = {t << 8 | f: crc32c(bytes((t, f))) for t in _TYPES for f in range(256)}


@dataclass(frozen=True, slots=True)
class JournalRecord:
    offset: int  # of the length field in the file
    end: int  # offset just past the record
    type: RecordType
    flags: int
    body: bytes
    group: int  # offset of the group write that holds it (version 1: the record's own offset)


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[JournalRecord]
    end: int  # offset after the last good group or record (the whole file when nothing was torn)
    torn: str | None  # why the scan stopped early at `end`, or None
    skipped: list[str]  # corruption skipped because skip_corruption was asked for (loud)


def journal_file_name(journal_id: int) -> str:
    return f"{journal_id:016x}.txn"


def parse_journal_file_name(name: str) -> int | None:
    if len(name) == 20 and name.endswith(".txn"):
        try:
            journal_id = int(name[:16], 16)
        except ValueError:
            return None
        return journal_id if journal_file_name(journal_id) == name else None  # canonical names only
    return None


def _instance_bytes(instance_id: str) -> bytes:
    try:
        return uuid.UUID(instance_id).bytes
    except (ValueError, TypeError, AttributeError):
        raise FormatError(f"cluster instance id {instance_id!r} is not a UUID") from None


def same_instance(a: str, b: str) -> bool:
    """Instance ids compare as UUIDs (with or without dashes)."""
    return _instance_bytes(a) == _instance_bytes(b)


def encode_file_header(instance_id: str) -> bytes:
    return FILE_HEADER.pack(MAGIC, VERSION, _instance_bytes(instance_id))


def decode_file_header(data: bytes) -> str:
    """Return the instance id of a journal file header, or raise FormatError."""
    if len(data) < FILE_HEADER_BYTES:
        raise FormatError(f"journal header is {len(data)} bytes, need {FILE_HEADER_BYTES}")
    magic, version, instance = FILE_HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"bad journal magic {magic!r}")
    if version not in VERSIONS_READ:
        raise FormatError(f"unsupported journal format version {version} (this bksim reads versions "
                          f"{', '.join(map(str, VERSIONS_READ))})")
    return str(uuid.UUID(bytes=instance))


def file_version(data: bytes) -> int:
    """The format version of a journal whose header `decode_file_header` accepted."""
    return FILE_HEADER.unpack_from(data)[1]


def encode_record(rtype: int, flags: int, body: bytes) -> bytes:
    crc = crc32c(body, crc32c(bytes((rtype, flags))))
    return RECORD_PREFIX.pack(len(body) + LENGTH_MIN, crc, rtype, flags) + body


def group_record(chunks: list[bytes]) -> bytes:
    """The GROUP record that frames one group write of `chunks` (encoded records, back to back)."""
    crc = 0
    for chunk in chunks:
        crc = crc32c(chunk, crc)
    return encode_record(RecordType.GROUP, 0, GROUP_BODY.pack(sum(map(len, chunks)), crc))


def framed_group(chunks: list[bytes]) -> bytes:
    """One group write as it goes to disk: the GROUP record, then `chunks`. The same bytes as
    `group_record(chunks) + b"".join(chunks)`."""
    return b"".join(framed_group_parts(chunks))


def framed_group_parts(chunks: list[bytes]) -> tuple[bytes, bytes]:
    """framed_group(chunks) as its two parts, (GROUP record, records), for a writer that writes them back to back:
    the records are joined once and their CRC taken in one call (the journal writer's path: a group holds two
    chunks per entry, and a group of ~0.5 MB is not copied again behind its 18-byte frame)."""
    records = b"".join(chunks)
    return encode_record(RecordType.GROUP, 0, GROUP_BODY.pack(len(records), crc32c(records))), records


def encode_file(instance_id: str, groups: list[list[bytes]]) -> bytes:
    """A whole journal file as the bookie writes it: the header, then each group of records framed."""
    return b"".join([encode_file_header(instance_id)] + [framed_group(records) for records in groups])


def entry_record(entry: bytes, flags: int) -> bytes:
    return encode_record(RecordType.ENTRY, flags, entry)


def master_key_record(ledger_id: int, master_key: bytes) -> bytes:
    return encode_record(RecordType.MASTER_KEY, 0, LEDGER_ID.pack(ledger_id) + master_key)


def fence_record(ledger_id: int) -> bytes:
    return encode_record(RecordType.FENCE, 0, LEDGER_ID.pack(ledger_id))


def explicit_lac_record(ledger_id: int, lac: int) -> bytes:
    return encode_record(RecordType.EXPLICIT_LAC, 0, LEDGER_LAC.pack(ledger_id, lac))


# body bytes per type: (at least, at most or None)
_BODY_BYTES = {RecordType.ENTRY: (ENTRY_HEADER_BYTES, None), RecordType.MASTER_KEY: (LEDGER_ID.size, None),
               RecordType.FENCE: (LEDGER_ID.size, LEDGER_ID.size),
               RecordType.EXPLICIT_LAC: (LEDGER_LAC.size, LEDGER_LAC.size), RecordType.PADDING: (0, None),
               RecordType.GROUP: (GROUP_BODY.size, GROUP_BODY.size)}


def check_body(record: JournalRecord) -> None:
    """Raise JournalCorruptError unless the record's body has the size its type needs (module docstring)."""
    least, most = _BODY_BYTES[record.type]
    size = len(record.body)
    if size < least or (most is not None and size > most):
        need = f"{least}" if least == most else f"at least {least}" if most is None else f"{least}..{most}"
        raise JournalCorruptError(f"{record.type.name} record at offset {record.offset} has a body of {size} bytes, "
                                  f"its type needs {need}")


def _parse_at(data: bytes, pos: int, group: int | None = None) -> tuple[JournalRecord | None, str | None]:
    """(record, None) for a valid record at pos (in the group write at `group`, default pos), else (None, why)."""
    size = len(data)
    if size - pos < RECORD_PREFIX_BYTES:
        return None, f"short record header ({size - pos} bytes) at offset {pos}"
    length, crc, rtype, flags = RECORD_PREFIX.unpack_from(data, pos)
    if length < LENGTH_MIN:
        return None, f"invalid record length {length} at offset {pos}"
    end = pos + 4 + length
    if end > size:
        return None, f"record at offset {pos} runs past end of file ({length} bytes, {size - pos - 4} left)"
    body = data[pos + RECORD_PREFIX_BYTES:end]
    seed = _SEEDS.get(rtype << 8 | flags)
    actual = crc32c(body, crc32c(bytes((rtype, flags))) if seed is None else seed)
    if actual != crc:
        return None, f"CRC mismatch at offset {pos} (stored {crc:#010x}, computed {actual:#010x})"
    rt = _TYPES.get(rtype)
    if rt is None:
        return None, f"unknown record type {rtype} at offset {pos}"
    return JournalRecord(pos, end, rt, flags, bytes(body), pos if group is None else group), None


def _next_valid_after(data: bytes, pos: int) -> int | None:
    """Offset of a valid record that follows the bad record at pos (if its length is plausible)."""
    if len(data) - pos < 4:
        return None
    (length,) = struct.unpack_from(">I", data, pos)
    nxt = pos + 4 + length
    if length < LENGTH_MIN or nxt >= len(data):
        return None
    record, _ = _parse_at(data, nxt)
    return nxt if record is not None else None


def scan_records(data: bytes, start: int, newest: bool, skip_corruption: bool = False,
                 name: str = "journal") -> ScanResult:
    """Parse records back to back (version 1 rules) from offset `start` of one journal file's full bytes.

    `newest`: the file is the last journal, so its tail may be torn. See the module docstring for the rules.
    """
    records: list[JournalRecord] = []
    skipped: list[str] = []
    pos = start
    size = len(data)
    while pos < size:
        record, why = _parse_at(data, pos)
        if record is not None:
            records.append(record)
            pos = record.end
            continue
        # maybe: the last group written before a crash may be torn
        rest_is_zero = data.count(0, pos) == size - pos
        nxt = _next_valid_after(data, pos)
        if newest and nxt is None and (rest_is_zero or "CRC" in why or "past end" in why or "short" in why):
            return ScanResult(records, pos, f"torn tail: {why}", skipped)
        problem = f"{name}: corruption: {why}" + (
            f", followed by a valid record at offset {nxt}" if nxt is not None else
            ("" if newest else " in a journal that is not the newest"))
        if not skip_corruption:
            raise JournalCorruptError(problem)
        skipped.append(problem)
        if nxt is None:
            return ScanResult(records, size, None, skipped)
        pos = nxt
    return ScanResult(records, pos, None, skipped)


def scan_journal(data: bytes, start: int, newest: bool, skip_corruption: bool = False,
                 name: str = "journal") -> ScanResult:
    """The records of one journal file (its full bytes, header already checked) from offset `start` (a group
    boundary), as replay sees them, by the rules of the file's version (module docstring). Never returns
    GROUP records. Raises JournalCorruptError on corruption unless `skip_corruption`."""
    scan = JournalScan(data, start, newest, skip_corruption, name, batch_bytes=0)
    records: list[JournalRecord] = []
    for batch in scan:
        if records:
            records += batch
        else:
            records = batch
    return ScanResult(records, scan.end, scan.torn, scan.skipped)


class JournalScan:
    """`scan_journal` a batch at a time, for replay: iterating yields the records in order, in lists of whole
    groups of about `batch_bytes` of journal each (0: no bound; a skipped damaged region's salvaged records are a
    list of their own), so a caller can apply and drop each list before the next is parsed. The same checks as
    `scan_journal`, which is built on it; JournalCorruptError is raised when the iteration reaches the damage, so
    the lists before it have been yielded by then. Once the iteration ends, `end`, `torn` and `skipped` are what
    `scan_journal` returns (`skipped` grows as the damage is met)."""

    def __init__(self, data: bytes, start: int, newest: bool, skip_corruption: bool = False,
                 name: str = "journal", batch_bytes: int = 1 << 20) -> None:
        self._data, self._start, self._newest, self._skip, self._name = data, start, newest, skip_corruption, name
        self._batch_bytes = batch_bytes
        self.end = start
        self.torn: str | None = None
        self.skipped: list[str] = []

    def __iter__(self) -> Iterator[list[JournalRecord]]:
        if file_version(self._data) == 1:
            result = scan_records(self._data, self._start, self._newest, self._skip, self._name)
            self.skipped.extend(result.skipped)
            self.end, self.torn = result.end, result.torn
            if result.records:
                yield result.records
            return
        yield from self._groups()

    def _groups(self) -> Iterator[list[JournalRecord]]:
        data, newest, skipped = self._data, self._newest, self.skipped
        pos, size = self._start, len(data)
        while pos < size:
            records: list[JournalRecord] = []
            limit = pos + self._batch_bytes if self._batch_bytes > 0 else size
            pos = _complete_groups(data, pos, records, limit)
            if records:
                yield records
            if pos >= size:
                break
            if pos >= limit:  # the batch is full, not a group `_complete_groups` could not take
                continue
            frame, why = _parse_group(data, pos)
            if frame is not None:
                body, end, crc = frame
                if end <= size and crc32c(memoryview(data)[body:end]) == crc:
                    inside, why = _records_of_group(data, pos, body, end)
                    if why is None:
                        if inside:
                            yield inside
                        pos = end
                        continue
                    why = f"group at offset {pos} passes its CRC but holds an invalid record: {why}"
                    followed = None  # a complete group is never torn, wherever it is
                else:
                    why = (f"group at offset {pos} runs past the end of the file ({end - body} bytes, {size - body} "
                           f"left)") if end > size else f"group at offset {pos} fails its CRC"
                    followed = end if end < size and data.count(0, end) != size - end else None
                    if newest and followed is None:
                        self.end, self.torn = pos, f"torn last group: {why}"
                        return
                resume = max(end, pos + 1)
            else:
                if newest and data.count(0, pos) == size - pos:
                    self.end, self.torn = pos, f"torn tail: {size - pos} zero bytes after the last group"
                    return
                followed = _next_group_record(data, pos + 1)
                if newest and followed is None:
                    self.end, self.torn = pos, f"torn last group: {why}"
                    return
                resume = size if followed is None else followed
            problem = f"{self._name}: corruption: {why}" + (
                f", followed by more of the journal at offset {followed}" if followed is not None else
                ("" if newest else " in a journal that is not the newest"))
            if not self._skip:
                raise JournalCorruptError(problem)
            salvaged = _salvage(data, pos, min(resume, size))
            skipped.append(f"{problem} (kept {len(salvaged)} records of it that pass their own CRC)")
            if salvaged:
                yield salvaged
            pos = resume
        self.end = min(pos, size)


def _complete_groups(data: bytes, pos: int, records: list[JournalRecord], limit: int) -> int:
    """Take the complete groups of valid records from pos on into `records`, until one ends at or past `limit`;
    return where the next group begins: at or past `limit`, or a group that is not complete (`JournalScan` judges
    it). The common case, read inline: each group's frame, its CRC, then each record's prefix and CRC (over type,
    flags and body in one call), exactly the checks of `_parse_group`, `_records_of_group` and `_parse_at`, which
    say why when one fails."""
    if type(data) is not bytes:
        return pos
    size = len(data)
    unpack_group, unpack_record = _GROUP_RECORD.unpack_from, RECORD_PREFIX.unpack_from
    types, group_type = _TYPES, RecordType.GROUP
    with memoryview(data) as view:
        while size - pos >= GROUP_RECORD_BYTES:
            length, crc, rtype, _flags, group_length, group_crc = unpack_group(data, pos)
            at = pos + GROUP_RECORD_BYTES
            end = at + group_length
            if (length != GROUP_RECORD_BYTES - 4 or rtype != group_type or end > size
                    or crc32c(view[pos + _CRC_FROM:at]) != crc or crc32c(view[at:end]) != group_crc):
                break
            taken = len(records)
            while at < end:
                if end - at < RECORD_PREFIX_BYTES:
                    break
                length, crc, rtype, flags = unpack_record(data, at)
                nxt = at + 4 + length
                rt = types.get(rtype)
                if (length < LENGTH_MIN or nxt > end or rt is None or rt is group_type
                        or crc32c(view[at + _CRC_FROM:nxt]) != crc):
                    break
                records.append(JournalRecord(at, nxt, rt, flags, data[at + RECORD_PREFIX_BYTES:nxt], pos))
                at = nxt
            else:
                pos = end
                if pos >= limit:
                    break
                continue
            del records[taken:]
            break
    return pos


def _parse_group(data: bytes, pos: int) -> tuple[tuple[int, int, int] | None, str]:
    """((first record offset, group end, crc), "") for a valid GROUP record at pos, else (None, why)."""
    if len(data) - pos >= GROUP_RECORD_BYTES:  # the common case read in one go, without a JournalRecord
        length, crc, rtype, _flags, group_length, group_crc = _GROUP_RECORD.unpack_from(data, pos)
        if (length == GROUP_RECORD_BYTES - 4 and rtype == RecordType.GROUP
                and crc32c(data[pos + _CRC_FROM:pos + GROUP_RECORD_BYTES]) == crc):
            body = pos + GROUP_RECORD_BYTES
            return (body, body + group_length, group_crc), ""
    record, why = _parse_at(data, pos)
    if record is None:
        return None, why
    if record.type is not RecordType.GROUP or len(record.body) != GROUP_BODY.size:
        return None, f"no group frame at offset {pos} (a {record.type.name} record of {len(record.body)} bytes)"
    length, crc = GROUP_BODY.unpack(record.body)
    return (record.end, record.end + length, crc), ""


def _records_of_group(data: bytes, group: int, pos: int, end: int) -> tuple[list[JournalRecord], str | None]:
    """The records filling [pos, end) exactly, or ([], why)."""
    out = []
    while pos < end:
        record, why = _parse_at(data, pos, group)
        if record is None or record.end > end or record.type is RecordType.GROUP:
            return [], why or f"record at offset {pos} crosses the group's end or is a GROUP record"
        out.append(record)
        pos = record.end
    return out, None


def _next_group_record(data: bytes, pos: int) -> int | None:
    """Offset of the first valid GROUP record at or after pos, or None."""
    at = data.find(_GROUP_LENGTH_FIELD, pos)
    while at != -1:
        if data[at + 8:at + 9] == bytes((RecordType.GROUP,)) and _parse_group(data, at)[0] is not None:
            return at
        at = data.find(_GROUP_LENGTH_FIELD, at + 1)
    return None


def _salvage(data: bytes, pos: int, end: int) -> list[JournalRecord]:
    """The data records in damaged bytes [pos, end) that pass their own CRC (for skip_corruption and the audit)."""
    out = []
    scan = scan_records(data[:end], pos, newest=True, skip_corruption=True)
    for record in scan.records:
        if record.type is not RecordType.GROUP:
            out.append(dataclasses.replace(record, group=pos))
    return out


def iter_file(data: bytes, newest: bool = True, skip_corruption: bool = False) -> Iterator[JournalRecord]:
    """Records of a whole journal file (header checked)."""
    decode_file_header(data)
    yield from scan_journal(data, FILE_HEADER_BYTES, newest, skip_corruption).records
