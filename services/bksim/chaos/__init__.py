"""Chaos scenarios on real processes: a fresh cluster per run, a recording workload, faults on a
seeded schedule, healing, then the checks of PROTOCOL.md section 7 and the journal audit.

- cluster.py   ChaosCluster: the local-cluster launcher's ZooKeeper, bookies and brokers (adapters/local_cluster.py:
               own run directory, free loopback ports, stable identities so a killed process restarts as
               itself; kill -9, SIGSTOP/SIGCONT, restart, all by pid) plus a proxy per broker to ZooKeeper,
               the broker->bookie link proxies and a bookie's private tmpfs ledger disk.
- proxy.py     a loopback TCP proxy with link faults (block, hold one or both directions, delay): between
               each broker and ZooKeeper, and on every broker->bookie link for the network scenarios.
- disk.py      disk faults on a bookie's files: torn or truncated journal tails, a flipped entry-log byte, a
               balloon that fills a (private tmpfs) ledger disk.
- wipe.py      a wiped bookie: empty its directories; judge the audit after its re-initialisation.
- workload.py  the ledger writers (Append streams through the brokers) and the topic producer, recording
               every acknowledged entry and every receipted message with its time.
- check.py     after healing: recover every ledger left OPEN, read everything back through two brokers
               (two readers), consume the topic with two subscriptions; lost / duplicate / reordered /
               divergent counts; the faults' own checks (a paused broker comes back fenced, a flipped copy is
               served and read around) and the audit judgement after a truncation.
- scenarios.py the named fault schedules (a plan drawn from the seed); the step types (StepAction, StepTarget).
- actions.py   what each step does (one function per StepAction) and whom it hits (one rule per StepTarget), in
               two explicit tables; the final heal.
- runner.py    one run end to end (workload, steps, checks, audit; every wait bounded) and campaigns.
- report.py    the report (report.json + report.txt), its figures (throughput, recovery times), the verdict
               rules, the campaign summary table.

chaos imports adapters and client only (tests/architecture/test_dependency_rule.py); the audit runs as a
`bksim audit --local` child process.
"""
