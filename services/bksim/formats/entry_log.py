"""Entry log file format (PROTOCOL.md §2.2 "Entry logs").

File ``<hex id>.log``: header (64 bytes) = magic b"BKEL" | version BE4 | ledger map offset BE8 |
ledger count BE4 | zero padding. Then records ``[length BE4][entry bytes]``. On roll a ledger map is appended,
framed like a record whose body starts with ledger id −1 and entry id −2 (so a scanner can tell it apart):
``[length BE4] -1 BE8 | -2 BE8 | count BE4 | count × (ledger id BE8, live bytes BE8)``, and the header's map
offset and count are patched. A log with map offset 0 was not rolled cleanly (a scan rebuilds its map).

A location is (log id, offset of the record's length field, entry length).

Compaction (bookie/compaction.py) writes a new log under a temporary name before it becomes ``<hex id>.log``:
``<new hex id>-from-<old hex id>.compacting`` while being written (not durable, never referenced by the index),
``<new hex id>-from-<old hex id>.compacted`` once synced and sealed (the index may reference it). Both names
carry the id of the log being compacted, so start-up can finish or undo a compaction a crash interrupted.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from bksim.model.errors import FormatError

MAGIC = b"BKEL"
VERSION = 1
HEADER = struct.Struct(">4sIqI")
HEADER_BYTES = 64
LENGTH = struct.Struct(">I")
MAP_IDS = struct.Struct(">qqI")  # -1, -2, count
MAP_PAIR = struct.Struct(">qq")
MAP_LEDGER_ID = -1
MAP_ENTRY_ID = -2
ENTRY_IDS = struct.Struct(">qq")


@dataclass(frozen=True, slots=True)
class LogHeader:
    version: int
    ledger_map_offset: int
    ledger_count: int


def entry_log_file_name(log_id: int) -> str:
    return f"{log_id:x}.log"


def parse_entry_log_file_name(name: str) -> int | None:
    if name.endswith(".log"):
        try:
            log_id = int(name[:-4], 16)
        except ValueError:
            return None
        return log_id if log_id >= 0 and entry_log_file_name(log_id) == name else None  # canonical names only
    return None


COMPACTING, COMPACTED = "compacting", "compacted"


def compaction_file_name(new_log_id: int, old_log_id: int, state: str) -> str:
    assert state in (COMPACTING, COMPACTED)
    return f"{new_log_id:x}-from-{old_log_id:x}.{state}"


def parse_compaction_file_name(name: str) -> tuple[int, int, str] | None:
    """(new log id, old log id, state) of a compaction file name, or None."""
    stem, dot, state = name.rpartition(".")
    if not dot or state not in (COMPACTING, COMPACTED):
        return None
    new, sep, old = stem.partition("-from-")
    try:
        ids = int(new, 16), int(old, 16)
    except ValueError:
        return None
    if not sep or min(ids) < 0 or compaction_file_name(ids[0], ids[1], state) != name:
        return None
    return ids[0], ids[1], state


def encode_header(ledger_map_offset: int = 0, ledger_count: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ledger_map_offset, ledger_count).ljust(HEADER_BYTES, b"\0")


def decode_header(data: bytes) -> LogHeader:
    if len(data) < HEADER_BYTES:
        raise FormatError(f"entry log header is {len(data)} bytes, need {HEADER_BYTES}")
    magic, version, map_offset, count = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"bad entry log magic {magic!r}")
    if version != VERSION:
        raise FormatError(f"unsupported entry log version {version}")
    return LogHeader(version, map_offset, count)


def encode_record(entry: bytes) -> bytes:
    return LENGTH.pack(len(entry)) + entry


def encode_ledger_map(live_bytes: dict[int, int]) -> bytes:
    body = MAP_IDS.pack(MAP_LEDGER_ID, MAP_ENTRY_ID, len(live_bytes)) + b"".join(
        MAP_PAIR.pack(lid, n) for lid, n in sorted(live_bytes.items()))
    return LENGTH.pack(len(body)) + body


def decode_map_length(field: bytes, offset: int) -> int:
    """The length field of the ledger map record at the header's map offset (`field`: the bytes read there)."""
    if len(field) != LENGTH.size:
        raise FormatError(f"ledger map offset {offset} is past the end of the entry log ({len(field)} bytes there)")
    return LENGTH.unpack(field)[0]


def decode_ledger_map(body: bytes) -> dict[int, int]:
    if len(body) < MAP_IDS.size:
        raise FormatError("ledger map record is too short")
    lid, eid, count = MAP_IDS.unpack_from(body)
    if (lid, eid) != (MAP_LEDGER_ID, MAP_ENTRY_ID) or len(body) != MAP_IDS.size + count * MAP_PAIR.size:
        raise FormatError("malformed ledger map record")
    return dict(MAP_PAIR.iter_unpack(body[MAP_IDS.size:]))


def check_record(record: bytes, ledger_id: int, entry_id: int, length: int) -> bytes:
    """Validate the bytes read at a location (length prefix + entry); return the entry or raise FormatError.

    Pair assertion across the disk boundary: the index said (ledger, entry, length); the log must agree.
    """
    if len(record) < 4 + 16:
        raise FormatError(f"entry log record for {ledger_id}:{entry_id} is short ({len(record)} bytes)")
    (stored_len,) = LENGTH.unpack_from(record)
    if stored_len != length or len(record) != 4 + length:
        raise FormatError(f"entry log record for {ledger_id}:{entry_id}: length {stored_len}, index says {length}")
    lid, eid = ENTRY_IDS.unpack_from(record, 4)
    if (lid, eid) != (ledger_id, entry_id):
        raise FormatError(f"entry log record holds {lid}:{eid}, index says {ledger_id}:{entry_id}")
    return bytes(record[4:])


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    ledger_id: int
    entry_id: int
    entry: bytes | None  # None for the ledger map record
    ledger_map: dict[int, int] | None


def scan(data: bytes) -> tuple[LogHeader, list[LogRecord], str | None]:
    """Parse a whole entry log: (header, records, why-the-scan-stopped-early or None)."""
    header = decode_header(data)
    records: list[LogRecord] = []
    pos = HEADER_BYTES
    size = len(data)
    while pos < size:
        if size - pos < 4:
            return header, records, f"short length field at offset {pos}"
        (length,) = LENGTH.unpack_from(data, pos)
        if length < 16 or pos + 4 + length > size:
            return header, records, f"bad record length {length} at offset {pos}"
        lid, eid = ENTRY_IDS.unpack_from(data, pos + 4)
        body = bytes(data[pos + 4:pos + 4 + length])
        if (lid, eid) == (MAP_LEDGER_ID, MAP_ENTRY_ID):
            records.append(LogRecord(pos, lid, eid, None, decode_ledger_map(body)))
        else:
            records.append(LogRecord(pos, lid, eid, body, None))
        pos += 4 + length
    return header, records, None


def iter_entries(data: bytes) -> Iterator[LogRecord]:
    _, records, _ = scan(data)
    return (r for r in records if r.entry is not None)
