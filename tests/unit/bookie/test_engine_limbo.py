"""A re-initialised bookie's ledgers in limbo (bookie/cookie.py "Limbo", PROTOCOL.md §2.1 "Unknown is never
no"): for a ledger whose id is at or below `limbo_ledger_id_max` the engine answers UNKNOWN_STATE, never
NO_LEDGER / NO_ENTRY, for what it lacks (reads, fencing reads, ReadLac), serves what it holds, and takes adds;
a ledger above the bound answers as on any bookie. Real files and RocksDB."""
from __future__ import annotations

import asyncio

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.model.config import BookieConfig
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S

from .conftest import KEY, entry

LIMBO_MAX = 10  # the bound the format recorded: ledgers 0..10 may predate it


def run(coro):
    return asyncio.run(coro)


async def formatted(engines, limbo_ledger_id_max: int = LIMBO_MAX) -> BookieEngine:
    """A started engine on the factory's directories with the limbo bound of a formatted bookie's cookie."""
    e = BookieEngine(BookieConfig(), disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                     instance_id=engines.instance_id, journal_dir=engines.journal_dir, ledger_dir=engines.ledger_dir,
                     log=engines.logs.append, limbo_ledger_id_max=limbo_ledger_id_max)
    await e.start()
    return e


def test_a_ledger_in_limbo_is_never_denied(engines):
    async def scenario():
        e = await formatted(engines)
        for ledger_id in (0, 7, LIMBO_MAX):
            status, data, _, message = await e.read_entry(ledger_id, 0)
            assert (status, data) == (S.UNKNOWN_STATE, b""), (ledger_id, status, message)
            assert f"ledger {ledger_id} is in limbo (id <= {LIMBO_MAX}" in message
            assert (await e.read_entry(ledger_id, -1))[0] == S.UNKNOWN_STATE
            assert (await e.read_lac(ledger_id))[0] == S.UNKNOWN_STATE
        await e.close()
    run(scenario())


def test_a_ledger_above_the_bound_answers_normally(engines):
    async def scenario():
        e = await formatted(engines)
        new = LIMBO_MAX + 1  # created after the format: nothing of it can predate this incarnation
        assert (await e.read_entry(new, 0))[0] == S.NO_LEDGER
        assert (await e.read_lac(new))[0] == S.NO_LEDGER
        await e.add_entries([(entry(new, 0), KEY, 0)])
        assert (await e.read_entry(new, 1))[0] == S.NO_ENTRY
        assert (await e.read_entry(new, 0))[0] == S.OK
        await e.close()
    run(scenario())


def test_a_fencing_read_of_a_limbo_ledger_fences_and_answers_unknown(engines):
    async def scenario():
        e = await formatted(engines)
        status, _, _, message = await e.read_entry(3, -1, fence=True, master_key=KEY)
        assert status == S.UNKNOWN_STATE, message
        statuses, msg = await e.add_entries([(entry(3, 0), KEY, 0)])
        assert statuses == [S.FENCED], msg  # the fence is in force although the answer was not a "no"
        statuses, _ = await e.add_entries([(entry(3, 0), KEY, FLAG_RECOVERY_ADD)])
        assert statuses == [S.OK]  # recovery writes back
        assert (await e.read_entry(3, 0, fence=True, master_key=KEY))[0] == S.OK
        assert (await e.read_entry(3, 1, fence=True, master_key=KEY))[0] == S.UNKNOWN_STATE
        await e.close()
    run(scenario())


def test_written_entries_are_served_and_the_rest_stays_unknown_across_a_restart(engines):
    async def scenario():
        e = await formatted(engines)
        await e.add_entries([(entry(4, i, lac=i - 1), KEY, 0) for i in range(3)])
        assert (await e.read_entry(4, 2))[0] == S.OK
        assert await e.read_lac(4) == (S.OK, 1, 2, "")
        assert (await e.read_entry(4, 3))[0] == S.UNKNOWN_STATE  # entry 3 may be an earlier incarnation's
        e.abandon()  # crash: the journal replays
        e = await formatted(engines)
        assert (await e.read_entry(4, 1))[0] == S.OK
        assert (await e.read_entry(4, 3))[0] == S.UNKNOWN_STATE
        await e.close()
    run(scenario())


def test_a_bookie_that_was_never_formatted_has_no_limbo(engines):
    async def scenario():
        e = await engines.started()
        assert e.limbo_ledger_id_max == -1
        assert (await e.read_entry(0, 0))[0] == S.NO_LEDGER
        await e.close()
    run(scenario())
