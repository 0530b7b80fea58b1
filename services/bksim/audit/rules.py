"""The audit's rules for one ledger: plain functions over its records from every bookie (both drivers call them).

Input: the ledger's metadata as a `LedgerView` (None when the snapshot does not know the ledger: deleted, or
created after the snapshot), its `Piece`s (one per file that holds records of it: journal blocks and entry
log blocks), and the evidence each bookie's inputs give ("complete": journal ids contiguous from 1, or entry
logs supplied; "partial": older journals missing; a bookie absent from the inputs has none).

The confirmed end: last_entry_id of a CLOSED ledger; for an OPEN or IN_RECOVERY ledger the highest LAC any
copy carries (those entries were acknowledged, so they too must be on Qa bookies). For ids 0..end:

- holders(e) = distinct bookies of e's segment ensemble holding a valid copy (journal record with a good
  CRC, entry digest matching when the digest type is crc32c; or an entry log record). No holder anywhere:
  `gap`; fewer than Qa: `below_ack_quorum`; when a non-holder of the segment lacks complete evidence either
  is `unverifiable` instead (unknown is never no); at least Qa but fewer than Qw: `under_replicated`. Each
  such finding names `missing`: the bookies of e's write set (ensemble indexes (e + i) mod E, i < Qw) without
  a valid copy. Per bookie the result counts `write_set_entries` (ids 0..end whose write set names it) and
  `missing_entries` (those of them it lacks, in gap / below_ack_quorum / under_replicated findings: not in
  unverifiable ones, which are unknown). A bookie re-initialised by `bksim bookie format` (audit/inputs.py)
  holds none of what its earlier incarnation held: those entries show here as its missing copies;
- `divergence`: two valid copies of one id with different bytes (any bookies, journal or entry log);
- `lac_above_last_entry` (CLOSED): a piggybacked or explicit LAC above last_entry_id.

Per bookie:
- `write_after_fence` (in journal order: journal id, offset): a normal add after the bookie's first FENCE of
  the ledger, unless an earlier journal copy on that bookie has identical bytes (an idempotent re-add);
- `lac_decreased`: over its normal adds ordered by entry id (not journal order: adds are journaled out of id
  order legally), a LAC below the LAC of a lower id (the writer's LAC went back; write-backs and explicit LACs
  are not the writer's piggybacked progress, so they are left out).

Benign, counted: identical duplicates on one bookie's journals, copies above a CLOSED ledger's end, copies on
bookies outside the entry's segment, an open ledger's tail (above its confirmed end), copies of ledgers the
snapshot does not know. Entry ranges with the same verdict and holders are reported as one finding.

Cost: the common case (everything in place) runs on C-speed set, sort and Counter operations over the
columnar blocks; per-record Python loops run only for ledgers that have something to report.
"""
from __future__ import annotations

import bisect
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bksim.audit.findings import Finding, RULES, VIOLATION
from bksim.audit.parse import JOURNAL, Block
from bksim.formats.entry import HEADER_BYTES
from bksim.model.digest import DIGEST_CRC32C
from bksim.model.status import FLAG_RECOVERY_ADD

MISSING_COPY_RULES = ("gap", "below_ack_quorum", "under_replicated")  # findings that count missing_entries

COMPLETE = "complete"
PARTIAL = "partial"
ABSENT = "absent"

# Findings kept per ledger (the counts stay exact). A lost bookie can make millions of entries under-replicated;
# ranges collapse those, but a bound keeps a pathological input from filling memory.
FINDINGS_PER_LEDGER_MAX = 1000


@dataclass(frozen=True, slots=True)
class LedgerView:
    """What the rules need of a ledger's metadata (plain values: cheap to pickle to Spark workers)."""
    state: str  # OPEN | IN_RECOVERY | CLOSED
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    last_entry_id: int
    digest_type: str
    segments: tuple[tuple[int, tuple[str, ...]], ...]  # (first_entry_id, ensemble)

    @classmethod
    def of(cls, metadata) -> "LedgerView":
        """From a metadata.ledger_metadata.LedgerMetadata."""
        return cls(metadata.state.value, metadata.ensemble_size, metadata.write_quorum_size,
                   metadata.ack_quorum_size, metadata.last_entry_id, metadata.digest_type,
                   tuple((s.first_entry_id, tuple(s.ensemble)) for s in metadata.segments))

    @property
    def closed(self) -> bool:
        return self.state == "CLOSED"


@dataclass(frozen=True, slots=True)
class Piece:
    """The records of one ledger in one file."""
    bookie: str
    kind: str  # JOURNAL | ENTRYLOG
    file_id: int
    path: str
    block: Block


@dataclass(slots=True)
class LedgerResult:
    ledger: int
    state: str  # the metadata's, or UNKNOWN
    last_entry_id: int | None
    confirmed_end: int | None  # the highest id checked for replicas (None: not checked)
    quorum: tuple[int, int, int] | None  # E, Qw, Qa
    entries: int = 0  # distinct entry ids with a valid copy
    copies: int = 0  # valid copies (journal and entry log)
    payload_bytes: int = 0
    histogram: dict[int, int] = field(default_factory=dict)  # holders -> entry ids (ids 0..confirmed_end)
    benign: dict[str, int] = field(default_factory=dict)
    rule_counts: dict[str, list[int]] = field(default_factory=dict)  # rule -> [findings, entries]
    findings: list[Finding] = field(default_factory=list)  # the first FINDINGS_PER_LEDGER_MAX in sort order
    copies_per_bookie: dict[str, int] = field(default_factory=dict)
    write_set_entries: dict[str, int] = field(default_factory=dict)  # bookie -> ids 0..confirmed end it should hold
    missing_entries: dict[str, int] = field(default_factory=dict)  # bookie -> of those, ids it lacks (exact)

    @property
    def violations(self) -> int:
        return sum(n for rule, (n, _) in self.rule_counts.items() if RULES[rule][0] == VIOLATION)

    def to_json(self) -> dict:
        return {
            "ledger": self.ledger, "state": self.state, "last_entry_id": self.last_entry_id,
            "confirmed_end": self.confirmed_end, "quorum": list(self.quorum) if self.quorum else None,
            "entries": self.entries, "copies": self.copies, "payload_bytes": self.payload_bytes,
            "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
            "benign": dict(sorted(self.benign.items())),
            "rule_counts": {k: {"findings": v[0], "entries": v[1]} for k, v in sorted(self.rule_counts.items())},
            "violations": self.violations,
            "copies_per_bookie": dict(sorted(self.copies_per_bookie.items())),
            **({"missing_entries": dict(sorted(self.missing_entries.items()))} if self.missing_entries else {}),
        }


class _Findings:
    """Findings of one ledger: exact counts per rule, the first `limit` findings in sort order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: list[Finding] = []
        self.counts: dict[str, list[int]] = {}
        self.missing: Counter = Counter()  # bookie -> entries it lacks (MISSING_COPY_RULES findings)

    def add(self, finding: Finding) -> None:
        count = self.counts.setdefault(finding.rule, [0, 0])
        count[0] += 1
        count[1] += finding.entries
        self.kept.append(finding)
        if len(self.kept) > 2 * self.limit:
            self.kept = sorted(self.kept, key=Finding.sort_key)[:self.limit]

    def result(self) -> list[Finding]:
        return sorted(self.kept, key=Finding.sort_key)[:self.limit]


class _Copies:
    """One bookie's valid copies of the ledger from one source, concatenated in file order."""

    __slots__ = ("ids", "digests", "lacs", "flags", "offsets", "spans", "fences", "explicit_lacs")

    def __init__(self) -> None:
        self.ids = array("q")
        self.digests = array("I")
        self.lacs = array("q")
        self.flags = b""
        self.offsets = array("q")
        self.spans: list[tuple[int, str, int, int]] = []  # (file id, path, start, end) over the arrays
        self.fences: list[tuple[int, int, str]] = []  # (file id, offset, path)
        self.explicit_lacs: list[tuple[int, int, int, str]] = []  # (file id, offset, lac, path)

    def append(self, piece: Piece, keep: list[int] | None) -> None:
        block = piece.block
        start = len(self.ids)
        if keep is None:
            self.ids += block.ids
            self.digests += block.digests
            self.lacs += block.lacs
            self.flags += block.flags
            self.offsets += block.offsets
        else:
            self.ids += array("q", (block.ids[i] for i in keep))
            self.digests += array("I", (block.digests[i] for i in keep))
            self.lacs += array("q", (block.lacs[i] for i in keep))
            self.flags += bytes(block.flags[i] for i in keep)
            self.offsets += array("q", (block.offsets[i] for i in keep))
        self.spans.append((piece.file_id, piece.path, start, len(self.ids)))
        self.fences += [(piece.file_id, offset, piece.path) for offset in block.fences]
        self.explicit_lacs += [(piece.file_id, offset, lac, piece.path) for offset, lac in block.explicit_lacs]

    def where(self, index: int) -> tuple[int, str, int]:
        """(file id, path, offset) of the copy at `index`."""
        for file_id, path, start, end in self.spans:
            if start <= index < end:
                return file_id, path, self.offsets[index]
        raise IndexError(index)


def _valid_indexes(block: Block, digest_type: str | None) -> list[int] | None:
    """None when every copy's digest is acceptable, else the indexes that are."""
    if digest_type == DIGEST_CRC32C:
        if block.stored == block.digests:
            return None
        return [i for i, (s, d) in enumerate(zip(block.stored, block.digests)) if s == d]
    if digest_type is None:  # the ledger is unknown: accept a matching digest, or none (0)
        if block.stored == block.digests or block.stored.count(0) == len(block.stored):
            return None
        return [i for i, (s, d) in enumerate(zip(block.stored, block.digests)) if s == d or s == 0]
    return None  # digest type "none": the stored field means nothing


def check_ledger(ledger_id: int, view: LedgerView | None, pieces: list[Piece], evidence: dict[str, str],
                 findings_max: int = FINDINGS_PER_LEDGER_MAX) -> LedgerResult:
    """Every rule of the module docstring for one ledger. Deterministic: the order of `pieces` does not matter."""
    pieces = sorted(pieces, key=lambda p: (p.bookie, p.kind, p.file_id, p.path))
    found = _Findings(findings_max)
    digest_type = view.digest_type if view is not None else None
    journals: dict[str, _Copies] = {}
    logs: dict[str, _Copies] = {}
    payload_bytes = 0
    for piece in pieces:
        block = piece.block
        keep = _valid_indexes(block, digest_type)
        if keep is not None:
            kept = set(keep)
            for i in range(len(block)):
                if i not in kept:
                    found.add(Finding("entry_digest_mismatch", ledger=ledger_id, first_entry=block.ids[i],
                                      last_entry=block.ids[i], bookie=piece.bookie, file=piece.path,
                                      offset=block.offsets[i], detail=f"stored digest {block.stored[i]:#010x}, "
                                      f"the bytes give {block.digests[i]:#010x} ({digest_type or 'unknown'} "
                                      f"digest type)"))
            payload_bytes += sum(block.entry_bytes[i] - HEADER_BYTES for i in keep)
        else:
            payload_bytes += block.payload_bytes
        target = journals if piece.kind == JOURNAL else logs
        copies = target.get(piece.bookie)
        if copies is None:
            copies = target[piece.bookie] = _Copies()
        copies.append(piece, keep)

    bookies = sorted(set(journals) | set(logs))
    held: dict[str, list[int]] = {}  # bookie -> sorted distinct ids it holds a valid copy of
    merged: dict[int, int] = {}  # entry id -> a digest seen for it (any bookie)
    copies_by_bookie: list[dict[int, int]] = []
    same_bookie_versions = False  # some bookie holds two different copies of one id
    copies_per_bookie: dict[str, int] = {}
    benign: Counter = Counter()
    max_lac = -1
    for bookie in bookies:
        j = journals.get(bookie)
        log = logs.get(bookie)
        n = 0
        digests: dict[int, int] = {}
        for copies in (j, log):
            if copies is None:
                continue
            n += len(copies.ids)
            part = dict(zip(copies.ids, copies.digests))
            if len(part) != len(copies.ids):  # an id twice in this source: identical copies, or two versions
                versions = len(set(zip(copies.ids, copies.digests)))
                if copies is j:
                    benign["duplicates"] += len(copies.ids) - versions
                same_bookie_versions |= versions != len(part)
            if digests and not digests.items() <= (digests | part).items():
                same_bookie_versions = True  # the entry log holds another version than the journal
            digests.update(part)
            if copies.lacs:
                max_lac = max(max_lac, max(copies.lacs))
        if j is not None and j.explicit_lacs:
            max_lac = max(max_lac, max(lac for _, _, lac, _ in j.explicit_lacs))
        held[bookie] = sorted(digests)
        copies_by_bookie.append(digests)
        merged.update(digests)
        copies_per_bookie[bookie] = n
    diverged = same_bookie_versions or not all(d.items() <= merged.items() for d in copies_by_bookie)

    result = LedgerResult(ledger_id, view.state if view else "UNKNOWN", view.last_entry_id if view else None,
                          None, (view.ensemble_size, view.write_quorum_size, view.ack_quorum_size) if view else None)
    result.entries = len(merged)
    result.copies = sum(copies_per_bookie.values())
    result.payload_bytes = payload_bytes
    result.copies_per_bookie = copies_per_bookie

    for bookie, j in journals.items():
        _check_fences(ledger_id, bookie, j, found)
        _check_lac_order(ledger_id, bookie, j, found)

    if view is None:
        benign["unknown_ledger_copies"] += result.copies
    else:
        end = view.last_entry_id if view.closed else max_lac
        result.confirmed_end = end
        if view.closed and max_lac > view.last_entry_id:
            _lac_above(ledger_id, view.last_entry_id, journals, logs, found)
        tail = sum(len(h) - bisect.bisect_right(h, end) for h in held.values())
        if tail:
            benign["above_last_entry" if view.closed else "open_ledger_tail"] += tail
        if end >= 0:
            result.histogram = _replicas(ledger_id, view, end, held, evidence, found, benign)
            result.write_set_entries = _write_set_entries(view, end)
            if diverged:
                _divergence(ledger_id, end, journals, logs, found)
    result.benign = {k: v for k, v in benign.items() if v}
    result.rule_counts = found.counts
    result.findings = found.result()
    result.missing_entries = {b: n for b, n in sorted(found.missing.items()) if n}
    return result


# -- replicas per entry --------------------------------------------------------------------------------------

def _segment_ranges(view: LedgerView, end: int):
    """(first, stop, ensemble) for each segment, clipped to ids 0..end."""
    segments = view.segments
    for i, (first, ensemble) in enumerate(segments):
        stop = segments[i + 1][0] if i + 1 < len(segments) else end + 1
        stop = min(stop, end + 1)
        if first < stop:
            yield first, stop, ensemble


def _replicas(ledger_id: int, view: LedgerView, end: int, held: dict[str, list[int]], evidence: dict[str, str],
              found: _Findings, benign: Counter) -> dict[int, int]:
    histogram: Counter = Counter()
    all_ids: list[int] | None = None  # every id held anywhere, sorted: only when something is missing
    qw = view.write_quorum_size
    for first, stop, ensemble in _segment_ranges(view, end):
        counts: Counter = Counter()
        members = set(ensemble)
        for bookie, ids in held.items():
            lo, hi = bisect.bisect_left(ids, first), bisect.bisect_left(ids, stop)
            if bookie in members:
                counts.update(ids[lo:hi])
            else:
                benign["outside_segment"] += hi - lo
        histogram.update(counts.values())
        absent = (stop - first) - len(counts)
        if absent:
            histogram[0] += absent
        if absent or (counts and min(counts.values()) < qw):
            if all_ids is None:
                all_ids = sorted(set().union(*held.values()))
            _classify(ledger_id, view, first, stop, ensemble, held, counts, all_ids, evidence, found)
    return dict(histogram)


def _in_write_sets(index: int, lo: int, hi: int, ensemble_size: int, write_quorum_size: int) -> int:
    """How many ids lo..hi have ensemble index `index` in their write set ((e + i) mod E, i < Qw)."""
    n = 0
    for i in range(write_quorum_size):
        r = (index - i) % ensemble_size  # e = r (mod E) puts `index` at position i of e's write set
        n += (hi - r) // ensemble_size - (lo - 1 - r) // ensemble_size
    return n


def _write_set(entry_id: int, ensemble: tuple[str, ...], write_quorum_size: int) -> tuple[str, ...]:
    return tuple(ensemble[(entry_id + i) % len(ensemble)] for i in range(write_quorum_size))


def _write_set_entries(view: LedgerView, end: int) -> dict[str, int]:
    out: Counter = Counter()
    for first, stop, ensemble in _segment_ranges(view, end):
        for index, bookie in enumerate(ensemble):
            out[bookie] += _in_write_sets(index, first, stop - 1, len(ensemble), view.write_quorum_size)
    return {b: n for b, n in sorted(out.items()) if n}


def _chunks(first: int, stop: int, counts: Counter, all_ids: list[int]):
    """(first, last, count, held elsewhere) for ids first..stop-1 in order: present ids one by one, absent
    ids in runs (split where a bookie outside the segment holds one)."""
    at = first
    for entry_id in sorted(counts):
        if entry_id > at:
            yield from _absent(at, entry_id - 1, all_ids)
        yield entry_id, entry_id, counts[entry_id], False
        at = entry_id + 1
    if at < stop:
        yield from _absent(at, stop - 1, all_ids)


def _absent(lo: int, hi: int, all_ids: list[int]):
    at = lo
    for entry_id in all_ids[bisect.bisect_left(all_ids, lo):bisect.bisect_right(all_ids, hi)]:
        if entry_id > at:
            yield at, entry_id - 1, 0, False
        yield entry_id, entry_id, 0, True
        at = entry_id + 1
    if at <= hi:
        yield at, hi, 0, False


def _classify(ledger_id: int, view: LedgerView, first: int, stop: int, ensemble: tuple[str, ...],
              held: dict[str, list[int]], counts: Counter, all_ids: list[int], evidence: dict[str, str],
              found: _Findings) -> None:
    qa, qw = view.ack_quorum_size, view.write_quorum_size
    sets = {}
    for bookie in ensemble:
        ids = held.get(bookie, [])
        sets[bookie] = set(ids[bisect.bisect_left(ids, first):bisect.bisect_left(ids, stop)])
    size = len(ensemble)
    run = None  # [rule, holders, elsewhere, missing, first, last]

    def flush():
        if run is not None:
            rule, holders, elsewhere, missing, lo, hi = run
            found.add(Finding(rule, ledger=ledger_id, first_entry=lo, last_entry=hi, missing=missing,
                              detail=_replica_detail(rule, holders, elsewhere, ensemble, first, qa, qw, evidence)))
            if rule in MISSING_COPY_RULES:
                for index, bookie in enumerate(ensemble):
                    if bookie in missing:  # every id of the run whose write set names it lacks it
                        found.missing[bookie] += _in_write_sets(index, lo, hi, size, qw)

    for lo, hi, count, elsewhere in _chunks(first, stop, counts, all_ids):
        if count >= qw:
            continue
        holders = tuple(b for b in ensemble if lo in sets[b]) if count else ()
        if count == 0 and not elsewhere:
            rule = "gap"
        elif count < qa:
            rule = "below_ack_quorum"
        else:
            rule = "under_replicated"
        if rule != "under_replicated" and any(evidence.get(b, ABSENT) != COMPLETE for b in ensemble
                                              if b not in holders):
            rule = "unverifiable"
        if lo == hi:
            missing = tuple(sorted(set(_write_set(lo, ensemble, qw)) - set(holders)))
        else:  # a run of ids nobody holds: the union of their write sets
            missing = tuple(sorted(b for i, b in enumerate(ensemble) if _in_write_sets(i, lo, hi, size, qw)))
        if run is not None and run[:4] == [rule, holders, elsewhere, missing] and run[5] + 1 == lo:
            run[5] = hi
            continue
        flush()
        run = [rule, holders, elsewhere, missing, lo, hi]
    flush()


def _replica_detail(rule: str, holders: tuple[str, ...], elsewhere: bool, ensemble: tuple[str, ...],
                    first: int, qa: int, qw: int, evidence: dict[str, str]) -> str:
    text = (f"held by {len(holders)} of the segment's bookies (Qw={qw}, Qa={qa}; segment from entry {first}: "
            f"{', '.join(ensemble)})")
    if holders:
        text += f": {', '.join(holders)}"
    if elsewhere:
        text += "; a copy exists only on a bookie outside the segment"
    if rule == "unverifiable":
        missing = [f"{b} ({evidence.get(b, ABSENT)})" for b in ensemble if b not in holders
                   and evidence.get(b, ABSENT) != COMPLETE]
        text += f"; no complete journal history in the inputs for {', '.join(missing)}"
    return text


# -- divergence ------------------------------------------------------------------------------------------------

def _divergence(ledger_id: int, end: int, journals: dict[str, _Copies], logs: dict[str, _Copies],
                found: _Findings) -> None:
    digests: dict[int, set[int]] = defaultdict(set)
    for source in (journals, logs):
        for copies in source.values():
            for entry_id, digest in zip(copies.ids, copies.digests):
                if entry_id <= end:
                    digests[entry_id].add(digest)
    divergent = {e for e, ds in digests.items() if len(ds) > 1}
    if not divergent:
        return
    where: dict[int, list[tuple[int, str, str, int]]] = defaultdict(list)  # id -> (digest, bookie, path, offset)
    for source in (journals, logs):
        for bookie, copies in source.items():
            for i, entry_id in enumerate(copies.ids):
                if entry_id in divergent:
                    _, path, offset = copies.where(i)
                    where[entry_id].append((copies.digests[i], bookie, path, offset))
    for entry_id in sorted(divergent):
        copies = sorted(where[entry_id])
        first = copies[0]
        versions = defaultdict(list)
        for digest, bookie, path, offset in copies:
            versions[digest].append(f"{bookie} {path}@{offset}")
        found.add(Finding("divergence", ledger=ledger_id, first_entry=entry_id, last_entry=entry_id, bookie=first[1],
                          file=first[2], offset=first[3],
                          detail="; ".join(f"digest {d:#010x}: {', '.join(v)}" for d, v in sorted(versions.items()))))


# -- per bookie, in journal order ----------------------------------------------------------------------------

def _check_fences(ledger_id: int, bookie: str, j: _Copies, found: _Findings) -> None:
    if not j.fences:
        return
    fence_file, fence_offset, fence_path = min(j.fences)
    seen: set[tuple[int, int]] = set()
    for i, file_id, path, offset in _in_order(j):
        entry_id, digest = j.ids[i], j.digests[i]
        if (file_id, offset) > (fence_file, fence_offset) and not j.flags[i] & FLAG_RECOVERY_ADD \
                and (entry_id, digest) not in seen:
            found.add(Finding("write_after_fence", ledger=ledger_id, first_entry=entry_id, last_entry=entry_id,
                              bookie=bookie, file=path, offset=offset,
                              detail=f"normal add journaled after this bookie's fence of the ledger "
                                     f"({fence_path}@{fence_offset}), with no identical earlier copy"))
        seen.add((entry_id, digest))


def _in_order(j: _Copies):
    """(index, file id, path, offset) of every copy, in journal order."""
    for file_id, path, start, end in j.spans:
        for i in range(start, end):
            yield i, file_id, path, j.offsets[i]


def _check_lac_order(ledger_id: int, bookie: str, j: _Copies, found: _Findings) -> None:
    """LacMonotonic as the journal can show it: the writer piggybacks its LAC at the moment it assigns an entry
    id (ids in order, LAC never decreasing), so over one bookie's normal adds the LAC is non-decreasing in the
    entry id. Journal order is not send order (a batch held by the write-cache throttle journals after the next
    one; a pending entry is resent to a replacement bookie after newer ones), so order by id, not by offset.
    RECOVERY_ADDs are left out: they are written by the recovering client, not the ledger's writer. Explicit
    LACs are left out: a WriteLac sent before an add may be journaled after it, and the bookie keeps their max."""
    ids, lacs = j.ids, j.lacs
    if j.flags.count(0) == len(j.flags):  # no write-backs: C-speed sort of every copy
        normal: range | list[int] = range(len(ids))
        pairs = sorted(zip(ids, lacs))
    else:
        normal = [i for i, flag in enumerate(j.flags) if not flag & FLAG_RECOVERY_ADD]
        pairs = sorted((ids[i], lacs[i]) for i in normal)
    by_id = [lac for _, lac in pairs]
    if by_id == sorted(by_id):
        return  # the common case: no LAC below a lower id's
    first: dict[tuple[int, int], int] = {}  # (entry id, lac) -> index of its first copy in journal order
    for i in normal:
        first.setdefault((ids[i], lacs[i]), i)
    top, top_entry, top_index = -1, -1, -1
    for entry_id, lac in dict.fromkeys(pairs):
        if lac < top:
            _, path, offset = j.where(first[(entry_id, lac)])
            _, top_path, top_offset = j.where(top_index)
            found.add(Finding("lac_decreased", ledger=ledger_id, first_entry=entry_id, last_entry=entry_id,
                              bookie=bookie, file=path, offset=offset,
                              detail=f"entry {entry_id} carries LAC {lac} below LAC {top} of entry {top_entry} "
                                     f"({top_path}@{top_offset}): the writer's LAC went back"))
        elif lac > top:
            top, top_entry, top_index = lac, entry_id, first[(entry_id, lac)]


def _lac_above(ledger_id: int, last_entry_id: int, journals: dict[str, _Copies], logs: dict[str, _Copies],
               found: _Findings) -> None:
    for source in (journals, logs):
        for bookie, copies in sorted(source.items()):
            for i, lac in enumerate(copies.lacs):
                if lac > last_entry_id:
                    _, path, offset = copies.where(i)
                    found.add(Finding("lac_above_last_entry", ledger=ledger_id, bookie=bookie, file=path, offset=offset,
                                      detail=f"entry {copies.ids[i]} carries LAC {lac}; the ledger is CLOSED at "
                                             f"last_entry_id {last_entry_id}"))
    for bookie, copies in sorted(journals.items()):
        for file_id, offset, lac, path in copies.explicit_lacs:
            if lac > last_entry_id:
                found.add(Finding("lac_above_last_entry", ledger=ledger_id, bookie=bookie, file=path, offset=offset,
                                  detail=f"explicit LAC {lac}; the ledger is CLOSED at last_entry_id {last_entry_id}"))
