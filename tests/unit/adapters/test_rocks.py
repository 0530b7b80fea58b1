"""The RocksDB adapter (adapters/rocks.py) on a real store: a synced write's fsync happens in Python, where the
GIL is released (rocksdict holds it for the whole of a write), and covers the write-ahead log and its directory."""
from __future__ import annotations

import asyncio
import os
import threading

from bksim.adapters import rocks


def test_a_synced_write_fsyncs_the_write_ahead_log_with_the_gil_released(tmp_path, monkeypatch):
    store = rocks.open_rocks(str(tmp_path / "db"))
    synced: list[str] = []
    others_ran: list[bool] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def recording(real):
        def sync(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            # another thread can run while the write syncs: it would block here if the GIL were held
            ran = threading.Event()
            threading.Thread(target=ran.set).start()
            others_ran.append(ran.wait(10.0))
            real(fd)
        return sync

    monkeypatch.setattr(rocks.os, "fdatasync", recording(real_fdatasync))
    monkeypatch.setattr(rocks.os, "fsync", recording(real_fsync))
    try:
        asyncio.run(store.write([(b"k1", b"v1")], [], sync=True))
        wal = [p for p in synced if p.endswith(".log")]
        assert wal and all(os.path.dirname(p) == store.path for p in wal), synced
        assert store.path in synced  # a log file the directory was never synced for: the directory too
        assert all(others_ran)
        synced.clear()
        asyncio.run(store.write([(b"k2", b"v2")], [], sync=True))
        assert [p for p in synced if p.endswith(".log")] and store.path not in synced, synced
        synced.clear()
        asyncio.run(store.write([(b"k3", b"v3")], [], sync=False))
        assert synced == []
        assert store.get(b"k1") == b"v1" and store.get(b"k3") == b"v3"
    finally:
        store.close()
    reopened = rocks.open_rocks(str(tmp_path / "db"))
    try:
        assert [reopened.get(k) for k in (b"k1", b"k2", b"k3")] == [b"v1", b"v2", b"v3"]
    finally:
        reopened.close()
