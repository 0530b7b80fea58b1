"""Journal file and record format (PROTOCOL.md §2.2), and the scanner that replay, dump and audit share.

File ``<16 hex id>.txn``:  header = magic b"BKJN" | version BE4 | instance id (16 bytes, UUID) | 8 zero bytes
Record:  length BE4 (of everything after it) | crc32c(type ‖ flags ‖ body) BE4 | type 1 | flags 1 | body

Bodies: ENTRY = entry bytes (formats.entry); MASTER_KEY = ledger id BE8 ‖ key; FENCE = ledger id BE8;
EXPLICIT_LAC = ledger id BE8 ‖ lac BE8; PADDING = zeros (never written by bksim today, accepted on read).

Torn tails (scan_records, ``newest=True``): a crash can tear only the last group written to the newest
file. A short header, a length running past the end of the file, an all-zero remainder, or a CRC mismatch in
a record that no valid record follows end the scan and are reported as the torn offset. Anything else (a
CRC mismatch followed by a valid record, a bad record in an older file) is corruption: JournalCorruptError.
"""
from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass
from typing import Iterator

from bksim.formats.crc import crc32c
from bksim.model.errors import FormatError, JournalCorruptError

MAGIC = b"BKJN"
VERSION = 1
FILE_HEADER = struct.Struct(">4sI16s8x")
FILE_HEADER_BYTES = FILE_HEADER.size  # 32
RECORD_PREFIX = struct.Struct(">IIBB")  # length, crc, type, flags
RECORD_PREFIX_BYTES = RECORD_PREFIX.size  # 10
LENGTH_MIN = RECORD_PREFIX_BYTES - 4  # crc + type + flags
LEDGER_ID = struct.Struct(">q")
LEDGER_LAC = struct.Struct(">qq")


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    PADDING = 5


@dataclass(frozen=True, slots=True)
class JournalRecord:
    offset: int  # of the length field in the file
    end: int  # offset just past the record
    type: RecordType
    flags: int
    body: bytes


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[JournalRecord]
    end: int  # offset after the last good record (the whole file when nothing was torn)
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
    if version != VERSION:
        raise FormatError(f"unsupported journal format version {version}")
    return str(uuid.UUID(bytes=instance))


def encode_record(rtype: int, flags: int, body: bytes) -> bytes:
    crc = crc32c(body, crc32c(bytes((rtype, flags))))
    return RECORD_PREFIX.pack(len(body) + LENGTH_MIN, crc, rtype, flags) + body


def entry_record(entry: bytes, flags: int) -> bytes:
    return encode_record(RecordType.ENTRY, flags, entry)


def master_key_record(ledger_id: int, master_key: bytes) -> bytes:
    return encode_record(RecordType.MASTER_KEY, 0, LEDGER_ID.pack(ledger_id) + master_key)


def fence_record(ledger_id: int) -> bytes:
    return encode_record(RecordType.FENCE, 0, LEDGER_ID.pack(ledger_id))


def explicit_lac_record(ledger_id: int, lac: int) -> bytes:
    return encode_record(RecordType.EXPLICIT_LAC, 0, LEDGER_LAC.pack(ledger_id, lac))


def _parse_at(data: bytes, pos: int) -> tuple[JournalRecord | None, str | None]:
    """(record, None) for a valid record at pos, else (None, why)."""
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
    actual = crc32c(body, crc32c(bytes((rtype, flags))))
    if actual != crc:
        return None, f"CRC mismatch at offset {pos} (stored {crc:#010x}, computed {actual:#010x})"
    try:
        rt = RecordType(rtype)
    except ValueError:
        return None, f"unknown record type {rtype} at offset {pos}"
    return JournalRecord(pos, end, rt, flags, bytes(body)), None


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
    """Parse records of one journal file (its full bytes) from offset `start`.

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


def iter_file(data: bytes, newest: bool = True, skip_corruption: bool = False) -> Iterator[JournalRecord]:
    """Records of a whole journal file (header checked)."""
    decode_file_header(data)
    yield from scan_records(data, FILE_HEADER_BYTES, newest, skip_corruption).records
