"""OwnedZnode (topics/owned_znode.py) over the in-memory metadata store with lost answers (LossyStore): a write whose
answer is lost is settled by reading it back (in, not applied, or someone else's); when the read-back is lost too,
a later version conflict made by that very write is taken as its own and written on top of; any other conflict or
a deletion is ZnodeTaken."""
from __future__ import annotations

import asyncio

import pytest

from bksim.metadata.memory import InMemoryMetadataStore
from bksim.model.errors import MetadataError
from bksim.topics.owned_znode import OwnedZnode, ZnodeTaken
from fakes.lossy_store import LossyStore

PATH = "/owned"


async def owned() -> tuple[InMemoryMetadataStore, LossyStore, OwnedZnode]:
    store = InMemoryMetadataStore()
    session = store.session("owner")
    await session.create(PATH, b"v0")
    lossy = LossyStore(session)
    znode = OwnedZnode(lossy, PATH)
    znode.version = 0
    return store, lossy, znode


async def content(lossy: LossyStore) -> tuple[bytes, int]:
    return await lossy.inner.get(PATH)


def test_a_lost_answer_is_settled_by_reading_back():
    async def main():
        _, lossy, znode = await owned()
        lossy.lose_next_set = "applied"
        await znode.write(b"v1")
        assert znode.version == 1 and await content(lossy) == (b"v1", 1)
        lossy.lose_next_set = "not applied"
        with pytest.raises(MetadataError, match="not applied"):
            await znode.write(b"v2")
        assert znode.version == 1 and await content(lossy) == (b"v1", 1)
        assert not znode.unsettled  # settled by the read-back: v2 is not in, and will not be
        await znode.write(b"v2")
        assert await content(lossy) == (b"v2", 2)
    asyncio.run(main())


async def a_write_in_doubt() -> tuple[LossyStore, OwnedZnode]:
    """The write of v1 lost its answer and its read-back; it is held back (it may land later)."""
    _, lossy, znode = await owned()
    lossy.lose_next_set, lossy.fail_next_get = "applied later", True
    with pytest.raises(MetadataError):
        await znode.write(b"v1")
    return lossy, znode


def test_a_write_that_lands_after_its_answer_and_read_back_were_lost_is_its_own():
    async def main():
        lossy, znode = await a_write_in_doubt()
        assert znode.unsettled  # what v1 named may be what the znode names: its writer keeps it
        await lossy.deliver_held()
        await znode.write(b"v2")  # meets version 1, made by its own write: on top of it
        assert znode.version == 2 and await content(lossy) == (b"v2", 2)
        assert not znode.unsettled
    asyncio.run(main())


def test_someone_elses_change_or_a_deletion_is_taken():
    async def main():
        lossy, znode = await a_write_in_doubt()
        lossy.held = None  # it never lands: another owner writes instead
        await lossy.inner.set(PATH, b"theirs", 0)
        with pytest.raises(ZnodeTaken, match="changed by another broker"):
            await znode.write(b"v2")
        _, lossy, znode = await owned()
        await lossy.inner.delete(PATH, 0)
        with pytest.raises(ZnodeTaken, match="deleted"):
            await znode.write(b"v1")
    asyncio.run(main())


def test_a_delete_settles_a_lost_answer_and_takes_its_own_late_write_as_its_own():
    async def main():
        store, lossy, znode = await owned()
        lossy.lose_next_delete = "not applied"
        with pytest.raises(MetadataError, match="not applied"):
            await znode.delete()
        assert await content(lossy) == (b"v0", 0)
        lossy.lose_next_delete = "applied"
        await znode.delete()  # read back: gone, the delete is in
        assert await lossy.inner.exists(PATH) is None
        lossy2, znode2 = await a_write_in_doubt()
        await znode2.delete()  # the held write lands first: its version is the owner's own, deleted on top of it
        assert await lossy2.inner.exists(PATH) is None
    asyncio.run(main())


def test_a_delete_meeting_someone_elses_change_is_taken():
    async def main():
        store, lossy, znode = await owned()
        await store.set(PATH, b"another owner", 0)
        with pytest.raises(ZnodeTaken):
            await znode.delete()
        assert await content(lossy) == (b"another owner", 1)
    asyncio.run(main())
