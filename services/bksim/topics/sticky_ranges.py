"""Key_Shared sticky hash ranges (Pulsar's KeySharedPolicy.stickyHashRange and its
HashRangeExclusiveStickyKeyConsumerSelector): pure, no I/O.

A key's *slot* is murmur3_32(key) mod HASH_RANGE_SIZE (65,536): the key hash the auto-split ring uses, reduced
to Pulsar's hash range. In sticky mode each consumer declares the slots it takes as inclusive ranges
[start, end] within 0..65535; ranges overlap neither each other nor another connected consumer's (else
CONSUMER_ASSIGN_ERROR naming the conflict, and the consumer is not added). `select(slot)` is the consumer whose
range holds the slot, or None: no consumer covers it, and the subscription holds such keys (does not deliver
them) until a consumer that covers them joins.
"""
from __future__ import annotations

import bisect
from typing import Generic, Iterable, TypeVar

from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError

HASH_RANGE_SIZE = 1 << 16
C = TypeVar("C")


def slot_of(key_hash: int) -> int:
    return key_hash % HASH_RANGE_SIZE


def check_ranges(ranges: Iterable[tuple[int, int]], ranges_max: int) -> tuple[tuple[int, int], ...]:
    """The ranges sorted by start; CONSUMER_ASSIGN_ERROR when one is malformed, they overlap, or are too many."""
    out = sorted((int(s), int(e)) for s, e in ranges)
    if not out:
        raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR, "a sticky Key_Shared consumer declares at least one "
                                                            "hash range")
    if len(out) > ranges_max:
        raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR, f"{len(out)} hash ranges: at most {ranges_max} "
                                                            f"(topic.key_shared_sticky_ranges_max)")
    for start, end in out:
        if not 0 <= start <= end < HASH_RANGE_SIZE:
            raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR,
                             f"hash range [{start}, {end}] is not within [0, {HASH_RANGE_SIZE - 1}] with start <= end")
    for (s1, e1), (s2, e2) in zip(out, out[1:]):
        if s2 <= e1:
            raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR, f"hash ranges [{s1}, {e1}] and [{s2}, {e2}] overlap")
    return tuple(out)


class StickyRanges(Generic[C]):
    """The ranges of the connected consumers, sorted by start; `names(consumer)` for the error text."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._entries: list[tuple[int, int, str, C]] = []   # (start, end, consumer name, consumer)

    def add(self, name: str, consumer: C, ranges: tuple[tuple[int, int], ...]) -> None:
        """Take `ranges` (already checked) for `consumer`; CONSUMER_ASSIGN_ERROR (nothing taken) on overlap."""
        for start, end in ranges:
            i = bisect.bisect_right(self._starts, end)  # the entries starting at or before `end`
            if i > 0:
                s, e, other, _ = self._entries[i - 1]
                if e >= start:
                    raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR,
                                     f"hash range [{start}, {end}] of consumer {name} overlaps [{s}, {e}] of "
                                     f"consumer {other}")
        for start, end in ranges:
            i = bisect.bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._entries.insert(i, (start, end, name, consumer))

    def remove(self, consumer: C) -> None:
        keep = [(s, e, n, c) for s, e, n, c in self._entries if c is not consumer]
        self._entries = keep
        self._starts = [s for s, _, _, _ in keep]

    def select(self, slot: int) -> C | None:
        i = bisect.bisect_right(self._starts, slot)
        if i == 0:
            return None
        start, end, _, consumer = self._entries[i - 1]
        return consumer if slot <= end else None

    def ranges_of(self, consumer: C) -> list[tuple[int, int]]:
        return [(s, e) for s, e, _, c in self._entries if c is consumer]

    def __len__(self) -> int:
        return len(self._entries)
