"""The ledger client a broker embeds (PROTOCOL.md §4): create, write, close, open (with or without recovery),
read, delete and list ledgers, over the MetadataStore and BookieTransport ports.

Owns: the handles of the ledgers this broker writes (at most `ledgers_open_max`), bookie placement (random,
from the writable registrations under /ledgers/available, drawn from the `rng` the caller passes in so a
simulator seed decides it), the placement quarantine (below), password checks (a client must present the ledger's password, as BookKeeper's
client does on open), and the translation of every refusal into a LedgerError with a status a client can act
on:

    BAD_REQUEST         quorum sizes (need E >= Qw >= Qa >= 1), a negative ledger id, an oversized payload, a bad
                        range (an empty payload is a valid entry, as in BookKeeper)
    NOT_ENOUGH_BOOKIES  fewer writable bookies than E (create, or no replacement during an ensemble change)
    NO_SUCH_LEDGER      no metadata for the id
    UNAUTHORIZED        wrong password
    LEDGER_CLOSED       append to a closed (or closing) ledger
    NOT_WRITER          append to or close a ledger this broker does not write (open ledgers are written only
                        by the broker that created them; another broker must recover it)
    FENCED              the writer was fenced (another client recovered or closed the ledger)
    READ_BEYOND_LAC     a read above the last confirmed entry
    READ_FAILED         an entry (or the LAC) unreadable on every replica: the truth is unknown
    RECOVERY_FAILED     recovery could not decide safely; the ledger stays IN_RECOVERY, retry later
    TOO_MANY_REQUESTS   a bound was reached (open ledgers)
    METADATA_ERROR      the metadata store failed (connection loss, session expired)

Placement quarantine (BookKeeper's bookieQuarantineTime): every bookie call of this service's writers, recoveries
and reads that ends without an answer (BookieUnreachable: refused, broken, past its deadline) is counted against
that bookie (`note_bookie_failure`); `quarantine_errors` of them within `quarantine_window_ms` quarantine it for
`quarantine_ms`: it is not chosen for new ensembles or as a replacement, so a blackholed but still registered
bookie stops stalling writers. It still serves reads and keeps its place in existing ensembles. When leaving
the quarantined bookies out would leave too few candidates, placement falls back to all writable bookies (as
BookKeeper does) and logs it. `quarantined()` shows who is out and until when.

The service keeps no state a restart would need: everything lives in ZooKeeper and on the bookies. A broker
that dies leaves its ledgers OPEN; any broker recovers them (open with recovery).
"""
from __future__ import annotations

import collections
import hmac
from typing import AsyncIterator, Callable, Protocol, Sequence

from bksim.broker.handle import LedgerHandle
from bksim.broker.reader import read_entries, read_lac
from bksim.broker.recovery import RecoveryRun
from bksim.formats.entry import Entry, master_key
from bksim.ledger.quorum import check_quorum_sizes
from bksim.ledger.recovery import LedgerRecovery
from bksim.ledger.writer import LedgerWriter
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.paths import AVAILABLE, READONLY_CHILD
from bksim.metadata.ledger_manager import (allocate_ledger_id, create_ledger_metadata, delete_ledger_metadata,
                                  list_ledger_ids, read_ledger_metadata, update_ledger_metadata)
from bksim.model.config import BrokerConfig
from bksim.model.digest import DIGEST_CRC32C, DIGEST_TYPES
from bksim.model.errors import (BksimError, LedgerError, MetadataError, NodeExistsError,
                                NoNodeError)
from bksim.model.status import LedgerStatus
from bksim.ports.bookie_transport import BookieTransport
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

CREATE_ATTEMPTS_MAX = 5  # id allocations that may meet an existing znode (a hand-reset counter) before giving up


class Rng(Protocol):
    def choice(self, seq: Sequence[str]) -> str: ...

    def sample(self, population: Sequence[str], k: int) -> list[str]: ...


def _metadata_error(e: MetadataError) -> LedgerError:
    return LedgerError(LedgerStatus.METADATA_ERROR, str(e))


class LedgerService:
    def __init__(self, *, store: MetadataStore, transport: BookieTransport, rng: Rng, clock: Clock,
                 config: BrokerConfig = BrokerConfig(), log: Callable[[str], None] = lambda line: None) -> None:
        self.store = store
        self.transport = transport
        self._rng = rng
        self._clock = clock
        self.config = config
        self._log = log
        self._handles: dict[int, LedgerHandle] = {}
        # why recently ended handles ended (closed, fenced, ...), so a late append gets that answer rather than
        # NOT_WRITER; bounded like the handles themselves, oldest forgotten first
        self._ended: collections.OrderedDict[int, tuple[LedgerError, LedgerMetadata]] = collections.OrderedDict()
        self._recoveries: list[LedgerRecovery] = []  # recoveries running now, oldest first
        # placement quarantine: bookie -> monotonic times of its recent failed calls (at most quarantine_errors),
        # and bookie -> the monotonic time its quarantine ends
        self._failures: dict[str, collections.deque[float]] = {}
        self._quarantine: dict[str, float] = {}
        self._fallback_logged: frozenset[str] = frozenset()  # the quarantined set of the last fallback logged
        # counters since start (exported as metrics): ledgers created, ensemble changes stored by this broker's
        # writers and recoveries, recoveries that closed a ledger / failed, writers of this broker fenced
        self.stats = {"ledgers_created": 0, "ensemble_changes": 0, "recoveries": 0, "recoveries_failed": 0,
                      "writers_fenced": 0}

    # -- bookies -------------------------------------------------------------------------------------------
    async def writable_bookies(self) -> list[str]:
        """Bookie ids registered as writable, sorted."""
        try:
            return [b for b in await self.store.children(AVAILABLE) if b != READONLY_CHILD]
        except NoNodeError:
            return []

    async def readonly_bookies(self) -> list[str]:
        try:
            return await self.store.children(f"{AVAILABLE}/{READONLY_CHILD}")
        except NoNodeError:
            return []

    # -- placement and quarantine ---------------------------------------------------------------------------
    def note_bookie_failure(self, bookie: str) -> None:
        """A call to `bookie` got no answer; `quarantine_errors` of them within the window quarantine it."""
        errors_max = self.config.quarantine_errors
        if errors_max <= 0:
            return
        now = self._clock.monotonic_ms()
        times = self._failures.get(bookie)
        if times is None:
            times = self._failures[bookie] = collections.deque(maxlen=errors_max)
        times.append(now)
        while times and times[0] <= now - self.config.quarantine_window_ms:
            times.popleft()
        if len(times) < errors_max:
            return
        del self._failures[bookie]
        if self._quarantine.get(bookie, -1.0) <= now:
            self._log(f"bookie {bookie}: quarantined for {self.config.quarantine_ms} ms ({errors_max} calls "
                      f"unanswered within {self.config.quarantine_window_ms} ms): not chosen for new ensembles "
                      f"or replacements")
        self._quarantine[bookie] = now + self.config.quarantine_ms

    def quarantined(self) -> dict[str, float]:
        """Quarantined bookies -> the time (the clock's monotonic_ms) their quarantine ends."""
        now = self._clock.monotonic_ms()
        for bookie in [b for b, until in self._quarantine.items() if until <= now]:
            del self._quarantine[bookie]
        return dict(self._quarantine)

    async def choose_bookies(self, count: int, *, exclude: Sequence[str] = ()) -> list[str]:
        """`count` distinct writable bookies, none in `exclude`, drawn at random, quarantined ones only when
        too few others remain. LedgerError(NOT_ENOUGH_BOOKIES) when even they are too few; MetadataError
        from the store."""
        writable = [b for b in await self.writable_bookies() if b not in exclude]
        candidates = self._unquarantined(writable, count, f"{count} bookie(s)")
        if len(candidates) < count:
            raise LedgerError(LedgerStatus.NOT_ENOUGH_BOOKIES,
                              f"{count} bookie(s) needed, {len(writable)} writable registered outside "
                              f"{list(exclude)}: {writable}")
        return self._rng.sample(candidates, count)

    async def replacement_candidates(self, ensemble: Sequence[str]) -> list[str]:
        """Writable bookies a writer of `ensemble` may pick replacements from (it leaves out the ensemble
        itself): without the quarantined ones while they leave at least as many candidates outside the
        ensemble as the ensemble has members that are quarantined or not writable (those it may be
        replacing), at least one."""
        writable = await self.writable_bookies()
        quarantined = self.quarantined()
        if not quarantined:
            return writable
        usable = set(writable) - set(quarantined)
        needed = max(1, sum(1 for b in ensemble if b not in usable))
        outside = [b for b in writable if b not in ensemble]
        kept = self._unquarantined(outside, needed, f"a replacement in {list(ensemble)}")
        return [b for b in writable if b in ensemble or b in kept]

    def _unquarantined(self, candidates: list[str], needed: int, what: str) -> list[str]:
        """`candidates` without the quarantined bookies, or all of them when that leaves fewer than
        `needed` (logged). Order kept, so that with no quarantine the rng draws as without one."""
        quarantined = self.quarantined()
        kept = [b for b in candidates if b not in quarantined]
        if len(kept) >= needed or len(kept) == len(candidates):
            return kept
        if self._fallback_logged != frozenset(quarantined):  # once per quarantined set: writers ask on each failure
            self._fallback_logged = frozenset(quarantined)
            self._log(f"placement of {what}: only {len(kept)} writable bookie(s) outside quarantine "
                      f"({sorted(b for b in candidates if b in quarantined)} quarantined); using quarantined ones "
                      f"too")
        return candidates

    # -- writing ---------------------------------------------------------------------------------------------
    async def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, *,
                            password: bytes, digest_type: str = DIGEST_CRC32C,
                            custom: dict[str, str] | None = None) -> LedgerHandle:
        try:
            check_quorum_sizes(ensemble_size, write_quorum_size, ack_quorum_size)
        except (ValueError, BksimError) as e:
            raise LedgerError(LedgerStatus.BAD_REQUEST, str(e)) from None
        if digest_type not in DIGEST_TYPES:
            raise LedgerError(LedgerStatus.BAD_REQUEST,
                              f"digest type {digest_type!r} is not one of {list(DIGEST_TYPES)}")
        if len(self._handles) >= self.config.ledgers_open_max:
            raise LedgerError(LedgerStatus.TOO_MANY_REQUESTS,
                              f"this broker already writes {len(self._handles)} ledgers "
                              f"(broker.ledgers_open_max)")
        try:
            writable = await self.writable_bookies()
            if len(writable) < ensemble_size:
                raise LedgerError(LedgerStatus.NOT_ENOUGH_BOOKIES,
                                  f"ensemble of {ensemble_size} needs {ensemble_size} "
                                  f"writable bookies, {len(writable)} registered: {writable}")
            ensemble = self._rng.sample(self._unquarantined(writable, ensemble_size,
                                                            f"an ensemble of {ensemble_size}"), ensemble_size)
            try:
                metadata = LedgerMetadata.new(ensemble, write_quorum_size, ack_quorum_size, password=password,
                                              digest_type=digest_type, ctime_ms=int(self._clock.wall_ms()),
                                              custom=custom or {})
            except ValueError as e:
                raise LedgerError(LedgerStatus.BAD_REQUEST, str(e)) from None
            for _ in range(CREATE_ATTEMPTS_MAX):
                ledger_id = await allocate_ledger_id(self.store)
                try:
                    version = await create_ledger_metadata(self.store, ledger_id, metadata)
                    break
                except NodeExistsError:
                    continue  # the idgen counter was reset by hand: never replace a ledger, take the next id
            else:
                raise LedgerError(LedgerStatus.METADATA_ERROR, "ledger ids collide with existing ledgers")
        except MetadataError as e:
            raise _metadata_error(e) from None
        self._log(f"ledger {ledger_id}: created E={ensemble_size} Qw={write_quorum_size} Qa={ack_quorum_size} "
                  f"on {ensemble}")
        writer = LedgerWriter(ledger_id, ensemble=ensemble, segment_first_entry_id=0,
                              write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size, rng=self._rng,
                              digest_type=digest_type)
        handle = LedgerHandle(writer=writer, payload_bytes_max=self.config.payload_bytes_max,
                              inflight_max=self.config.append_inflight_max, on_done=self._handle_done,
                              **self._driver_args(ledger_id, metadata, version))
        self._handles[ledger_id] = handle
        self.stats["ledgers_created"] += 1
        return handle

    def _driver_args(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> dict:
        return dict(ledger_id=ledger_id, metadata=metadata, version=version, store=self.store,
                    transport=self.transport, master_key=master_key(metadata.password),
                    batch_entries_max=self.config.add_batch_entries_max,
                    requests_per_bookie_max=self.config.add_requests_per_bookie_max,
                    cas_attempts_max=self.config.metadata_cas_attempts_max,
                    writable_bookies=self.replacement_candidates, log=self._log,
                    bookie_failed=self.note_bookie_failure, ensemble_changed=self._note_ensemble_change)

    def _note_ensemble_change(self) -> None:
        self.stats["ensemble_changes"] += 1

    def _handle_done(self, handle: LedgerHandle) -> None:
        if self._handles.get(handle.ledger_id) is handle:
            if handle.error is not None and handle.error.status is LedgerStatus.FENCED:
                self.stats["writers_fenced"] += 1
            del self._handles[handle.ledger_id]
            self._ended[handle.ledger_id] = (handle.error or LedgerError(
                LedgerStatus.LEDGER_CLOSED, f"ledger {handle.ledger_id} is closed"), handle.metadata)
            while len(self._ended) > self.config.ledgers_open_max:
                self._ended.popitem(last=False)

    def handle(self, ledger_id: int) -> LedgerHandle | None:
        """The handle of a ledger this broker writes, if any."""
        return self._handles.get(ledger_id)

    def writer_of(self, ledger_id: int, password: bytes | None = None) -> LedgerHandle:
        """The handle for appending to / closing `ledger_id`, or the LedgerError that says why not. With a
        `password`, a wrong one is UNAUTHORIZED before anything else is told."""
        handle = self._handles.get(ledger_id)
        if handle is not None:
            if password is not None:
                self.check_password(ledger_id, handle.metadata, password)
            return handle
        ended = self._ended.get(ledger_id)
        if ended is not None:
            error, metadata = ended
            if password is not None:
                self.check_password(ledger_id, metadata, password)
            raise LedgerError(error.status, error.message)
        raise LedgerError(LedgerStatus.NOT_WRITER, f"this broker does not write ledger {ledger_id} (only its creator "
                                                   f"writes an open ledger; open it with recovery to close it)")

    async def appender(self, ledger_id: int, password: bytes) -> LedgerHandle:
        """writer_of for an Append call, with the precise reason when this broker has no handle: UNAUTHORIZED,
        NO_SUCH_LEDGER, LEDGER_CLOSED, or NOT_WRITER (open, written by another broker)."""
        try:
            return self.writer_of(ledger_id, password)
        except LedgerError as e:
            if e.status is not LedgerStatus.NOT_WRITER:
                raise
        metadata, _ = await self.metadata(ledger_id, password)
        if metadata.is_closed:
            raise LedgerError(LedgerStatus.LEDGER_CLOSED, f"ledger {ledger_id} is closed")
        return self.writer_of(ledger_id, password)

    async def close_ledger(self, ledger_id: int, password: bytes) -> LedgerMetadata:
        """Close a ledger this broker writes; closing an already CLOSED ledger returns its metadata."""
        handle = self._handles.get(ledger_id)
        if handle is None:
            metadata, _ = await self.metadata(ledger_id, password)
            if metadata.is_closed:
                return metadata
            self.writer_of(ledger_id)  # raises NOT_WRITER
        self.check_password(ledger_id, handle.metadata, password)
        return await handle.close()

    # -- opening and recovery ---------------------------------------------------------------------------------
    async def metadata(self, ledger_id: int, password: bytes | None = None) -> tuple[LedgerMetadata, int]:
        if ledger_id < 0:  # every call naming a ledger comes here first (ids are 0..2^63-1)
            raise LedgerError(LedgerStatus.BAD_REQUEST, f"invalid ledger id {ledger_id}")
        try:
            metadata, version = await read_ledger_metadata(self.store, ledger_id)
        except NoNodeError:
            raise LedgerError(LedgerStatus.NO_SUCH_LEDGER, f"ledger {ledger_id} does not exist") from None
        except MetadataError as e:
            raise _metadata_error(e) from None
        if password is not None:
            self.check_password(ledger_id, metadata, password)
        return metadata, version

    @staticmethod
    def check_password(ledger_id: int, metadata: LedgerMetadata, password: bytes) -> None:
        if not hmac.compare_digest(master_key(password), master_key(metadata.password)):  # constant time
            raise LedgerError(LedgerStatus.UNAUTHORIZED, f"wrong password for ledger {ledger_id}")

    async def open_ledger(self, ledger_id: int, *, password: bytes, recover: bool) -> LedgerMetadata:
        """Without recovery: the metadata as it is (a reader of an open ledger reads up to the LAC). With
        recovery: fence the writer and close the ledger (PROTOCOL.md §4), returning the CLOSED metadata."""
        if recover:
            return await self.recover_ledger(ledger_id, password=password)
        metadata, _ = await self.metadata(ledger_id, password)
        return metadata

    async def recover_ledger(self, ledger_id: int, *, password: bytes) -> LedgerMetadata:
        metadata, _ = await self.metadata(ledger_id, password)
        if metadata.is_closed:
            return metadata
        handle = self._handles.get(ledger_id)
        if handle is not None:  # recovering our own ledger: our writer is about to be fenced anyway
            handle.abort(f"ledger {ledger_id} is being recovered by this broker")
        try:
            metadata, version = await update_ledger_metadata(self.store, ledger_id, _to_recovery,
                                                             attempts_max=self.config.metadata_cas_attempts_max)
        except MetadataError as e:
            raise _metadata_error(e) from None
        if metadata.is_closed:
            return metadata
        self._log(f"ledger {ledger_id}: recovery started (segments "
                  f"{[(s.first_entry_id, list(s.ensemble)) for s in metadata.segments]})")
        recovery = LedgerRecovery(ledger_id, segments=[(s.first_entry_id, s.ensemble) for s in metadata.segments],
                                  write_quorum_size=metadata.write_quorum_size,
                                  ack_quorum_size=metadata.ack_quorum_size, rng=self._rng,
                                  digest_type=metadata.digest_type, read_window=self.config.read_window_max)
        self._recoveries.append(recovery)
        try:
            run = RecoveryRun(recovery=recovery, **self._driver_args(ledger_id, metadata, version))
            closed = await run.run()
            self.stats["recoveries"] += 1
        except BaseException:
            self.stats["recoveries_failed"] += 1
            raise
        finally:
            self._recoveries.remove(recovery)
        self._log(f"ledger {ledger_id}: recovered and CLOSED at last_entry_id {closed.last_entry_id} "
                  f"(recovered LAC {recovery.recovered_lac}, {len(recovery.found)} entries written back)")
        return closed

    # -- reading ------------------------------------------------------------------------------------------------
    async def read_lac(self, ledger_id: int, *, password: bytes) -> int:
        handle = self._handles.get(ledger_id)
        if handle is not None:
            self.check_password(ledger_id, handle.metadata, password)
            return handle.last_add_confirmed  # the writer knows best
        metadata, _ = await self.metadata(ledger_id, password)
        return await read_lac(self.transport, ledger_id, metadata, bookie_failed=self.note_bookie_failure)

    async def read_entries(self, ledger_id: int, first: int, last: int, *, password: bytes) -> AsyncIterator[Entry]:
        """Entries first..last in order; `last` -1 means "up to the LAC". Raises READ_BEYOND_LAC above it."""
        metadata, _ = await self.metadata(ledger_id, password)
        lac = await self.read_lac(ledger_id, password=password)
        if last == -1:
            last = lac
        if first < 0 or last < first - 1:
            raise LedgerError(LedgerStatus.BAD_REQUEST, f"bad range {first}..{last}")
        if last > lac:
            raise LedgerError(LedgerStatus.READ_BEYOND_LAC,
                              f"ledger {ledger_id}: entry {last} is above the last confirmed "
                              f"entry {lac}")
        if last - first + 1 > self.config.read_entries_max:
            raise LedgerError(LedgerStatus.BAD_REQUEST,
                              f"{last - first + 1} entries asked, at most "
                              f"{self.config.read_entries_max} per call (broker.read_entries_max)")
        handle = self._handles.get(ledger_id)
        if handle is not None:
            metadata = handle.metadata  # newer segments than the znode we read may exist only here
        async for entry in read_entries(self.transport, ledger_id, metadata, first, last,
                                        window=self.config.read_window_max,
                                        speculative_ms=self.config.speculative_read_ms,
                                        bookie_failed=self.note_bookie_failure):
            yield entry

    # -- the rest -------------------------------------------------------------------------------------------------
    async def delete_ledger(self, ledger_id: int, *, password: bytes) -> None:
        await self.metadata(ledger_id, password)
        handle = self._handles.get(ledger_id)
        if handle is not None:
            handle.abort(f"ledger {ledger_id} was deleted")
        try:
            await delete_ledger_metadata(self.store, ledger_id)
        except NoNodeError:
            raise LedgerError(LedgerStatus.NO_SUCH_LEDGER, f"ledger {ledger_id} does not exist") from None
        except MetadataError as e:
            raise _metadata_error(e) from None
        self._log(f"ledger {ledger_id}: deleted")

    async def list_ledgers(self) -> list[int]:
        try:
            return await list_ledger_ids(self.store)
        except MetadataError as e:
            raise _metadata_error(e) from None

    @property
    def open_handles(self) -> list[LedgerHandle]:
        return list(self._handles.values())

    @property
    def running_recoveries(self) -> list[LedgerRecovery]:
        """The state machines of the recoveries this broker runs now (for invariant checks)."""
        return list(self._recoveries)

    async def close(self, *, close_ledgers: bool) -> None:
        """Shut down. `close_ledgers`: close every ledger this broker writes first (a clean stop, like a
        Pulsar broker unloading its topics); otherwise pending appends fail and the ledgers stay OPEN."""
        for handle in list(self._handles.values()):
            if close_ledgers:
                try:
                    await handle.close()
                except LedgerError as e:
                    self._log(f"ledger {handle.ledger_id}: not closed on shutdown: {e}")
            else:
                handle.abort("the broker is shutting down")
        self._handles.clear()


def _to_recovery(metadata: LedgerMetadata) -> LedgerMetadata | None:
    return None if metadata.is_closed else metadata.with_state(LedgerState.IN_RECOVERY)
