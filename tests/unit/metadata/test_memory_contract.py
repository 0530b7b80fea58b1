"""The MetadataStore contract (tests/metadata_contract.py) on InMemoryMetadataStore, the in-memory twin of
ZooKeeper used by unit tests and the simulator. The same checks run on a real ZooKeeper in
tests/integration/test_zk_metadata.py."""
from __future__ import annotations

import asyncio

import pytest

from bksim.metadata.memory import InMemoryMetadataStore, SessionView
from bksim.model.errors import SessionExpiredError
from metadata_contract import CONTRACT


class MemoryHarness:
    """The contract's harness over one in-memory tree: expiry is immediate and exact."""

    def __init__(self) -> None:
        self.tree = InMemoryMetadataStore()
        self.store = self.tree
        self.root = "/contract"
        self._sessions = 0

    async def new_session(self) -> SessionView:
        self._sessions += 1
        return self.tree.session(f"contract-{self._sessions}")

    async def expire(self, session: SessionView) -> None:
        self.tree.expire(session)
        with pytest.raises(SessionExpiredError):
            await session.exists("/")


@pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__.removeprefix("check_"))
def test_contract(check):
    asyncio.run(check(MemoryHarness()))
