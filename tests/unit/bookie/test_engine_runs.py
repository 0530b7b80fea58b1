"""A batch of one key and flags is accepted as a run (BookieEngine.start_adds_compact / _accept_run) when its
outcome is known up front, else entry by entry: either way the outcome is the entry-by-entry path's. Two real
engines take the same batches, one through start_adds_compact and one through the entry-by-entry path alone;
their statuses, messages, journal records (byte for byte), reads and LACs must agree."""
from __future__ import annotations

import asyncio

from bksim.bookie.engine import AddBatch
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S

from .conftest import KEY, EngineFactory, entry

OTHER_KEY = b"o" * 32


def batches():
    """(entries, key, flags, taken as a run) in order: runs, and batches that each take the entry-by-entry path
    for a reason."""
    yield [entry(1, i, lac=i - 1) for i in range(10)], KEY, 0, True                 # a new ledger: key record first
    yield [entry(1, i, b"p" * 900, lac=i - 1) for i in range(10, 60)], KEY, 0, True  # the next run: fills the half
    yield [entry(1, 60), entry(2, 61), entry(1, 62)], KEY, 0, False                  # two ledgers
    yield [entry(1, 63), b"short", entry(1, 64)], KEY, 0, False                      # an entry below the header size
    yield [entry(1, i) for i in range(5, 13)], KEY, 0, False                         # re-adds: ids it holds
    yield [entry(1, 70), entry(1, 69)], KEY, 0, False                                # ids not ascending
    yield [entry(1, -3 + i) for i in range(2)], KEY, 0, False                        # a negative id
    yield [entry(1, 80), entry(1, 81)], OTHER_KEY, 0, False                          # the wrong key
    yield [entry(3, i) for i in range(4)], KEY, 0, True
    yield "fence", 3, None, None
    yield [entry(3, i) for i in range(4, 6)], KEY, 0, False                          # fenced
    yield [entry(3, i) for i in range(4, 6)], KEY, FLAG_RECOVERY_ADD, True           # recovery adds, fenced ledger
    yield [entry(4, i, b"q" * 1000) for i in range(40)], KEY, 0, False               # more than the half has room for


def test_a_run_and_the_entry_by_entry_path_agree_on_everything(tmp_path):
    async def main():
        engines = [EngineFactory(tmp_path / "runs"), EngineFactory(tmp_path / "one-by-one")]
        a, b = [await f.started(write_cache_bytes_max=2 * 48 * 1024) for f in engines]
        taken = []
        accept_run = a._accept_run
        a._accept_run = lambda *args: taken.append(accept_run(*args)) or taken[-1]
        for entries, key, flags, as_run in batches():
            if entries == "fence":
                for e in (a, b):
                    assert (await e.read_entry(key, -1, fence=True, master_key=KEY))[0] is S.OK
                continue
            run = a.start_adds_compact(entries, key, flags)
            assert taken.pop() is as_run, entries[:1]
            one_by_one = b._start_adds([(x, key, flags) for x in entries], AddBatch(len(entries)))
            assert await run.result() == await one_by_one.result(), entries[:1]
            assert (b"".join(run.chunks), run.nrecords) == (b"".join(one_by_one.chunks), one_by_one.nrecords)
        for ledger_id, last in ((1, 81), (2, 61), (3, 5), (4, 39)):
            for entry_id in range(-1, last + 1):
                assert await a.read_entry(ledger_id, entry_id) == await b.read_entry(ledger_id, entry_id)
            assert await a.read_lac(ledger_id) == await b.read_lac(ledger_id)
        # how many checkpoints a throttled add asks for depends on when the first one ends: not compared
        counts = [{k: v for k, v in e.stats.items() if k != "checkpoints"} for e in (a, b)]
        assert counts[0] == counts[1] and a.stats["throttled"] == 1
        assert a.stats["checkpoints"] >= 1 and b.stats["checkpoints"] >= 1  # the throttled add asked for one
        for e in (a, b):
            await e.close()
    asyncio.run(main())
