"""The deterministic world (ARCHITECTURE.md "sim/"): the production code runs here unchanged, driven by one seed.

Five scenarios run on it:
- the ledger world (`bksim sim`, the default): brokers running the real broker/ ledger client write, read and
  recover ledgers on bookies running the real BookieEngine, over a simulated network and metadata store, with
  partitions, crashes, session expiries and takeovers; the invariants of PROTOCOL.md §7 checked as it runs
  and by a final audit;
- the bookie world (`bksim sim --world bookie`): one BookieEngine under crashes and disk faults;
- the garbage-collection world (`bksim sim --world gc`): the bookie world plus a simulated metadata store of
  ledgers (ledger_source), ledger deletions, garbage collection and compaction crashed at each of their steps;
- the format scenario: a bookie wiped and formatted under an open ledger, then the ledger recovered (limbo);
- the autorecovery world: the ledger world plus the auditor and replication workers (autorecovery/), with
  bookies lost for good; replicas restored, never lowered, lost ledgers reported.

Modules:
- the world: loop (SimLoop, a virtual-time asyncio event loop: no threads, no I/O, deterministic order;
  run()); clock (SimClock, ports.clock.Clock on the loop's virtual time); disk (SimDisk, ports.disk.Disk in
  memory, with durable vs page-cache bytes, directory entries durable only after sync_dir, crashes with torn
  tails, latencies, bit flips); kv (SimKvRegistry / SimKeyValueStore, ports.kv.KeyValueStore with RocksDB's
  crash behaviour); network (SimNetwork: per-link delay, loss, duplication, reordering, partitions, slow and
  down nodes; SimBookieTransport, the BookieTransport port over it); cluster (SimCluster: bookie processes
  with their disks, crashes, restarts and registrations, an InMemoryMetadataStore as ZooKeeper); trace (the
  per-run trace: one seed -> one byte-identical trace).
- plan: every knob drawn from the seed: BookiePlan, LedgerPlan and its FaultEvent schedule.
- ledger_scenario (run_ledger_sim) and ledger_checks (LedgerChecks: what the writers and readers know, the
  invariants; CheckedStore: every metadata write a CAS).
- bookie_scenario (run_bookie_sim) and bookie_checks (what the clients know, the invariants of PROTOCOL.md
  §2.1/§7 checked on every answer).
- gc_scenario (run_gc_sim), gc_checks (LiveEntriesStayReadable, DeletedStaysDeleted) and ledger_source
  (SimLedgerSource, the garbage collector's metadata store); its knobs: plan.GcPlan.
- format_scenario (run_format_scenario).
- autorecovery_scenario (run_autorecovery_sim; its knobs: plan.AutorecoveryPlan).
- known_issues: engine issues the simulator found that are not fixed yet (with their seeds).
Never imports adapters/ (the dependency rule).
"""
