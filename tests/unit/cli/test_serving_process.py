"""What a serving process (bookie, broker) does once its start-up is done (adapters/serving_process.py): the
collector freezes what start-up made and collects the young generation less often; the allocator keeps large
blocks on the heap instead of giving each its own mmap. Run in child interpreters, so the test process's own
collector and allocator are left as they are."""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
from bksim.cli import bookie_cmd  # what a bookie has imported by the time it settles
from bksim.adapters import serving_process
before = (gc.get_freeze_count(), gc.get_threshold())
serving_process.settle_collector()
print(json.dumps([before, [gc.get_freeze_count(), gc.get_threshold()]]))
"""


def test_settling_freezes_the_start_up_objects_and_raises_the_young_threshold():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    (frozen_before, threshold_before), (frozen_after, threshold_after) = json.loads(out.stdout)
    assert frozen_before == 0 and threshold_before[0] == 700  # Python's defaults
    assert frozen_after > 10_000  # the modules bookie_cmd imports: their functions, classes, dicts
    from bksim.adapters.serving_process import GC_GEN0_THRESHOLD
    assert threshold_after == [GC_GEN0_THRESHOLD, 20, 20]


ALLOCATOR_PROBE = """
import ctypes, json, sys
from bksim.adapters import serving_process

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
settled = serving_process.settle_allocator() if sys.argv[1] == "settled" else None
before = mallinfo2().hblkhd
block = bytearray(4 << 20)
print(json.dumps([settled, mallinfo2().hblkhd - before]))
"""


def mmapped_bytes_of_a_4_mib_block(mode: str) -> tuple[bool | None, int]:
    out = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE, mode], capture_output=True, text=True, timeout=60,
                         check=True)
    settled, mmapped = json.loads(out.stdout)
    return settled, mmapped


def test_settling_keeps_large_blocks_on_the_heap():
    _, mmapped = mmapped_bytes_of_a_4_mib_block("default")
    assert mmapped >= 4 << 20  # glibc's default: a block this large gets a mapping of its own
    assert mmapped_bytes_of_a_4_mib_block("settled") == (True, 0)  # from the heap: reused, not faulted in again
