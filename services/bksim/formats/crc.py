"""CRC32C (Castagnoli), hardware accelerated via the `crc32c` package."""
from __future__ import annotations

from crc32c import crc32c as _crc32c


def crc32c(data: bytes, value: int = 0) -> int:
    """CRC32C of `data`, continuing from `value` (0 to start)."""
    return _crc32c(data, value)
