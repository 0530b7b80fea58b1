"""The autorecovery daemon's supervision (cli/autorecovery_cmd.py) without ZooKeeper: a failed session is started
again after a back-off until `stop`, and the auditor loop makes a new Auditor (a new vote) after a session
expiry. The parts it wires are stubbed; the real-process test is tests/integration/test_autorecovery.py."""
from __future__ import annotations

import asyncio

from bksim.autorecovery import auditor as auditor_module
from bksim.cli import autorecovery_cmd
from bksim.model.config import AutoRecoveryConfig, Config
from bksim.model.errors import SessionExpiredError

CONFIG = Config(autorecovery=AutoRecoveryConfig(bookie_check_interval_ms=1))


def test_a_failed_session_is_started_again_after_a_back_off_until_stopped(monkeypatch):
    calls: list[int] = []
    lines: list[str] = []

    async def session(config, owner_id, stop, log):
        calls.append(len(calls))
        if len(calls) < 3:
            raise RuntimeError(f"boom {len(calls)}")
        stop.set()  # the third session runs until stopped

    monkeypatch.setattr(autorecovery_cmd, "_run_session", session)
    monkeypatch.setattr(autorecovery_cmd, "RESTART_BACKOFF_S", 0.001)

    async def scenario():
        await asyncio.wait_for(autorecovery_cmd.run_daemon(CONFIG, "b1", asyncio.Event(), lines.append), 10)

    asyncio.run(scenario())
    assert calls == [0, 1, 2]
    assert [line.split(";")[0] for line in lines] == ["autorecovery: RuntimeError: boom 1",
                                                      "autorecovery: RuntimeError: boom 2"], lines


def test_the_auditor_votes_again_with_a_new_auditor_after_its_session_expired(monkeypatch):
    made: list[object] = []

    class FakeAuditor:
        def __init__(self, *args, **kwargs) -> None:
            made.append(self)

        async def run(self, stop):
            if len(made) == 1:
                raise SessionExpiredError("/ledgers/underreplication/auditorelection", "expired")
            stop.set()

    monkeypatch.setattr(auditor_module, "Auditor", FakeAuditor)
    lines: list[str] = []

    async def scenario():
        await asyncio.wait_for(autorecovery_cmd._audit(None, None, None, None, CONFIG, "b1", asyncio.Event(),
                                                       lines.append), 10)

    asyncio.run(scenario())
    assert len(made) == 2 and made[0] is not made[1]
    assert any("voting again on a new session" in line for line in lines), lines
