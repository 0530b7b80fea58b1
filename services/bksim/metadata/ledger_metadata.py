"""Ledger metadata (PROTOCOL.md §3): the value stored at a ledger's znode, its transitions and its bytes.

A `LedgerMetadata` is a frozen value, validated on construction (ValueError naming the field):

- E >= Qw >= Qa >= 1;
- segments: at least one; the first starts at entry 0; first_entry_ids strictly increase; every ensemble
  holds exactly E distinct, non-empty bookie ids;
- OPEN and IN_RECOVERY: last_entry_id = -1 and length = 0 (the end is known only once CLOSED);
- CLOSED: last_entry_id >= -1, length >= 0, an empty ledger (-1) has length 0, and no segment starts after
  last_entry_id + 1 (a segment starts at LAC + 1 of the writer that added it, and the close never goes
  below that LAC);
- digest_type "crc32c" or "none"; password bytes; ctime_ms >= 0; custom a str -> str map (read-only).

Transitions (pure: each returns a new value, the caller CASes it onto the znode version it read):

    state         with_state(IN_RECOVERY)   closed(last, length)          with_new_segment(first, ensemble)
    OPEN          -> IN_RECOVERY            -> CLOSED                     -> OPEN, segment added/replaced
    IN_RECOVERY   (already: same value)     -> CLOSED                     -> IN_RECOVERY (recovery write-back)
    CLOSED        LedgerStateError          same values: same value;      LedgerStateError
                                            else LedgerStateError

A new segment starting at the last segment's first_entry_id replaces it (PROTOCOL.md §4 ensemble
change: the segment at LAC + 1 received nothing acknowledged yet).

`with_replaced_bookie(first_entry_id, bookie, replacement)` swaps one bookie of one segment, in any state
(CLOSED included: state, end and the segments' ranges stay): autorecovery's change once the replacement holds
every entry of that segment the replaced bookie held (PROTOCOL.md §6; BookKeeper's replaceEnsembleEntry). Whether a writer may change the
ensemble of an IN_RECOVERY ledger (it may not: it is fenced) is the protocol's decision, not this module's.

Bytes: compact JSON with sorted keys (the same value always gives the same bytes), "format_version": 1,
the password in base64. `decode` raises MetadataFormatError saying what is wrong for anything else:
garbage, a missing or unknown field, a wrong type, an unknown format_version, a value that breaks an
invariant above.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import enum
import json
import types
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from bksim.ledger.quorum import write_set_indexes
from bksim.model.digest import DIGEST_CRC32C, DIGEST_NONE, DIGEST_TYPES
from bksim.model.errors import LedgerStateError, MetadataFormatError

FORMAT_VERSION = 1

__all__ = ["FORMAT_VERSION", "DIGEST_CRC32C", "DIGEST_NONE", "DIGEST_TYPES", "LedgerState", "Segment",
           "LedgerMetadata", "write_set_indexes", "encode", "decode"]


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Segment:
    """The ensemble that stores entries from `first_entry_id` until the next segment's first entry."""
    first_entry_id: int
    ensemble: tuple[str, ...]

    def __post_init__(self) -> None:
        if not _is_int(self.first_entry_id) or self.first_entry_id < 0:
            raise ValueError(f"segment first_entry_id must be an int >= 0, got {self.first_entry_id!r}")
        if not isinstance(self.ensemble, tuple):
            object.__setattr__(self, "ensemble", tuple(self.ensemble))
        if not self.ensemble:
            raise ValueError(f"segment at entry {self.first_entry_id} has an empty ensemble")
        for bookie in self.ensemble:
            if not isinstance(bookie, str) or not bookie:
                raise ValueError(f"segment at entry {self.first_entry_id}: bookie id {bookie!r} is not a "
                                 f"non-empty string")
        if len(set(self.ensemble)) != len(self.ensemble):
            raise ValueError(f"segment at entry {self.first_entry_id} names a bookie twice: {list(self.ensemble)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    segments: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = DIGEST_CRC32C
    password: bytes = field(default=b"", repr=False)  # never in logs
    ctime_ms: int = 0
    custom: Mapping[str, str] = field(default_factory=dict, hash=False)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.segments, tuple):
            object.__setattr__(self, "segments", tuple(self.segments))
        try:
            custom = dict(self.custom)
        except (TypeError, ValueError):
            raise ValueError(f"custom metadata must be a str -> str mapping, got {self.custom!r}") from None
        object.__setattr__(self, "custom", types.MappingProxyType(custom))
        self._validate()

    def _validate(self) -> None:
        if self.format_version != FORMAT_VERSION or not _is_int(self.format_version):
            raise ValueError(f"format_version {self.format_version!r} is not {FORMAT_VERSION}")
        e, qw, qa = self.ensemble_size, self.write_quorum_size, self.ack_quorum_size
        if not (_is_int(e) and _is_int(qw) and _is_int(qa)) or not e >= qw >= qa >= 1:
            raise ValueError(f"need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, got "
                             f"E={e!r} Qw={qw!r} Qa={qa!r}")
        if not isinstance(self.state, LedgerState):
            raise ValueError(f"state {self.state!r} is not a LedgerState")
        if not self.segments:
            raise ValueError("a ledger has at least one segment")
        previous = -1
        for segment in self.segments:
            if not isinstance(segment, Segment):
                raise ValueError(f"segment {segment!r} is not a Segment")
            if previous == -1 and segment.first_entry_id != 0:
                raise ValueError(f"the first segment starts at entry {segment.first_entry_id}, not 0")
            if segment.first_entry_id <= previous:
                raise ValueError(f"segment first_entry_ids must strictly increase, got "
                                 f"{[s.first_entry_id for s in self.segments]}")
            if len(segment.ensemble) != e:
                raise ValueError(f"segment at entry {segment.first_entry_id} has {len(segment.ensemble)} "
                                 f"bookies, ensemble_size is {e}")
            previous = segment.first_entry_id
        if not _is_int(self.last_entry_id) or not _is_int(self.length):
            raise ValueError(f"last_entry_id and length are ints, got {self.last_entry_id!r}, {self.length!r}")
        if self.state is LedgerState.CLOSED:
            if self.last_entry_id < -1 or self.length < 0:
                raise ValueError(f"CLOSED ledger: last_entry_id {self.last_entry_id} < -1 or length "
                                 f"{self.length} < 0")
            if self.last_entry_id == -1 and self.length != 0:
                raise ValueError(f"CLOSED empty ledger (last_entry_id -1) with length {self.length}")
            if self.segments[-1].first_entry_id > self.last_entry_id + 1:
                raise ValueError(f"CLOSED at last_entry_id {self.last_entry_id} but a segment starts at "
                                 f"{self.segments[-1].first_entry_id}")
        elif (self.last_entry_id, self.length) != (-1, 0):
            raise ValueError(f"{self.state.name} ledger with last_entry_id {self.last_entry_id} and length "
                             f"{self.length}: only a CLOSED ledger has an end")
        if self.digest_type not in DIGEST_TYPES:
            raise ValueError(f"digest_type {self.digest_type!r} is not one of {list(DIGEST_TYPES)}")
        if not isinstance(self.password, bytes):
            raise ValueError(f"password must be bytes, got {type(self.password).__name__}")
        if not _is_int(self.ctime_ms) or self.ctime_ms < 0:
            raise ValueError(f"ctime_ms must be an int >= 0, got {self.ctime_ms!r}")
        for key, value in self.custom.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"custom metadata is str -> str, got {key!r}: {value!r}")

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def new(cls, ensemble: Sequence[str], write_quorum_size: int, ack_quorum_size: int, *,
            password: bytes = b"", digest_type: str = DIGEST_CRC32C, ctime_ms: int = 0,
            custom: Mapping[str, str] | None = None) -> "LedgerMetadata":
        """A new OPEN ledger: one segment starting at entry 0, E = len(ensemble)."""
        return cls(ensemble_size=len(ensemble), write_quorum_size=write_quorum_size,
                   ack_quorum_size=ack_quorum_size, segments=(Segment(0, tuple(ensemble)),),
                   password=password, digest_type=digest_type, ctime_ms=ctime_ms, custom=custom or {})

    def _replace(self, **changes: Any) -> "LedgerMetadata":
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return LedgerMetadata(**values)

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The current ensemble: the last segment's."""
        return self.segments[-1].ensemble

    def segment_for(self, entry_id: int) -> Segment:
        """The segment holding `entry_id`: the last one starting at or before it."""
        if not _is_int(entry_id) or entry_id < 0:
            raise ValueError(f"entry id must be an int >= 0, got {entry_id!r}")
        firsts = [s.first_entry_id for s in self.segments]
        return self.segments[bisect.bisect_right(firsts, entry_id) - 1]

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        return self.segment_for(entry_id).ensemble

    def write_set(self, entry_id: int) -> list[str]:
        """The bookies that store `entry_id`: indexes (e + i) mod E, i < Qw, of its segment's ensemble."""
        ensemble = self.ensemble_for(entry_id)
        return [ensemble[i] for i in write_set_indexes(entry_id, self.ensemble_size, self.write_quorum_size)]

    # -- transitions ---------------------------------------------------------------------------------------

    def with_state(self, state: LedgerState) -> "LedgerMetadata":
        """OPEN -> IN_RECOVERY (recovery step 1); IN_RECOVERY -> IN_RECOVERY is the same value.

        CLOSED is reached only through `closed()` (it needs the end); nothing leaves CLOSED or goes back
        to OPEN: LedgerStateError naming both states.
        """
        allowed = {LedgerState.OPEN: (LedgerState.IN_RECOVERY,),
                   LedgerState.IN_RECOVERY: (LedgerState.IN_RECOVERY,)}
        if state not in allowed.get(self.state, ()):
            hint = " (use closed(last_entry_id, length))" if state is LedgerState.CLOSED else ""
            raise LedgerStateError(f"ledger metadata cannot go from {self.state.name} to {state.name}{hint}")
        return self if state is self.state else self._replace(state=state)

    def closed(self, last_entry_id: int, length: int) -> "LedgerMetadata":
        """CLOSED with this end. From OPEN or IN_RECOVERY; closing a CLOSED ledger succeeds (returns the
        same value) only with identical last_entry_id and length, else LedgerStateError: the end of a
        closed ledger never changes (ClosedLedgerIsImmutable)."""
        if self.state is LedgerState.CLOSED:
            if (last_entry_id, length) == (self.last_entry_id, self.length):
                return self
            raise LedgerStateError(
                f"ledger is already CLOSED at last_entry_id {self.last_entry_id} length {self.length}; cannot "
                f"close it at last_entry_id {last_entry_id} length {length} (another client recovered it)")
        return self._replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_new_segment(self, first_entry_id: int, ensemble: Sequence[str]) -> "LedgerMetadata":
        """A new last segment {first_entry_id, ensemble}; it replaces the last segment when that one starts at
        the same entry, and may not start before it. Not allowed on a CLOSED ledger (LedgerStateError)."""
        if self.state is LedgerState.CLOSED:
            raise LedgerStateError(f"ledger is CLOSED at last_entry_id {self.last_entry_id}: its ensembles "
                                   f"never change")
        segment = Segment(first_entry_id, tuple(ensemble))
        last = self.segments[-1]
        if segment.first_entry_id < last.first_entry_id:
            raise ValueError(f"a new segment at entry {first_entry_id} would start before the last segment "
                             f"(entry {last.first_entry_id})")
        kept = self.segments[:-1] if segment.first_entry_id == last.first_entry_id else self.segments
        return self._replace(segments=(*kept, segment))

    def with_replaced_bookie(self, first_entry_id: int, bookie: str, replacement: str) -> "LedgerMetadata":
        """The segment starting at `first_entry_id` with `replacement` in `bookie`'s place (the same ensemble
        index), everything else unchanged. ValueError when no segment starts there, it does not name `bookie`,
        or it already names `replacement`."""
        for i, segment in enumerate(self.segments):
            if segment.first_entry_id == first_entry_id:
                break
        else:
            raise ValueError(f"no segment starts at entry {first_entry_id}")
        if bookie not in segment.ensemble:
            raise ValueError(f"segment at entry {first_entry_id} does not name {bookie}: {list(segment.ensemble)}")
        ensemble = tuple(replacement if b == bookie else b for b in segment.ensemble)
        changed = Segment(first_entry_id, ensemble)  # ValueError: `replacement` is already in the ensemble
        return self._replace(segments=(*self.segments[:i], changed, *self.segments[i + 1:]))


# -- bytes -----------------------------------------------------------------------------------------------------

_FIELDS = {
    "format_version": int, "ensemble_size": int, "write_quorum_size": int, "ack_quorum_size": int,
    "state": str, "last_entry_id": int, "length": int, "segments": list, "digest_type": str,
    "password": str, "ctime_ms": int, "custom": dict,
}


def encode(metadata: LedgerMetadata) -> bytes:
    """Compact JSON, sorted keys: equal values give equal bytes."""
    doc = {
        "format_version": metadata.format_version,
        "ensemble_size": metadata.ensemble_size,
        "write_quorum_size": metadata.write_quorum_size,
        "ack_quorum_size": metadata.ack_quorum_size,
        "state": metadata.state.value,
        "last_entry_id": metadata.last_entry_id,
        "length": metadata.length,
        "segments": [{"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)} for s in metadata.segments],
        "digest_type": metadata.digest_type,
        "password": base64.b64encode(metadata.password).decode("ascii"),
        "ctime_ms": metadata.ctime_ms,
        "custom": dict(metadata.custom),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode(data: bytes, source: str = "ledger metadata") -> LedgerMetadata:
    """Parse and validate; MetadataFormatError naming `source` and the problem for anything else."""
    def bad(problem: str) -> MetadataFormatError:
        return MetadataFormatError(f"{source} is not valid ledger metadata: {problem}")

    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, or an integer of more digits than Python converts
        raise bad(f"not UTF-8 JSON ({e})") from None
    except RecursionError:
        raise bad("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise bad(f"not a JSON object but {type(doc).__name__}")
    if "format_version" not in doc:
        raise bad("no format_version")
    version = doc["format_version"]
    if version != FORMAT_VERSION or not _is_int(version):
        raise MetadataFormatError(f"{source} has ledger metadata format_version {version!r}; this bksim reads "
                                  f"format_version {FORMAT_VERSION} only")
    missing = sorted(set(_FIELDS) - set(doc))
    unknown = sorted(set(doc) - set(_FIELDS))
    if missing:
        raise bad(f"missing field(s) {missing}")
    if unknown:
        raise bad(f"unknown field(s) {unknown}")
    for name, kind in _FIELDS.items():
        value = doc[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise bad(f"field {name!r} is {type(value).__name__}, expected {kind.__name__}")
    try:
        state = LedgerState(doc["state"])
    except ValueError:
        raise bad(f"state {doc['state']!r} is not one of {[s.value for s in LedgerState]}") from None
    try:
        password = base64.b64decode(doc["password"], validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad(f"password is not base64 ({e})") from None
    segments = []
    for raw in doc["segments"]:
        if not isinstance(raw, dict) or set(raw) != {"first_entry_id", "ensemble"}:
            raise bad(f"segment {raw!r} is not {{first_entry_id, ensemble}}")
        if not isinstance(raw["ensemble"], list):
            raise bad(f"segment {raw!r}: ensemble is not a list")
        try:
            segments.append(Segment(raw["first_entry_id"], tuple(raw["ensemble"])))
        except ValueError as e:
            raise bad(str(e)) from None
    try:
        return LedgerMetadata(
            format_version=version, ensemble_size=doc["ensemble_size"], write_quorum_size=doc["write_quorum_size"],
            ack_quorum_size=doc["ack_quorum_size"], state=state, last_entry_id=doc["last_entry_id"],
            length=doc["length"], segments=tuple(segments), digest_type=doc["digest_type"], password=password,
            ctime_ms=doc["ctime_ms"], custom=doc["custom"])
    except ValueError as e:
        raise bad(str(e)) from None
