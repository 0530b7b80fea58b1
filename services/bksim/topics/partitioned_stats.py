"""The stats of a partitioned topic from its partitions' stats (Pulsar's PartitionedTopicStats): pure, no I/O.

Each partition is served by its own owner, so whoever asks (the client, following each partition's owner) gathers
one Topic.stats() per partition and `aggregate` sums them:

- the topic's counters and rates (msgRateIn ... bytesOutCounter, storageSize, estimatedBacklogSizeBytes,
  heldSends, backlogEvictedEntries) are sums; backlogSize (the largest subscription backlog, in messages) is the
  largest of the partitions'; publishers are listed once per partition they write to;
- each subscription (by name) sums msgBacklog, unackedMessages, msgOutCounter, bytesOutCounter, totalMsgExpired
  and its rates, takes the latest lastExpireTimestamp, and lists the consumers of every partition;
- "metadata" {"partitions": N} and "partitions" {partition name: its own stats} as Pulsar's perPartition view.
"""
from __future__ import annotations

TOPIC_SUMS = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "msgInCounter", "bytesInCounter",
              "msgOutCounter", "bytesOutCounter", "storageSize", "estimatedBacklogSizeBytes", "heldSends",
              "backlogEvictedEntries")
SUBSCRIPTION_SUMS = ("msgBacklog", "unackedMessages", "msgOutCounter", "bytesOutCounter", "msgRateOut",
                     "msgThroughputOut", "replayQueueSize", "totalMsgExpired")


def _add(total: dict, part: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        if isinstance(part.get(key), (int, float)) and not isinstance(part.get(key), bool):
            total[key] = round(total.get(key, 0) + part[key], 1) if isinstance(part[key], float) \
                else total.get(key, 0) + part[key]


def aggregate(topic: str, partitions: dict[str, dict]) -> dict:
    """PartitionedTopicStats of `topic` from {partition name: Topic.stats()} (every partition present)."""
    out: dict = {"topic": topic, "metadata": {"partitions": len(partitions)}, "publishers": [], "subscriptions": {},
                 "backlogSize": 0, "partitions": dict(sorted(partitions.items()))}
    for key in TOPIC_SUMS:
        out[key] = 0
    for name, stats in sorted(partitions.items()):
        _add(out, stats, TOPIC_SUMS)
        out["backlogSize"] = max(out["backlogSize"], stats.get("backlogSize", 0))
        out["publishers"] += [p | {"partition": name} for p in stats.get("publishers", [])]
        for sub_name, sub in stats.get("subscriptions", {}).items():
            total = out["subscriptions"].setdefault(sub_name, {"type": sub.get("type"), "consumers": []})
            _add(total, sub, SUBSCRIPTION_SUMS)
            if "lastExpireTimestamp" in sub:
                total["lastExpireTimestamp"] = max(total.get("lastExpireTimestamp", 0), sub["lastExpireTimestamp"])
            total["consumers"] += [c | {"partition": name} for c in sub.get("consumers", [])]
    for key in ("deduplicationStatus", "backlogQuotas"):
        values = {repr(s.get(key)) for s in partitions.values()}
        if len(values) == 1:
            out[key] = next(iter(partitions.values())).get(key)
    return out
