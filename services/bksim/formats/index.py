"""RocksDB key and value layouts of the bookie index (PROTOCOL.md §2.2 "Index").

locations: key = ledger id BE8 ‖ entry id BE8 (sorts by ledger then entry); value = log id BE4 ‖ offset BE8 ‖
length BE4. "Last entry of ledger L" = reverse seek (floor) from location_key(L, ENTRY_ID_MAX).
ledgers: key = ledger id BE8; value = version 1 | flags 1 (exists, fenced, has explicit LAC) | explicit LAC BE8 |
key length 1 | master key.
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
