"""Deleting a partitioned topic: one broker does it all (Pulsar's deletePartitionedTopic), atomic as users see it.

The state is in the partitioned topic's metadata znode (/admin/partitioned-topics/<tenant>/<ns>/persistent/<t>):

    ACTIVE     {"partitions": N}                      producers and consumers admitted
    DELETING   {"partitions": N, "deleting": true}    nobody admitted to any partition; partitions being deleted
    GONE       (no znode)                             the last partition went, then the znode

    transition   from      to        how
    mark         ACTIVE    DELETING  compare-and-set of the znode, after the refusals below (ACTIVE only)
    partition    DELETING  DELETING  partition i released by its owner, then its znodes and ledgers deleted
    finish       DELETING  GONE      delete the znode, after every partition

Ordering contracts:
- the mark is written before any partition is touched: a broker killed mid-deletion leaves the topic DELETING
  (listed, admitting nobody), and a retried delete on any broker skips the refusals and goes on where the crash
  left it (deleting a partition that is already gone does nothing);
- admission: a broker loading a partition (TopicService._load) reads the mark AFTER creating its ownership znode,
  and the deleting broker reads a partition's owner AFTER writing the mark, so one of them sees the other: no
  partition is served once its deletion has begun;
- a partition served by another broker is released by that broker's ownership watchdog (`release_deleting`, every
  OWNERSHIP_CHECK_MS: its producers and consumers are dropped and refused when they come back); the deleting
  broker waits for that at most `RELEASE_WAIT_MS`, else SERVICE_UNAVAILABLE: the topic stays DELETING and a retry
  finishes it.

Refusals (ACTIVE only, nothing changed): NOT_ALLOWED while producers or consumers are connected to a partition
served here, or (without force) while a partition has subscriptions.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bksim.model.errors import BadVersionError, MetadataError, NoNodeError
from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError, znode_object
from bksim.topics.names import TopicName

if TYPE_CHECKING:
    from bksim.topics.service import TopicService

ACTIVE, DELETING, GONE = "ACTIVE", "DELETING", "GONE"
TRANSITIONS = {(ACTIVE, "mark"): DELETING, (DELETING, "partition"): DELETING, (DELETING, "finish"): GONE}
RELEASE_WAIT_MS = 5_000       # a partition's owner releases it within one watchdog round (OWNERSHIP_CHECK_MS)
RELEASE_POLL_MS = 100


def _move(state: str, event: str) -> str:
    to = TRANSITIONS.get((state, event))
    if to is None:
        raise AssertionError(f"partitioned topic deletion: no transition {event!r} from {state}")
    return to


def being_deleted(name: TopicName) -> TopicError:
    return TopicError(TopicStatus.NOT_ALLOWED, f"topic {name.base} is being deleted: its partitions admit no "
                                               f"producer or consumer (retry the deletion if it was interrupted)")


async def _read(service: "TopicService", name: TopicName) -> tuple[dict, int] | None:
    try:
        data, version = await service.store.get(name.partitioned_path)
    except NoNodeError:
        return None
    except MetadataError as e:
        raise TopicError(TopicStatus.METADATA_ERROR, f"reading {name}: {e}") from None
    return znode_object(data, name.partitioned_path), version


async def is_deleting(service: "TopicService", name: TopicName) -> bool:
    """Whether the partitioned topic `name` belongs to (its base) is DELETING."""
    found = await _read(service, name.base)
    return found is not None and bool(found[0].get("deleting"))


async def delete_partitioned(service: "TopicService", name: TopicName, partitions: int, force: bool) -> int:
    """Run the deletion (module docstring) from whatever state the znode is in; the partition count."""
    parts = [name.partition(i) for i in range(partitions)]
    while True:
        found = await _read(service, name)
        if found is None:
            raise TopicError(TopicStatus.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        doc, version = found
        state = DELETING if doc.get("deleting") else ACTIVE
        if state == DELETING:
            service._log(f"topic {name}: deletion resumed (it was marked deleting)")
            break
        await _refuse(service, parts, force)
        try:
            await service.store.set(name.partitioned_path, json.dumps(doc | {"deleting": True}).encode(), version)
        except BadVersionError:
            continue  # changed meanwhile (another deletion marked it): decide again
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR, f"marking {name} deleting: {e}") from None
        state = _move(state, "mark")
        service._log(f"topic {name}: marked deleting ({partitions} partitions)")
        break
    for part in parts:
        await _release(service, part)
        await service._delete_one(part)
        state = _move(state, "partition")
    try:
        await service.store.delete(name.partitioned_path)
    except NoNodeError:
        pass
    except MetadataError as e:
        raise TopicError(TopicStatus.METADATA_ERROR, f"deleting {name}: {e}") from None
    _move(state, "finish")
    service._log(f"topic {name}: deleted")
    return partitions


async def _refuse(service: "TopicService", parts: list[TopicName], force: bool) -> None:
    for part in parts:
        loaded = service.topics.get(str(part))
        if loaded is not None and (loaded.producers or any(s.consumers for s in loaded.subscriptions.values())):
            raise TopicError(TopicStatus.NOT_ALLOWED, f"topic {part} has connected producers or consumers")
        subs = await service._children(part.managed_ledger_path)
        if subs and not force:
            raise TopicError(TopicStatus.NOT_ALLOWED, f"topic {part} has subscriptions {subs}; use --force")


async def _release(service: "TopicService", part: TopicName) -> None:
    """The partition served by nobody: unloaded here, or released by its owner (bounded wait)."""
    await service.unload_for_deletion(str(part))
    waited = 0
    while True:
        owner = await service._owner(part)
        if owner is None or (owner[0] == service.broker_id and str(part) not in service.topics):
            return
        if waited >= RELEASE_WAIT_MS:
            raise TopicError(TopicStatus.SERVICE_UNAVAILABLE,
                             f"topic {part} is still served by broker {owner[0]} after {RELEASE_WAIT_MS} ms; "
                             f"{part.base} stays marked deleting: retry the deletion", owner_address=owner[1])
        await service._clock.sleep_ms(RELEASE_POLL_MS)
        waited += RELEASE_POLL_MS


async def release_deleting(service: "TopicService") -> None:
    """The ownership watchdog's round: unload every partition served here whose topic is DELETING."""
    bases: dict[str, bool] = {}
    for key, topic in list(service.topics.items()):
        if topic.name.partition_index is None:
            continue
        base = str(topic.name.base)
        if base not in bases:
            try:
                bases[base] = await is_deleting(service, topic.name)
            except TopicError:
                bases[base] = False  # ZooKeeper unreachable: look again next round
        if bases[base]:
            await service.unload_for_deletion(key)
