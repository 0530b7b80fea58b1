"""Hypothesis strategies shared by the fuzz tests: arbitrary bytes, and valid encodings mutated.

`mutated(valid)` draws an encoding from the strategy `valid` and damages it the ways disks, networks and
hostile peers do: bit flips, truncation, extension with random bytes, a byte range overwritten, and a 2-, 4-
or 8-byte field (at any offset, so every length and count field is hit) set to an extreme value (0, 2^15,
2^31, 2^32 - 1, 2^63 - 1, -1 ...), in both byte orders. One to three mutations per example.
"""
from __future__ import annotations

from hypothesis import strategies as st

RAW_BYTES_MAX = 512  # arbitrary-bytes examples: long enough to pass every fixed header of these formats

_EXTREMES = {
    2: [0, 1, 0x7FFF, 0x8000, 0xFFFF],
    4: [0, 1, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0x0100_0000],
    8: [0, 1, 2**31, 2**32 - 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1],
}


def raw_bytes(max_size: int = RAW_BYTES_MAX) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size)


@st.composite
def _mutate(draw, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "extend", "overwrite", "field"]))
        if kind == "flip" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate" and buf:
            buf = buf[:draw(st.integers(0, len(buf) - 1))]
        elif kind == "extend":
            buf += draw(st.binary(min_size=1, max_size=64))
        elif kind == "overwrite" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            patch = draw(st.binary(min_size=1, max_size=16))
            buf[i:i + len(patch)] = patch
        elif kind == "field" and buf:
            width = draw(st.sampled_from([2, 4, 8]))
            if len(buf) >= width:
                i = draw(st.integers(0, len(buf) - width))
                value = draw(st.sampled_from(_EXTREMES[width]))
                buf[i:i + width] = value.to_bytes(width, draw(st.sampled_from(["big", "little"])))
    return bytes(buf)


def mutated(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid encodings from `valid`, each damaged one to three times."""
    return valid.flatmap(_mutate)
