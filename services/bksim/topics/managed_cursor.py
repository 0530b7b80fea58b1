"""ManagedCursor: a durable subscription position (PROTOCOL.md §5 "Cursor state", "Cursor persistence").

The ack state lives in a CursorState (cursor_state.py); this class makes it durable through a cursor ledger
(snapshots, cursor_codec.py) and the cursor znode, over the LedgerLayout, the broker's LedgerService, the
MetadataStore and the Clock ports.

Public API (LEAD's subscription code calls these):

    cursor = await ManagedCursor.open(name=, path=, layout=, ledgers=, store=, clock=, config=,
                                      initial_position="latest"|"earliest", log=, on_fenced=)
    cursor.mark_delete                          everything <= it is acknowledged
    cursor.persisted_mark_delete                the mark-delete of the last completed persist (or of the state
                                                recovered at open): where the cursor comes back after a crash;
                                                retention trims only below it
    cursor.read_position  (settable)            next entry to dispatch; cursor.rewind() -> after mark_delete
    cursor.check(pos) -> Position               INVALID_ACK unless the topic holds pos or it is <= mark_delete
    cursor.ack(positions) -> int                individual acks (each checked first)
    cursor.ack_cumulative(pos, properties=None) mark-delete to pos (an older pos is a no-op)
    cursor.expire_until(pos)                    TTL: like ack_cumulative, for every subscription type
    cursor.ack_batch_indexes(pos, indexes, batch_size) -> bool   True when the entry is now acked as a whole
    cursor.is_acked(pos), cursor.acked_batch_indexes(pos)
    cursor.redelivery_count(pos), cursor.increment_redelivery(pos) -> int
    cursor.properties (a copy), cursor.set_property(name, int)
    await cursor.seek(pos)                      reset (all acks after pos forgotten), persisted at once
    cursor.backlog() -> int                     unacked entries up to the last confirmed one
    await cursor.persist(force=False) -> bool   write a snapshot now (force) or if due; True if written
    await cursor.close()                        clean close: final state persisted (see below)
    cursor.closed_cleanly                       True once close() has put the whole state where the next owner
                                                reads it (False before, after abort() or a failed close, or when the
                                                close had to leave ranges out of the znode)
    await cursor.delete()                       znode first, then the cursor ledger
    cursor.abort(reason)                        stop without writing anything (lost ownership, broker dying)
    cursor.stats_internal() -> dict             Pulsar's field names (markDeletePosition, ...)

Every acknowledgement changes memory only and marks the cursor dirty; a background task persists a dirty
cursor every `topic.cursor_persist_interval_ms` (so a kill -9 redelivers at most what was acked during the
last interval: at-least-once). The subscription type rules (cumulative acks only for Exclusive/Failover) are
the caller's; this class does not know the type.

Persistence (each step logged; stats_internal()["lastPersist"] says where the last snapshot went):
- open: read the znode; create it if missing (cursor_ledger -1, mark-delete at the initial position:
  "earliest" = before the first entry, "latest" = the last confirmed entry). If the znode names a cursor
  ledger: open it WITH RECOVERY (fences a previous owner still writing it) and restore its last complete
  snapshot (cursor_codec.find_last_snapshot). If that ledger is gone (NO_SUCH_LEDGER: its metadata was
  deleted), or holds no complete snapshot, restore the znode's own (bounded) state instead, and say so: a log
  line and stats_internal()["recovery"] = {"source": "znode", "reason": ...}. Never "earliest" silently. Any
  other ledger error (bookies down or failing, recovery or reads not completing) fails the open with
  SERVICE_UNAVAILABLE and writes nothing: the topic load fails, the client retries, and the ledger is read
  once its bookies serve it again. Falling back then would move the mark-delete backwards, and the next
  persist would delete the ledger holding the newer state (acknowledged messages delivered again).
- persist: append the snapshot to the cursor ledger (chunks + marker when larger than
  topic.cursor_snapshot_chunk_bytes). The first persist after open creates a NEW ledger (never appends to
  a recovered one), writes the snapshot into it, CASes the znode to name it, then deletes the old ledger.
  After topic.cursor_ledger_entries_max entries the ledger rolls the same way. A CAS whose answer and
  read-back were both lost (owned_znode.py) may still land: the new ledger is kept (the znode may name it)
  until a later znode write succeeds, and the next persist starts a new ledger (so writes the znode first).
- append failure: the state goes into the znode (cursor_ledger -1) with at most topic.ranges_in_metadata_max
  ranges / batch entries / redelivery counts, the lowest ones; what was left out is logged and reported in
  stats (those messages would be redelivered after a restart, never lost); the next persist starts a new
  ledger and stays dirty until a full snapshot is written.
- clean close: if the whole state fits the znode bounds, the znode alone (cursor_ledger -1) and the cursor
  ledger is deleted (recovery then reads no ledger); else a final snapshot to the ledger, the ledger closed,
  and the znode CASed to name it.
- delete: the znode first (a crash then leaks a ledger, never resurrects a cursor), then the ledger.

Ownership: every znode write is a CAS on the version this cursor read or wrote. A CAS conflict (or a deleted
znode, or a FENCED cursor ledger) means another broker owns the topic now: TopicError(TopicStatus.TOPIC_FENCED), the
cursor stops (state "Fenced"), `on_fenced` is called and every later call raises the same error.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from bksim.topics import cursor_codec as codec
from bksim.topics.cursor_state import CursorState
from bksim.topics.errors import TopicError
from bksim.topics.layout import LedgerLayout
from bksim.topics.owned_znode import OwnedZnode, ZnodeTaken
from bksim.topics.positions import Position
from bksim.model.config import TopicConfig
from bksim.model.errors import LedgerError, MetadataError, NodeExistsError, NoNodeError
from bksim.model.status import LedgerStatus, TopicStatus
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

CURSOR_PASSWORD = b"bksim-cursor"
STATS_RANGES_MAX = 100  # ranges individuallyDeletedMessages lists (the count is always given)
# the ledger errors on recovery that mean "this ledger will never give the state": fall back to the znode.
# Every other one (READ_FAILED, RECOVERY_FAILED, NOT_ENOUGH_BOOKIES, METADATA_ERROR, ...) fails the open: a retry
# may succeed, and nothing is rolled back meanwhile (Pulsar falls back on read and recovery errors too; a
# transient outage then costs the acks only the ledger held).
GONE = (LedgerStatus.NO_SUCH_LEDGER,)
INITIAL_POSITIONS = ("earliest", "latest")

OPEN, NO_LEDGER, CLOSED, DELETED, FENCED = "Open", "NoLedger", "Closed", "Deleted", "Fenced"


class ManagedCursor:
    def __init__(self, *, name: str, path: str, layout: LedgerLayout, ledgers, store: MetadataStore, clock: Clock,
                 config: TopicConfig, password: bytes, log: Callable[[str], None],
                 on_fenced: Callable[[TopicError], None] | None) -> None:
        self.name = name
        self.path = path
        self.layout = layout
        self._ledgers = ledgers
        self._store = store
        self._clock = clock
        self.config = config
        self._password = password
        self._log = log
        self._on_fenced = on_fenced
        self.state = CursorState(layout, layout.previous_position(layout.first_position()),
                                 redelivery_counts_max=config.redelivery_counts_max,
                                 batch_size_max=config.batch_messages_max, log=log, name=name)
        self._znode = OwnedZnode(store, path, lambda line: self._log(f"cursor {self.name}: {line}"))
        self._ledger_id = -1            # the cursor ledger the znode names (-1: none)
        self._handle = None             # our writable handle of _ledger_id (None: none yet, or recovered read-only)
        self._ledger_entries = 0        # entries in our handle's ledger
        self._seq = 0                   # snapshot number
        self._persisted_changes = -1    # state.changes at the last complete persist
        self._persisted_md = self.state.mark_delete  # the mark-delete the znode or cursor ledger holds
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task | None = None
        self._status = NO_LEDGER
        self._fenced: TopicError | None = None
        self._last_persist: dict = {}
        self._last_persist_ms = -1e18
        self._persist_errors = 0
        self._last_error = ""
        self._last_switch_ms = 0
        self._aborted = False
        self._closed_cleanly = False
        # cursor ledgers a znode write with no known outcome may name: deleted once a later znode write succeeds
        self._maybe_named: list[int] = []
        self.recovery: dict = {}

    # ------------------------------------------------------------------------------------------ opening
    @classmethod
    async def open(cls, *, name: str, path: str, layout: LedgerLayout, ledgers, store: MetadataStore, clock: Clock,
                   config: TopicConfig, initial_position: str = "latest", password: bytes = CURSOR_PASSWORD,
                   log: Callable[[str], None] = lambda line: None,
                   on_fenced: Callable[[TopicError], None] | None = None,
                   background_flush: bool = True) -> "ManagedCursor":
        """Open (creating or recovering) the cursor whose znode is `path`. `background_flush` False: nothing
        persists unless persist()/close() is called (tests, tools)."""
        if initial_position not in INITIAL_POSITIONS:
            raise TopicError(TopicStatus.BAD_REQUEST,
                             f"initial position {initial_position!r} is not one of {INITIAL_POSITIONS}")
        cursor = cls(name=name, path=path, layout=layout, ledgers=ledgers, store=store, clock=clock, config=config,
                     password=password, log=log, on_fenced=on_fenced)
        await cursor._open(initial_position)
        if background_flush:
            cursor._flusher = asyncio.get_running_loop().create_task(cursor._flush_loop(),
                                                                     name=f"cursor-flush {path}")
        return cursor

    async def _open(self, initial_position: str) -> None:
        started = self._clock.monotonic_ms()
        try:
            data, self._znode.version = await self._store.get(self.path)
        except NoNodeError:
            data = None
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"cursor {self.name}: reading {self.path}: {e}") from None
        if data is None:
            layout = self.layout
            md = (layout.previous_position(layout.first_position()) if initial_position == "earliest"
                  else layout.last_confirmed)
            self.state.restore(mark_delete=md, acked={}, batches=(), redeliveries=(), properties={},
                               last_active=self._clock.wall_ms())
            raw, _ = codec.encode_znode(codec.CursorSnapshot.of(self.state), -1, self.config.ranges_in_metadata_max)
            try:
                await self._store.create(self.path, raw)
                self._znode.version = 0
                self._persisted_changes = self.state.changes
                self._persisted_md = md
                self.recovery = {"source": "new", "initialPosition": initial_position}
                self._log(f"cursor {self.name}: created {self.path} at {md} ({initial_position})")
                return
            except NodeExistsError:  # created meanwhile by another broker: read it like any other
                try:
                    data, self._znode.version = await self._store.get(self.path)
                except MetadataError as e:
                    raise TopicError(TopicStatus.METADATA_ERROR,
                                     f"cursor {self.name}: reading {self.path}: {e}") from None
            except NoNodeError:
                parent = self.path.rsplit("/", 1)[0]
                raise TopicError(TopicStatus.TOPIC_NOT_FOUND,
                                 f"cursor {self.name}: managed ledger znode {parent} does not "
                                 f"exist") from None
            except MetadataError as e:
                raise TopicError(TopicStatus.METADATA_ERROR, f"cursor {self.name}: creating {self.path}: {e}") from None
        try:
            znode = codec.decode_znode(data, self.path)
        except codec.CodecError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"cursor {self.name}: {e}") from None
        self._ledger_id = znode.cursor_ledger
        source, reason, found = "znode", "", None
        if znode.cursor_ledger >= 0:
            found, reason = await self._recover_ledger(znode.cursor_ledger)
        if found is not None:
            source = "ledger"
            snapshot = found.snapshot
            self._seq = found.seq
        else:
            snapshot = znode.snapshot
            if reason:
                self._log(f"cursor {self.name}: WARNING {reason}; falling back to the state in {self.path} "
                          f"(mark-delete {snapshot.mark_delete}, {len(snapshot.acked)} ledgers with acks"
                          f"{', left out then: ' + str(znode.left_out) if znode.left_out else ''}): messages "
                          f"acked after that will be delivered again")
        notes = snapshot.restore_into(self.state)
        for note in notes:
            self._log(f"cursor {self.name}: on recovery: {note}")
        self._persisted_changes = self.state.changes
        self._persisted_md = self.state.mark_delete
        self.recovery = {"source": source, "cursorLedger": znode.cursor_ledger,
                         "durationMs": round(self._clock.monotonic_ms() - started, 3)}
        if reason:
            self.recovery["reason"] = reason
        if found is not None:
            self.recovery.update(entryId=found.entry_id, entriesRead=found.entries_read, seq=found.seq)
            if found.skipped:
                self.recovery["skipped"] = list(found.skipped[:10])
        if source == "znode" and znode.left_out:
            self.recovery["leftOut"] = znode.left_out
        if notes:
            self.recovery["corrections"] = notes
        self._log(f"cursor {self.name}: recovered from the {source}"
                  f"{' (cursor ledger ' + str(znode.cursor_ledger) + ')' if source == 'ledger' else ''}: "
                  f"mark-delete {self.state.mark_delete}, {self.state.acked_count} acked entries after it, "
                  f"{self.state.batch_count} partial batches, {self.state.redelivery_tracked} redelivery counts")

    async def _recover_ledger(self, ledger_id: int) -> tuple[codec.Found | None, str]:
        try:
            metadata = await self._ledgers.open_ledger(ledger_id, password=self._password, recover=True)

            async def read(first: int, last: int) -> list[bytes]:
                return [e.payload async for e in self._ledgers.read_entries(ledger_id, first, last,
                                                                           password=self._password)]

            found = await codec.find_last_snapshot(read, metadata.last_entry_id)
        except LedgerError as e:
            if e.status not in GONE:
                raise TopicError(TopicStatus.SERVICE_UNAVAILABLE,
                                 f"cursor {self.name}: cursor ledger {ledger_id} cannot be "
                                 f"read now ({e}); the open fails so that no acknowledgement "
                                 f"is rolled back: retry once its bookies serve it") from None
            return None, f"cursor ledger {ledger_id} is unreadable ({e})"
        if found is None:
            return None, (f"cursor ledger {ledger_id} has no complete snapshot "
                          f"(last entry {metadata.last_entry_id})")
        return found, ""

    # ------------------------------------------------------------------------------------------ reading
    @property
    def mark_delete(self) -> Position:
        return self.state.mark_delete

    @property
    def persisted_mark_delete(self) -> Position:
        return self._persisted_md

    @property
    def read_position(self) -> Position:
        return self.state.read_position

    @read_position.setter
    def read_position(self, pos: Position) -> None:
        self.state.read_position = pos

    def rewind(self) -> None:
        self.state.rewind()

    def is_acked(self, pos: Position) -> bool:
        return self.state.is_acked(pos)

    def acked_batch_indexes(self, pos: Position) -> list[int]:
        return self.state.acked_batch_indexes(pos)

    def redelivery_count(self, pos: Position) -> int:
        return self.state.redelivery_count(pos)

    @property
    def properties(self) -> dict[str, int]:
        return dict(self.state.properties)

    def backlog(self) -> int:
        return self.state.backlog()

    @property
    def dirty(self) -> bool:
        return self.state.changes != self._persisted_changes

    @property
    def closed_cleanly(self) -> bool:
        """Whether close() completed with the whole state where the next owner reads it (the znode, or the closed
        cursor ledger the znode names): only then is every acknowledgement the cursor held at the close durable. A
        close that raised (a metadata or ledger error, a fenced cursor, the broker stopped meanwhile), an abort, or a
        close whose cursor ledger failed with more ranges than the znode takes, is not clean."""
        return self._closed_cleanly

    # ------------------------------------------------------------------------------------------ acks
    def _writable(self) -> None:
        if self._fenced is not None:
            raise TopicError(TopicStatus.TOPIC_FENCED, self._fenced.message)
        if self._status in (CLOSED, DELETED):
            raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, f"cursor {self.name} is {self._status.lower()}")

    def _touch(self) -> None:
        self.state.last_active = self._clock.wall_ms()

    def check(self, pos: Position) -> Position:
        return self.state.check(pos)

    def ack(self, positions: Iterable[Position]) -> int:
        self._writable()
        n = self.state.ack(positions)
        self._touch()
        return n

    def ack_cumulative(self, pos: Position, properties: dict[str, int] | None = None) -> bool:
        self._writable()
        moved = self.state.ack_cumulative(pos, properties)
        self._touch()
        return moved

    def expire_until(self, pos: Position) -> bool:
        self._writable()
        return self.state.expire_until(pos)

    def ack_batch_indexes(self, pos: Position, indexes: Iterable[int], batch_size: int) -> bool:
        self._writable()
        done = self.state.ack_batch_indexes(pos, indexes, batch_size)
        self._touch()
        return done

    def increment_redelivery(self, pos: Position) -> int:
        self._writable()
        return self.state.increment_redelivery(pos)

    def set_property(self, name: str, value: int) -> None:
        self._writable()
        self.state.set_property(name, value)

    async def seek(self, pos: Position) -> None:
        """Reset to pos: acks after it are forgotten, the new state is persisted (ledger and znode) before
        this returns."""
        self._writable()
        async with self._lock:
            self._writable()
            self.state.seek(pos)
            self._touch()
            self._log(f"cursor {self.name}: reset to {self.state.read_position} (mark-delete {self.mark_delete})")
            await self._persist_locked(update_znode=True)

    # ------------------------------------------------------------------------------------------ persisting
    async def persist(self, force: bool = False) -> bool:
        """Write a snapshot if the cursor is dirty and the last persist is at least cursor_persist_interval_ms
        old (force: now, dirty or not). True when a snapshot was written (ledger or znode)."""
        self._writable()
        if not force and (not self.dirty or
                          self._clock.monotonic_ms() - self._last_persist_ms < self.config.cursor_persist_interval_ms):
            return False
        async with self._lock:
            self._writable()
            if not force and not self.dirty:
                return False
            await self._persist_locked()
            return True

    async def _flush_loop(self) -> None:
        interval = self.config.cursor_persist_interval_ms
        while True:
            await self._clock.sleep_ms(interval)
            if self._status in (CLOSED, DELETED, FENCED):
                return
            if not self.dirty:
                continue
            # shielded: close() cancels this task, but a persist under way finishes (close waits for the lock)
            persist = asyncio.ensure_future(self.persist())
            persist.add_done_callback(_retrieved)
            try:
                await asyncio.shield(persist)
            except TopicError as e:
                if e.status is TopicStatus.TOPIC_FENCED:
                    return
                self._log(f"cursor {self.name}: background persist failed: {e}")
            except Exception as e:  # a bug: say so, and keep persisting (a dead flusher would persist nothing)
                self._persist_errors += 1
                self._last_error = f"unexpected {e!r}"
                self._log(f"cursor {self.name}: background persist failed unexpectedly: {e!r}")

    async def _persist_locked(self, update_znode: bool = False) -> None:
        """Persist the current state: to the cursor ledger, else (append failed) to the znode."""
        started = self._clock.monotonic_ms()
        changes = self.state.changes
        snap = codec.CursorSnapshot.of(self.state)
        if snap.mark_delete < self._persisted_md:  # a seek back: from its first write on, a recovery may come back
            self._persisted_md = snap.mark_delete   # with it (whatever the write's outcome), so it is what counts
        self._seq += 1
        packed = codec.pack(snap, self._seq)
        entries = codec.entries_for(packed, self.config.cursor_snapshot_chunk_bytes)
        try:
            rolling = self._handle is not None and self._ledger_entries >= self.config.cursor_ledger_entries_max
            if self._handle is None or rolling:
                written = await self._switch_ledger(snap, packed, entries, "rolled" if rolling else "new")
            else:
                written = await self._append(self._handle, packed, entries)
                if update_znode:
                    await self._write_znode(snap, self._ledger_id)
        except LedgerError as e:
            if e.status is LedgerStatus.FENCED:
                raise self._fence(f"cursor ledger {self._ledger_id} was fenced: another broker recovered it "
                                  f"({e})") from None
            self._check_not_aborted()
            await self._fallback_to_znode(snap, changes, started, f"cursor ledger append failed: {e}")
            return
        self._persisted_changes = changes
        self._persisted_md = snap.mark_delete
        self._last_persist_ms = self._clock.monotonic_ms()
        self._last_persist = {"to": "ledger", "ledger": self._ledger_id, "seq": self._seq,
                              "timestampMs": self._clock.wall_ms(), "entries": written,
                              "bytes": len(packed.compressed), "payloadBytes": packed.payload_bytes,
                              "durationMs": round(self._last_persist_ms - started, 3)}

    async def _append(self, handle, packed: codec.Packed, entries: list[bytes]) -> int:
        futures = [handle.append(e) for e in entries]
        ids = list(await asyncio.gather(*futures))
        written = len(entries)
        if len(entries) > 1:
            await handle.append(codec.marker_entry(packed, list(zip(ids, (len(e) for e in entries)))))
            written += 1
        self._ledger_entries += written
        return written

    async def _switch_ledger(self, snap: codec.CursorSnapshot, packed: codec.Packed, entries: list[bytes],
                             why: str) -> int:
        """A new cursor ledger holding the snapshot, named by the znode (CAS), then the old one deleted."""
        c = self.config
        handle = await self._ledgers.create_ledger(c.ensemble_size, c.write_quorum_size, c.ack_quorum_size,
                                                   password=self._password,
                                                   custom={"bksim.cursor": self.name, "bksim.znode": self.path})
        old_id, old_handle = self._ledger_id, self._handle
        self._ledger_entries = 0
        try:
            written = await self._append(handle, packed, entries)
            await self._write_znode(snap, handle.ledger_id)
        except BaseException:
            self._ledger_entries = 0
            if not self._znode.unsettled:
                await self._delete_quietly(handle.ledger_id, "its snapshot or the znode update failed")
                raise
            # the znode write's answer and its read-back were lost: it may land and name the new ledger, so the
            # ledger stays until a later znode write settles it; the next persist writes the znode first
            handle.abort(f"cursor {self.name}: the znode write naming it has no known outcome")
            self._maybe_named.append(handle.ledger_id)
            if old_handle is not None:
                old_handle.abort(f"cursor {self.name}: its next snapshot goes to a new cursor ledger")
                self._handle = None
            self._log(f"cursor {self.name}: cursor ledger {handle.ledger_id} kept: the znode write naming it may "
                      f"still land")
            raise
        self._handle, self._ledger_id = handle, handle.ledger_id
        self._status = OPEN
        self._last_switch_ms = self._clock.wall_ms()
        self._log(f"cursor {self.name}: cursor ledger {handle.ledger_id} ({why}) named by {self.path}"
                  f"{'; deleting the previous one, ' + str(old_id) if old_id >= 0 else ''}")
        if old_handle is not None:
            old_handle.abort(f"cursor {self.name} moved to cursor ledger {handle.ledger_id}")
        if old_id >= 0:
            await self._delete_quietly(old_id, f"replaced by {handle.ledger_id}")
        return written

    async def _fallback_to_znode(self, snap: codec.CursorSnapshot, changes: int, started: float, why: str) -> None:
        raw, left_out = codec.encode_znode(snap, -1, self.config.ranges_in_metadata_max)
        old_id, old_handle = self._ledger_id, self._handle
        await self._cas(raw)
        self._persisted_md = snap.mark_delete  # the znode always holds the mark-delete (ranges may be left out)
        self._ledger_id, self._handle, self._ledger_entries = -1, None, 0
        self._status = NO_LEDGER
        self._persist_errors += 1
        self._last_error = why
        not_persisted = (f"; NOT persisted: {', '.join(f'{v} {k}' for k, v in left_out.items())} beyond "
                         f"topic.ranges_in_metadata_max={self.config.ranges_in_metadata_max} (those messages "
                         f"would be delivered again after a restart)" if left_out else "")
        self._log(f"cursor {self.name}: {why}; state written to {self.path} instead (mark-delete "
                  f"{snap.mark_delete}){not_persisted}")
        if old_handle is not None:
            old_handle.abort(f"cursor {self.name}: {why}")
        if old_id >= 0:
            await self._delete_quietly(old_id, "the znode holds the state now")
        if not left_out:
            self._persisted_changes = changes
        self._last_persist_ms = self._clock.monotonic_ms()
        self._last_persist = {"to": "znode", "seq": self._seq, "timestampMs": self._clock.wall_ms(),
                              "bytes": len(raw), "durationMs": round(self._last_persist_ms - started, 3),
                              "reason": why, "notPersisted": left_out}

    async def _write_znode(self, snap: codec.CursorSnapshot, cursor_ledger: int) -> dict[str, int]:
        raw, left_out = codec.encode_znode(snap, cursor_ledger, self.config.ranges_in_metadata_max)
        await self._cas(raw)
        return left_out

    def _check_not_aborted(self) -> None:
        if self._aborted:
            raise TopicError(TopicStatus.SERVICE_UNAVAILABLE,
                             f"cursor {self.name} was aborted: nothing more is written")

    async def _cas(self, raw: bytes) -> None:
        self._check_not_aborted()
        try:
            await self._znode.write(raw)
        except ZnodeTaken as e:
            raise self._fence(str(e)) from None
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"cursor {self.name}: writing {self.path}: {e}") from None
        doomed, self._maybe_named = self._maybe_named, []
        for ledger_id in doomed:  # the znode names what was just written: no lost write can name these any more
            await self._delete_quietly(ledger_id, "a lost znode write may have named it; the znode names another")

    def _fence(self, why: str) -> TopicError:
        error = TopicError(TopicStatus.TOPIC_FENCED, f"cursor {self.name}: {why}")
        if self._fenced is None:
            self._fenced = error
            self._status = FENCED
            self._log(f"cursor {self.name}: fenced: {why}; it stops (another broker owns the topic)")
            self._stop_flusher()
            if self._handle is not None:
                self._handle.abort(f"cursor {self.name} fenced")
            if self._on_fenced is not None:
                self._on_fenced(error)
        return error

    async def _delete_quietly(self, ledger_id: int, why: str) -> None:
        try:
            await self._ledgers.delete_ledger(ledger_id, password=self._password)
        except LedgerError as e:
            if e.status is not LedgerStatus.NO_SUCH_LEDGER:
                self._log(f"cursor {self.name}: cursor ledger {ledger_id} ({why}) not deleted: {e}; it leaks")

    def _stop_flusher(self) -> None:
        task, self._flusher = self._flusher, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    # ------------------------------------------------------------------------------------------ closing
    async def close(self) -> None:
        """Clean close: the final state persisted (znode alone when it fits its bounds, else a final snapshot in
        the cursor ledger, then the ledger closed and named by the znode)."""
        self._writable()
        self._stop_flusher()
        async with self._lock:
            self._writable()
            self._touch()
            snap = codec.CursorSnapshot.of(self.state)
            changes = self.state.changes
            bound = self.config.ranges_in_metadata_max
            left_out = False
            if codec.fits_znode(self.state, bound):
                old_id, old_handle = self._ledger_id, self._handle
                await self._write_znode(snap, -1)
                self._ledger_id, self._handle = -1, None
                if old_handle is not None:
                    old_handle.abort(f"cursor {self.name} closed (state in the znode)")
                if old_id >= 0:
                    await self._delete_quietly(old_id, "the cursor closed with its state in the znode")
                self._log(f"cursor {self.name}: closed; state in {self.path} (mark-delete {snap.mark_delete})")
            else:
                if self.dirty or self._handle is None:
                    await self._persist_locked()
                if self._handle is not None:
                    try:
                        await self._ledgers.close_ledger(self._handle.ledger_id, self._password)
                    except LedgerError as e:
                        if e.status is LedgerStatus.FENCED:
                            raise self._fence(f"cursor ledger {self._ledger_id} was fenced ({e})") from None
                        self._log(f"cursor {self.name}: cursor ledger {self._ledger_id} not closed: {e} (the "
                                  f"next owner recovers it)")
                    self._handle = None
                    await self._write_znode(codec.CursorSnapshot.of(self.state), self._ledger_id)
                    self._log(f"cursor {self.name}: closed; state in cursor ledger {self._ledger_id} "
                              f"({self.state.range_count()} ranges > {bound} for the znode)")
                else:
                    left_out = bool(self._last_persist.get("notPersisted"))
                    self._log(f"cursor {self.name}: closed; its cursor ledger failed: the znode holds what fits "
                              f"({self._last_persist.get('notPersisted')} left out)")
            # clean: nothing left out, and no ack slipped in while the close waited for its writes
            self._closed_cleanly = not left_out and self.state.changes == changes
            self._persisted_changes = self.state.changes
            self._persisted_md = self.state.mark_delete
            self._status = CLOSED

    async def delete(self) -> None:
        """Remove the cursor: znode first (CAS), then its cursor ledger."""
        self._writable()
        self._stop_flusher()
        async with self._lock:
            self._writable()
            try:
                await self._znode.delete()
            except ZnodeTaken as e:
                raise self._fence(str(e)) from None
            except MetadataError as e:
                raise TopicError(TopicStatus.METADATA_ERROR, f"cursor {self.name}: deleting {self.path}: {e}") from None
            if self._handle is not None:
                self._handle.abort(f"cursor {self.name} deleted")
                self._handle = None
            if self._ledger_id >= 0:
                await self._delete_quietly(self._ledger_id, "the cursor was deleted")
            self._status = DELETED
            self._log(f"cursor {self.name}: deleted")

    def abort(self, reason: str) -> None:
        """Stop without writing anything: the cursor ledger stays as it is (OPEN) for the next owner to recover;
        acks since the last persist are lost (they will be redelivered)."""
        self._aborted = True
        self._stop_flusher()
        if self._handle is not None:
            self._handle.abort(reason)
            self._handle = None
        if self._status not in (DELETED, FENCED):
            self._status = CLOSED
        self._log(f"cursor {self.name}: aborted ({reason}); nothing persisted")

    # ------------------------------------------------------------------------------------------ stats
    def stats_internal(self) -> dict:
        s = self.state
        ranges = s.range_count()
        shown = [f"({a}..{b}]" for a, b in s.ranges(STATS_RANGES_MAX)]
        if ranges > len(shown):
            shown.append(f"...({ranges - len(shown)} more)")
        return {
            "markDeletePosition": str(s.mark_delete),
            "persistentMarkDeletePosition": str(self._persisted_md),
            "readPosition": str(s.read_position),
            "cursorLedger": self._ledger_id,
            "cursorLedgerLastEntry": self._ledger_entries - 1 if self._handle is not None else -1,
            "individuallyDeletedMessages": "[" + ", ".join(shown) + "]",
            "totalNonContiguousDeletedMessagesRange": ranges,
            "individuallyDeletedEntries": s.acked_count,
            "batchDeletedIndexes": s.batch_count,
            "redeliveryCounts": s.redelivery_tracked,
            "redeliveryCountsUntracked": s.redelivery_counts_untracked,
            "numberOfEntriesSinceFirstNotAckedMessage": self.layout.entries_between(s.mark_delete, s.read_position),
            "backlog": s.backlog(),
            "state": self._status,
            "properties": dict(s.properties),
            "lastActive": s.last_active,
            "lastLedgerSwitchTimestamp": self._last_switch_ms,
            "dirty": self.dirty,
            "lastPersist": dict(self._last_persist),
            "persistErrors": self._persist_errors,
            "lastPersistError": self._last_error,
            "recovery": dict(self.recovery),
            "memoryBytes": s.memory_bytes(),
        }


def _retrieved(task: asyncio.Future) -> None:
    """Done callback of a shielded persist: its exception is handled by whoever awaited it, if anyone still did."""
    if not task.cancelled():
        task.exception()
