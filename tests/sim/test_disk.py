"""SimDisk's durability model (bksim.sim.disk): what survives a crash, torn tails, directory entries,
atomic_write, dead handles. Every coroutine runs on the simulator's loop."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.sim.disk import DiskFaults, ProcessCrashed, SimDisk
from bksim.sim.loop import run

ALWAYS_TORN = DiskFaults(torn_tail_probability=1.0, sector_bytes=4)
NEVER_TORN = DiskFaults()


def disk_with_dir(faults: DiskFaults = NEVER_TORN) -> SimDisk:
    disk = SimDisk(faults, random.Random(1))
    disk.makedirs("/d")
    return disk


async def durable_file(disk: SimDisk, path: str, data: bytes):
    f = disk.create(path)
    f.write(data)
    await f.sync()
    await disk.sync_dir("/d")
    return f


def test_unsynced_writes_are_lost_and_synced_ones_survive():
    async def main():
        disk = disk_with_dir()
        f = await durable_file(disk, "/d/a", b"synced.")
        f.write(b"unsynced")
        assert disk.read_all("/d/a") == b"synced.unsynced"  # reads see the page cache
        assert disk.durable_bytes("/d/a") == b"synced."
        lost = disk.crash(random.Random(0))
        after = disk.reopen()
        return after.read_all("/d/a"), lost
    data, lost = run(main())
    assert data == b"synced." and lost == ["/d/a: 15 bytes -> 7 durable"]


def test_write_synced_and_write_synced_now_are_durable_when_they_return():
    async def main():
        disk = disk_with_dir()
        f = await durable_file(disk, "/d/a", b"")
        await f.write_synced(b"one.")
        f.write_synced_now(b"two.")
        await f.write_synced(b"thr", b"ee.")
        f.write_synced_now(b"fo", b"ur.")
        disk.crash(random.Random(0))
        return disk.reopen().read_all("/d/a")
    assert run(main()) == b"one.two.three.four."


async def torn_results(faults: DiskFaults, seeds: int, unsynced: bytes) -> set[bytes]:
    """What "/d/a" holds after a crash, over `seeds` seeds: 2 durable bytes "ab", then `unsynced` written."""
    kept = set()
    for seed in range(seeds):
        disk = disk_with_dir(faults)
        f = await durable_file(disk, "/d/a", b"ab")
        f.write(unsynced)
        disk.crash(random.Random(seed))
        kept.add(disk.reopen().read_all("/d/a"))
    return kept


def test_a_torn_tail_keeps_a_sector_aligned_prefix_of_the_unsynced_bytes():
    kept = run(torn_results(ALWAYS_TORN, 40, b"cdefghij"))  # sectors of 4
    # cut at file offsets 4 or 8 (sector boundaries) or at the end (10): never mid-sector
    assert {k for k in kept if not k.endswith(b"\0")} == {b"abcd", b"abcdefgh", b"abcdefghij"}


def test_a_torn_tail_may_end_in_zeros():
    async def main():
        faults = DiskFaults(torn_tail_probability=1.0, torn_zeros_probability=1.0, sector_bytes=4)
        disk = disk_with_dir(faults)
        f = await durable_file(disk, "/d/a", b"ab")
        f.write(b"cdefghij")
        disk.crash(random.Random(3))
        return disk.reopen().read_all("/d/a")
    data = run(main())
    assert data.startswith(b"ab") and data.endswith(b"\0" * 4)  # one or two zero sectors after the cut


def test_a_crash_during_write_synced_can_tear_the_write():
    async def main():
        disk = disk_with_dir(DiskFaults(latency_ms_min=1.0, latency_ms_max=1.0, torn_tail_probability=1.0,
                                        sector_bytes=1))
        f = await durable_file(disk, "/d/a", b"")
        task = asyncio.get_running_loop().create_task(f.write_synced(b"0123456789"))
        await asyncio.sleep(0.0005)  # the sync is half done
        disk.crash(random.Random(5))
        with pytest.raises(ProcessCrashed):
            await task
        return disk.reopen().read_all("/d/a")
    data = run(main())
    assert b"0123456789".startswith(data) and data != b"0123456789"


def test_a_created_name_is_durable_only_after_sync_dir():
    async def main():
        disk = disk_with_dir()
        f = disk.create("/d/new")
        await f.write_synced(b"data")  # the bytes are durable, the name is not
        disk.crash(random.Random(0))
        disk = disk.reopen()
        gone = not disk.exists("/d/new")
        f = disk.create("/d/new")
        await f.write_synced(b"data")
        await disk.sync_dir("/d")
        disk.crash(random.Random(0))
        return gone, disk.reopen().read_all("/d/new")
    assert run(main()) == (True, b"data")


def test_remove_and_rename_are_durable_only_after_sync_dir():
    async def main():
        disk = disk_with_dir()
        disk.makedirs("/e")
        await durable_file(disk, "/d/a", b"A")
        await durable_file(disk, "/d/b", b"B")
        disk.remove("/d/a")
        disk.rename("/d/b", "/e/b")
        assert disk.list_dir("/d") == [] and disk.list_dir("/e") == ["b"]
        disk.crash(random.Random(0))
        disk = disk.reopen()
        before = (disk.list_dir("/d"), disk.list_dir("/e"))
        disk.remove("/d/a")
        disk.rename("/d/b", "/e/b")
        await disk.sync_dir("/e")  # the new name is durable; the old one is not yet gone
        disk.crash(random.Random(0))
        disk = disk.reopen()
        middle = (disk.list_dir("/d"), disk.list_dir("/e"))
        disk.remove("/d/a")
        disk.remove("/d/b")
        await disk.sync_dir("/d")
        disk.crash(random.Random(0))
        disk = disk.reopen()
        return before, middle, (disk.list_dir("/d"), disk.list_dir("/e"), disk.read_all("/e/b"))
    before, middle, after = run(main())
    assert before == (["a", "b"], [])
    assert middle == (["a", "b"], ["b"])
    assert after == ([], ["b"], b"B")


def test_atomic_write_is_all_or_nothing_and_durable_after_its_directory_sync():
    async def main():
        faults = DiskFaults(latency_ms_min=1.0, latency_ms_max=1.0)
        outcomes = []
        for crash_after_ms in (0.5, 1.5, 2.5):  # during the file fsync, during the dir fsync, after both
            disk = SimDisk(faults, random.Random(0))
            disk.makedirs("/d")
            await disk.atomic_write("/d/mark", b"old")
            task = asyncio.get_running_loop().create_task(disk.atomic_write("/d/mark", b"new"))
            await asyncio.sleep(crash_after_ms / 1000.0)
            disk.crash(random.Random(0))
            await asyncio.gather(task, return_exceptions=True)
            disk = disk.reopen()
            outcomes.append((disk.read_all("/d/mark"), disk.list_dir("/d")))
        return outcomes
    assert run(main()) == [(b"old", ["mark"]), (b"old", ["mark"]), (b"new", ["mark"])]


def test_truncate_is_durable():
    async def main():
        disk = disk_with_dir()
        await durable_file(disk, "/d/a", b"0123456789")
        await disk.truncate("/d/a", 4)
        disk.crash(random.Random(0))
        return disk.reopen().read_all("/d/a")
    assert run(main()) == b"0123"


def test_pwrite_in_place_is_lost_without_sync():
    async def main():
        disk = disk_with_dir()
        f = await durable_file(disk, "/d/a", b"header--body")
        f.pwrite(0, b"HEADER")
        assert disk.read(("/d/a"), 0, 6) == b"HEADER"
        disk.crash(random.Random(0))
        return disk.reopen().read_all("/d/a")
    assert run(main()) == b"header--body"


def test_handles_of_a_crashed_or_exited_process_are_dead():
    async def main():
        disk = disk_with_dir()
        f = await durable_file(disk, "/d/a", b"x")
        disk.crash(random.Random(0))
        for call in (lambda: f.write(b"y"), lambda: disk.read_all("/d/a"), lambda: disk.create("/d/b"),
                     lambda: disk.remove("/d/a")):
            with pytest.raises(ProcessCrashed):
                call()
        with pytest.raises(ProcessCrashed):
            await f.sync()
        alive = disk.reopen()
        g = alive.open_append("/d/a")
        g.write(b"z")  # a process exit keeps the page cache, unlike a crash
        alive.exit_process()
        with pytest.raises(ProcessCrashed):
            alive.read_all("/d/a")
        return alive.reopen().read_all("/d/a")
    assert run(main()) == b"xz"


def test_create_list_usage_and_errors():
    async def main():
        disk = SimDisk(DiskFaults(capacity_bytes=1000), random.Random(0))
        with pytest.raises(FileNotFoundError):
            disk.create("/nowhere/a")
        disk.makedirs("/x/y")
        disk.create("/x/y/b").write(b"12345")
        disk.create("/x/y/a").write(b"123")
        with pytest.raises(FileExistsError):
            disk.create("/x/y/a")
        with pytest.raises(FileNotFoundError):
            disk.read_all("/x/y/c")
        return disk.list_dir("/x"), disk.list_dir("/x/y"), disk.list_dir("/none"), disk.usage("/x")
    assert run(main()) == (["y"], ["a", "b"], [], (1000, 992))


def test_flip_bit_changes_durable_bytes_and_the_page_cache():
    async def main():
        disk = disk_with_dir()
        await durable_file(disk, "/d/a", b"\x00\x00")
        disk.flip_bit("/d/a", 1, 3)
        seen = disk.read_all("/d/a")
        disk.crash(random.Random(0))
        return seen, disk.reopen().read_all("/d/a")
    assert run(main()) == (b"\x00\x08", b"\x00\x08")


def test_a_torn_tail_may_have_sectors_that_never_landed_before_ones_that_did():
    faults = DiskFaults(torn_tail_probability=1.0, torn_zeros_probability=1.0, sector_bytes=4)
    shapes = run(torn_results(faults, 60, b"cdefghijklmn"))
    assert all(s.startswith(b"ab") for s in shapes)  # durable bytes are never lost
    for s in shapes:  # every torn byte is either what was written there, or a zero
        assert all(b in (0, w) for b, w in zip(s[2:], b"cdefghijklmn"))
    # a zero sector followed by a sector that landed: the page order a power cut can leave
    assert any(s[2:4] == b"\0\0" and s[4:8] == b"efgh" for s in shapes)
    assert any(s[4:8] == b"\0" * 4 and s[8:12] == b"ijkl" for s in shapes)
