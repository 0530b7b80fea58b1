"""ZkMetadataStore: the MetadataStore port (ports/metadata.py) over a started kazoo client.

Owns: the bridge from kazoo's asynchronous calls (`create_async`, `get_async`, ...: answered on kazoo's
threads) to asyncio futures on the caller's loop (no thread per call, no blocking of the loop), the
mapping of kazoo's exceptions to the MetadataError tree, and the session binding.

Invariants:
- One store = one ZooKeeper session: the one the client has when the store is made. When that session
  expires (kazoo reports LOST, or the client already holds another session) every later call raises
  SessionExpiredError, even though kazoo itself reconnects with a new session; the owner makes a new
  ZkMetadataStore on the client to continue. An ephemeral create that completes on a newer session than
  the store's is undone (deleted) and reported as SessionExpiredError, so the store never owns a node
  that outlives the session it is bound to.
- Bounded: each call waits at most `operation_timeout_ms` for ZooKeeper's answer, then raises
  ConnectionLossError (the outcome of a write is unknown; the request may still be applied later).
- Retries only where idempotent: a read (get, exists, children) that meets a connection loss is sent
  again, `read_tries_max` tries in all. Writes are never retried here: a write that may have been applied
  surfaces as ConnectionLossError and the protocol re-reads before deciding (a blind retry of a CAS or a
  sequential create could apply twice).

The store does not own the client: `close()` only detaches the state listener.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState

from bksim.model.config import ZooKeeperConfig
from bksim.model.errors import (BadVersionError, ConnectionLossError, MetadataError, NoChildrenForEphemeralsError,
                                NodeExistsError, NoNodeError, NotEmptyError, SessionExpiredError)
from bksim.ports.metadata import ANY_VERSION

_DEFAULTS = ZooKeeperConfig()

_ERRORS: tuple[tuple[type[BaseException], type[MetadataError]], ...] = (
    (kz.NoNodeError, NoNodeError),
    (kz.NodeExistsError, NodeExistsError),
    (kz.BadVersionError, BadVersionError),
    (kz.NotEmptyError, NotEmptyError),
    (kz.NoChildrenForEphemeralsError, NoChildrenForEphemeralsError),
    (kz.SessionExpiredError, SessionExpiredError),  # includes ConnectionClosedError: the client was stopped
    (kz.ZookeeperStoppedError, SessionExpiredError),
    (kz.ConnectionLoss, ConnectionLossError),
    (kz.ConnectionDropped, ConnectionLossError),
    (kz.OperationTimeoutError, ConnectionLossError),
)


class ZkMetadataStore:
    def __init__(self, client: KazooClient, *, operation_timeout_ms: float = _DEFAULTS.operation_timeout_ms,
                 read_tries_max: int = _DEFAULTS.read_tries_max) -> None:
        assert operation_timeout_ms > 0 and read_tries_max >= 1
        client_id = client.client_id
        if client_id is None:
            raise SessionExpiredError(message="the kazoo client has no live session (start it first)")
        self._client = client
        self.session_id: int = client_id[0]
        self._timeout_s = operation_timeout_ms / 1000.0
        self._read_tries_max = read_tries_max
        self._lost = False
        client.add_listener(self._on_state)

    def close(self) -> None:
        """Detach from the client (which the caller owns and stops)."""
        self._client.remove_listener(self._on_state)

    @property
    def expired(self) -> bool:
        if self._lost:
            return True
        client_id = self._client.client_id  # None while disconnected: not (yet) known to be expired
        return client_id is not None and client_id[0] != self.session_id

    # -- the port -------------------------------------------------------------------------------------------

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        created = await self._call(path, self._client.create_async, path, data, ephemeral=ephemeral,
                                   sequence=sequential, makepath=make_parents)
        if ephemeral and self.expired:
            # maybe: kazoo sent it on a newer session than ours; that node must not outlive our session
            try:
                await self._call(created, self._client.delete_async, created, check_session=False)
            except MetadataError:
                pass  # best effort: gone already, or unreachable (then it dies with that session)
            raise self._expired_error(created)
        return created

    async def get(self, path: str) -> tuple[bytes, int]:
        data, stat = await self._read(path, self._client.get_async, path)
        return data, stat.version

    async def set(self, path: str, data: bytes, version: int) -> int:
        stat = await self._call(path, self._client.set_async, path, data, version)
        return stat.version

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        await self._call(path, self._client.delete_async, path, version)

    async def children(self, path: str) -> list[str]:
        return sorted(await self._read(path, self._client.get_children_async, path))

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        names, stat = await self._read(path, self._client.get_children_async, path, None, True)  # GetChildren2
        return sorted(names), stat.cversion

    async def exists(self, path: str) -> int | None:
        stat = await self._read(path, self._client.exists_async, path)
        return None if stat is None else stat.version

    async def sync(self, path: str) -> None:
        await self._read(path, self._client.sync_async, path)

    # -- internals ------------------------------------------------------------------------------------------

    async def _read(self, path: str, method: Callable[..., Any], *args: Any) -> Any:
        for attempt in range(1, self._read_tries_max + 1):
            try:
                return await self._call(path, method, *args)
            except ConnectionLossError:
                if attempt == self._read_tries_max:
                    raise
        raise AssertionError("unreachable")

    async def _call(self, path: str, method: Callable[..., Any], *args: Any, check_session: bool = True,
                    **kwargs: Any) -> Any:
        if check_session and self.expired:
            raise self._expired_error(path)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return  # we stopped waiting (timeout, cancellation)
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        def on_done(result: Any) -> None:  # on kazoo's callback thread: hand over, never block
            try:
                loop.call_soon_threadsafe(settle, result)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for this answer any more

        try:
            method(*args, **kwargs).rawlink(on_done)
        except kz.BadArgumentsError as e:
            raise ValueError(f"{path}: {e}") from None
        except kz.KazooException as e:  # raised synchronously: e.g. the client is closed
            raise self._translate(path, e) from None
        try:
            return await asyncio.wait_for(future, self._timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionLossError(path, f"no answer from ZooKeeper within {self._timeout_s * 1000:.0f} ms: "
                                            f"the outcome is unknown") from None
        except kz.BadArgumentsError as e:
            raise ValueError(f"{path}: {e}") from None
        except kz.KazooException as e:
            raise self._translate(path, e) from None

    def _translate(self, path: str, error: BaseException) -> MetadataError:
        for kazoo_type, ours in _ERRORS:
            if isinstance(error, kazoo_type):
                if ours is SessionExpiredError:
                    self._lost = True
                    return self._expired_error(path)
                detail = str(error)
                return ours(path, f"{ours.default_message} ({detail})" if detail else "")
        return MetadataError(path, f"ZooKeeper error {type(error).__name__}: {error}")

    def _expired_error(self, path: str) -> SessionExpiredError:
        return SessionExpiredError(path, f"ZooKeeper session 0x{self.session_id:x} expired: its ephemeral nodes "
                                         f"are gone; make a new store for the client's new session")

    def _on_state(self, state: str) -> None:
        # on kazoo's connection thread: only flip a flag
        if state == KazooState.LOST:
            self._lost = True


class RenewingZkMetadataStore:
    """The MetadataStore of a long-lived process (the broker): calls go to a ZkMetadataStore bound to the kazoo
    client's current session. A call in flight when the session expires fails (SessionExpiredError); a call
    made after kazoo has a new session binds a new ZkMetadataStore to it, first awaiting
    `on_new_session(store)` (re-create the ephemeral registrations the old session took with it)."""

    def __init__(self, client: KazooClient, *, operation_timeout_ms: float = _DEFAULTS.operation_timeout_ms,
                 read_tries_max: int = _DEFAULTS.read_tries_max, on_new_session=None) -> None:
        self._client = client
        self._options = dict(operation_timeout_ms=operation_timeout_ms, read_tries_max=read_tries_max)
        self._on_new_session = on_new_session
        self._store = ZkMetadataStore(client, **self._options)
        self._renewing: asyncio.Lock | None = None
        self.renewals = 0

    @property
    def session_id(self) -> int:
        return self._store.session_id

    async def _current(self) -> ZkMetadataStore:
        if not self._store.expired:
            return self._store
        if self._renewing is None:
            self._renewing = asyncio.Lock()
        async with self._renewing:
            if self._store.expired and self._client.client_id is not None:
                self._store.close()
                self._store = ZkMetadataStore(self._client, **self._options)
                self.renewals += 1
                if self._on_new_session is not None:
                    await self._on_new_session(self._store)
        return self._store

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        return await (await self._current()).create(path, data, ephemeral=ephemeral, sequential=sequential,
                                                    make_parents=make_parents)

    async def get(self, path: str) -> tuple[bytes, int]:
        return await (await self._current()).get(path)

    async def set(self, path: str, data: bytes, version: int) -> int:
        return await (await self._current()).set(path, data, version)

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        return await (await self._current()).delete(path, version)

    async def children(self, path: str) -> list[str]:
        return await (await self._current()).children(path)

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        return await (await self._current()).children_with_cversion(path)

    async def exists(self, path: str) -> int | None:
        return await (await self._current()).exists(path)

    async def sync(self, path: str) -> None:
        return await (await self._current()).sync(path)

    def close(self) -> None:
        self._store.close()
