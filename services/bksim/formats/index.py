"""RocksDB key and value layouts of the bookie index (PROTOCOL.md §2.2 "Index").

locations: key = ledger id BE8 ‖ entry id BE8 (sorts by ledger then entry); value = log id BE4 ‖ offset BE8 ‖
length BE4. "Last entry of ledger L" = reverse seek (floor) from location_key(L, ENTRY_ID_MAX).
ledgers: key = ledger id BE8; value = version 1 | flags 1 (exists, fenced, has explicit LAC) | explicit LAC BE8 |
key length 1 | master key.
entrylogs (entry-log metadata, bookie/gc.py): key = log id BE4 (the log id of a location value); value =
version 1 | ledger count BE4 | count x (ledger id BE8, bytes BE8): the bytes each ledger's records take in that
sealed log (what its ledger map says, or what a scan of an unsealed log found). Written once a log is sealed
(rolled, or left behind by a restart, or made by compaction), deleted with the log; the log being written has
no record (its map is in memory). Ledger id -1 (UNKNOWN_LEDGER) in a record means a scan of the log stopped
on a damaged record before its end: records past it may belong to ledgers the record does not list. A record
whose log file is gone (a crash between the two deletes) is dropped
at start; a sealed log without a record is scanned once at start and gets one.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from bksim.model.errors import FormatError

LOCATION_KEY = struct.Struct(">qq")
LOCATION_VALUE = struct.Struct(">IqI")
LEDGER_KEY = struct.Struct(">q")
LEDGER_VALUE_HEAD = struct.Struct(">BBqB")
ENTRY_ID_MAX = (1 << 63) - 1
LEDGER_VALUE_VERSION = 1
LOG_META_KEY = struct.Struct(">I")
LOG_META_HEAD = struct.Struct(">BI")
LOG_META_PAIR = struct.Struct(">qq")
LOG_META_VERSION = 1
UNKNOWN_LEDGER = -1
_EXISTS, _FENCED, _HAS_LAC = 1, 2, 4


@dataclass(frozen=True, slots=True)
class Location:
    log_id: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """What a bookie durably knows about one ledger. Fields never "un-happen": fenced stays fenced."""
    master_key: bytes = b""
    fenced: bool = False
    explicit_lac: int | None = None


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return LOCATION_KEY.pack(ledger_id, entry_id)


def decode_location_key(key: bytes) -> tuple[int, int]:
    if len(key) != LOCATION_KEY.size:
        raise FormatError(f"location key of {len(key)} bytes")
    return LOCATION_KEY.unpack(key)


def encode_location(loc: Location) -> bytes:
    return LOCATION_VALUE.pack(loc.log_id, loc.offset, loc.length)


def decode_location(value: bytes) -> Location:
    if len(value) != LOCATION_VALUE.size:
        raise FormatError(f"location value of {len(value)} bytes")
    return Location(*LOCATION_VALUE.unpack(value))


def ledger_key(ledger_id: int) -> bytes:
    return LEDGER_KEY.pack(ledger_id)


def decode_ledger_key(key: bytes) -> int:
    if len(key) != LEDGER_KEY.size:
        raise FormatError(f"ledger key of {len(key)} bytes")
    return LEDGER_KEY.unpack(key)[0]


def encode_ledger(record: LedgerRecord) -> bytes:
    if len(record.master_key) > 255:
        raise FormatError("master key longer than 255 bytes")
    flags = _EXISTS | (_FENCED if record.fenced else 0) | (_HAS_LAC if record.explicit_lac is not None else 0)
    lac = record.explicit_lac if record.explicit_lac is not None else -1
    return LEDGER_VALUE_HEAD.pack(LEDGER_VALUE_VERSION, flags, lac, len(record.master_key)) + record.master_key


def decode_ledger(value: bytes) -> LedgerRecord:
    if len(value) < LEDGER_VALUE_HEAD.size:
        raise FormatError(f"ledger value of {len(value)} bytes")
    version, flags, lac, key_len = LEDGER_VALUE_HEAD.unpack_from(value)
    if version != LEDGER_VALUE_VERSION or not flags & _EXISTS:
        raise FormatError(f"bad ledger value (version {version}, flags {flags:#x})")
    key = value[LEDGER_VALUE_HEAD.size:]
    if len(key) != key_len:
        raise FormatError(f"ledger value: master key is {len(key)} bytes, header says {key_len}")
    return LedgerRecord(bytes(key), bool(flags & _FENCED), lac if flags & _HAS_LAC else None)


def log_meta_key(log_id: int) -> bytes:
    return LOG_META_KEY.pack(log_id)


def decode_log_meta_key(key: bytes) -> int:
    if len(key) != LOG_META_KEY.size:
        raise FormatError(f"entry-log metadata key of {len(key)} bytes")
    return LOG_META_KEY.unpack(key)[0]


def encode_log_meta(ledger_bytes: dict[int, int]) -> bytes:
    return LOG_META_HEAD.pack(LOG_META_VERSION, len(ledger_bytes)) + b"".join(
        LOG_META_PAIR.pack(lid, n) for lid, n in sorted(ledger_bytes.items()))


def decode_log_meta(value: bytes) -> dict[int, int]:
    if len(value) < LOG_META_HEAD.size:
        raise FormatError(f"entry-log metadata value of {len(value)} bytes")
    version, count = LOG_META_HEAD.unpack_from(value)
    if version != LOG_META_VERSION or len(value) != LOG_META_HEAD.size + count * LOG_META_PAIR.size:
        raise FormatError(f"bad entry-log metadata value (version {version}, {count} ledgers, {len(value)} bytes)")
    return dict(LOG_META_PAIR.iter_unpack(value[LOG_META_HEAD.size:]))
