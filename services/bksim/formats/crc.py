"""CRC32C (Castagnoli), hardware accelerated via the `crc32c` package.

`crc32c(data, value=0)`: the CRC of `data`, continuing from `value`. The C function is exported as is:
it sits on the add path, where a Python wrapper costs a third more per call.
"""
from __future__ import annotations

from crc32c import crc32c

__all__ = ["crc32c"]
