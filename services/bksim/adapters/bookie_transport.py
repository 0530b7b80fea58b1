"""GrpcBookieTransport: the BookieTransport port (ports/bookie_transport.py) over real gRPC, and the resolver
that turns a bookie id into its address through the bookie's ZooKeeper registration.

Owns, per bookie id: one gRPC channel, made on first use from the address `resolve` gives; one pipelined
AddEntries stream (bookie_client.AddStream, window `add_window_max`), opened on first add and shared by every
caller, so the batches sent to one bookie are journaled there in the order they were sent, whichever ledgers
they belong to; and the stream's batch-id counter.

Invariants:
- Every call is bounded by `timeout_ms` from its start, whatever it waits for: the address, window room on
  the stream, the answer. A bookie's answer comes back as StatusCode values; no answer raises
  BookieUnreachable(bookie, why). For an add that means the outcome is unknown (it may be journaled).
- A broken stream is forgotten at once: the calls waiting on it raise BookieUnreachable and the next add
  opens a new stream. An add whose answer misses the deadline breaks the stream (answers come in request
  order, so everything sent after it is stuck behind it); so does a wait for window room during which no
  answer at all arrived.
- A connection failure (gRPC UNAVAILABLE) retires the bookie's channel: it is closed, the next call makes a
  new one (a fresh connection attempt: a dead bookie fails fast, a restarted one answers at once), and the
  resolver (if it has `forget`) drops its cached address. gRPC keeps its reconnect back-off (1 s growing
  to 120 s, during which calls fail without trying) in the subchannel, and by default subchannels live in
  a process-wide pool keyed by address and channel options, outliving a closed channel. So the channels
  made here use their own pool (`grpc.use_local_subchannel_pool`): bookie_client.BookieClient, which uses
  the shared one, would hand the new channel the old back-off and keep a restarted bookie unreachable
  for seconds after it serves.
- Closing a channel (retiring it, or close()) cancels the calls still in flight on it, and gRPC reports such
  a call to its awaiter as asyncio.CancelledError, not as an AioRpcError. Every call here turns that into
  BookieUnreachable ("cancelled with its channel"): another call's connection failure never makes an answer
  vanish. Only a cancellation of the caller's own task propagates as CancelledError. (Otherwise a ledger recovery
  would wait forever for a fencing read-forward call cancelled so.)
- read_entries is one ReadEntries call, plus one more for the rest each time the bookie's answer was full
  (the entries it left unread come back TOO_MANY_REQUESTS), all within the one `timeout_ms`.
- list_entries is one ListEntries call per page of the bookie's answer, each within `timeout_ms` (a ledger of
  millions of entries takes several pages; each advances, so there are at most as many calls as the bookie
  holds entries of the ledger).
- After `close()` every call raises BookieUnreachable; close itself is bounded by `timeout_ms`.

TLS: with `tls` (security.tls.ChannelSecurity) every channel is TLS (the CA, the broker's certificate for
bookies that require one, hostname verification against the address the resolver gave); a failed handshake is
UNAVAILABLE like a refused connection, and retires the channel the same way. The files are read when a
channel is made, so a channel made after they changed presents the new certificate.

Batch ids come from one counter for all streams (a bookie only echoes them; answers are matched to requests by
their order on the stream). The streams send requests serialized here (bookie_client.SerializedAddStub), and the
transport keeps the requests of the last batch it prepared: a writer sends the same entries to each bookie of a
write set, one call per bookie, and an add whose entries equal the previous add's sends those very bytes again.

Cost: per add, a comparison with the previous add's entries; per batch, one AddRequest built and serialized
(one AddEntry per entry, or the compact form; besides, per entry only a size sum for batches of more than one
entry, and a status mapping when some status is not OK), one future and one timer per add; no task per call.
"""
from __future__ import annotations

import asyncio
import json
import logging
from operator import itemgetter
from typing import Awaitable, Callable, Mapping, Sequence

import grpc

from bksim.adapters.bookie_client import FRAME_BYTES_MAX, AddStream, SerializedAddStub, serialized_request
from bksim.bookie.requests import answered_count, list_all_entries
from bksim.gen import bookie_pb2, bookie_pb2_grpc
from bksim.metadata.paths import bookie_path
from bksim.model.errors import BookieUnreachable, MetadataError, NoNodeError
from bksim.model.status import FLAG_FENCE, StatusCode
from bksim.ports.metadata import MetadataStore
from bksim.security.tls import ChannelSecurity, open_channel

log = logging.getLogger("bksim.bookie_transport")

Resolve = Callable[[str], Awaitable[str]]

RESOLVER_CACHE_MAX = 4096  # bookie addresses a RegistrationResolver remembers (oldest forgotten first)
CHANNEL_CLOSE_TIMEOUT_S = 1.0  # closing a retired channel; the next connect to that bookie waits at most this

_ReadEntryRequest = bookie_pb2.ReadEntryRequest
_ReadLacRequest = bookie_pb2.ReadLacRequest
_ReadEntriesRequest = bookie_pb2.ReadEntriesRequest
_ListEntriesRequest = bookie_pb2.ListEntriesRequest
_ENTRY, _KEY = itemgetter(0), itemgetter(1)  # of an add's (entry bytes, master key, flags)
_ENTRY_OVERHEAD = 32  # protobuf bytes of one AddEntry besides its entry and master key (tags, lengths, flags)
_REQUEST_OVERHEAD = 64  # protobuf bytes of an AddRequest besides its entries
_OK = StatusCode.OK
_UNKNOWN_STATE = StatusCode.UNKNOWN_STATE  # what a status code this build does not know means: not a "no"
_STATUS_BY_VALUE = {int(s): s for s in StatusCode}


# -- addresses --------------------------------------------------------------------------------------------

def address_of_id(bookie_id: str) -> str | None:
    """The address a bookie id names when it has the default "host:port" form (IPv6 as "[::1]:port"), else None."""
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return None  # an unbracketed IPv6 address is ambiguous
    return bookie_id


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class RegistrationResolver:
    """bookie id -> "host:port" from the bookie's registration node (/ledgers/available/<id>, then
    /ledgers/available/readonly/<id>, data {"bookie_id", "host", "port", "state", "pid"}) via a MetadataStore.

    Addresses read from a node are cached (at most `cache_max`, oldest dropped first) until `forget(id)`;
    the transport calls `forget` when the bookie's connection fails, so a bookie that moved is found again.
    An id with no registration node that has the form "host:port" resolves to itself (not cached): a dead
    bookie's node is gone, and the caller still gets a connection attempt that fails fast; so does such an id
    when the store cannot be read (ZooKeeper unreachable, session expired). Anything else raises
    BookieUnreachable naming the paths looked at. A bookie named in `overrides` is dialled at the address given
    there, registered or not (broker.bookie_address_overrides: links routed through a proxy).
    """

    def __init__(self, store: MetadataStore, cache_max: int = RESOLVER_CACHE_MAX,
                 overrides: Mapping[str, str] | None = None) -> None:
        assert cache_max > 0
        self._store = store
        self._overrides = dict(overrides or {})  # bookie id -> address dialled instead of the registered one
        self._cache: dict[str, str] = {}
        self._cache_max = cache_max
        self.lookups = 0  # registration reads (tests and diagnostics)

    async def __call__(self, bookie_id: str) -> str:
        override = self._overrides.get(bookie_id)
        if override is not None:
            return override
        cached = self._cache.get(bookie_id)
        if cached is not None:
            return cached
        try:
            paths = (bookie_path(bookie_id, read_only=False), bookie_path(bookie_id, read_only=True))
        except ValueError as e:
            raise BookieUnreachable(bookie_id, f"not a valid bookie id: {e}") from None
        for path in paths:
            self.lookups += 1
            try:
                data, _version = await self._store.get(path)
            except NoNodeError:
                continue
            except MetadataError as e:  # ZooKeeper unreachable, session expired: the id may still be an address
                address = address_of_id(bookie_id)
                if address is None:
                    raise BookieUnreachable(bookie_id, f"cannot read its registration {path}: {e}") from None
                return address
            address = self._parse(bookie_id, path, data)
            if len(self._cache) >= self._cache_max:
                del self._cache[next(iter(self._cache))]
            self._cache[bookie_id] = address
            return address
        address = address_of_id(bookie_id)
        if address is None:
            raise BookieUnreachable(bookie_id, f"not registered ({paths[0]} and {paths[1]} do not exist) and the "
                                               f"id is not a host:port address")
        return address

    def forget(self, bookie_id: str) -> None:
        self._cache.pop(bookie_id, None)

    @staticmethod
    def _parse(bookie_id: str, path: str, data: bytes) -> str:
        try:
            registration = json.loads(data.decode())
            host, port = registration["host"], int(registration["port"])
            if not isinstance(host, str) or not host or not 0 < port < 65536:
                raise ValueError(f"host {host!r}, port {port}")
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            fallback = address_of_id(bookie_id)
            if fallback is not None:
                return fallback
            raise BookieUnreachable(bookie_id, f"registration {path} has no usable host and port "
                                               f"({type(e).__name__}: {e})") from None
        return _address(host, port)


def registration_resolver(store: MetadataStore, cache_max: int = RESOLVER_CACHE_MAX,
                          overrides: Mapping[str, str] | None = None) -> RegistrationResolver:
    """The resolver GrpcBookieTransport needs in production: addresses from ZooKeeper registrations, except
    for the bookies in `overrides` (broker.bookie_address_overrides), which are dialled where it says."""
    return RegistrationResolver(store, cache_max, overrides)


# -- the transport ----------------------------------------------------------------------------------------

def _status(value: int) -> StatusCode:
    return _STATUS_BY_VALUE.get(value, _UNKNOWN_STATE)


class _Channel:
    """One gRPC channel to one bookie, with a subchannel pool of its own (see the module docstring)."""
    __slots__ = ("address", "channel", "stub", "add_stub")

    def __init__(self, address: str, frame_bytes_max: int, tls: ChannelSecurity | None = None) -> None:
        self.address = address
        self.channel = open_channel(address, [
            ("grpc.max_receive_message_length", frame_bytes_max),
            ("grpc.max_send_message_length", -1),  # the bookie decides what is too big (RESOURCE_EXHAUSTED)
            ("grpc.use_local_subchannel_pool", 1),
        ], tls)
        self.stub = bookie_pb2_grpc.BookieStub(self.channel)
        self.add_stub = SerializedAddStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()


class _Stream:
    """The add stream of one bookie (on `channel`) and, once we broke it, why."""
    __slots__ = ("channel", "stream", "why")

    def __init__(self, channel: _Channel, stream: AddStream) -> None:
        self.channel = channel
        self.stream = stream
        self.why: str | None = None


class GrpcBookieTransport:
    """BookieTransport over gRPC: `resolve(bookie id)` gives "host:port"; every call waits at most `timeout_ms`;
    each bookie's add stream has at most `add_window_max` unanswered AddRequests; `frame_bytes_max` bounds the
    messages both ways: an add batch larger than it is sent as several requests (keep it at most the bookies'
    frame_bytes_max, which refuses a larger message and with it the whole stream), and a read answer may be
    that large (keep it above the bookies' entry_bytes_max). One event loop only."""

    def __init__(self, resolve: Resolve, *, timeout_ms: float, add_window_max: int,
                 frame_bytes_max: int = FRAME_BYTES_MAX, tls: ChannelSecurity | None = None) -> None:
        assert timeout_ms > 0 and add_window_max > 0 and frame_bytes_max > _REQUEST_OVERHEAD
        self._resolve = resolve
        self._forget: Callable[[str], None] | None = getattr(resolve, "forget", None)
        self._timeout_s = timeout_ms / 1000.0
        self._window_max = add_window_max
        self._frame_bytes_max = frame_bytes_max
        self._tls = tls  # None: plaintext channels
        self._request_bytes_max = frame_bytes_max - _REQUEST_OVERHEAD
        self._channels: dict[str, _Channel] = {}
        self._connecting: dict[str, asyncio.Task] = {}  # bookie -> resolve + channel, shared by its callers
        self._retiring: dict[str, asyncio.Task] = {}  # bookie -> close of its retired channel
        self._streams: dict[str, _Stream] = {}
        self._next_batch = 0  # batch ids: one counter for every stream (a bookie only echoes them)
        self._last_prepared: tuple[tuple, list[tuple[int, bytes]]] | None = None  # entries, their requests
        self._background: set[asyncio.Task] = set()
        self._closed = False
        self.stats = {"adds": 0, "requests": 0, "requests_reused": 0, "entries": 0, "streams_opened": 0,
                      "streams_broken": 0, "channels_opened": 0, "channels_retired": 0, "read_batches": 0,
                      "read_batch_continuations": 0, "list_pages": 0}

    # -- the port ----------------------------------------------------------------------------------------
    async def add(self, bookie: str, entries: Sequence[tuple[bytes, bytes, int]]) -> list[StatusCode]:
        """Send `entries` on the bookie's stream; one status per entry, in order. One AddRequest, unless the
        batch would not fit in one `frame_bytes_max` message: then consecutive requests (in entry order). The
        requests of the batch the previous call sent are sent again as they are (same batch ids, same bytes) when
        `entries` equals it: a writer's copies for its write set are serialized once."""
        n = len(entries)
        if n == 0:
            return []
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        s = self._streams.get(bookie)
        if s is None or s.stream.error is not None:
            s = await self._open_stream(bookie, deadline)
        parts = self._prepared(entries)
        stream = s.stream
        answered_before = stream.answered
        batch_id = parts[0][0]
        futures = []
        try:
            async with asyncio.timeout_at(deadline):
                for batch_id, request in parts:
                    futures.append(await stream.send_serialized(batch_id, request))
                results = [await future for future in futures]
        except TimeoutError:
            if len(futures) == len(parts):
                why = f"no answer to add batch {batch_id} ({n} entries) within {self._timeout_ms_text}"
                self._break(bookie, s, why)
            else:
                why = (f"add batch {batch_id} not sent within {self._timeout_ms_text} (the window of "
                       f"{self._window_max} unanswered requests stayed full)")
                if stream.answered == answered_before:
                    self._break(bookie, s, why + ", and no answer arrived meanwhile")
            raise BookieUnreachable(bookie, why) from None
        except BookieUnreachable as e:  # from the stream, which names no bookie: `e` is the gRPC code and why
            why = s.why or f"add stream broken: {e}"
            self._failed(bookie, e.code, s, s.channel)
            raise BookieUnreachable(bookie, why) from None
        self.stats["adds"] += 1
        self.stats["requests"] += len(parts)
        self.stats["entries"] += n
        statuses = results[0].statuses if len(results) == 1 else [v for r in results for v in r.statuses]
        if not any(statuses):
            return [_OK] * n
        return [_status(v) for v in statuses]

    def _prepared(self, entries: Sequence[tuple[bytes, bytes, int]]) -> list[tuple[int, bytes]]:
        """(batch id, serialized AddRequest) of each request `entries` is sent in; those of the previous call
        when it was given equal entries (compared by value: a caller may reuse its list)."""
        key = tuple(entries)
        last = self._last_prepared
        if last is not None and last[0] == key:
            self.stats["requests_reused"] += len(last[1])
            return last[1]
        n = len(key)
        if n == 1 or (sum(map(len, map(_ENTRY, key))) + sum(map(len, map(_KEY, key))) + n * _ENTRY_OVERHEAD
                      <= self._request_bytes_max):
            parts = (key,)
        else:
            parts = self._split(key)
        prepared = []
        for part in parts:
            batch_id = self._next_batch
            self._next_batch = batch_id + 1
            prepared.append((batch_id, serialized_request(batch_id, part)))
        self._last_prepared = (key, prepared)
        return prepared

    def _split(self, entries: Sequence[tuple[bytes, bytes, int]]) -> list[Sequence[tuple[bytes, bytes, int]]]:
        """Consecutive runs of `entries` that each fit in one request (an entry too big even alone goes alone:
        the bookie decides)."""
        parts, start, size = [], 0, 0
        for i, (e, k, _) in enumerate(entries):
            grow = len(e) + len(k) + _ENTRY_OVERHEAD
            if i > start and size + grow > self._request_bytes_max:
                parts.append(entries[start:i])
                start, size = i, 0
            size += grow
        parts.append(entries[start:])
        return parts

    async def read_entry(self, bookie: str, ledger_id: int, entry_id: int, *, fence: bool = False,
                         master_key: bytes = b"") -> tuple[StatusCode, bytes]:
        """(status, entry bytes); entry_id -1 = the bookie's last entry of the ledger."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        channel = await self._channel(bookie, deadline)
        request = _ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id, flags=FLAG_FENCE if fence else 0,
                                    master_key=master_key)
        try:
            r = await channel.stub.ReadEntry(request, timeout=self._left(bookie, deadline))
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            self._failed(bookie, code, None, channel)
            raise BookieUnreachable(bookie, f"ReadEntry {ledger_id}:{entry_id}{' FENCE' if fence else ''}: "
                                            f"{code}: {e.details()}") from None
        except asyncio.CancelledError:
            if _own_cancellation():
                raise
            raise _cancelled_with_channel(bookie, f"ReadEntry {ledger_id}:{entry_id}{' FENCE' if fence else ''}",
                                          channel) from None
        return _status(r.status), r.entry

    async def read_entries(self, bookie: str, ledger_id: int, entry_ids: Sequence[int], *, fence: bool = False,
                           master_key: bytes = b"") -> list[tuple[StatusCode, bytes]]:
        """[(status, entry bytes)], result i for entry_ids[i], by ReadEntries calls, all within `timeout_ms`.
        Entries the bookie left unread because its answer was full (TOO_MANY_REQUESTS) are asked for again
        in a further call; each call answers at least one entry, so there are at most len(entry_ids) calls."""
        n = len(entry_ids)
        if n == 0:
            return []
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        channel = await self._channel(bookie, deadline)
        flags = FLAG_FENCE if fence else 0
        out: list[tuple[StatusCode, bytes]] = []
        while len(out) < n:
            ids = entry_ids[len(out):] if out else entry_ids
            request = _ReadEntriesRequest(ledger_id=ledger_id, entry_ids=ids, flags=flags, master_key=master_key)
            try:
                r = await channel.stub.ReadEntries(request, timeout=self._left(bookie, deadline))
            except grpc.aio.AioRpcError as e:
                code = e.code().name
                self._failed(bookie, code, None, channel)
                raise BookieUnreachable(bookie, f"ReadEntries {ledger_id}:{ids[0]}..(x{len(ids)})"
                                                f"{' FENCE' if fence else ''}: {code}: {e.details()}") from None
            except asyncio.CancelledError:
                if _own_cancellation():
                    raise
                raise _cancelled_with_channel(bookie, f"ReadEntries {ledger_id}:{ids[0]}..(x{len(ids)})"
                                                      f"{' FENCE' if fence else ''}", channel) from None
            results = r.results
            if len(results) != len(ids):
                raise BookieUnreachable(bookie, f"ReadEntries {ledger_id}: {len(results)} results for "
                                                f"{len(ids)} entry ids")
            statuses = [_status(x.status) for x in results]
            answered = answered_count(statuses)  # the rest were left unread (the answer was full): ask again
            out += [(statuses[i], results[i].entry) for i in range(answered)]
            if answered < len(ids):
                self.stats["read_batch_continuations"] += 1
        self.stats["read_batches"] += 1
        return out

    async def read_lac(self, bookie: str, ledger_id: int) -> tuple[StatusCode, int]:
        """(status, the bookie's known LAC of the ledger)."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        channel = await self._channel(bookie, deadline)
        try:
            r = await channel.stub.ReadLac(_ReadLacRequest(ledger_id=ledger_id), timeout=self._left(bookie, deadline))
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            self._failed(bookie, code, None, channel)
            raise BookieUnreachable(bookie, f"ReadLac {ledger_id}: {code}: {e.details()}") from None
        except asyncio.CancelledError:
            if _own_cancellation():
                raise
            raise _cancelled_with_channel(bookie, f"ReadLac {ledger_id}", channel) from None
        return _status(r.status), r.last_add_confirmed

    async def list_entries(self, bookie: str, ledger_id: int) -> tuple[StatusCode, list[tuple[int, int]]]:
        """(status, the ranges of entry ids the bookie holds of the ledger): ListEntries calls, one per page,
        each within `timeout_ms` (bookie/requests.py list_all_entries joins them)."""
        async def page(first_entry: int):
            deadline = asyncio.get_running_loop().time() + self._timeout_s
            channel = await self._channel(bookie, deadline)
            what = f"ListEntries {ledger_id} from {first_entry}"
            try:
                r = await channel.stub.ListEntries(_ListEntriesRequest(ledger_id=ledger_id, first_entry=first_entry),
                                                   timeout=self._left(bookie, deadline))
            except grpc.aio.AioRpcError as e:
                code = e.code().name
                self._failed(bookie, code, None, channel)
                raise BookieUnreachable(bookie, f"{what}: {code}: {e.details()}") from None
            except asyncio.CancelledError:
                if _own_cancellation():
                    raise
                raise _cancelled_with_channel(bookie, what, channel) from None
            self.stats["list_pages"] += 1
            return _status(r.status), [(x.first, x.last) for x in r.ranges], r.next_entry
        return await list_all_entries(bookie, ledger_id, page)

    def unanswered(self, bookie: str) -> int:
        """AddRequests sent on the bookie's current stream that have no answer yet (0 without a stream)."""
        s = self._streams.get(bookie)
        return 0 if s is None or s.stream.error is not None else s.stream.sent - s.stream.answered

    async def close(self) -> None:
        """End every stream (their unanswered adds fail now) and close every channel, within `timeout_ms`.
        Later calls raise BookieUnreachable."""
        if self._closed:
            return
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        streams = [s.stream for s in self._streams.values()]
        channels = list(self._channels.values())
        self._streams.clear()
        self._channels.clear()
        pending = [*(s.close(timeout_s=0) for s in streams), *(c.close() for c in channels),
                   *self._connecting.values(), *self._retiring.values(), *self._background]
        if pending:
            done = asyncio.gather(*pending, return_exceptions=True)
            try:
                await asyncio.wait_for(done, self._timeout_s)
            except TimeoutError:
                log.warning("closing the bookie transport took longer than %s; some channels may linger",
                            self._timeout_ms_text)

    # -- connections ---------------------------------------------------------------------------------------
    @property
    def _timeout_ms_text(self) -> str:
        return f"{self._timeout_s * 1000:g} ms"

    def _left(self, bookie: str, deadline: float) -> float:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise BookieUnreachable(bookie, f"no answer within {self._timeout_ms_text} (deadline passed)")
        return left

    async def _channel(self, bookie: str, deadline: float) -> _Channel:
        channel = self._channels.get(bookie)
        if channel is not None:
            return channel
        if self._closed:
            raise BookieUnreachable(bookie, "the bookie transport is closed")
        task = self._connecting.get(bookie)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(bookie, deadline))
            task.add_done_callback(_retrieve)
            self._connecting[bookie] = task
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._left(bookie, deadline))
        except TimeoutError:
            raise BookieUnreachable(bookie, f"its address was not resolved within {self._timeout_ms_text}") from None
        except asyncio.CancelledError:
            if task.cancelled() and self._closed:
                raise BookieUnreachable(bookie, "the bookie transport is closed") from None
            raise

    async def _connect(self, bookie: str, deadline: float) -> _Channel:
        """Resolve the address and make the channel (once for all concurrent callers of this bookie)."""
        try:
            retiring = self._retiring.get(bookie)
            if retiring is not None:  # one channel per bookie at a time
                await asyncio.wait([retiring], timeout=CHANNEL_CLOSE_TIMEOUT_S)
            left = max(deadline - asyncio.get_running_loop().time(), 0.001)
            try:
                address = await asyncio.wait_for(self._resolve(bookie), left)
            except BookieUnreachable:
                raise
            except TimeoutError:
                raise BookieUnreachable(bookie, f"its address was not resolved within "
                                                f"{self._timeout_ms_text}") from None
            except Exception as e:  # noqa: BLE001 - any resolver failure means: cannot reach it now
                raise BookieUnreachable(bookie, f"cannot resolve its address: {type(e).__name__}: {e}") from None
            if self._closed:
                raise BookieUnreachable(bookie, "the bookie transport is closed")
            channel = _Channel(address, self._frame_bytes_max, self._tls)
            self._channels[bookie] = channel
            self.stats["channels_opened"] += 1
            return channel
        finally:
            self._connecting.pop(bookie, None)

    async def _open_stream(self, bookie: str, deadline: float) -> _Stream:
        channel = await self._channel(bookie, deadline)
        s = self._streams.get(bookie)  # another caller may have opened one while we waited
        if s is not None and s.stream.error is None:
            return s
        if s is not None:
            self._forget_stream(bookie, s)
        s = _Stream(channel, AddStream(channel.add_stub, self._window_max, self._timeout_s))
        self._streams[bookie] = s
        self.stats["streams_opened"] += 1
        return s

    def _break(self, bookie: str, s: _Stream, why: str) -> None:
        """Abort a stream we no longer trust: its unanswered adds fail with `why`, the next add opens a new one."""
        if s.why is None:
            s.why = why
            self.stats["streams_broken"] += 1
        self._forget_stream(bookie, s)

    def _forget_stream(self, bookie: str, s: _Stream) -> None:
        if self._streams.get(bookie) is s:
            del self._streams[bookie]
            self._spawn(s.stream.close(timeout_s=0))  # ends the call now; waiting futures fail

    def _failed(self, bookie: str, code: str, s: _Stream | None, channel: _Channel) -> None:
        """A call got no answer (gRPC status `code`): forget a broken stream; retire the channel if the
        connection failed."""
        if s is not None:
            self._forget_stream(bookie, s)
        if code != "UNAVAILABLE":
            return  # deadline, message too large, cancelled: the connection itself is fine
        if self._channels.get(bookie) is not channel:
            return  # already retired (by a concurrent failure)
        del self._channels[bookie]
        self.stats["channels_retired"] += 1
        s = self._streams.get(bookie)
        if s is not None and s.channel is channel:
            self._forget_stream(bookie, s)
        if self._forget is not None:
            self._forget(bookie)
        self._retiring[bookie] = self._spawn(self._retire(bookie, channel))

    async def _retire(self, bookie: str, channel: _Channel) -> None:
        try:
            await asyncio.wait_for(channel.close(), CHANNEL_CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("closing the channel to bookie %s (%s) took longer than %ss", bookie, channel.address,
                        CHANNEL_CLOSE_TIMEOUT_S)
        finally:
            if self._retiring.get(bookie) is asyncio.current_task():
                del self._retiring[bookie]

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve)
        return task


def _own_cancellation() -> bool:
    """Whether the current task is being cancelled (by its owner, a timeout, ...), as opposed to a call it
    awaited having been cancelled underneath it (gRPC cancels the calls of a channel that is closed)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _cancelled_with_channel(bookie: str, what: str, channel: _Channel) -> BookieUnreachable:
    """A unary call that gRPC cancelled itself because its channel was closed (retired after a concurrent call
    found the connection broken, or the transport closed): no answer will come."""
    return BookieUnreachable(bookie, f"{what}: cancelled with its channel to {channel.address} (retired after a "
                                     f"connection failure, or the transport closed)")


def _retrieve(task: asyncio.Task) -> None:
    """Mark a background task's exception as retrieved (it is reported to the callers that waited, if any)."""
    if not task.cancelled():
        task.exception()
