"""The deterministic world (ARCHITECTURE.md "sim/"): the production code runs here unchanged, driven by one seed.

- loop: SimLoop, a virtual-time asyncio event loop (no threads, no I/O, deterministic order); run().
- clock: SimClock (ports.clock.Clock) on the loop's virtual time.
- disk: SimDisk (ports.disk.Disk) in memory, with durable vs page-cache bytes, directory entries durable only
  after sync_dir, crashes with torn tails, latencies, bit flips.
- kv: SimKvRegistry / SimKeyValueStore (ports.kv.KeyValueStore) with RocksDB's crash behaviour.
- trace: the per-run trace (one seed -> one byte-identical trace).
- plan: BookiePlan, every knob of a bookie simulation drawn from the seed.
- bookie_checks: what the clients know, and the invariants of PROTOCOL.md §2.1/§7 checked on every answer.
- bookie_scenario: the first simulation (one BookieEngine, crashes and restarts, audits); run_bookie_sim().
- known_issues: engine issues the simulator found that are not fixed yet (with their seeds).
Never imports adapters/ (the dependency rule).
"""
