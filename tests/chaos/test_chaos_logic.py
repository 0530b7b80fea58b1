"""The chaos runner's pure parts: seeded schedules and the step tables, recovery-time and throughput figures, the
verdict rules, the report's renderings and the campaign table (no processes)."""
from __future__ import annotations

import pytest

from bksim.chaos import actions, report, runner
from bksim.chaos.scenarios import SCENARIOS, Step, StepAction, StepTarget, plan
from bksim.chaos.workload import (Recorder, ledger_payload, parse_ledger_payload, parse_topic_payload,
                                  topic_payload)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_has_a_reproducible_schedule_that_heals_what_it_breaks(name):
    for seed in range(1, 30):
        steps = plan(name, seed, 15.0)
        assert steps == plan(name, seed, 15.0)  # the seed decides everything
        assert [s.at for s in steps] == sorted(s.at for s in steps)
        assert steps[0].fault and steps[0].at > 0
        if name != "zookeeper-restart":  # a stop-start heals itself
            assert not steps[-1].fault, f"{name} seed {seed} ends with an unhealed fault: {steps[-1]}"
    assert plan(name, 1, 15.0) != plan(name, 2, 15.0)


def test_every_step_type_has_an_action_and_a_target_rule_and_a_step_names_a_known_one():
    assert set(actions.ACTIONS) == set(StepAction) and set(actions.TARGETS) == set(StepTarget)
    step = Step(1.0, "kill9-tear", "random-bookie", True)
    assert (step.action, step.target) == (StepAction.KILL9_TEAR, StepTarget.RANDOM_BOOKIE)
    assert step.to_dict() == {"at": 1.0, "action": "kill9-tear", "target": "random-bookie", "fault": True,
                              "down_s": 0.0, "arg": ""}
    with pytest.raises(ValueError, match="kill-9"):
        Step(1.0, "kill-9", "random-bookie", True)
    with pytest.raises(ValueError, match="any-bookie"):
        Step(1.0, "kill9", "any-bookie", True)


def test_unknown_scenario_is_refused_by_name():
    with pytest.raises(KeyError, match="unknown scenario 'nope'"):
        plan("nope", 1, 10.0)
    with pytest.raises(runner.ChaosError, match="unknown scenario"):
        runner.run("nope", 1, 10.0, "/nonexistent")


def test_payloads_name_their_position():
    assert parse_ledger_payload(ledger_payload(17, 42)) == (17, 42)
    assert parse_ledger_payload(b"garbage") is None
    assert parse_topic_payload(topic_payload(12345)) == 12345
    assert parse_topic_payload(ledger_payload(1, 1)) is None


def _recorder(ledger_times, topic_times):
    rec = Recorder(0.0)
    rec.acks = {"ledger": list(ledger_times), "topic": list(topic_times)}
    return rec


def test_recovery_time_is_the_end_of_the_last_gap_after_the_fault():
    steady = [i * 0.1 for i in range(0, 100)]  # acks every 0.1 s for 10 s
    topic = [t for t in steady if not 3.0 < t < 5.0]  # a 2 s stall after the fault at 3.0
    faults = [{"t": 3.0, "action": "kill9", "victims": "broker-1"}]
    out = report.recovery_times(_recorder(steady, topic), faults, tail_from=8.0)
    (f,) = out["per_fault"]
    assert f["ledger_s"] == 0.0
    assert f["topic_s"] == pytest.approx(2.0, abs=0.11)
    assert out["max_s"] == f["recovery_s"] == f["topic_s"]
    assert out["tail_acks"] == {"ledger": 20, "topic": 20}


def test_a_gap_starting_just_before_the_next_fault_belongs_to_that_fault():
    times = [i * 0.1 for i in range(0, 30)] + [i * 0.1 for i in range(60, 100)]  # stall 2.9 .. 6.0
    faults = [{"t": 1.0, "action": "kill9", "victims": "b"}, {"t": 3.0, "action": "kill9", "victims": "b"}]
    first, second = report.recovery_times(_recorder(times, times), faults, 8.0)["per_fault"]
    assert first["recovery_s"] == 0.0
    assert second["recovery_s"] == pytest.approx(3.0, abs=0.11)


def test_throughput_baseline_and_dip():
    rec = Recorder(0.0)
    for second, n in enumerate([100, 100, 100, 100, 20, 0, 100]):
        rec.counts["topic"][second] = n
    out = report.throughput(rec, [{"t": 4.2}])
    assert out["topic"]["baseline_per_s"] == 100
    assert out["topic"]["min_per_s_after_first_fault"] == 0
    assert out["topic"]["dip_fraction"] == 1.0


def _clean_report(**over):
    out = {"ledgers": {"lost": 0, "reordered": 0, "divergent": 0, "read_errors": 0, "not_closed": 0},
              "topic": {"lost": 0, "reordered": 0, "divergent": 0, "read_errors": 0, "duplicates": 0},
              "recovery": {"tail_acks": {"ledger": 5, "topic": 5}}, "audit": {"verdict": "clean"}, "problems": []}
    for key, value in over.items():
        part, field = key.split("__")
        out[part][field] = value
    return out


@pytest.mark.parametrize("key, needle", [
    ("ledgers__lost", "ledgers: lost = 1"), ("topic__reordered", "topic: reordered = 1"),
    ("topic__divergent", "topic: divergent = 1"), ("topic__duplicates", "duplicates = 1"),
    ("ledgers__not_closed", "not CLOSED"), ("ledgers__read_errors", "read_errors = 1"),
])
def test_each_violation_fails_the_run(key, needle):
    assert report.violations(_clean_report()) == []
    found = report.violations(_clean_report(**{key: 1}))
    assert len(found) == 1 and needle in found[0]


def test_no_acks_in_the_tail_and_an_unclean_audit_fail_the_run():
    rep = _clean_report()
    rep["recovery"]["tail_acks"]["topic"] = 0
    rep["audit"] = {"verdict": "violations", "exit_status": 1}
    found = report.violations(rep)
    assert any("liveness: no topic" in v for v in found)
    assert any("audit: violations" in v for v in found)


def test_campaign_table_sums_per_scenario():
    rows = [{"scenario": "broker-kill", "verdict": "PASS", "acknowledged": 1000, "lost": 0, "duplicates": 0,
             "reordered": 0, "divergent": 0, "audit": "clean", "recovery_s": 2.0},
            {"scenario": "broker-kill", "verdict": "FAIL", "acknowledged": 500, "lost": 3, "duplicates": 1,
             "reordered": 0, "divergent": 0, "audit": "clean", "recovery_s": 4.0},
            {"scenario": "bookie-kill", "verdict": "PASS", "acknowledged": 10, "lost": 0, "duplicates": 0,
             "reordered": 0, "divergent": 0, "audit": "clean", "recovery_s": None}]
    table = report.summary_table(rows).splitlines()
    assert table[0].startswith("| scenario | runs | acknowledged ops | lost | duplicates | reordered | divergent")
    assert "| broker-kill | 2 | 1,500 | 3 | 1 | 0 | 0 | clean 2 | 3.00 | 1 |" in table
    assert "| bookie-kill | 1 | 10 | 0 | 0 | 0 | 0 | clean 1 | - | 0 |" in table
    assert table[-1].startswith("| **all** | 3 | 1,510 | 3 |")


def test_a_stream_that_never_acknowledges_again_is_not_recovered():
    ledger = [i * 0.1 for i in range(100)]
    topic = [i * 0.1 for i in range(40)]  # nothing after 3.9 s; the workload ran until 10 s
    faults = [{"t": 4.0, "action": "kill9", "victims": "bookie-2, bookie-3"}]
    out = report.recovery_times(_recorder(ledger, topic), faults, tail_from=7.0, end_t=10.0)
    (f,) = out["per_fault"]
    assert f["not_recovered"] == ["topic"] and f["topic_s"] == pytest.approx(6.0)
    assert f["ledger_s"] == 0.0
    assert out["tail_acks"]["topic"] == 0


def test_an_aborted_run_reports_what_happened_so_far_and_why_it_stopped():
    timeline = [{"t": 0.5, "kind": "workload", "what": "started"}]
    out = report.aborted("broker-kill", 7, 8.0, "/runs/x", timeline, ["healed after the schedule: x"],
                         runner.ChaosError("bookie-2 did not stop\nmore")).to_dict()
    assert list(out) == ["scenario", "seed", "duration_s", "run_dir", "timeline", "problems", "violations", "verdict"]
    assert out["violations"] == ["run aborted: ChaosError: bookie-2 did not stop"] and out["verdict"] == "FAIL"
    assert out["problems"][-1] == "run aborted: ChaosError: bookie-2 did not stop\nmore"
    assert report.render_text(out).splitlines() == [
        "chaos broker-kill seed 7: FAIL (? s, run dir /runs/x)", "", "timeline:",
        "     0.50s  workload  started", "",
        "throughput (acks/s; baseline before the first fault -> lowest second after it):",
        "recovery (fault -> acknowledgements flowing again):",
        "ledgers: None ledgers, None entries acknowledged; lost None, reordered None, divergent None, recovered at "
        "the end None, not closed None, unconfirmed kept None",
        "topic: None/None messages receipted; lost None, duplicates None, reordered None, divergent None, failed "
        "sends None",
        "audit: None (? s)", "problem: healed after the schedule: x", "problem: run aborted: ChaosError: bookie-2 "
        "did not stop", "VIOLATION: run aborted: ChaosError: bookie-2 did not stop", "verdict: FAIL"]


def test_a_full_report_keeps_its_field_order_and_judges_itself():
    rep = report.Report("bookie-kill", 1, 8.0, "/runs/y", plan=[], cluster_start_s=1.0,
                        tail={"from_s": 5.0, "to_s": 8.0}, entrylog_flips=[], check_s=0.1,
                        ledgers=_clean_report()["ledgers"], ledger_writers=[], ledger_ends=[],
                        topic=_clean_report()["topic"], audit={"verdict": "clean"}, failed_checks=[], timeline=[],
                        faults=[], throughput={}, recovery={"tail_acks": {"ledger": 0, "topic": 3}}, problems=[])
    rep.judge()
    rep.elapsed_s = 9.0
    assert list(rep.to_dict()) == [
        "scenario", "seed", "duration_s", "run_dir", "plan", "cluster_start_s", "tail", "entrylog_flips", "check_s",
        "ledgers", "ledger_writers", "ledger_ends", "topic", "audit", "failed_checks", "timeline", "faults",
        "throughput", "recovery", "problems", "violations", "verdict", "elapsed_s"]
    assert rep.verdict == "FAIL" and rep.violations == [
        "liveness: no ledger acknowledgement in the tail after the last fault was healed"]


def test_the_autorecovery_scenarios_have_room_for_a_replacement_and_wait_after_each_loss():
    widest = max(e for e, _, _ in runner.LEDGER_SHAPES)
    lost = plan("bookie-lost", 3, 8.0)
    assert [s.action for s in lost] == [StepAction.KILL9_LOST, StepAction.AWAIT_REREPLICATION] * 2
    assert SCENARIOS["bookie-lost"].bookies - 2 >= widest  # two losses for good still leave a full ensemble
    damaged = plan("disk-damage-repair", 3, 8.0)
    assert [s.action for s in damaged] == [StepAction.KILL9_WIPE, StepAction.REFORMAT_RESTART,
                                           StepAction.CHECK_ALL_REPAIR]
    assert SCENARIOS["disk-damage-repair"].bookies > widest  # a replacement outside the damaged bookie's ensemble
    assert dict(SCENARIOS["disk-damage-repair"].env)["BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS"] == "600000"
    # the scenarios whose audit counts the copies their faults destroyed run without autorecovery (nothing may
    # repair them first); the others keep the default (on)
    judged = ("bookie-wipe", "journal-torn-tail")
    assert all(dict(SCENARIOS[n].env) == {"BKSIM_AUTORECOVERY_ENABLED": "false"} for n in judged)
    assert all(s.bookies == 3 and not s.env for n, s in SCENARIOS.items()
               if n not in ("bookie-lost", "disk-damage-repair", "gc-under-faults") + judged)
    # gc-under-faults changes only its bookies' garbage collection, entry logs and checkpoints
    assert all(k.startswith("BKSIM_BOOKIE_") for k, _ in SCENARIOS["gc-under-faults"].env)


def test_gc_under_faults_kills_compacting_bookies_restarts_them_and_verifies_with_deleting_writers():
    for seed in range(1, 30):
        steps = plan("gc-under-faults", seed, 8.0)
        assert [(s.action, s.target) for s in steps] == [
            (StepAction.KILL9, StepTarget.COMPACTING_BOOKIE), (StepAction.RESTART, StepTarget.SAME),
            (StepAction.KILL9, StepTarget.COMPACTING_BOOKIE), (StepAction.RESTART, StepTarget.SAME),
            (StepAction.VERIFY_GC, StepTarget.ALL_BOOKIES)]
        assert [s.fault for s in steps] == [True, False, True, False, False]
        kill1, restart1, kill2, restart2, verify = (s.at for s in steps)
        # (times are rounded to 10 ms)
        assert 1.49 <= restart1 - kill1 <= 2.51 and kill2 >= restart1 + 0.99 and 1.49 <= restart2 - kill2 <= 2.51
        assert verify == pytest.approx(restart2 + 3.0, abs=0.011)  # ledgers created and closed after the last fault
    scenario = SCENARIOS["gc-under-faults"]
    env = dict(scenario.env)
    assert int(env["BKSIM_BOOKIE_GC_WAIT_TIME_MS"]) <= int(env["BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS"]) <= int(
        env["BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS"]) <= 2000  # several rounds within an 8 s run
    assert float(env["BKSIM_BOOKIE_MINOR_COMPACTION_THRESHOLD"]) <= float(env["BKSIM_BOOKIE_MAJOR_COMPACTION_THRESHOLD"])
    options = dict(scenario.writer_options)
    assert options["keep_closed"] >= 1 and options["entries_per_ledger"] * 8 <= runner.LEDGER_RATE * 8.0
    assert all(not s.writer_options for n, s in SCENARIOS.items() if n != "gc-under-faults")


def test_the_rereplication_times_are_a_field_of_their_own_and_a_line_of_text():
    rep = report.Report("bookie-lost", 1, 8.0, "/runs/z", audit={"verdict": "clean"},
                        rereplication=[{"bookie": "bookie-2", "bookie_id": "h:2", "cause": "loss", "t": 1.5,
                                        "rereplication_s": 2.25},
                                       {"bookie": "bookie-4", "bookie_id": "h:4", "cause": "loss", "t": 4.0,
                                        "rereplication_s": None}],
                        recovery={"tail_acks": {"ledger": 3, "topic": 3}})
    rep.judge()
    out = rep.to_dict()
    assert list(out) == ["scenario", "seed", "duration_s", "run_dir", "audit", "rereplication", "recovery",
                         "violations", "verdict"]
    text = report.render_text(out)
    assert "rereplication: loss of bookie-2 at 1.50s -> every closed ledger fully replicated in 2.25 s" in text
    assert "rereplication: loss of bookie-4 at 4.00s -> every closed ledger fully replicated NOT within the bound" in text
    assert "rereplication" not in report.Report("bookie-kill", 1, 8.0, "/r").to_dict()


def test_verify_gc_checks_only_ledgers_that_lived_away_from_every_fault():
    from types import SimpleNamespace

    from bksim.chaos.workload import LedgerRecord

    def record(ledger_id, created, closed, end="closed"):
        return LedgerRecord(ledger_id, "w", (3, 3, 2), "b", end=end, created_t=created, closed_t=closed)

    writer = SimpleNamespace(ledgers=[record(1, 1.0, 8.0), record(2, 1.0, 9.5), record(3, 11.0, 13.0),
                                      record(4, 12.5, 14.0), record(5, 12.5, 14.0, end="handed-over"),
                                      record(6, 15.0, None), record(7, 20.5, 21.0)])
    faults = [{"t": 10.0, "healed_t": 12.0}, {"t": 20.0}]  # the second not healed: it lasts until now
    away = actions.ledgers_away_from_faults([writer], faults, now=22.0, margin_s=1.0)
    # 2 closed within the margin before the first fault, 3 during it, 5 not closed by its writer, 6 not closed,
    # 7 during the unhealed one
    assert [r.ledger_id for r in away] == [1, 4]


def test_the_html_report_shows_the_verdict_the_acks_per_second_and_links_the_audit(tmp_path):
    from bksim.formats.style import STYLESHEET

    rep = report.Report("bookie-kill", 3, 8.0, str(tmp_path), audit={"verdict": "clean"},
                        timeline=[{"t": 1.25, "kind": "fault", "what": "kill -9 <bookie-2>"}],
                        faults=[{"t": 2.0, "action": "kill", "victims": "bookie-2"}],
                        throughput={"ledger": {"per_second": [0, 90, 100, 20, 95], "baseline_per_s": 95,
                                               "min_per_s_after_first_fault": 20, "dip_fraction": 0.79}},
                        recovery={"per_fault": [{"t": 2.0, "action": "kill", "victims": "bookie-2", "ledger_s": 0.7,
                                                 "topic_s": 0.0, "recovery_s": 0.7, "not_recovered": []}],
                                  "tail_acks": {"ledger": 0}})
    rep.judge()
    report.write(rep.to_dict(), str(tmp_path))
    page = (tmp_path / "report.html").read_text()
    assert STYLESHEET in page and '<a href="audit/report.html">' in page
    assert page.index("FAIL") < page.index("<svg") and "liveness: no ledger acknowledgement" in page
    assert page.count("<polyline") == 1 and page.count('stroke="var(--bad)"') == 1  # one stream, one fault
    assert "kill -9 &lt;bookie-2&gt;" in page and "<bookie-2>" not in page


def test_a_wiped_bookie_is_formatted_only_once_its_killed_predecessors_registration_is_gone(tmp_path, monkeypatch):
    """`bksim bookie format` refuses a bookie still registered (a kill -9 leaves the registration until the session
    expires): the operator's re-initialisation waits for it to go, however fast the wiped bookie refused to start."""
    from types import SimpleNamespace

    log = tmp_path / "bookie-3.log"
    log.write_text("")

    class Cluster:
        run_dir = str(tmp_path)
        def __init__(self):
            self.registered = True  # the predecessor's session has not expired yet
            self.calls: list[str] = []

        def spawn(self, node):
            node.pid = 4242
            with open(log, "a") as f:
                f.write("bksim: error: the journal directory was wiped\n")
            self.calls.append("spawn")

        def wait_registration(self, node, wanted, timeout_s):
            self.registered = False
            self.calls.append("registration gone")
            return 1.2 if wanted(None) else None

        def wait_registered(self, node):
            self.calls.append("registered")
            return 0.1

    def format_bookie(node, cwd):
        if cluster.registered:
            raise actions.ChaosError("bookie is registered as running: stop it before formatting")
        cluster.calls.append("format")
        return "formatted"

    cluster = Cluster()
    node = SimpleNamespace(name="bookie-3", log_path=str(log), pid=None)
    state = SimpleNamespace(cluster=cluster, recorder=SimpleNamespace(event=lambda *a, **k: None), failed_checks=[])
    monkeypatch.setattr(actions.processes, "wait_status", lambda pid, timeout_s: 2)  # refuses at once
    monkeypatch.setattr(actions, "format_bookie", format_bookie)
    actions.reformat_restart(state, None, [node])
    assert cluster.calls == ["spawn", "registration gone", "format", "spawn", "registered"]
    assert state.failed_checks == []
