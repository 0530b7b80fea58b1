"""A managed ledger: one topic (or partition) as an ordered list of ledgers (PROTOCOL.md §5).

Owns: the managed-ledger znode {ledgers: [{ledger_id, entries, size, ctime_ms, closed_ms}], properties} and its
version (every write is a CAS; BadVersion means another broker took the topic: the ledger is FENCED here and
every pending and later append fails with TOPIC_FENCED), the one ledger open for writing, the FIFO of pending
appends, the last confirmed position (reads never go past it), rollover, trimming, and a bounded cache of
recently appended entries (tailing consumers are served from memory, as Pulsar's entry cache does).

Invariants:
- at most one ledger of the list is open for writing, and it is the last one (OnlyOneLedgerOpenAtATime);
- appends are acknowledged strictly in the order they were made; positions increase (EntryOrderMaintained);
- a new owner never appends to a ledger it did not create: open() recovers (fences) the last ledger first;
- a failed add is never retried on the same ledger. Unlike Pulsar, which re-sends every pending add to the
  next ledger (duplicates in the log), we first recover the failed ledger: an append whose entry id is at or
  below the recovered last_entry_id is durable there and is acknowledged with that position; only the others
  are re-sent, in order, to the next ledger. No duplicate enters the log on this path.
- trimming removes only a contiguous prefix of closed ledgers below every cursor's persisted mark-delete,
  metadata first, then the ledgers.

States (ManagedLedgerState; TRANSITIONS lists every move, and `_move`, the one place the state changes, refuses
any other with ManagedLedgerStateError):

    NONE ──open──> LEDGER_OPENED ──roll──> ROLLING      roll: the ledger is full or old, or an add failed:
                         ^                    │          close (or recover) it, then create the next
                         └─────roll done──────┘
    from NONE, LEDGER_OPENED or ROLLING:
        abandon, CAS lost, roll failed ──> FENCED   every pending and later append fails with TOPIC_FENCED
        close ───────────────────────────> CLOSED   a clean close on this broker (unload, shutdown)

FENCED and CLOSED are final: a topic is loaded again into a new ManagedLedger.

check_invariants() raises InvariantError naming the invariant broken (the unit tests call it after every
operation):
- LedgersOrdered: ledger ids strictly increase along the list (positions compare by ledger id).
- OnlyLastLedgerOpen: at most one ledger of the list is open (closed_ms 0), and it is the last one.
- CurrentIsLast: the ledger written (or last written) by this broker is the last of the list.
- CountsConsistent: entries and sizes are >= 0, an empty ledger has size 0; a ledger whose closing metadata
  is known has entries = last_entry_id + 1 and size = length; the open current ledger counts exactly the
  entries confirmed in it.
- StateMatchesFields: unless FENCED or CLOSED, LEDGER_OPENED <=> a handle on the open current ledger and no
  roll running; ROLLING: a roll is running; NONE: none is; FENCED / CLOSED: no append is pending.
- ConfirmedInOrder: no ledger after last_confirmed's holds a confirmed entry; last_confirmed lies within its
  ledger; the head of the pending queue is never confirmed (a confirmed head is acknowledged at once);
  appends sent to one ledger hold increasing entry ids; at most topic.pending_adds_max are pending.
- CacheBounded: the entry cache holds confirmed positions only, its byte count is the sum of its payloads
  and at most its bound.
"""
from __future__ import annotations

import asyncio
import collections
import enum
import json
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from bksim.broker.ledgers import LedgerService
from bksim.broker.reader import read_entries
from bksim.topics.errors import TopicError
from bksim.topics.names import TopicName
from bksim.topics.owned_znode import OwnedZnode, ZnodeTaken
from bksim.topics.positions import Position
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.model.histogram import LatencyHistogram
from bksim.model.config import BrokerConfig, TopicConfig
from bksim.model.errors import BksimError, FormatError, LedgerError, MetadataError, NoNodeError
from bksim.model.invariants import InvariantError
from bksim.model.status import LedgerStatus, TopicStatus
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

LEDGER_PASSWORD = b"bksim-managed-ledger"  # topic ledgers are written and read only by brokers
RECOVERY_RETRY_MS = 500
ROLL_ATTEMPTS_MAX = 20
RECOVERY_ATTEMPT_TIMEOUTS = 6  # one recovery attempt may take this many broker.bookie_timeout_ms
# a ledger the topic no longer lists (trimmed, empty, or made by a roll that failed) is deleted in at most this many
# tries, this far apart; then it leaks (Pulsar's DEFAULT_LEDGER_DELETE_RETRIES, DEFAULT_LEDGER_DELETE_BACKOFF_TIME_SEC)
LEDGER_DELETE_RETRIES = 3
LEDGER_DELETE_BACKOFF_MS = 60_000


class ManagedLedgerState(enum.StrEnum):
    """The managed ledger's life (the values are Pulsar's ManagedLedgerImpl.State names, shown by stats)."""
    NONE = "None"                   # created, not opened yet
    LEDGER_OPENED = "LedgerOpened"  # a ledger is open for writing: appends go to it
    ROLLING = "Rolling"             # closing (or recovering) the current ledger and creating the next
    FENCED = "Fenced"               # ownership lost on this broker: every append fails with TOPIC_FENCED
    CLOSED = "Closed"               # closed cleanly on this broker (unload, shutdown)


_S = ManagedLedgerState
TRANSITIONS: dict[ManagedLedgerState, frozenset[ManagedLedgerState]] = {
    _S.NONE: frozenset({_S.LEDGER_OPENED, _S.FENCED, _S.CLOSED}),
    _S.LEDGER_OPENED: frozenset({_S.ROLLING, _S.FENCED, _S.CLOSED}),
    _S.ROLLING: frozenset({_S.LEDGER_OPENED, _S.FENCED, _S.CLOSED}),
    _S.FENCED: frozenset(),
    _S.CLOSED: frozenset(),
}
FINAL = frozenset({_S.FENCED, _S.CLOSED})


class ManagedLedgerStateError(BksimError):
    """A state move the managed ledger's transition table does not allow (a bug in its caller or in itself)."""


@dataclass(slots=True)
class LedgerInfo:
    ledger_id: int
    entries: int = 0       # closed: the ledger's entries; open: 0 in the znode, the live count in memory
    size: int = 0          # payload bytes
    ctime_ms: int = 0
    closed_ms: int = 0     # 0 = still open

    def to_json(self) -> dict:
        return {"ledger_id": self.ledger_id, "entries": self.entries, "size": self.size, "ctime_ms": self.ctime_ms,
                "closed_ms": self.closed_ms}

    @staticmethod
    def from_json(d: dict) -> "LedgerInfo":
        return LedgerInfo(int(d["ledger_id"]), int(d.get("entries", 0)), int(d.get("size", 0)),
                          int(d.get("ctime_ms", 0)), int(d.get("closed_ms", 0)))


@dataclass(slots=True)
class ManagedLedgerInfo:
    ledgers: list[LedgerInfo] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({"ledgers": [i.to_json() for i in self.ledgers], "properties": self.properties},
                          sort_keys=True).encode()

    @staticmethod
    def from_bytes(data: bytes) -> "ManagedLedgerInfo":
        """The znode's value; FormatError saying what is wrong for bytes that are not one."""
        if not data:
            return ManagedLedgerInfo()
        try:
            d = json.loads(data)
            return ManagedLedgerInfo([LedgerInfo.from_json(x) for x in d.get("ledgers", [])],
                                     {str(k): str(v) for k, v in d.get("properties", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as e:
            raise FormatError(f"not a managed ledger's JSON: {type(e).__name__}: {str(e)[:200]}") from None


class _PendingAdd:
    __slots__ = ("payload", "future", "on_confirmed", "ledger_id", "sent_id", "entry_id", "added_ms")

    def __init__(self, payload: bytes, future: asyncio.Future,
                 on_confirmed: Callable[[Position], None] | None, added_ms: float = 0.0) -> None:
        self.added_ms = added_ms  # when add() took it: its append latency runs to its confirmation
        self.payload = payload
        self.future = future
        self.on_confirmed = on_confirmed
        self.ledger_id = -1   # the ledger it was sent to (-1: waiting for a ledger)
        self.sent_id = -1     # the entry id the ledger's writer gave it
        self.entry_id = -1    # its entry id there, once confirmed


class ManagedLedger:
    """Implements topics.layout.LedgerLayout for the topic's cursors."""

    def __init__(self, name: TopicName, *, ledgers: LedgerService, store: MetadataStore, clock: Clock,
                 config: TopicConfig = TopicConfig(), broker_config: BrokerConfig = BrokerConfig(),
                 log: Callable[[str], None] = lambda line: None, entry_cache_bytes: int = 64 * 1024 * 1024) -> None:
        self.name = name
        self.path = name.managed_ledger_path
        self._ledgers = ledgers
        self._store = store
        self._clock = clock
        self.config = config
        self._broker_config = broker_config
        self._log = log
        self.info = ManagedLedgerInfo()
        self._znode = OwnedZnode(store, self.path, lambda line: self._log(f"topic {self.name}: {line}"))
        self._state = ManagedLedgerState.NONE
        self._handle = None
        self._current: LedgerInfo | None = None
        self._current_sent_entries = 0
        self._current_sent_bytes = 0
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._last_confirmed = Position(-1, -1)
        self._listeners: list[Callable[[], None]] = []
        self._roll_task: asyncio.Task | None = None
        self._drained: asyncio.Future | None = None  # close() waiting for the pending queue to empty
        self._metadata_lock = asyncio.Lock()
        self._closed_metadata: dict[int, LedgerMetadata] = {}
        self._deletions: set[asyncio.Task] = set()  # deletes to try again after LEDGER_DELETE_BACKOFF_MS
        self._cache: collections.OrderedDict[Position, bytes] = collections.OrderedDict()
        self._cache_bytes = 0
        self._cache_bytes_max = entry_cache_bytes
        self.fence_reason = ""
        self.entries_added = 0   # since this broker opened the topic
        self.add_latency = LatencyHistogram()  # add() -> confirmed, per entry (pulsar_storage_write_latency)
        self.bytes_added = 0
        self.last_ledger_created_ms = 0

    @property
    def state(self) -> ManagedLedgerState:
        return self._state

    def _move(self, to: ManagedLedgerState) -> None:
        """The one way the state changes: refuses a move the transition table (TRANSITIONS) does not list."""
        if to not in TRANSITIONS[self._state]:
            raise ManagedLedgerStateError(f"topic {self.name}: the managed ledger cannot move from {self._state} "
                                          f"to {to} (allowed: {sorted(TRANSITIONS[self._state]) or 'none'})")
        self._state = to

    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks an invariant of the module docstring. Costs O(ledgers +
        pending + cached entries); for tests and debugging, between operations (not inside one)."""
        ledgers, current, state = self.info.ledgers, self._current, self._state
        ids = [i.ledger_id for i in ledgers]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            self._broken("LedgersOrdered", f"ledger ids {ids}")
        open_ids = [i.ledger_id for i in ledgers if not i.closed_ms]
        if len(open_ids) > 1 or (open_ids and open_ids[0] != ids[-1]):
            self._broken("OnlyLastLedgerOpen", f"open ledgers {open_ids} in {ids}")
        if current is not None and (not ledgers or current is not ledgers[-1]):
            self._broken("CurrentIsLast", f"current ledger {current.ledger_id}, ledgers {ids}")
        for info in ledgers:
            md = self._closed_metadata.get(info.ledger_id) if info.closed_ms else None
            if (info.entries < 0 or info.size < 0 or (info.entries == 0 and info.size != 0)
                    or (md is not None and (info.entries, info.size) != (md.last_entry_id + 1, md.length))):
                self._broken("CountsConsistent", f"ledger {info.ledger_id}: {info.entries} entries, {info.size} "
                                                 f"bytes" + (f", closed at {md.last_entry_id} with length "
                                                             f"{md.length}" if md is not None else ""))
        if current is not None and not current.closed_ms and current.entries != self._last_entry_of_current() + 1:
            self._broken("CountsConsistent", f"open ledger {current.ledger_id} counts {current.entries} entries, "
                                             f"last confirmed {self._last_confirmed}")
        opened = (self._handle is not None and current is not None and not current.closed_ms
                  and self._handle.ledger_id == current.ledger_id and self._roll_task is None)
        if (state not in FINAL and (state is ManagedLedgerState.LEDGER_OPENED) != opened
                or (state is ManagedLedgerState.ROLLING and self._roll_task is None)
                or (state is ManagedLedgerState.NONE and self._roll_task is not None)
                or (state in FINAL and self._pending)):
            self._broken("StateMatchesFields", f"handle {self._handle.ledger_id if self._handle else None}, current "
                                               f"{current.ledger_id if current else None}, roll "
                                               f"{'running' if self._roll_task else 'none'}, "
                                               f"{len(self._pending)} pending")
        last = self._last_confirmed
        after = [i.ledger_id for i in ledgers if i.ledger_id > last.ledger and (self.entries_in(i.ledger_id) or 0)]
        within = last.ledger not in ids or last.entry < (self.entries_in(last.ledger) or 0)
        if after or not within:
            self._broken("ConfirmedInOrder", f"last confirmed {last}, ledgers after it with entries {after}")
        if self._pending and self._pending[0].entry_id >= 0:
            self._broken("ConfirmedInOrder", f"the pending head is confirmed at {self._pending[0].entry_id} in "
                                             f"ledger {self._pending[0].ledger_id}")
        sent: dict[int, int] = {}
        for op in self._pending:
            if op.sent_id >= 0:
                if op.sent_id <= sent.get(op.ledger_id, -1):
                    self._broken("ConfirmedInOrder", f"pending appends sent to ledger {op.ledger_id} out of order "
                                                     f"({sent[op.ledger_id]} then {op.sent_id})")
                sent[op.ledger_id] = op.sent_id
        if len(self._pending) > self.config.pending_adds_max:
            self._broken("ConfirmedInOrder", f"{len(self._pending)} appends pending, at most "
                                             f"{self.config.pending_adds_max}")
        cached = sum(len(p) for p in self._cache.values())
        beyond = [p for p in self._cache if p > last]
        if cached != self._cache_bytes or beyond or (self._cache and self._cache_bytes > self._cache_bytes_max):
            self._broken("CacheBounded", f"{self._cache_bytes} bytes counted, {cached} cached (at most "
                                         f"{self._cache_bytes_max}), beyond last confirmed {last}: {beyond[:3]}")

    def _broken(self, invariant: str, detail: str) -> None:
        raise InvariantError(f"topic {self.name} managed ledger ({self._state})", invariant, detail)

    # ---- open / close --------------------------------------------------------------------------------------
    @staticmethod
    async def create_znode(store: MetadataStore, name: TopicName) -> None:
        """Create an empty managed ledger (topic create). NodeExists propagates to the caller."""
        await store.create(name.managed_ledger_path, ManagedLedgerInfo().to_bytes(), make_parents=True)

    async def open(self) -> None:
        """Take the topic: recover (fence) the last ledger, drop empty ones, start a fresh ledger, CAS the list."""
        try:
            data, self._znode.version = await self._store.get(self.path)
        except NoNodeError:
            raise TopicError(TopicStatus.TOPIC_NOT_FOUND, f"topic {self.name} does not exist") from None
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"topic {self.name}: {e}") from None
        try:
            self.info = ManagedLedgerInfo.from_bytes(data)
        except FormatError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"topic {self.name}: {self.path}: {e}") from None
        kept: list[LedgerInfo] = []
        empty: list[int] = []
        for info in self.info.ledgers:
            if not info.closed_ms:
                try:
                    metadata = await self._recover_once(info.ledger_id)
                except LedgerError as e:
                    if e.status is LedgerStatus.NO_SUCH_LEDGER:
                        self._log(f"topic {self.name}: ledger {info.ledger_id} is gone; dropped from the list")
                        continue
                    raise _unavailable(f"topic {self.name}: recovering ledger {info.ledger_id} failed", e) from None
                info.entries = metadata.last_entry_id + 1
                info.size = metadata.length
                info.closed_ms = self._clock.wall_ms()
                self._closed_metadata[info.ledger_id] = metadata
            if info.entries == 0:
                empty.append(info.ledger_id)
                continue
            kept.append(info)
        self.info.ledgers = kept
        await self._start_ledger(reason="open")
        self._set_last_confirmed_to_end()
        for ledger_id in empty:
            await self._delete_ledger(ledger_id)
        if self._state in FINAL:  # abandoned or closed while opening
            raise self._not_writable()
        self._move(ManagedLedgerState.LEDGER_OPENED)
        self._log(f"topic {self.name}: opened with ledgers {[i.ledger_id for i in self.info.ledgers]}")

    async def close(self) -> None:
        """Clean close (broker shutdown, unload): wait for pending appends, close the ledger, record it."""
        if self._state in FINAL:
            return
        # Wait until no append is pending and no roll runs (a roll may start while appends settle: the ledger
        # filled up). Wait on the queue itself, not on the appends' futures: a caller may cancel its future (a
        # producer's connection drops and its Send is cancelled) while the entry is still in flight to the
        # ledger, and an append made while we wait is pending too.
        while self._state not in FINAL and (self._roll_task is not None or self._pending):
            if self._roll_task is not None:
                await asyncio.gather(self._roll_task, return_exceptions=True)
            else:
                self._drained = asyncio.get_running_loop().create_future()
                try:
                    await self._drained
                finally:
                    self._drained = None
        if self._state in FINAL:  # fenced meanwhile (a failed roll), which failed every pending append
            return
        self._move(ManagedLedgerState.CLOSED)
        handle, current = self._handle, self._current  # the ledger closed here is the one recorded closed
        if handle is not None and current is not None:
            try:
                metadata = await handle.close()
                self._record_closed(current, metadata)
                async with self._metadata_lock:
                    await self._write_info()
            except (LedgerError, TopicError) as e:
                self._log(f"topic {self.name}: ledger {current.ledger_id} not closed cleanly ({e}); the next "
                          f"owner recovers it")
        self._fail_pending(TopicError(TopicStatus.SERVICE_UNAVAILABLE, f"topic {self.name} is closed on this broker"))

    def abandon(self, reason: str) -> None:
        """Stop without closing (ownership lost, broker crash-like stop): pending appends fail, ledger stays open."""
        if self._state not in FINAL:
            self._fence(reason)

    # ---- appends -----------------------------------------------------------------------------------------------
    @property
    def entry_bytes_max(self) -> int:
        """The largest entry a topic takes: topic.message_bytes_max capped by the ledger's payload_bytes_max."""
        return min(self.config.message_bytes_max, self._broker_config.payload_bytes_max)

    def append(self, payload: bytes, on_confirmed: Callable[[Position], None] | None = None) -> asyncio.Future:
        """Append one entry; the future resolves with its Position once it and every earlier append are durable.

        `on_confirmed(position)` runs inside the confirmation itself: after last_confirmed moved to the entry,
        before the future resolves and before any later entry is confirmed. State that must never lag the log
        (dedup's persisted sequence ids, which a dedup snapshot at last_confirmed claims to cover) is recorded
        there, as Pulsar records them in the add-complete callback; a continuation of the future runs later, after
        other appends may have been confirmed and snapshotted."""
        if self._state in FINAL:
            raise self._not_writable()
        if len(self._pending) >= self.config.pending_adds_max:
            raise TopicError(TopicStatus.TOO_MANY_REQUESTS,
                             f"topic {self.name} has {len(self._pending)} appends pending "
                             f"(topic.pending_adds_max)")
        future = asyncio.get_running_loop().create_future()
        op = _PendingAdd(payload, future, on_confirmed, self._clock.monotonic_ms())
        self._pending.append(op)
        if self._roll_task is None and self._handle is not None:
            self._send(op)
        return future

    def _not_writable(self) -> TopicError:
        if self._state is ManagedLedgerState.FENCED:
            return TopicError(TopicStatus.TOPIC_FENCED,
                              f"topic {self.name} is fenced on this broker: {self.fence_reason}")
        return TopicError(TopicStatus.SERVICE_UNAVAILABLE, f"topic {self.name} is closed on this broker")

    def _send(self, op: _PendingAdd) -> None:
        handle = self._handle
        try:
            future = handle.append(op.payload)
        except LedgerError as e:
            self._add_failed(handle.ledger_id, e)
            return
        op.ledger_id = handle.ledger_id
        op.sent_id = handle.writer.last_add_pushed
        self._current_sent_entries += 1
        self._current_sent_bytes += len(op.payload)
        future.add_done_callback(lambda f, op=op, lid=handle.ledger_id: self._add_done(op, lid, f))
        if self._ledger_full():
            self._start_roll("full")

    def _add_done(self, op: _PendingAdd, ledger_id: int, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            if op.ledger_id == ledger_id and self._current is not None and self._current.ledger_id == ledger_id:
                self._add_failed(ledger_id, error)
            return
        if op.ledger_id != ledger_id:
            return  # a stale answer for an op that moved on
        op.entry_id = future.result()
        self._confirm_head()

    def _confirm_head(self) -> None:
        confirmed = False
        now_ms = None
        while self._pending and self._pending[0].entry_id >= 0:
            op = self._pending.popleft()
            if now_ms is None:
                now_ms = self._clock.monotonic_ms()
            self.add_latency.observe(now_ms - op.added_ms)
            pos = Position(op.ledger_id, op.entry_id)
            info = self._info_of(op.ledger_id)
            if info is not None and not info.closed_ms:
                info.entries = max(info.entries, op.entry_id + 1)
                info.size += len(op.payload)
            self._last_confirmed = pos
            self.entries_added += 1
            self.bytes_added += len(op.payload)
            self._cache_put(pos, op.payload)
            if op.on_confirmed is not None:
                try:
                    op.on_confirmed(pos)
                except Exception as e:  # a bug in the caller's hook must not stop the confirmation of later entries
                    self._log(f"topic {self.name}: confirmation hook of {pos} failed: {e!r}")
            if not op.future.done():
                op.future.set_result(pos)
            confirmed = True
        self._wake_close()
        if confirmed:
            for listener in list(self._listeners):
                listener()

    def _add_failed(self, ledger_id: int, error: BaseException) -> None:
        if self._state in FINAL or self._roll_task is not None:
            return  # the roll in progress sorts out every pending append
        self._log(f"topic {self.name}: add to ledger {ledger_id} failed ({error}); recovering it and moving on")
        self._start_roll("failed", failed_ledger=ledger_id)

    def _ledger_full(self) -> bool:
        c = self.config
        if self._current is None:
            return False
        age = self._clock.wall_ms() - self._current.ctime_ms
        if age < c.ledger_age_ms_min:
            return False
        return (self._current_sent_entries >= c.ledger_entries_max or self._current_sent_bytes >= c.ledger_bytes_max
                or (age >= c.ledger_age_ms_max and self._current_sent_entries > 0))

    def check_rollover(self) -> None:
        """Periodic: roll a ledger that got too old while idle (called by the topic's maintenance task)."""
        if self._state is ManagedLedgerState.LEDGER_OPENED and self._roll_task is None and self._ledger_full():
            self._start_roll("age")

    # ---- rollover (also the failure path) -----------------------------------------------------------------
    def _start_roll(self, reason: str, failed_ledger: int | None = None) -> None:
        if self._roll_task is not None or self._state in FINAL:
            return
        self._move(ManagedLedgerState.ROLLING)
        self._roll_task = asyncio.get_running_loop().create_task(self._roll(reason, failed_ledger))

    async def _roll(self, reason: str, failed_ledger: int | None) -> None:
        old, handle = self._current, self._handle
        try:
            metadata = None
            if failed_ledger is None:
                try:
                    metadata = await handle.close()  # waits for the appends sent to it
                except LedgerError as e:
                    self._log(f"topic {self.name}: closing ledger {old.ledger_id} failed ({e}); recovering it")
            if metadata is None:
                metadata = await self._recover_until_closed(old.ledger_id)
            self._settle_after_close(old, metadata)
            self._handle = None
            for attempt in range(ROLL_ATTEMPTS_MAX):
                try:
                    await self._start_ledger(reason=reason)
                    break
                except TopicError as e:
                    if e.status is TopicStatus.TOPIC_FENCED or attempt == ROLL_ATTEMPTS_MAX - 1:
                        raise
                    self._log(f"topic {self.name}: creating the next ledger failed ({e}); retrying")
                    await self._clock.sleep_ms(RECOVERY_RETRY_MS)
            self._roll_task = None
            if self._state in FINAL:  # fenced while rolling: the fence failed every pending append
                return
            self._move(ManagedLedgerState.LEDGER_OPENED)
            for op in list(self._pending):
                if op.entry_id < 0 and op.ledger_id != self._handle.ledger_id:
                    self._send(op)
                    if self._roll_task is not None:
                        break  # a failure or a roll started again: it re-sends the rest
        except TopicError as e:
            self._roll_task = None
            self._fence(e.message if e.status is TopicStatus.TOPIC_FENCED else f"rollover failed: {e}")
        except asyncio.CancelledError:
            self._roll_task = None
            raise

    async def _recover_until_closed(self, ledger_id: int) -> LedgerMetadata:
        """Recover our own failed ledger (fence + close at what is durable). Retries while bookies are missing;
        gives up only when the topic is fenced or closed meanwhile."""
        while True:
            try:
                return await self._recover_once(ledger_id)
            except LedgerError as e:
                if e.status in (LedgerStatus.UNAUTHORIZED, LedgerStatus.NO_SUCH_LEDGER):
                    raise TopicError(TopicStatus.INTERNAL,
                                     f"topic {self.name}: ledger {ledger_id} cannot be recovered: {e}")
                self._log(f"topic {self.name}: recovering ledger {ledger_id} failed ({e}); retrying")
            if self._state in FINAL:
                raise TopicError(TopicStatus.TOPIC_FENCED,
                                 f"topic {self.name}: stopped while recovering ledger {ledger_id}")
            await self._clock.sleep_ms(RECOVERY_RETRY_MS)

    async def _recover_once(self, ledger_id: int) -> LedgerMetadata:
        """One recovery attempt, bounded: an attempt that neither ends nor fails within RECOVERY_ATTEMPT_TIMEOUTS
        bookie timeouts is abandoned (LedgerError RECOVERY_FAILED) so the caller tries again. A backstop: every
        bookie call of a recovery has its own deadline, and a call cancelled with its gRPC channel is "no
        answer" (tests/integration/test_recovery_lost_answer.py: two bookies of the ensemble come back during a
        recovery), so an attempt normally ends well before."""
        limit_s = RECOVERY_ATTEMPT_TIMEOUTS * self._broker_config.bookie_timeout_ms / 1000
        try:
            return await asyncio.wait_for(self._ledgers.recover_ledger(ledger_id, password=LEDGER_PASSWORD), limit_s)
        except asyncio.TimeoutError:
            raise LedgerError(LedgerStatus.RECOVERY_FAILED,
                              f"recovery of ledger {ledger_id} took more than {limit_s:.0f}s; "
                              f"abandoned") from None

    def _settle_after_close(self, info: LedgerInfo, metadata: LedgerMetadata) -> None:
        """The ledger is CLOSED at metadata.last_entry_id: pending appends at or below it are durable there
        (acknowledge them, in order); the rest go to the next ledger."""
        last = metadata.last_entry_id
        for op in self._pending:
            if op.ledger_id != info.ledger_id or op.entry_id >= 0:
                continue
            if 0 <= op.sent_id <= last:
                op.entry_id = op.sent_id
            else:
                op.ledger_id = -1
                op.sent_id = -1
        self._confirm_head()
        self._record_closed(info, metadata)

    def _record_closed(self, info: LedgerInfo, metadata: LedgerMetadata) -> None:
        info.entries = metadata.last_entry_id + 1
        info.size = metadata.length
        info.closed_ms = self._clock.wall_ms()
        self._closed_metadata[info.ledger_id] = metadata

    async def _start_ledger(self, *, reason: str) -> None:
        """Create the next ledger and CAS the list (dropping a closed empty last ledger)."""
        c = self.config
        try:
            handle = await self._ledgers.create_ledger(
                c.ensemble_size, c.write_quorum_size, c.ack_quorum_size, password=LEDGER_PASSWORD,
                custom={"application": "bksim", "component": "managed-ledger", "managed-ledger": str(self.name)})
        except LedgerError as e:
            raise _unavailable(f"topic {self.name}: cannot create a ledger", e) from None
        now = self._clock.wall_ms()
        dropped = [i for i in self.info.ledgers if i.closed_ms and i.entries == 0]
        new_info = LedgerInfo(handle.ledger_id, 0, 0, now, 0)
        async with self._metadata_lock:
            previous = list(self.info.ledgers)
            self.info.ledgers = [i for i in self.info.ledgers if not (i.closed_ms and i.entries == 0)] + [new_info]
            try:
                await self._write_info()
            except TopicError:
                self.info.ledgers = previous
                handle.abort("the managed ledger list could not be updated")
                await self._delete_ledger(handle.ledger_id)
                raise
        self._handle = handle
        self._current = new_info
        self._current_sent_entries = 0
        self._current_sent_bytes = 0
        self.last_ledger_created_ms = now
        for info in dropped:
            await self._delete_ledger(info.ledger_id)
        self._log(f"topic {self.name}: writing ledger {handle.ledger_id} ({reason})")

    async def _write_info(self) -> None:
        """CAS the znode (a lost answer settled by reading it back: topics/owned_znode.py); changed or deleted by
        someone else = another broker owns the topic now: fence."""
        try:
            await self._znode.write(self.info.to_bytes())
        except ZnodeTaken as e:
            raise TopicError(TopicStatus.TOPIC_FENCED,
                             f"topic {self.name}: the managed ledger changed under us (another broker took it over, "
                             f"or it was deleted): {e}") from None
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"topic {self.name}: {e}") from None

    async def _delete_ledger(self, ledger_id: int, tries_left: int = LEDGER_DELETE_RETRIES) -> None:
        """Delete a ledger the topic no longer lists; a failed try is made again LEDGER_DELETE_BACKOFF_MS later, in
        the background, while tries are left (also after the topic closed: no one else will delete it)."""
        self._closed_metadata.pop(ledger_id, None)
        try:
            await self._ledgers.delete_ledger(ledger_id, password=LEDGER_PASSWORD)
        except LedgerError as e:
            if e.status is LedgerStatus.NO_SUCH_LEDGER:
                return
            tries_left -= 1
            if tries_left <= 0:
                self._log(f"topic {self.name}: ledger {ledger_id} not deleted ({e}) in {LEDGER_DELETE_RETRIES} tries; "
                          f"it leaks until removed by hand")
                return
            self._log(f"topic {self.name}: ledger {ledger_id} not deleted ({e}); trying again in "
                      f"{LEDGER_DELETE_BACKOFF_MS / 1000:g} s")
            task = asyncio.get_running_loop().create_task(self._delete_later(ledger_id, tries_left),
                                                          name=f"delete-ledger-{ledger_id}")
            self._deletions.add(task)
            task.add_done_callback(self._deletions.discard)

    async def _delete_later(self, ledger_id: int, tries_left: int) -> None:
        await self._clock.sleep_ms(LEDGER_DELETE_BACKOFF_MS)
        await self._delete_ledger(ledger_id, tries_left)

    def _fence(self, reason: str) -> None:
        if self._state in FINAL:  # already fenced (or closed): pending appends failed then
            return
        self._move(ManagedLedgerState.FENCED)
        self.fence_reason = reason
        self._log(f"topic {self.name}: fenced: {reason}")
        if self._handle is not None:
            self._handle.abort(f"topic {self.name} is fenced")
        self._fail_pending(TopicError(TopicStatus.TOPIC_FENCED,
                                      f"topic {self.name} is fenced on this broker: {reason}"))
        for listener in list(self._listeners):
            listener()

    def _fail_pending(self, error: TopicError) -> None:
        while self._pending:
            op = self._pending.popleft()
            if not op.future.done():
                op.future.set_exception(error)
                op.future.exception()
        self._wake_close()

    def _wake_close(self) -> None:
        """Wake close() once no append is pending (confirmed or failed, whatever became of their futures)."""
        if self._drained is not None and not self._pending and not self._drained.done():
            self._drained.set_result(None)

    # ---- trimming --------------------------------------------------------------------------------------------
    async def trim(self, slowest: Position | None, *, retention_ms: int, retention_bytes: int) -> list[int]:
        """Delete the contiguous prefix of closed ledgers that lie entirely at or below `slowest` (the slowest
        durable cursor's PERSISTED mark-delete, as Pulsar's slowest-reader bound; None = no cursors) and are older
        than retention_ms or beyond retention_bytes (-1 = no limit of that kind). Metadata first, then the
        ledgers. Returns deleted ids. An in-memory mark-delete is not enough: after a crash the cursor comes
        back at its persisted position, which must still name entries that exist (dedup replays from it)."""
        if self._state in FINAL or (retention_ms < 0 and retention_bytes < 0):
            return []
        async with self._metadata_lock:
            now = self._clock.wall_ms()
            total = sum(i.size for i in self.info.ledgers)
            victims: list[LedgerInfo] = []
            for info in self.info.ledgers:
                if not info.closed_ms or info is self._current:
                    break
                if slowest is not None and Position(info.ledger_id, info.entries - 1) > slowest:
                    break  # not consumed by every durable cursor
                expired = retention_ms >= 0 and now - info.closed_ms >= retention_ms
                over = retention_bytes >= 0 and total > retention_bytes
                if not (expired or over):
                    break
                victims.append(info)
                total -= info.size
            if not victims:
                return []
            previous = list(self.info.ledgers)
            self.info.ledgers = self.info.ledgers[len(victims):]
            try:
                await self._write_info()
            except TopicError as e:
                self.info.ledgers = previous
                if e.status is TopicStatus.TOPIC_FENCED:
                    self._fence(e.message)
                raise
        for info in victims:
            await self._delete_ledger(info.ledger_id)
            for pos in [p for p in self._cache if p.ledger == info.ledger_id]:
                self._cache_bytes -= len(self._cache.pop(pos))
        self._log(f"topic {self.name}: trimmed ledgers {[i.ledger_id for i in victims]}")
        return [i.ledger_id for i in victims]

    # ---- reading ------------------------------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` runs after new entries are confirmed (and when the topic is fenced)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    async def read(self, start: Position, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to `max_entries` entries from `start` (an existing position <= last confirmed) within its ledger."""
        if not self.contains(start):
            return []
        info = self._info_of(start.ledger)
        last = info.entries - 1 if info.closed_ms else self._last_entry_of_current()
        last = min(last, start.entry + max_entries - 1)
        out: list[tuple[Position, bytes]] = []
        entry = start.entry
        while entry <= last:  # serve from the cache while it has them
            payload = self._cache.get(Position(start.ledger, entry))
            if payload is None:
                break
            out.append((Position(start.ledger, entry), payload))
            entry += 1
        if entry <= last:
            async for e in self._read_from_bookies(start.ledger, entry, last):
                out.append((Position(start.ledger, e.entry_id), e.payload))
        return out

    async def _read_from_bookies(self, ledger_id: int, first: int, last: int) -> AsyncIterator:
        metadata = self._closed_metadata.get(ledger_id)
        try:
            if metadata is None and self._handle is not None and self._handle.ledger_id == ledger_id:
                metadata = self._handle.metadata
            if metadata is None:
                metadata, _ = await self._ledgers.metadata(ledger_id, LEDGER_PASSWORD)
                if metadata.is_closed:
                    self._closed_metadata[ledger_id] = metadata
            async for entry in read_entries(self._ledgers.transport, ledger_id, metadata, first, last,
                                            window=self._broker_config.read_window_max,
                                            speculative_ms=self._broker_config.speculative_read_ms):
                yield entry
        except LedgerError as e:
            raise _unavailable(f"topic {self.name}: reading ledger {ledger_id} entries {first}..{last} failed", e) \
                from None

    def _cache_put(self, pos: Position, payload: bytes) -> None:
        if self._cache_bytes_max <= 0:
            return
        self._cache[pos] = payload
        self._cache_bytes += len(payload)
        while self._cache_bytes > self._cache_bytes_max and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old)

    async def find_newest_before(self, publish_time_of: Callable[[bytes], int], time_ms: int) -> Position | None:
        """The last position whose entry was published before `time_ms` (binary search over each ledger, reading
        only the probed entries); None if the first entry is already at or after it."""
        found: Position | None = None
        for info in self.info.ledgers:
            count = self.entries_in(info.ledger_id) or 0
            if count == 0:
                continue
            lo, hi = 0, count - 1
            first = await self.read(Position(info.ledger_id, 0), 1)
            if not first or publish_time_of(first[0][1]) >= time_ms:
                return found
            while lo < hi:  # invariant: entry lo is before time_ms
                mid = (lo + hi + 1) // 2
                got = await self.read(Position(info.ledger_id, mid), 1)
                if got and publish_time_of(got[0][1]) < time_ms:
                    lo = mid
                else:
                    hi = mid - 1
            found = Position(info.ledger_id, lo)
            if lo < count - 1:
                return found
        return found

    # ---- LedgerLayout ---------------------------------------------------------------------------------------------
    def _info_of(self, ledger_id: int) -> LedgerInfo | None:
        for info in reversed(self.info.ledgers):
            if info.ledger_id == ledger_id:
                return info
        return None

    def _last_entry_of_current(self) -> int:
        if self._last_confirmed.ledger == (self._current.ledger_id if self._current else None):
            return self._last_confirmed.entry
        return -1

    def _set_last_confirmed_to_end(self) -> None:
        for info in reversed(self.info.ledgers):
            if info.closed_ms and info.entries > 0:
                self._last_confirmed = Position(info.ledger_id, info.entries - 1)
                return
        current = self._current.ledger_id if self._current else -1
        self._last_confirmed = Position(current, -1)

    @property
    def last_confirmed(self) -> Position:
        return self._last_confirmed

    def ledger_ids(self) -> list[int]:
        return [i.ledger_id for i in self.info.ledgers]

    def entries_in(self, ledger_id: int) -> int | None:
        info = self._info_of(ledger_id)
        if info is None:
            return None
        if info.closed_ms:
            return info.entries
        return self._last_entry_of_current() + 1 if info is self._current else info.entries

    def contains(self, pos: Position) -> bool:
        count = self.entries_in(pos.ledger)
        return count is not None and 0 <= pos.entry < count and pos <= self._last_confirmed

    def first_position(self) -> Position:
        for info in self.info.ledgers:
            if (self.entries_in(info.ledger_id) or 0) > 0 or info is self._current:
                return Position(info.ledger_id, 0)
        return Position(self._current.ledger_id if self._current else -1, 0)

    def next_position(self, pos: Position) -> Position:
        ids = self.ledger_ids()
        for k, ledger_id in enumerate(ids):
            if ledger_id < pos.ledger:
                continue
            count = self.entries_in(ledger_id) or 0
            if ledger_id == pos.ledger:
                if pos.entry + 1 < count or k == len(ids) - 1:
                    return Position(ledger_id, pos.entry + 1)
                continue
            if count > 0 or k == len(ids) - 1:
                return Position(ledger_id, 0)
        return Position(pos.ledger, pos.entry + 1)

    def previous_position(self, pos: Position) -> Position:
        if pos.entry > 0:
            return Position(pos.ledger, pos.entry - 1)
        prev = None
        for info in self.info.ledgers:
            if info.ledger_id >= pos.ledger:
                break
            count = self.entries_in(info.ledger_id) or 0
            if count > 0:
                prev = Position(info.ledger_id, count - 1)
        return prev if prev is not None else Position(pos.ledger, -1)

    def entries_between(self, a: Position, b: Position) -> int:
        """Entries in (a, b]."""
        if b <= a:
            return 0
        total = 0
        for info in self.info.ledgers:
            count = self.entries_in(info.ledger_id) or 0
            lo = 0 if info.ledger_id > a.ledger else (a.entry + 1 if info.ledger_id == a.ledger else count)
            hi = count - 1 if info.ledger_id < b.ledger else (b.entry if info.ledger_id == b.ledger else -1)
            if hi >= lo:
                total += hi - lo + 1
        return total

    # ---- stats ------------------------------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def number_of_entries(self) -> int:
        return sum(self.entries_in(i.ledger_id) or 0 for i in self.info.ledgers)

    @property
    def total_size(self) -> int:
        return sum(i.size for i in self.info.ledgers)

    def stats_internal(self) -> dict:
        current = self._current
        return {
            "entriesAddedCounter": self.entries_added,
            "numberOfEntries": self.number_of_entries,
            "totalSize": self.total_size,
            "currentLedgerEntries": (self.entries_in(current.ledger_id) or 0) if current else 0,
            "currentLedgerSize": current.size if current else 0,
            "lastLedgerCreatedTimestamp": self.last_ledger_created_ms,
            "pendingAddEntriesCount": len(self._pending),
            "lastConfirmedEntry": str(self._last_confirmed),
            "state": self._state.value,
            "ledgers": [{"ledgerId": i.ledger_id, "entries": self.entries_in(i.ledger_id) or 0, "size": i.size,
                         "ctime_ms": i.ctime_ms, "closed": bool(i.closed_ms)} for i in self.info.ledgers],
        }


# Ledger failures a topic client survives by trying again (possibly on another broker).
_LEDGER_UNAVAILABLE = frozenset({LedgerStatus.NOT_ENOUGH_BOOKIES, LedgerStatus.READ_FAILED,
                                 LedgerStatus.RECOVERY_FAILED, LedgerStatus.TOO_MANY_REQUESTS, LedgerStatus.ABORTED})


def _unavailable(what: str, e: LedgerError) -> TopicError:
    if e.status in _LEDGER_UNAVAILABLE:
        status = TopicStatus.SERVICE_UNAVAILABLE
    elif e.status is LedgerStatus.METADATA_ERROR:
        status = TopicStatus.METADATA_ERROR
    else:
        status = TopicStatus.INTERNAL
    return TopicError(status, f"{what}: {e}")
