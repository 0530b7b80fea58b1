"""What a serving process (bookie, broker) tunes once its start-up is done: its allocator and its garbage collector.
Process-wide settings: a library never calls these for its host; the bookie and broker commands do, and the
benchmarks that measure a bookie's or broker's work in their own process."""
from __future__ import annotations

import ctypes
import gc as collector

GC_GEN0_THRESHOLD = 50_000
MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # glibc malloc: blocks below this come from the heap, not their own mmap
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc malloc: free memory it keeps at the heap's top, not given back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)


def settle_process() -> None:
    """Tune a serving process (bookie, broker) once its start-up is done: its allocator, its garbage collector."""
    settle_allocator()
    settle_collector()


def settle_allocator() -> bool:
    """Keep the large blocks a serving process allocates and frees all the time on the heap (glibc's mallopt).

    By default glibc gives a block of 128 KiB or more its own mmap and unmaps it when freed, and returns free heap
    above 128 KiB to the system: a bookie or broker serialises, receives and copies requests of 100 KiB to 0.5 MiB
    thousands of times a second, so each one faulted in fresh pages, which on a VM whose host reclaims memory
    cost far more than the copying (an AddRequest of 512 entries of 1 KiB: 720 us to serialise, 53 us with this).
    Up to TRIM_THRESHOLD_BYTES of freed memory stays with the process. False when the C library has no mallopt
    (not glibc): nothing changed.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                 TRIM_THRESHOLD_BYTES))


def settle_collector() -> None:
    """Tune Python's garbage collector for a serving process, once its start-up is done.

    Freezes what start-up made (modules, descriptors, the gRPC server: tens of thousands of objects that live as
    long as the process), so a full collection no longer walks them: a bookie's took 20-40 ms, twice in ten
    seconds of adds, each one a stall of every add in flight. Then collects the young generation every
    GC_GEN0_THRESHOLD allocations, not every 700: the add paths allocate a few small objects per entry, which at
    tens of thousands of entries a second would be hundreds of collections a second.
    """
    collector.freeze()
    collector.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
