"""MurmurHash3 x86 32-bit (Austin Appleby's public-domain algorithm), the hash Pulsar uses for key routing:
partition = murmur3_32(key) mod partitions, and Key_Shared's consistent-hash ring. Pure Python; keys are
short, so the per-call cost is a few microseconds."""
from __future__ import annotations

import struct

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def murmur3_32(data: bytes | str, seed: int = 0) -> int:
    """Unsigned 32-bit MurmurHash3 of `data` (str is hashed as UTF-8)."""
    if isinstance(data, str):
        data = data.encode()
    length = len(data)
    h = seed & _MASK
    blocks = length // 4
    for (k,) in struct.iter_unpack("<I", data[: blocks * 4]):
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
        h = _rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[blocks * 4:]
    k = 0
    if len(tail) == 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if tail:
        k ^= tail[0]
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h

