"""Autorecovery (PROTOCOL.md §6): the cluster restores lost replicas by itself, as BookKeeper's autorecovery
daemon does.

- `marks`: the under-replication marks, their locks and the operators' disable switch in the metadata store
  (BookKeeper's ZkLedgerUnderreplicationManager).
- `auditor`: one per cluster, elected through ephemeral-sequential votes; it marks every ledger that names a
  lost bookie, and its periodic check of all ledgers marks copies missing on live bookies (BookKeeper's
  AuditorElector and Auditor).
- `worker`: the replication workers; each claims a mark, copies the affected closed segments to a
  replacement bookie and replaces the bookie in the metadata (BookKeeper's ReplicationWorker).

Pure asyncio code over ports (MetadataStore, BookieTransport, Clock) and the broker's ledger client, so a
bookie process, `bksim autorecovery run` and the simulator run the same code. It never imports the bookie
(bookies are reached through the BookieTransport port) nor the topic layer.
"""
