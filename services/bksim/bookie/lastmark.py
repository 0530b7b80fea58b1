"""The checkpoint mark file `<ledger_dir>/lastmark` (PROTOCOL.md §2.2, checkpoint step 7).

16 bytes (journal id BE8, offset BE8) and their CRC32C (BE4). Written all-or-nothing by the engine
(temp file, fsync, rename, fsync dir); a damaged file refuses start-up rather than guessing where replay
should begin. No file = never checkpointed = replay from the first journal.
"""
from __future__ import annotations

import os
import struct

from bksim.bookie.journal import JournalMark
from bksim.formats.crc import crc32c
from bksim.model.errors import FormatError
from bksim.ports.disk import Disk

LASTMARK_FILE = "lastmark"
_MARK = struct.Struct(">qqI")  # journal id, offset, crc32c of the first 16 bytes


def encode_lastmark(mark: JournalMark) -> bytes:
    head = struct.pack(">qq", mark.journal_id, mark.offset)
    return head + crc32c(head).to_bytes(4, "big")


def decode_lastmark(data: bytes) -> JournalMark:
    if len(data) != _MARK.size:
        raise FormatError(f"lastmark file is {len(data)} bytes, expected {_MARK.size}")
    journal_id, offset, crc = _MARK.unpack(data)
    if crc32c(data[:16]) != crc:
        raise FormatError("lastmark file has a bad checksum")
    return JournalMark(journal_id, offset)


def read_lastmark(disk: Disk, ledger_dir: str) -> JournalMark:
    path = os.path.join(ledger_dir, LASTMARK_FILE)
    if not disk.exists(path):
        return JournalMark(0, 0)
    return decode_lastmark(disk.read_all(path))
