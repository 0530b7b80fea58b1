"""The local-disk adapter on real files: a synced write of several parts appends them back to back."""
from __future__ import annotations

import asyncio

from bksim.adapters.localdisk import LocalDisk


def test_synced_writes_append_their_parts_back_to_back(tmp_path):
    path = str(tmp_path / "journal")
    disk = LocalDisk()
    f = disk.create(path)
    f.write_synced_now(b"frame-1|", b"records-1|")
    asyncio.run(f.write_synced(b"frame-2|", b"records-2|"))
    f.write_synced_now(b"whole|")
    assert f.size == len(b"frame-1|records-1|frame-2|records-2|whole|")
    f.close()
    assert disk.read_all(path) == b"frame-1|records-1|frame-2|records-2|whole|"
