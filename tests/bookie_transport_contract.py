"""The BookieTransport contract (services/bksim/ports/bookie_transport.py) as behaviours, run against every
implementation of the port:

- tests/integration/test_grpc_transport_contract.py: GrpcBookieTransport against in-process gRPC bookie
  servers (adapters/bookie_server.py over a real BookieEngine on real files) on loopback;
- tests/sim/test_sim_transport_contract.py: the simulator's SimBookieTransport inside a SimLoop, over
  simulated bookies (the real engine on simulated disks);
- tests/unit/broker/test_fake_bookies_contract.py: FakeBookies, the broker unit tests' double.

One list of checks, three transports: what the broker and the simulator are tested against cannot drift
from what a real bookie answers unnoticed.

Each check is `async def check_...(h: Harness)`. A harness gives:
- `h.transport`: the BookieTransport under test;
- `h.bookie`: the id of a running bookie configured with `contract_config()`'s limits;
- `h.missing`: an id no bookie answers to.
Every check uses ledger ids of its own.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import pytest

from bksim.formats.entry import decode_entry, encode_entry, master_key
from bksim.model.config import KiB, BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode
from bksim.ports.bookie_transport import BookieTransport

S = StatusCode
KEY = master_key(b"contract")
OTHER_KEY = master_key(b"not the password")
# the bookies' limits, small enough to be reached by a test
ENTRY_BYTES_MAX = 64 * KiB
FRAME_BYTES_MAX = 256 * KiB
READ_BATCH_MAX = 8
PER_STREAM_MAX = 16
TOTAL_MAX = 32
LIST_IDS_MAX = 4  # entry ids per ListEntries answer: a ledger of more is listed in pages
BIG_PAYLOAD = b"x" * (60 * KiB)  # 4 such entries fit in one ReadEntries answer, 5 do not


def contract_config(base: BookieConfig = BookieConfig()) -> BookieConfig:
    """`base` with the limits the checks reach."""
    return dataclasses.replace(base, entry_bytes_max=ENTRY_BYTES_MAX, frame_bytes_max=FRAME_BYTES_MAX,
                               read_batch_entries_max=READ_BATCH_MAX, add_inflight_per_stream_max=PER_STREAM_MAX,
                               add_inflight_total_max=TOTAL_MAX, list_entries_ids_max=LIST_IDS_MAX)


class Harness(Protocol):
    transport: BookieTransport
    bookie: str
    missing: str


def entry(ledger: int, entry_id: int, payload: bytes = b"payload") -> bytes:
    """An entry whose piggybacked LAC is the entry before it."""
    return encode_entry(ledger, entry_id, entry_id - 1, 0, payload)


async def write(h: Harness, ledger: int, n: int, payload: bytes = b"payload") -> None:
    for i in range(n):  # one add per entry: large entries would not fit in one request together
        assert await h.transport.add(h.bookie, [(entry(ledger, i, payload), KEY, 0)]) == [S.OK]


async def check_add_then_read_returns_the_bytes(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 101
    assert await t.add(b, [(entry(ledger, i), KEY, 0) for i in range(3)]) == [S.OK] * 3
    for i in range(3):
        assert await t.read_entry(b, ledger, i) == (S.OK, entry(ledger, i))
    assert await t.read_entry(b, ledger, -1) == (S.OK, entry(ledger, 2))  # -1: the last entry stored
    assert await t.add(b, [(entry(ledger, 1), KEY, 0)]) == [S.OK]  # adding it again is idempotent
    assert await t.read_entry(b, ledger, 1) == (S.OK, entry(ledger, 1))
    assert await t.add(b, []) == []


async def check_missing_entries_and_unknown_ledgers_are_explicit_negatives(h: Harness) -> None:
    t, b, ledger, unknown = h.transport, h.bookie, 102, 99_102
    await write(h, ledger, 2)
    assert await t.read_entry(b, ledger, 7) == (S.NO_ENTRY, b"")
    assert await t.read_entry(b, unknown, 0) == (S.NO_LEDGER, b"")
    assert await t.read_entry(b, unknown, -1) == (S.NO_LEDGER, b"")
    assert await t.read_entries(b, unknown, [0, -1]) == [(S.NO_LEDGER, b"")] * 2
    assert await t.read_lac(b, unknown) == (S.NO_LEDGER, -1)


async def check_read_lac_is_the_highest_piggybacked_lac(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 103
    await write(h, ledger, 5)
    assert await t.read_lac(b, ledger) == (S.OK, 3)  # entry 4 carries LAC 3


async def check_bad_entries_are_bad_requests(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 104
    too_big = entry(ledger, 1, b"y" * ENTRY_BYTES_MAX)  # header + payload > entry_bytes_max
    assert await t.add(b, [(entry(ledger, 0), KEY, 0), (b"short", KEY, 0), (too_big, KEY, 0)]) == \
        [S.OK, S.BAD_REQUEST, S.BAD_REQUEST]
    assert await t.read_entry(b, ledger, 1) == (S.NO_ENTRY, b"")


async def check_a_fence_makes_later_adds_fail_and_its_read_returns_the_lac(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 105
    await write(h, ledger, 5)
    status, last = await t.read_entry(b, ledger, -1, fence=True, master_key=KEY)
    assert (status, last) == (S.OK, entry(ledger, 4))
    assert decode_entry(last).last_add_confirmed == 3  # what recovery starts from
    assert await t.add(b, [(entry(ledger, 5), KEY, 0)]) == [S.FENCED]
    assert await t.read_lac(b, ledger) == (S.OK, 3)
    assert await t.read_entry(b, ledger, -1, fence=True, master_key=KEY) == (S.OK, entry(ledger, 4))  # again: OK
    assert await t.add(b, [(entry(ledger, 5), KEY, FLAG_RECOVERY_ADD)]) == [S.OK]  # recovery may still add
    assert await t.read_entry(b, ledger, 5) == (S.OK, entry(ledger, 5))
    assert await t.read_lac(b, ledger) == (S.OK, 4)


async def check_fencing_a_ledger_never_seen_creates_it_fenced(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 106
    assert await t.read_entry(b, ledger, -1, fence=True, master_key=KEY) == (S.NO_ENTRY, b"")
    assert await t.read_lac(b, ledger) == (S.OK, -1)
    assert await t.read_entry(b, ledger, 0) == (S.NO_ENTRY, b"")  # known now: no longer NO_LEDGER
    assert await t.add(b, [(entry(ledger, 0), KEY, 0)]) == [S.FENCED]


async def check_the_master_key_is_checked(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 107
    await write(h, ledger, 2)
    assert await t.add(b, [(entry(ledger, 2), OTHER_KEY, 0)]) == [S.UNAUTHORIZED]
    assert await t.read_entry(b, ledger, -1, fence=True, master_key=OTHER_KEY) == (S.UNAUTHORIZED, b"")
    assert await t.read_entries(b, ledger, [0, 1, 5], fence=True, master_key=OTHER_KEY) == \
        [(S.UNAUTHORIZED, b"")] * 3
    assert await t.read_entry(b, ledger, -1, fence=True, master_key=b"") == (S.UNAUTHORIZED, b"")
    assert await t.add(b, [(entry(ledger, 2), KEY, 0)]) == [S.OK]  # the refused fences fenced nothing
    never_seen = 99_107  # a key is needed to fence or to write a ledger
    assert await t.read_entry(b, never_seen, -1, fence=True, master_key=b"") == (S.BAD_REQUEST, b"")
    assert await t.add(b, [(entry(never_seen, 0), b"", 0)]) == [S.BAD_REQUEST]
    assert await t.read_entry(b, never_seen, 0) == (S.NO_LEDGER, b"")


async def check_read_entries_gives_a_status_per_id(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 108
    await write(h, ledger, 5)
    ids = [0, 3, 7, -1, 4, 3]
    assert await t.read_entries(b, ledger, ids) == [
        (S.OK, entry(ledger, 0)), (S.OK, entry(ledger, 3)), (S.NO_ENTRY, b""), (S.OK, entry(ledger, 4)),
        (S.OK, entry(ledger, 4)), (S.OK, entry(ledger, 3))]
    for i in ids:  # result i answers ids[i] exactly as read_entry does
        assert (await t.read_entries(b, ledger, [i]))[0] == await t.read_entry(b, ledger, i)
    assert await t.read_entries(b, ledger, []) == []


async def check_read_entries_refuses_malformed_batches(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 109
    await write(h, ledger, 2)
    assert await t.read_entries(b, ledger, list(range(READ_BATCH_MAX + 1))) == \
        [(S.BAD_REQUEST, b"")] * (READ_BATCH_MAX + 1)
    assert await t.read_entries(b, ledger, [0, -2]) == [(S.BAD_REQUEST, b"")] * 2
    at_max = await t.read_entries(b, ledger, list(range(READ_BATCH_MAX)))
    assert [status for status, _ in at_max] == [S.OK, S.OK] + [S.NO_ENTRY] * (READ_BATCH_MAX - 2)
    # the refused fencing batch fenced nothing
    assert await t.read_entries(b, ledger, [0, -2], fence=True, master_key=KEY) == [(S.BAD_REQUEST, b"")] * 2
    assert await t.add(b, [(entry(ledger, 2), KEY, 0)]) == [S.OK]


async def check_read_entries_fences_once_first(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 110
    await write(h, ledger, 3)
    fenced = await t.read_entries(b, ledger, [-1, 0, 1, 2, 3, 4], fence=True, master_key=KEY)
    assert fenced == [(S.OK, entry(ledger, 2)), (S.OK, entry(ledger, 0)), (S.OK, entry(ledger, 1)),
                      (S.OK, entry(ledger, 2)), (S.NO_ENTRY, b""), (S.NO_ENTRY, b"")]
    assert await t.add(b, [(entry(ledger, 3), KEY, 0)]) == [S.FENCED]
    assert await t.read_entries(b, ledger, [0, 1], fence=True, master_key=KEY) == \
        [(S.OK, entry(ledger, 0)), (S.OK, entry(ledger, 1))]
    never_seen = 99_110
    assert await t.read_entries(b, never_seen, [0, 1], fence=True, master_key=KEY) == [(S.NO_ENTRY, b"")] * 2
    assert await t.add(b, [(entry(never_seen, 0), KEY, 0)]) == [S.FENCED]


async def check_read_entries_returns_every_entry_past_one_answer_s_budget(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 111
    await write(h, ledger, 6, BIG_PAYLOAD)  # 6 x 60 KiB: more than one frame_bytes_max answer holds
    assert await t.read_entries(b, ledger, list(range(7))) == \
        [(S.OK, entry(ledger, i, BIG_PAYLOAD)) for i in range(6)] + [(S.NO_ENTRY, b"")]
    assert await t.read_entries(b, ledger, list(range(5, -1, -1)), fence=True, master_key=KEY) == \
        [(S.OK, entry(ledger, i, BIG_PAYLOAD)) for i in range(5, -1, -1)]


async def check_an_add_batch_past_the_in_flight_bound_is_overload(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 112
    too_many = [(entry(ledger, i), KEY, 0) for i in range(PER_STREAM_MAX + 1)]
    assert await t.add(b, too_many) == [S.TOO_MANY_REQUESTS] * (PER_STREAM_MAX + 1)
    assert await t.read_entry(b, ledger, 0) == (S.NO_LEDGER, b"")  # nothing of it was stored
    assert await t.add(b, too_many[:PER_STREAM_MAX]) == [S.OK] * PER_STREAM_MAX  # the stream goes on
    assert await t.read_entry(b, ledger, PER_STREAM_MAX - 1) == (S.OK, entry(ledger, PER_STREAM_MAX - 1))


async def check_list_entries_gives_the_held_ids_as_ranges(h: Harness) -> None:
    t, b, ledger = h.transport, h.bookie, 115
    held = [0, 1, 2, 5, 9, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20]  # out of order, gaps; more than one answer holds
    assert await t.add(b, [(entry(ledger, i), KEY, 0) for i in held]) == [S.OK] * len(held)
    assert await t.list_entries(b, ledger) == (S.OK, [(0, 2), (5, 5), (7, 16), (20, 20)])
    assert await t.add(b, [(entry(ledger, 3), KEY, 0), (entry(ledger, 7), KEY, 0)]) == [S.OK] * 2
    assert await t.list_entries(b, ledger) == (S.OK, [(0, 3), (5, 5), (7, 16), (20, 20)])
    one_range = 116  # a range longer than one answer is joined across the answers
    assert await t.add(b, [(entry(one_range, i), KEY, 0) for i in range(3 * LIST_IDS_MAX + 1)]) == \
        [S.OK] * (3 * LIST_IDS_MAX + 1)
    assert await t.list_entries(b, one_range) == (S.OK, [(0, 3 * LIST_IDS_MAX)])


async def check_list_entries_of_unknown_and_empty_ledgers(h: Harness) -> None:
    t, b, unknown, fenced = h.transport, h.bookie, 99_117, 117
    assert await t.list_entries(b, unknown) == (S.NO_LEDGER, [])
    assert await t.read_entry(b, fenced, -1, fence=True, master_key=KEY) == (S.NO_ENTRY, b"")
    assert await t.list_entries(b, fenced) == (S.OK, [])  # known (fenced) without entries
    assert await t.list_entries(b, -1) == (S.BAD_REQUEST, [])
    assert await t.add(b, [(entry(fenced, 4), KEY, FLAG_RECOVERY_ADD)]) == [S.OK]
    assert await t.list_entries(b, fenced) == (S.OK, [(4, 4)])


async def check_a_bookie_that_does_not_answer_is_unreachable(h: Harness) -> None:
    t = h.transport
    with pytest.raises(BookieUnreachable):
        await t.add(h.missing, [(entry(113, 0), KEY, 0)])
    with pytest.raises(BookieUnreachable):
        await t.read_entry(h.missing, 113, 0)
    with pytest.raises(BookieUnreachable):
        await t.read_entries(h.missing, 113, [0, 1])
    with pytest.raises(BookieUnreachable):
        await t.read_lac(h.missing, 113)
    with pytest.raises(BookieUnreachable):
        await t.list_entries(h.missing, 113)
    assert await t.add(h.bookie, [(entry(113, 0), KEY, 0)]) == [S.OK]  # the others are not affected


async def check_calls_after_close_are_unreachable(h: Harness) -> None:
    t, b = h.transport, h.bookie
    await write(h, 114, 1)
    await t.close()
    with pytest.raises(BookieUnreachable):
        await t.add(b, [(entry(114, 1), KEY, 0)])
    with pytest.raises(BookieUnreachable):
        await t.read_entry(b, 114, 0)
    with pytest.raises(BookieUnreachable):
        await t.read_entries(b, 114, [0])
    with pytest.raises(BookieUnreachable):
        await t.read_lac(b, 114)
    with pytest.raises(BookieUnreachable):
        await t.list_entries(b, 114)


CONTRACT = [
    check_add_then_read_returns_the_bytes,
    check_missing_entries_and_unknown_ledgers_are_explicit_negatives,
    check_read_lac_is_the_highest_piggybacked_lac,
    check_bad_entries_are_bad_requests,
    check_a_fence_makes_later_adds_fail_and_its_read_returns_the_lac,
    check_fencing_a_ledger_never_seen_creates_it_fenced,
    check_the_master_key_is_checked,
    check_read_entries_gives_a_status_per_id,
    check_read_entries_refuses_malformed_batches,
    check_read_entries_fences_once_first,
    check_read_entries_returns_every_entry_past_one_answer_s_budget,
    check_an_add_batch_past_the_in_flight_bound_is_overload,
    check_list_entries_gives_the_held_ids_as_ranges,
    check_list_entries_of_unknown_and_empty_ledgers,
    check_a_bookie_that_does_not_answer_is_unreachable,
    check_calls_after_close_are_unreachable,
]


def check_id(check) -> str:
    return check.__name__.removeprefix("check_")
