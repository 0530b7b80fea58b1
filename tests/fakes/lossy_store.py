"""LossyStore: an IN-MEMORY FAKE's failure modes around a real MetadataStore session, for unit tests of writers
that must settle lost answers (topics/owned_znode.py and its users)."""
from __future__ import annotations

from bksim.model.errors import BadVersionError, ConnectionLossError


class LossyStore:
    """Wraps a metadata session: the next `set` raises ConnectionLossError, after applying it, not applying it, or
    holding it back to apply later (`deliver_held`, or before the next `set`: a client that queued it over a
    reconnect sends it first, as it does before a `delete`); `lose_next_delete` loses the next delete's answer after
    applying it or not; `fail_next_get` makes the next read-back raise ConnectionLossError too."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lose_next_set: str | None = None  # "applied" | "not applied" | "applied later"
        self.fail_next_get = False
        self.lose_next_delete: str | None = None  # "applied" | "not applied"
        self.held: tuple | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def set(self, path, data, version):
        if self.held is not None:  # sent before this one (a client's queue is in order): it lands first
            await self.deliver_held()
        mode, self.lose_next_set = self.lose_next_set, None
        if mode == "applied":
            await self.inner.set(path, data, version)
        elif mode == "applied later":
            self.held = (path, data, version)
        if mode is not None:
            raise ConnectionLossError(path)
        return await self.inner.set(path, data, version)

    async def delete(self, path, version=-1):
        if self.held is not None:  # a write sent before this delete lands first
            await self.deliver_held()
        mode, self.lose_next_delete = self.lose_next_delete, None
        if mode == "applied":
            await self.inner.delete(path, version)
        if mode is not None:
            raise ConnectionLossError(path)
        return await self.inner.delete(path, version)

    async def get(self, path):
        if self.fail_next_get:
            self.fail_next_get = False
            raise ConnectionLossError(path)
        return await self.inner.get(path)

    async def deliver_held(self) -> None:
        held, self.held = self.held, None
        try:
            await self.inner.set(*held)
        except BadVersionError:
            pass  # the znode moved meanwhile: ZooKeeper refuses the late write, as it would
