"""BookieServicer.ReadEntries (adapters/bookie_server.py) over a recording engine, without a network: the
fence is asked once, by the first id's read, before any other read; a fence the first read does not confirm
answers every id with its status and reads nothing more; an engine failure mid-batch is IO_ERROR for the rest."""
from __future__ import annotations

import asyncio

from bksim.adapters.bookie_server import BookieServicer
from bksim.gen import bookie_pb2
from bksim.model.config import BookieConfig
from bksim.model.status import FLAG_FENCE, StatusCode

S = StatusCode


class RecordingEngine:
    def __init__(self, first_status: StatusCode = S.OK, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.first_status = first_status
        self.fail_at = fail_at

    async def read_entry(self, ledger_id, entry_id, fence=False, master_key=b""):
        self.calls.append((entry_id, fence))
        await asyncio.sleep(0)
        if entry_id == self.fail_at:
            raise RuntimeError("disk on fire")
        if len(self.calls) == 1 and self.first_status is not S.OK:
            return self.first_status, b"", -1, "no"
        return S.OK, b"e%d" % entry_id, 7, ""


def call(engine, ids, flags=0):
    servicer = BookieServicer(engine, BookieConfig(), "b", log=lambda line: None)
    request = bookie_pb2.ReadEntriesRequest(ledger_id=1, entry_ids=ids, flags=flags, master_key=b"k")
    return asyncio.run(servicer.ReadEntries(request, None)).results


def test_fence_once_first():
    engine = RecordingEngine()
    results = call(engine, [4, 5, 6], FLAG_FENCE)
    assert engine.calls == [(4, True), (5, False), (6, False)]
    assert [(r.status, r.entry, r.last_add_confirmed) for r in results] == [(S.OK, b"e%d" % i, 7) for i in (4, 5, 6)]
    engine = RecordingEngine()
    call(engine, [4, 5])
    assert engine.calls == [(4, False), (5, False)]


def test_a_fence_not_confirmed_answers_every_id_and_reads_nothing_more():
    for status in (S.UNAUTHORIZED, S.IO_ERROR, S.BAD_REQUEST):
        engine = RecordingEngine(first_status=status)
        results = call(engine, [4, 5, 6], FLAG_FENCE)
        assert engine.calls == [(4, True)]
        assert [r.status for r in results] == [status] * 3 and all(r.entry == b"" for r in results)
    engine = RecordingEngine(first_status=S.NO_ENTRY)  # fenced; the entry is simply not there
    results = call(engine, [4, 5], FLAG_FENCE)
    assert engine.calls == [(4, True), (5, False)]
    assert [r.status for r in results] == [S.NO_ENTRY, S.OK]


def test_an_engine_failure_is_io_error_for_the_rest():
    engine = RecordingEngine(fail_at=5)
    results = call(engine, [4, 5, 6])
    assert [r.status for r in results] == [S.OK, S.IO_ERROR, S.IO_ERROR]
    assert "disk on fire" in results[1].message
