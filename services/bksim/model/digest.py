"""Digest types of entries (PROTOCOL.md §1), named in ledger metadata (§3): one vocabulary for the entry format,
the metadata, the ledger client and the audit.

- "crc32c": CRC32C over the 32 header bytes then the payload;
- "none": the digest field is 0 and means nothing.
"""
from __future__ import annotations

DIGEST_CRC32C = "crc32c"
DIGEST_NONE = "none"
DIGEST_TYPES = (DIGEST_CRC32C, DIGEST_NONE)
