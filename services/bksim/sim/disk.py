"""SimDisk: ports.disk.Disk entirely in memory, with the durability rules of a real file system and a crash.

Owns the simulated device: files (inodes), their names, and what survives a crash.

The model (like ext4 with data=ordered and without auto_da_alloc; what the engine may rely on is exactly
what the Disk port promises):
- Each file has current bytes (what reads see: the page cache) and durable bytes. `AppendFile.sync()`,
  `write_synced[_now]()`, `Disk.truncate()` and the fsync inside `atomic_write()` make the file's current
  bytes durable (those written before the call, for sync()).
- A name that is created, renamed or removed is durable only after `sync_dir()` of its directory; until
  then a crash restores the directory's previous durable names. So `atomic_write` (temp, fsync, rename,
  fsync dir) replaces a file all-or-nothing, and a crash between its rename and its directory sync leaves
  the OLD content. Directories themselves are durable once made (the bookie makes its directories once).
- `crash(rng)`: every name goes back to its durable state; every file loses its unsynced bytes, except
  that (seeded, per file, with `torn_tail_probability`) a prefix of its unsynced appended bytes survives,
  cut at a sector boundary (devices write whole sectors) or at their end (the data reached the device but
  the fsync had not returned): a torn tail. Sometimes (`torn_zeros_probability`) its sectors also reached the
  device in any order: each sector of the kept prefix is then left as zeros with probability 1/2 (written
  later than the crash), and one or two sectors of zeros follow it (blocks allocated but not written). So
  "zeros, then valid bytes" is a torn tail too. `sector_bytes=1` tears anywhere, a harsher model than real
  devices.
  Unsynced overwrites in place (pwrite) are lost. What is left after a crash is durable.
- A crash ends the process that used the disk: every call through this SimDisk, and through files opened
  with it, raises ProcessCrashed afterwards (so a dead engine's leftover tasks cannot write after the
  crash). The next process attaches with `reopen()`.
- Latency: every coroutine method (the ones that would run off the event loop) sleeps a seeded latency in
  virtual time; `write_synced_now` (an fdatasync on the loop's thread) blocks the virtual loop for it.
- `usage()` reports a configured capacity minus the bytes held by the files.

Must not: touch real files, use threads, or draw randomness from anything but the rng it is given.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import os
import random
from dataclasses import dataclass

from bksim.sim.loop import SimLoop

GiB = 1 << 30
TORN_ZEROS_SECTORS_MAX = 2  # whole sectors of zeros a torn tail may end with


@functools.lru_cache(maxsize=4096)
def _norm(path: str) -> str:
    """Paths are absolute and normalised inside the device ("a/b" and "/a/./b" are "/a/b")."""
    return os.path.normpath(os.path.join("/", path))


@functools.lru_cache(maxsize=4096)
def _dirname(path: str) -> str:
    return os.path.dirname(path)


class ProcessCrashed(OSError):
    """The process that owned this disk handle crashed: its I/O calls fail from then on."""


@dataclass(frozen=True, slots=True)
class DiskFaults:
    """What the simulated disk does to the engine. Probabilities in [0, 1], latencies in virtual ms."""
    latency_ms_min: float = 0.0
    latency_ms_max: float = 0.0
    torn_tail_probability: float = 0.0  # per file with unsynced appended bytes, at a crash
    torn_zeros_probability: float = 0.0  # a kept torn prefix has sectors that never landed, and zeros after it
    sector_bytes: int = 512  # a torn tail is cut at a multiple of this (file offset), or at its end
    capacity_bytes: int = GiB

    def __post_init__(self) -> None:
        assert 0.0 <= self.latency_ms_min <= self.latency_ms_max, self
        assert 0.0 <= self.torn_tail_probability <= 1.0 and 0.0 <= self.torn_zeros_probability <= 1.0, self
        assert self.capacity_bytes > 0 and self.sector_bytes >= 1, self


class _Inode:
    __slots__ = ("ino", "data", "durable")

    def __init__(self, ino: int, data: bytes = b"") -> None:
        self.ino = ino
        self.data = bytearray(data)  # what reads see (page cache)
        self.durable = b""  # what survives a crash


class _Device:
    """The storage shared by every process incarnation that attaches to it."""

    def __init__(self, faults: DiskFaults, rng: random.Random) -> None:
        self.faults, self.rng = faults, rng
        self.generation = 0  # bumped by every crash: handles of older generations are dead
        self.dirs: set[str] = {"/"}
        self.names: dict[str, _Inode] = {}
        self.durable_names: dict[str, _Inode] = {}
        self._inos = itertools.count(1)

    def new_inode(self, data: bytes = b"") -> _Inode:
        return _Inode(next(self._inos), data)

    def sync_names(self, directory: str) -> None:
        """Make the current names of `directory` (not of its subdirectories) durable."""
        for path in [p for p in self.durable_names if _dirname(p) == directory]:
            if path not in self.names:
                del self.durable_names[path]
        for path, inode in self.names.items():
            if _dirname(path) == directory:
                self.durable_names[path] = inode


class SimDisk:
    """ports.disk.Disk for one process incarnation over a simulated device."""

    def __init__(self, faults: DiskFaults | None = None, rng: random.Random | None = None, *,
                 _device: _Device | None = None) -> None:
        self._device = _device or _Device(faults or DiskFaults(), rng or random.Random(0))
        self._generation = self._device.generation
        self._exited = False

    @property
    def faults(self) -> DiskFaults:
        return self._device.faults

    # -- process lifecycle -------------------------------------------------------------------------------
    def reopen(self) -> "SimDisk":
        """A handle for the next process on the same device (after a crash or a clean stop)."""
        return SimDisk(_device=self._device)

    def exit_process(self) -> None:
        """The process using this handle exited (no power loss: the page cache, so every byte and name it
        wrote, stays). Its later calls raise ProcessCrashed."""
        self._exited = True

    def crash(self, rng: random.Random) -> list[str]:
        """Power loss: keep only durable names and bytes (plus seeded torn tails). Kills every handle.

        Returns one line per file that lost bytes, for the trace."""
        d = self._device
        d.generation += 1
        f = d.faults
        lost: list[str] = []
        for path in sorted(set(d.names) | set(d.durable_names)):
            if path not in d.durable_names:
                lost.append(f"{path}: name not durable (created or renamed without a directory sync): gone")
            elif d.names.get(path) is not d.durable_names[path]:
                lost.append(f"{path}: rename/remove not durable: the old name is back")
        seen: set[int] = set()
        for path in sorted(d.durable_names):
            inode = d.durable_names[path]
            if inode.ino in seen:
                continue
            seen.add(inode.ino)
            durable_len = len(inode.durable)
            pending = len(inode.data) - durable_len
            kept = b""
            if pending > 0 and f.torn_tail_probability > 0 and rng.random() < f.torn_tail_probability:
                kept = bytes(inode.data[durable_len:_torn_cut(durable_len, len(inode.data), f.sector_bytes, rng)])
                if f.torn_zeros_probability > 0 and rng.random() < f.torn_zeros_probability:
                    kept = _sectors_lost(kept, durable_len, f.sector_bytes, rng) \
                        + bytes(f.sector_bytes * rng.randint(1, TORN_ZEROS_SECTORS_MAX))
            if pending > 0 or kept or inode.data[:durable_len] != inode.durable:
                lost.append(f"{path}: {len(inode.data)} bytes -> {durable_len} durable"
                            + (f" + torn tail of {len(kept)} bytes" if kept else ""))
            inode.data = bytearray(inode.durable + kept)
            inode.durable = bytes(inode.data)
        d.names = dict(d.durable_names)
        return lost

    def _check(self) -> _Device:
        if self._generation != self._device.generation or self._exited:
            raise ProcessCrashed("disk handle of a crashed or exited process")
        return self._device

    async def _latency(self) -> None:
        f = self._device.faults
        await asyncio.sleep(self._device.rng.uniform(f.latency_ms_min, f.latency_ms_max) / 1000.0)

    def _block(self) -> None:
        """A device call on the loop's thread: the virtual loop is blocked for one latency."""
        f = self._device.faults
        if f.latency_ms_max > 0:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, SimLoop), "SimDisk runs on a SimLoop"
            loop.block_ms(self._device.rng.uniform(f.latency_ms_min, f.latency_ms_max))

    # -- the Disk port -----------------------------------------------------------------------------------
    def create(self, path: str) -> "SimFile":
        d = self._check()
        path = _norm(path)
        if _dirname(path) not in d.dirs:
            raise FileNotFoundError(f"no directory {_dirname(path)} for {path}")
        if path in d.names or path in d.dirs:
            raise FileExistsError(path)
        inode = d.names[path] = d.new_inode()
        return SimFile(self, inode, path)

    def open_append(self, path: str) -> "SimFile":
        path = _norm(path)
        return SimFile(self, self._inode(path), path)

    def _inode(self, path: str) -> _Inode:
        inode = self._check().names.get(_norm(path))
        if inode is None:
            raise FileNotFoundError(path)
        return inode

    def read(self, path: str, offset: int, length: int) -> bytes:
        return bytes(self._inode(path).data[offset:offset + length])

    def read_all(self, path: str) -> bytes:
        return bytes(self._inode(path).data)

    def exists(self, path: str) -> bool:
        d = self._check()
        path = _norm(path)
        return path in d.names or path in d.dirs

    def list_dir(self, path: str) -> list[str]:
        d = self._check()
        path = _norm(path)
        if path not in d.dirs:
            return []
        return sorted(os.path.basename(p) for p in itertools.chain(d.names, d.dirs)
                      if p != path and _dirname(p) == path)

    def makedirs(self, path: str) -> None:
        d = self._check()
        path = _norm(path)
        while path not in d.dirs:
            if path in d.names:
                raise FileExistsError(f"{path} is a file")
            d.dirs.add(path)
            path = _dirname(path)

    def remove(self, path: str) -> None:
        d = self._check()
        path = _norm(path)
        if path not in d.names:
            raise FileNotFoundError(path)
        del d.names[path]

    async def delete(self, path: str) -> None:
        self.remove(path)  # no thread in the simulation: the same step, at the same virtual instant

    def rename(self, src: str, dst: str) -> None:
        d = self._check()
        src, dst = _norm(src), _norm(dst)
        if src not in d.names:
            raise FileNotFoundError(src)
        if _dirname(dst) not in d.dirs:
            raise FileNotFoundError(f"no directory {_dirname(dst)} for {dst}")
        d.names[dst] = d.names.pop(src)

    async def truncate(self, path: str, size: int) -> None:
        inode = self._inode(path)
        await self._latency()
        self._check()
        del inode.data[size:]
        inode.durable = bytes(inode.data)

    async def atomic_write(self, path: str, data: bytes) -> None:
        d = self._check()
        path = _norm(path)
        tmp = path + ".tmp"
        if _dirname(path) not in d.dirs:
            raise FileNotFoundError(f"no directory {_dirname(path)} for {path}")
        inode = d.names[tmp] = d.new_inode(data)
        await self._latency()  # fsync of the temp file
        self._check()
        inode.durable = bytes(inode.data)
        d.names[path] = d.names.pop(tmp)  # rename: durable only after the directory sync below
        await self._latency()  # fsync of the directory
        self._check()
        d.sync_names(_dirname(path))

    async def sync_dir(self, path: str) -> None:
        self._check()
        await self._latency()
        self._check().sync_names(_norm(path))

    def usage(self, path: str) -> tuple[int, int]:
        d = self._check()
        used = sum(len(inode.data) for inode in {i.ino: i for i in d.names.values()}.values())
        return d.faults.capacity_bytes, max(0, d.faults.capacity_bytes - used)

    # -- for the simulator's checkers and fault injection (not part of the port) -----------------------
    def durable_bytes(self, path: str) -> bytes | None:
        """What a crash now would leave at `path` (without torn tails), or None if the name is not durable."""
        inode = self._device.durable_names.get(_norm(path))
        return inode.durable if inode is not None else None

    def flip_bit(self, path: str, offset: int, bit: int) -> None:
        """Bit rot: flip one durable bit of a file (and the page cache's copy)."""
        inode = self._device.durable_names[_norm(path)]
        assert offset < len(inode.durable) and 0 <= bit < 8, (path, offset, bit)
        mask = 1 << bit
        durable = bytearray(inode.durable)
        durable[offset] ^= mask
        inode.durable = bytes(durable)
        if offset < len(inode.data):
            inode.data[offset] ^= mask


def _torn_cut(start: int, end: int, sector_bytes: int, rng: random.Random) -> int:
    """Where a torn write of the bytes [start, end) stops: a sector boundary inside, or the end."""
    first = (start // sector_bytes + 1) * sector_bytes
    cuts = list(range(first, end, sector_bytes)) + [end]
    return cuts[rng.randrange(len(cuts))]


def _sectors_lost(kept: bytes, start: int, sector_bytes: int, rng: random.Random) -> bytes:
    """`kept` (the torn bytes from file offset `start`) with each sector, independently with probability 1/2,
    left as zeros: a write whose sectors reach the device in any order, cut by the crash. Bytes before `start`
    were durable already and stay."""
    out = bytearray(kept)
    first = start // sector_bytes * sector_bytes
    for a in range(first, start + len(kept), sector_bytes):
        if rng.random() < 0.5:
            lo, hi = max(a, start) - start, min(a + sector_bytes, start + len(kept)) - start
            out[lo:hi] = bytes(hi - lo)
    return bytes(out)


class SimFile:
    """ports.disk.AppendFile over one simulated inode."""

    def __init__(self, disk: SimDisk, inode: _Inode, path: str) -> None:
        self.path = path
        self._disk, self._inode = disk, inode
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._inode.data)

    def _check(self) -> _Inode:
        self._disk._check()
        if self._closed:
            raise ValueError(f"{self.path}: I/O on a closed file")
        return self._inode

    def write(self, data: bytes) -> None:
        self._check().data += data

    async def write_chunks(self, chunks: list[bytes]) -> None:
        self._check()
        await self._disk._latency()
        inode = self._check()
        for chunk in chunks:
            inode.data += chunk

    async def write_chunks_synced(self, chunks: list[bytes]) -> None:
        inode = self._check()
        for chunk in chunks:  # maybe: a crash during the sync below keeps only a prefix of them (torn tail)
            inode.data += chunk
        snapshot = bytes(inode.data)
        await self._disk._latency()
        self._check().durable = snapshot

    async def sync(self) -> None:
        snapshot = bytes(self._check().data)
        await self._disk._latency()
        self._check().durable = snapshot

    async def write_synced(self, *parts: bytes) -> None:
        inode = self._check()
        for data in parts:  # maybe: a crash during the sync below keeps only a prefix of them (torn tail)
            inode.data += data
        snapshot = bytes(inode.data)
        await self._disk._latency()
        self._check().durable = snapshot

    def write_synced_now(self, *parts: bytes) -> None:
        inode = self._check()
        for data in parts:
            inode.data += data
        self._disk._block()
        inode.durable = bytes(inode.data)

    def drop_cached(self, start: int, end: int) -> None:
        self._check()  # a simulated file has no page cache: nothing to drop, nothing changes

    def pwrite(self, offset: int, data: bytes) -> None:
        inode = self._check()
        if len(inode.data) < offset:
            inode.data += bytes(offset - len(inode.data))
        inode.data[offset:offset + len(data)] = data

    def close(self) -> None:
        self._closed = True
