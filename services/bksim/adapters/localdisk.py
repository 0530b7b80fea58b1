"""Real files (ports.disk.Disk): os calls, fdatasync, and blocking work run off the event loop."""
from __future__ import annotations

import asyncio
import os
import shutil

_IOV_MAX = 1024  # writev's per-call limit on Linux


class LocalFile:
    """An append-only file descriptor (ports.disk.AppendFile)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._size = os.fstat(fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n

    def _write_chunks(self, chunks: list[bytes]) -> None:
        for start in range(0, len(chunks), _IOV_MAX):
            part = chunks[start:start + _IOV_MAX]
            want = sum(map(len, part))
            n = os.writev(self._fd, part)
            self._size += n
            if n < want:  # maybe: a short writev; finish the rest byte-exactly
                self.write(b"".join(part)[n:])

    async def write_chunks(self, chunks: list[bytes]) -> None:
        await asyncio.to_thread(self._write_chunks, chunks)

    def _write_chunks_synced(self, chunks: list[bytes]) -> None:
        self._write_chunks(chunks)
        os.fdatasync(self._fd)

    async def write_chunks_synced(self, chunks: list[bytes]) -> None:
        await asyncio.to_thread(self._write_chunks_synced, chunks)

    def write_synced_now(self, *parts: bytes) -> None:
        self._write_chunks(list(parts))  # one writev: the parts are not joined first
        os.fdatasync(self._fd)

    async def sync(self) -> None:
        await asyncio.to_thread(os.fdatasync, self._fd)

    def drop_cached(self, start: int, end: int) -> None:
        try:
            os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # advisory (a file system without page cache hints): nothing was changed

    async def write_synced(self, *parts: bytes) -> None:
        await asyncio.to_thread(self.write_synced_now, *parts)

    def pwrite(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LocalDisk:
    def create(self, path: str) -> LocalFile:
        # no O_APPEND: Linux pwrite() on an O_APPEND file ignores its offset (pwrite(2), BUGS)
        return LocalFile(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def open_append(self, path: str) -> LocalFile:
        fd = os.open(path, os.O_WRONLY)
        os.lseek(fd, 0, os.SEEK_END)
        return LocalFile(path, fd)

    def read(self, path: str, offset: int, length: int) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def read_all(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        os.remove(path)

    async def delete(self, path: str) -> None:
        await asyncio.to_thread(os.remove, path)

    def rename(self, src: str, dst: str) -> None:
        shutil.move(src, dst)

    async def truncate(self, path: str, size: int) -> None:
        def run() -> None:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)
        await asyncio.to_thread(run)

    async def atomic_write(self, path: str, data: bytes) -> None:
        def run() -> None:
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_dir(os.path.dirname(path) or ".")
        await asyncio.to_thread(run)

    async def sync_dir(self, path: str) -> None:
        await asyncio.to_thread(_fsync_dir, path)

    def usage(self, path: str) -> tuple[int, int]:
        st = os.statvfs(path)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
