"""bookie/requests.py, the request rules the gRPC server and the simulator share, without a network:
the add bounds (per stream, per bookie, released by answers and by a stream's end) and ReadEntries (the
frame budget, an engine failure with and without an `internal_error` policy, what `answered_count` takes) and
the client's side of ListEntries pages (`list_all_entries`)."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from bksim.bookie.requests import (RESPONSE_OVERHEAD, RESULT_OVERHEAD, AddAdmission, answered_count, list_all_entries,
                                   read_entries)
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode as S

CONFIG = dataclasses.replace(BookieConfig(), add_inflight_per_stream_max=10, add_inflight_total_max=15)


def test_a_stream_past_its_bound_is_refused_without_counting():
    bookie = AddAdmission(CONFIG, "b1")
    a = bookie.open_stream()
    assert a.admit(6) is None and a.admit(4) is None
    statuses, why = a.admit(1)
    assert statuses == [S.TOO_MANY_REQUESTS] and "add_inflight_per_stream_max=10" in why and "10 + 1" in why
    a.answered(6)
    assert a.admit(5) is None
    assert (bookie.requests, bookie.entries, bookie.rejected_entries, bookie.inflight_total) == (4, 15, 1, 9)


def test_the_bookie_bound_counts_every_stream_until_answered_or_closed():
    bookie = AddAdmission(CONFIG, "b1")
    a, b = bookie.open_stream(), bookie.open_stream()
    assert a.admit(10) is None
    statuses, why = b.admit(6)
    assert statuses == [S.TOO_MANY_REQUESTS] * 6 and "in bookie b1: 10 + 6 > add_inflight_total_max=15" in why
    assert b.admit(5) is None
    a.close()  # its unanswered entries stop counting, and a late answer changes nothing
    a.answered(10)
    assert bookie.inflight_total == 5
    assert b.admit(5) is None and bookie.inflight_total == 10


class Engine:
    def __init__(self, size: int, fail_at: int | None = None) -> None:
        self.size, self.fail_at, self.reads = size, fail_at, []

    async def read_entry(self, ledger_id, entry_id, fence=False, master_key=b""):
        self.reads.append(entry_id)
        if entry_id == self.fail_at:
            raise RuntimeError("disk on fire")
        return S.OK, b"e" * self.size, 3, ""


def test_the_answer_stays_within_the_frame_and_always_answers_the_first_id():
    frame = 1000
    config = dataclasses.replace(BookieConfig(), frame_bytes_max=frame, entry_bytes_max=512)
    fits = (frame - RESPONSE_OVERHEAD) // (300 + RESULT_OVERHEAD)  # 2 entries of 300 bytes
    engine = Engine(300)
    results = asyncio.run(read_entries(engine, config, 1, [0, 1, 2, 3]))
    assert [r[0] for r in results] == [S.OK] * fits + [S.TOO_MANY_REQUESTS] * (4 - fits)
    assert "frame_bytes_max=1000" in results[fits][3]
    assert answered_count([r[0] for r in results]) == fits
    huge = asyncio.run(read_entries(Engine(2000), config, 1, [0, 1]))  # alone over the budget: still sent
    assert [r[0] for r in huge] == [S.OK, S.TOO_MANY_REQUESTS]
    # a first TOO_MANY_REQUESTS is that id's answer (a bookie that could not take it); the rest are asked again
    assert answered_count([S.TOO_MANY_REQUESTS, S.TOO_MANY_REQUESTS]) == 1


def test_an_engine_failure_propagates_unless_the_caller_answers_it():
    with pytest.raises(RuntimeError, match="disk on fire"):
        asyncio.run(read_entries(Engine(1, fail_at=1), BookieConfig(), 1, [0, 1, 2]))
    results = asyncio.run(read_entries(Engine(1, fail_at=1), BookieConfig(), 1, [0, 1, 2],
                                       internal_error=lambda e: f"internal: {e}"))
    assert [(r[0], r[3]) for r in results] == [(S.OK, ""), (S.IO_ERROR, "internal: disk on fire"),
                                               (S.IO_ERROR, "internal: disk on fire")]


def pages_of(answers: dict):
    asked = []

    async def ask(first_entry: int):
        asked.append(first_entry)
        return answers[first_entry]
    return ask, asked


def test_list_pages_are_joined_where_a_boundary_cut_a_range():
    ask, asked = pages_of({0: (S.OK, [(0, 2)], 3), 3: (S.OK, [(3, 4), (6, 6)], 8), 8: (S.OK, [(9, 9)], 10),
                           10: (S.OK, [], -1)})
    assert asyncio.run(list_all_entries("b1", 7, ask)) == (S.OK, [(0, 4), (6, 6), (9, 9)])
    assert asked == [0, 3, 8, 10]


def test_a_list_page_that_is_not_ok_ends_the_listing_without_ranges():
    ask, _ = pages_of({0: (S.NO_LEDGER, [], -1)})
    assert asyncio.run(list_all_entries("b1", 7, ask)) == (S.NO_LEDGER, [])
    ask, asked = pages_of({0: (S.OK, [(0, 2)], 3), 3: (S.IO_ERROR, [], -1)})
    assert asyncio.run(list_all_entries("b1", 7, ask)) == (S.IO_ERROR, [])
    assert asked == [0, 3]


def test_a_list_page_that_does_not_advance_is_a_broken_answer():
    ask, asked = pages_of({0: (S.OK, [(0, 2)], 3), 3: (S.OK, [], 3)})
    with pytest.raises(BookieUnreachable) as e:
        asyncio.run(list_all_entries("b1", 7, ask))
    assert e.value.bookie == "b1" and "does not advance" in str(e.value)
    assert asked == [0, 3]
