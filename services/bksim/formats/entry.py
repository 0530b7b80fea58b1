"""Entry format (PROTOCOL.md §1); the wire format is the disk format.

    ledger_id BE8 | entry_id BE8 | last_add_confirmed BE8 | ledger_length BE8 | digest 4 | payload

digest = CRC32C over the 32 header bytes then the payload (digest type "crc32c"), or 0 (type "none").
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from bksim.formats.crc import crc32c
from bksim.model.digest import DIGEST_CRC32C, DIGEST_NONE, DIGEST_TYPES
from bksim.model.errors import FormatError

HEADER = struct.Struct(">qqqqI")
HEADER_BYTES = HEADER.size  # 36
IDS = struct.Struct(">qqq")  # ledger_id, entry_id, last_add_confirmed: what the bookie parses on add


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    ledger_length: int
    payload: bytes


def encode_entry(ledger_id: int, entry_id: int, last_add_confirmed: int, ledger_length: int, payload: bytes,
                 digest_type: str = DIGEST_CRC32C) -> bytes:
    head = struct.pack(">qqqq", ledger_id, entry_id, last_add_confirmed, ledger_length)
    if digest_type == DIGEST_CRC32C:
        digest = crc32c(payload, crc32c(head))
    elif digest_type == DIGEST_NONE:
        digest = 0
    else:
        raise FormatError(f"unknown digest type {digest_type!r} (known: {', '.join(DIGEST_TYPES)})")
    return head + digest.to_bytes(4, "big") + payload


def parse_ids(data: bytes) -> tuple[int, int, int]:
    """(ledger_id, entry_id, last_add_confirmed) of an entry, without verifying its digest."""
    if len(data) < HEADER_BYTES:
        raise FormatError(f"entry of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    return IDS.unpack_from(data)


def decode_entry(data: bytes, digest_type: str = DIGEST_CRC32C, ledger_id: int | None = None,
                 entry_id: int | None = None) -> Entry:
    """Parse and verify an entry: digest, and (when given) the expected ledger and entry ids.

    A mismatch means "this replica is bad", never "the entry does not exist": callers treat FormatError so.
    """
    if len(data) < HEADER_BYTES:
        raise FormatError(f"entry of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    lid, eid, lac, length, digest = HEADER.unpack_from(data)
    payload = bytes(data[HEADER_BYTES:])
    if digest_type == DIGEST_CRC32C:
        actual = crc32c(payload, crc32c(bytes(data[:32])))
        if actual != digest:
            raise FormatError(f"digest mismatch in ledger {lid} entry {eid}: stored {digest:#010x}, computed {actual:#010x}")
    elif digest_type != DIGEST_NONE:
        raise FormatError(f"unknown digest type {digest_type!r}")
    if ledger_id is not None and lid != ledger_id:
        raise FormatError(f"expected ledger {ledger_id}, entry says ledger {lid}")
    if entry_id is not None and eid != entry_id:
        raise FormatError(f"expected entry {entry_id}, entry says entry {eid}")
    return Entry(lid, eid, lac, length, payload)


def master_key(password: bytes) -> bytes:
    """The ledger's master key sent with every add and fencing read: SHA-256("ledger" || password) (PROTOCOL.md §1)."""
    return hashlib.sha256(b"ledger" + password).digest()
