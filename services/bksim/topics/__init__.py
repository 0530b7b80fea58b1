"""The topic layer (PROTOCOL.md §5): managed ledgers, durable cursors, subscriptions and dispatchers,
producers with dedup, ownership. Pure asyncio code over ports (MetadataStore, the broker's LedgerService,
Clock), so the broker process runs it and a simulator could."""
