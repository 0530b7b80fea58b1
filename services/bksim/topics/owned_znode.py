"""OwnedZnode: a znode its owner (the broker serving a topic) writes by compare-and-set on the version it last
saw, with lost answers settled rather than guessed.

A write whose answer is lost (ConnectionLossError) may or may not have been applied. The owner reads the znode
back: it holds exactly the written bytes, one version on: the write is in; the version did not move: it is not
(the read came after the write on the same session, which ZooKeeper answers in order, so that is final);
anything else: someone else wrote it. When the read-back fails too, the outcome stays unknown and the write may
still land later (ZooKeeper's client queues requests over a reconnect): the next version conflict first checks
whether the znode holds exactly that write, one version on, and then writes on top of it instead of taking it
for another owner.

Outcomes of `write` and `delete`: returns (done); raises ZnodeTaken (another owner changed or deleted it: the
caller fences); raises MetadataError (not done, or unknown: its message says which).
"""
from __future__ import annotations

from typing import Callable

from bksim.model.errors import BadVersionError, ConnectionLossError, MetadataError, NoNodeError
from bksim.ports.metadata import MetadataStore


class ZnodeTaken(Exception):
    """Someone else changed or deleted the znode: this owner's writes are over."""


class OwnedZnode:
    def __init__(self, store: MetadataStore, path: str, log: Callable[[str], None] = lambda line: None) -> None:
        self.store = store
        self.path = path
        self.version = -1  # the version this owner last read or wrote
        self._log = log
        self._unsettled: bytes | None = None  # a write whose outcome is still unknown (it may land later)

    @property
    def unsettled(self) -> bool:
        """Did the last write fail with its outcome unknown (it may still land)? Until a later write settles it,
        whatever that write named may be what the znode names."""
        return self._unsettled is not None

    async def write(self, raw: bytes) -> None:
        try:
            self.version = await self.store.set(self.path, raw, self.version)
            self._unsettled = None
            return
        except BadVersionError:
            if self._unsettled is not None and await self._own_write_landed():
                return await self.write(raw)  # the version moved by our own earlier write: write on top of it
            raise ZnodeTaken(f"{self.path} was changed by another broker (version {self.version} expected)") from None
        except NoNodeError:
            raise ZnodeTaken(f"{self.path} was deleted by someone else") from None
        except ConnectionLossError as e:
            loss = e
        try:  # the outcome is unknown: read back and decide
            data, version = await self.store.get(self.path)
        except NoNodeError:
            raise ZnodeTaken(f"{self.path} was deleted by someone else") from None
        except MetadataError as e:
            self._unsettled = raw
            raise MetadataError(self.path, f"{loss}; then {e}") from None
        self._unsettled = None
        if data == raw and version == self.version + 1:
            self.version = version
            return
        if version != self.version:
            raise ZnodeTaken(f"{self.path} was changed by another broker (version {version}, {self.version} "
                             f"expected)")
        raise MetadataError(self.path, f"{loss} (not applied)")

    async def delete(self) -> None:
        """Delete the znode by CAS on the owner's version, settled as `write` is: a lost answer is read back (gone:
        the delete is in; the version unchanged: not applied, MetadataError; anything else: ZnodeTaken), and a
        version conflict made by the owner's own earlier write (landed late) is deleted on top of."""
        try:
            await self.store.delete(self.path, self.version)
            self._unsettled = None
            return
        except BadVersionError:
            if self._unsettled is not None and await self._own_write_landed():
                return await self.delete()
            raise ZnodeTaken(f"{self.path} was changed by another broker (version {self.version} expected)") from None
        except NoNodeError:
            raise ZnodeTaken(f"{self.path} was deleted by someone else") from None
        except ConnectionLossError as e:
            loss = e
        try:
            _, version = await self.store.get(self.path)
        except NoNodeError:
            self._unsettled = None
            return  # gone: the delete is in (ZooKeeper answers a session in order)
        except MetadataError as e:
            raise MetadataError(self.path, f"{loss}; then {e}") from None
        if version == self.version:
            raise MetadataError(self.path, f"{loss} (not applied)")
        raise ZnodeTaken(f"{self.path} was changed by another broker (version {version}, {self.version} expected)")

    async def _own_write_landed(self) -> bool:
        """After a version conflict, with an earlier write whose outcome was unknown: did that write make the
        change (the znode holds exactly its bytes, one version on)? Then adopt its version."""
        try:
            data, version = await self.store.get(self.path)
        except NoNodeError:
            return False
        except MetadataError as e:  # still unknown: kept for the next conflict
            raise MetadataError(self.path, f"reading it back after a version conflict: {e}") from None
        unsettled, self._unsettled = self._unsettled, None
        if data == unsettled and version == self.version + 1:
            self._log(f"an earlier write of {self.path} whose answer was lost landed after all (version {version}); "
                      f"writing on top of it")
            self.version = version
            return True
        return False
