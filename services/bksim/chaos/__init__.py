"""Chaos scenarios on real processes (issue 6): a fresh cluster per run, a recording workload, faults on a
seeded schedule, healing, then the checks of PROTOCOL.md section 7 and the journal audit.

- cluster.py   ChaosCluster: ZooKeeper, bookies and brokers as child processes of this run (own run
               directory, free loopback ports, stable identities so a killed process restarts as itself);
               kill -9, SIGSTOP/SIGCONT, restart, all by pid.
- proxy.py     a loopback TCP proxy that can cut a broker off from ZooKeeper.
- workload.py  the ledger writers (Append streams through the brokers) and the topic producer, recording
               every acknowledged entry and every receipted message with its time.
- check.py     after healing: recover every ledger left OPEN, read everything back through two brokers
               (two readers), consume the topic with two subscriptions; lost / duplicate / reordered /
               divergent counts.
- scenarios.py the named fault schedules (a plan drawn from the seed).
- runner.py    one run end to end (report.json + report.txt) and campaigns (summary table).

chaos imports adapters and client only (tests/architecture/test_dependency_rule.py); the audit runs as a
`bksim audit --local` child process.
"""
