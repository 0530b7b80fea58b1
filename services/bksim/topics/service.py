"""The broker's topic service: tenants, namespaces, topics, lookup and ownership (PROTOCOL.md §3, §5).

Owns: the topics this broker serves (loaded on first use by a producer or consumer), their ephemeral ownership
znodes, and the admin metadata under /admin.

Ownership: a broker serves a topic only while it holds /ownership/<tenant>/<ns>/<topic> (ephemeral, tied to
its ZooKeeper session; it names the broker and this TopicService's `instance`). A znode naming this broker id
but another instance is a predecessor's (a restart after kill -9, before the old session expired): NOT_OWNER
until that session expires and the znode goes, never adopted (the predecessor's session can expire at any
moment, and another broker would then take the topic while this one still served it). Any broker answers Lookup: the current owner if there is one, else the broker chosen by
rendezvous hashing of the topic over the registered brokers (it takes the topic when a client arrives). A
broker that finds another owner answers NOT_OWNER with that owner's address. Takeover = the managed ledger's
open(): recover (fence) the last ledger, start a new one, CAS the list. A broker that loses its ownership
znode (session expiry) or a CAS fences the topic: producers and consumers are dropped with TOPIC_FENCED and
look the topic up again; a lost session stops serving every topic before anything is waited on (the store may be
on a new session already). A watchdog re-checks every owned topic's znode every `OWNERSHIP_CHECK_MS`. Unloading
releases the znode only while it still names this instance (a close may end after the topic went elsewhere).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Callable

from bksim.broker.ledgers import LedgerService
from bksim.topics import backlog_quota as bq
from bksim.topics.errors import TopicError, znode_object
from bksim.topics.cursor_codec import CodecError, decode_znode
from bksim.topics.managed_cursor import CURSOR_PASSWORD
from bksim.topics.managed_ledger import LEDGER_PASSWORD, ManagedLedger
from bksim.topics.partitioned_delete import being_deleted, delete_partitioned, is_deleting, release_deleting
from bksim.topics.names import (PARTITIONS_MAX, TENANTS_ROOT, TopicName, check_name, namespace_managed_ledgers,
                                       namespace_partitioned, parse_namespace, policies_path, tenant_path)
from bksim.topics.topic import Policies, Topic
from bksim.formats.murmur3 import murmur3_32
from bksim.metadata.paths import BROKERS_AVAILABLE
from bksim.model.config import BrokerConfig, TopicConfig
from bksim.model.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError, NotEmptyError
from bksim.model.status import TopicStatus
from bksim.ports.clock import Clock
from bksim.ports.metadata import MetadataStore

OWNERSHIP_CHECK_MS = 1_000


def _meta(what: str, e: MetadataError) -> TopicError:
    return TopicError(TopicStatus.METADATA_ERROR, f"{what}: {e}")


def _field(doc: dict, path: str, read: Callable):
    """`read(doc)`; METADATA_ERROR naming the path when a field is missing or of the wrong type or size."""
    try:
        return read(doc)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
        raise TopicError(TopicStatus.METADATA_ERROR, f"{path}: malformed ({type(e).__name__}: {e})"[:300]) from None


class TopicService:
    def __init__(self, *, store: MetadataStore, ledgers: LedgerService, clock: Clock, broker_id: str, address: str,
                 open_cursor_factory, config: TopicConfig = TopicConfig(), broker_config: BrokerConfig = BrokerConfig(),
                 log: Callable[[str], None] = lambda line: None, instance: str = "") -> None:
        """`open_cursor_factory(ml, topic_name, subscription, initial_position, on_fenced)` -> ManagedCursor (async);
        the cursor calls `on_fenced(TopicError)` when a CAS on its znode shows another broker owns the topic.
        `instance` tells this process's ownership znodes from a predecessor's with the same broker id (default:
        the broker id and the wall time at construction)."""
        self.store = store
        self.ledgers = ledgers
        self._clock = clock
        self.broker_id = broker_id
        self.address = address
        self.instance = instance or f"{broker_id}@{clock.wall_ms()}"
        self._open_cursor = open_cursor_factory
        self.config = config
        self.broker_config = broker_config
        self._log = log
        self.topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self._watchdog: asyncio.Task | None = None
        self._closing = False
        # ownership changes since start (exported as metrics): topics loaded here, topics fenced here (lost)
        self.stats = {"topics_loaded": 0, "topics_lost": 0}

    def start(self) -> None:
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_ownership())

    # ---- tenants and namespaces ------------------------------------------------------------------------------
    async def create_tenant(self, tenant: str, admin_roles: list[str] | tuple[str, ...] = ()) -> None:
        """A new tenant administered by `admin_roles` (Pulsar's TenantInfo.adminRoles; security/permissions.py
        reads and changes them)."""
        check_name("tenant", tenant)
        try:
            await self.store.create(tenant_path(tenant), json.dumps({"adminRoles": sorted(set(admin_roles))}).encode(),
                                    make_parents=True)
        except NodeExistsError:
            raise TopicError(TopicStatus.ALREADY_EXISTS, f"tenant {tenant} already exists") from None
        except MetadataError as e:
            raise _meta(f"creating tenant {tenant}", e) from None

    async def list_tenants(self) -> list[str]:
        return await self._children(TENANTS_ROOT)

    async def _children(self, path: str) -> list[str]:
        try:
            return sorted(await self.store.children(path))
        except NoNodeError:
            return []
        except MetadataError as e:
            raise _meta(f"listing {path}", e) from None

    async def _require_tenant(self, tenant: str) -> None:
        try:
            if await self.store.exists(tenant_path(tenant)) is None:
                raise TopicError(TopicStatus.TENANT_NOT_FOUND,
                                 f"tenant {tenant} does not exist (bksim tenant create {tenant})")
        except MetadataError as e:
            raise _meta(f"reading tenant {tenant}", e) from None

    async def create_namespace(self, namespace: str, policies: Policies) -> Policies:
        tenant, ns = parse_namespace(namespace)
        if policies.retention_ms < -1 or policies.retention_bytes < -1 or policies.ttl_ms < 0:
            raise TopicError(TopicStatus.BAD_REQUEST, f"namespace {namespace}: retention must be >= -1 and ttl >= 0")
        await self._require_tenant(tenant)
        try:
            await self.store.create(policies_path(tenant, ns), json.dumps(policies.to_json()).encode(),
                                    make_parents=True)
        except NodeExistsError:
            raise TopicError(TopicStatus.ALREADY_EXISTS, f"namespace {namespace} already exists") from None
        except MetadataError as e:
            raise _meta(f"creating namespace {namespace}", e) from None
        return policies

    async def get_namespace(self, namespace: str) -> Policies:
        tenant, ns = parse_namespace(namespace)
        try:
            data, _ = await self.store.get(policies_path(tenant, ns))
        except NoNodeError:
            raise TopicError(TopicStatus.NAMESPACE_NOT_FOUND, f"namespace {namespace} does not exist "
                                                              f"(bksim namespace create {namespace})") from None
        except MetadataError as e:
            raise _meta(f"reading namespace {namespace}", e) from None
        path = policies_path(tenant, ns)
        return _field(znode_object(data, path), path, Policies.from_json)

    async def set_backlog_quota(self, namespace: str, quota: bq.BacklogQuota) -> tuple[bq.BacklogQuota, ...]:
        """Replace the namespace's quota of quota.type (BAD_REQUEST when not below a set retention); the topics
        loaded here apply it at once, the other brokers' within OWNERSHIP_CHECK_MS."""
        def change(p: Policies) -> Policies:
            bq.check_against_retention(quota, p.retention_ms, p.retention_bytes)
            return dataclasses.replace(p, backlog_quotas=bq.with_quota(p.backlog_quotas, quota))
        policies = await self._update_policies(namespace, change)
        self._log(f"namespace {namespace}: backlog quota {quota.describe()} set")
        return policies.backlog_quotas

    async def remove_backlog_quota(self, namespace: str, kind: str) -> tuple[bq.BacklogQuota, ...]:
        policies = await self._update_policies(
            namespace, lambda p: dataclasses.replace(p, backlog_quotas=bq.without_quota(p.backlog_quotas, kind)))
        self._log(f"namespace {namespace}: backlog quota {kind} removed")
        return policies.backlog_quotas

    async def _update_policies(self, namespace: str, change: Callable[[Policies], Policies]) -> Policies:
        """Compare-and-set of the policies znode: `change` decides from what was read (again after a conflict);
        the znode's other fields (grants) are kept."""
        tenant, ns = parse_namespace(namespace)
        path = policies_path(tenant, ns)
        while True:
            try:
                data, version = await self.store.get(path)
            except NoNodeError:
                raise TopicError(TopicStatus.NAMESPACE_NOT_FOUND, f"namespace {namespace} does not exist "
                                                                  f"(bksim namespace create {namespace})") from None
            except MetadataError as e:
                raise _meta(f"reading namespace {namespace}", e) from None
            doc = znode_object(data, path)
            policies = change(_field(doc, path, Policies.from_json))
            try:
                await self.store.set(path, json.dumps(doc | policies.to_json()).encode(), version)
            except BadVersionError:
                continue  # changed meanwhile (a grant, another policy): decide again from the new value
            except MetadataError as e:
                raise _meta(f"writing namespace {namespace}", e) from None
            self._apply_policies(namespace, policies)
            return policies

    def _apply_policies(self, namespace: str, policies: Policies) -> None:
        """The namespace's backlog quotas into the topics loaded here (retention, TTL and dedup are read when a
        topic loads)."""
        for topic in self.topics.values():
            if topic.name.ns == namespace and topic.policies.backlog_quotas != policies.backlog_quotas:
                topic.policies = dataclasses.replace(topic.policies, backlog_quotas=policies.backlog_quotas)

    async def _refresh_policies(self) -> None:
        for namespace in {t.name.ns for t in self.topics.values()}:
            try:
                self._apply_policies(namespace, await self.get_namespace(namespace))
            except TopicError:
                continue  # ZooKeeper unreachable or the namespace gone: keep what the topics have

    async def list_namespaces(self, tenant: str) -> list[str]:
        check_name("tenant", tenant)
        await self._require_tenant(tenant)
        return [f"{tenant}/{ns}" for ns in await self._children(policies_path(tenant, "")[:-1])]

    # ---- topics -------------------------------------------------------------------------------------------------
    async def create_topic(self, topic: str, partitions: int) -> int:
        name = TopicName.parse(topic)
        if name.partition_index is not None:
            raise TopicError(TopicStatus.BAD_REQUEST, f"{topic} names a partition; create the partitioned topic "
                                                      f"{name.base} instead")
        if not 0 <= partitions <= PARTITIONS_MAX:
            raise TopicError(TopicStatus.BAD_REQUEST, f"partitions must be 0..{PARTITIONS_MAX}, not {partitions}")
        await self.get_namespace(name.ns)
        if await self._partitions(name) is not None or await self._exists(name.managed_ledger_path):
            raise TopicError(TopicStatus.ALREADY_EXISTS, f"topic {topic} already exists")
        try:
            if partitions:
                await self.store.create(name.partitioned_path, json.dumps({"partitions": partitions}).encode(),
                                        make_parents=True)
                for i in range(partitions):
                    try:
                        await ManagedLedger.create_znode(self.store, name.partition(i))
                    except NodeExistsError:
                        pass
            else:
                await ManagedLedger.create_znode(self.store, name)
        except NodeExistsError:
            raise TopicError(TopicStatus.ALREADY_EXISTS, f"topic {topic} already exists") from None
        except MetadataError as e:
            raise _meta(f"creating topic {topic}", e) from None
        self._log(f"topic {topic}: created" + (f" with {partitions} partitions" if partitions else ""))
        return partitions

    async def _exists(self, path: str) -> bool:
        try:
            return await self.store.exists(path) is not None
        except MetadataError as e:
            raise _meta(f"reading {path}", e) from None

    async def _partitions(self, name: TopicName) -> int | None:
        try:
            data, _ = await self.store.get(name.partitioned_path)
        except NoNodeError:
            return None
        except MetadataError as e:
            raise _meta(f"reading {name}", e) from None
        return _field(znode_object(data, name.partitioned_path), name.partitioned_path, lambda d: int(d["partitions"]))

    async def get_topic(self, topic: str) -> int:
        """Partitions of a topic (0 = non-partitioned); TOPIC_NOT_FOUND when it does not exist."""
        name = TopicName.parse(topic)
        await self.get_namespace(name.ns)
        partitions = await self._partitions(name)
        if partitions is not None:
            return partitions
        if await self._exists(name.managed_ledger_path):
            return 0
        raise TopicError(TopicStatus.TOPIC_NOT_FOUND, f"topic {topic} does not exist (bksim topic create {topic})")

    async def list_topics(self, namespace: str) -> list[str]:
        tenant, ns = parse_namespace(namespace)
        await self.get_namespace(namespace)
        partitioned = await self._children(namespace_partitioned(tenant, ns))
        out = {f"persistent://{tenant}/{ns}/{t}" for t in partitioned}
        for local in await self._children(namespace_managed_ledgers(tenant, ns)):
            base = TopicName(tenant, ns, local).base.local
            if local == base or base not in partitioned:
                out.add(f"persistent://{tenant}/{ns}/{local}")
        return sorted(out)

    async def delete_topic(self, topic: str, force: bool) -> int:
        """Delete a topic: refuse while producers/consumers are connected here, or (without force) while
        subscriptions exist. Metadata first, then the ledgers. A partitioned topic: every partition, wherever it
        is served, as topics/partitioned_delete.py says (marked deleting first; a retry finishes it)."""
        partitions = await self.get_topic(topic)
        name = TopicName.parse(topic)
        if partitions:
            return await delete_partitioned(self, name, partitions, force)
        parts = [name.partition(i) for i in range(partitions)] if partitions else [name]
        for part in parts:
            owner = await self._owner(part)
            if owner is not None and owner[0] != self.broker_id:
                raise TopicError(TopicStatus.NOT_OWNER, f"topic {part} is served by broker {owner[0]}; delete it there",
                                 owner_address=owner[1])
            loaded = self.topics.get(str(part))
            if loaded is not None and (loaded.producers or any(s.consumers for s in loaded.subscriptions.values())):
                raise TopicError(TopicStatus.NOT_ALLOWED, f"topic {part} has connected producers or consumers")
            subs = await self._children(part.managed_ledger_path)
            if subs and not force:
                raise TopicError(TopicStatus.NOT_ALLOWED, f"topic {part} has subscriptions {subs}; use --force")
        for part in parts:
            await self._delete_one(part)
        if partitions:
            try:
                await self.store.delete(name.partitioned_path)
            except NoNodeError:
                pass
            except MetadataError as e:
                raise _meta(f"deleting {topic}", e) from None
        self._log(f"topic {topic}: deleted")
        return partitions

    async def _delete_one(self, name: TopicName) -> None:
        loaded = self.topics.pop(str(name), None)
        if loaded is not None:
            await loaded.close()
        ledger_ids: list[int] = []
        cursor_ledgers: list[int] = []
        try:
            data, _ = await self.store.get(name.managed_ledger_path)
            ledger_ids = _field(znode_object(data, name.managed_ledger_path), name.managed_ledger_path,
                                lambda d: [int(x["ledger_id"]) for x in d.get("ledgers", [])])
            for node in await self._children(name.managed_ledger_path):
                path = f"{name.managed_ledger_path}/{node}"
                try:
                    cdata, _ = await self.store.get(path)
                    lid = decode_znode(cdata, path).cursor_ledger
                    if lid >= 0:
                        cursor_ledgers.append(lid)
                except (CodecError, NoNodeError):
                    pass
                await self.store.delete(path)
            await self.store.delete(name.managed_ledger_path)
        except NoNodeError:
            pass
        except NotEmptyError:
            raise TopicError(TopicStatus.NOT_ALLOWED,
                             f"topic {name} got a new subscription while being deleted") from None
        except MetadataError as e:
            raise _meta(f"deleting {name}", e) from None
        try:
            await self.store.delete(name.ownership_path)
        except (NoNodeError, MetadataError):
            pass
        for lid, password in [(i, LEDGER_PASSWORD) for i in ledger_ids] + [(i, CURSOR_PASSWORD) for i in cursor_ledgers]:
            try:
                await self.ledgers.delete_ledger(lid, password=password)
            except Exception as e:  # noqa: BLE001 - a ledger that cannot be deleted leaks; say so, go on
                self._log(f"topic {name}: ledger {lid} not deleted ({e})")

    # ---- lookup and ownership -------------------------------------------------------------------------------------
    async def _owner(self, name: TopicName) -> tuple[str, str, str] | None:
        """(broker id, address, instance) from the topic's ownership znode, or None."""
        try:
            data, _ = await self.store.get(name.ownership_path)
        except NoNodeError:
            return None
        except MetadataError as e:
            raise _meta(f"reading the owner of {name}", e) from None
        d = znode_object(data, name.ownership_path)
        return str(d.get("broker_id", "")), str(d.get("address", "")), str(d.get("instance", ""))

    async def _brokers(self) -> dict[str, str]:
        out = {}
        for b in await self._children(BROKERS_AVAILABLE):
            try:
                data, _ = await self.store.get(f"{BROKERS_AVAILABLE}/{b}")
                d = znode_object(data, f"{BROKERS_AVAILABLE}/{b}")
                out[b] = f"{d.get('host', '127.0.0.1')}:{d.get('port', 0)}"
            except (NoNodeError, TopicError):
                continue  # gone meanwhile, or not a broker's registration: not a broker to name
        out.setdefault(self.broker_id, self.address)
        return out

    async def lookup(self, topic: str) -> tuple[str, str, bool]:
        """(broker id, address, owned) for a non-partitioned topic or a partition."""
        name = TopicName.parse(topic)
        await self._require_topic(name)
        owner = await self._owner(name)
        if owner is not None:
            return owner[0], owner[1], True
        brokers = await self._brokers()
        chosen = max(brokers, key=lambda b: (murmur3_32(f"{b}/{name}"), b))  # rendezvous hashing
        return chosen, brokers[chosen], False

    async def _require_topic(self, name: TopicName) -> None:
        if not await self._exists(name.managed_ledger_path):
            if name.partition_index is None and await self._partitions(name) is not None:
                raise TopicError(TopicStatus.BAD_REQUEST, f"{name} is partitioned: use its partitions "
                                                          f"({name}-partition-<i>)")
            await self.get_namespace(name.ns)
            raise TopicError(TopicStatus.TOPIC_NOT_FOUND,
                             f"topic {name} does not exist (bksim topic create {name.base})")

    async def acquire(self, topic: str) -> Topic:
        """The topic, loaded here (taking ownership if nobody has it); NOT_OWNER if another broker has it."""
        if self._closing:
            raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, "this broker is shutting down")
        name = TopicName.parse(topic)
        key = str(name)
        loaded = self.topics.get(key)
        if loaded is not None and loaded.fenced is None:
            return loaded
        if loaded is not None:
            self.topics.pop(key, None)
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            topic_obj = await self._load(name)
            future.set_result(topic_obj)
            return topic_obj
        except BaseException as e:
            future.set_exception(e)
            future.exception()
            raise
        finally:
            self._loading.pop(key, None)

    async def _load(self, name: TopicName) -> Topic:
        await self._require_topic(name)
        policies = await self.get_namespace(name.ns)
        mine = json.dumps({"broker_id": self.broker_id, "address": self.address, "instance": self.instance}).encode()
        try:
            await self.store.create(name.ownership_path, mine, ephemeral=True, make_parents=True)
        except NodeExistsError:
            owner = await self._owner(name)
            if owner is None or owner[0] != self.broker_id or owner[2] != self.instance:
                predecessor = owner is not None and owner[0] == self.broker_id
                raise TopicError(TopicStatus.NOT_OWNER,
                                 f"topic {name} is served by broker {owner[0] if owner else '?'}"
                                 + (" (a previous instance of this broker, until its ZooKeeper session expires)"
                                    if predecessor else ""),
                                 owner_address=owner[1] if owner else "") from None
            # our own znode from this session (a topic fenced here and being loaded again): keep it
        except MetadataError as e:
            raise _meta(f"taking ownership of {name}", e) from None
        if name.partition_index is not None and await is_deleting(self, name):  # after the znode: see
            try:                                                                 # partitioned_delete.py
                await self.store.delete(name.ownership_path)
            except MetadataError:
                pass  # our session's ephemeral: it goes with the session at worst
            raise being_deleted(name)
        ml = ManagedLedger(name, ledgers=self.ledgers, store=self.store, clock=self._clock, config=self.config,
                           broker_config=self.broker_config, log=self._log)

        holder: list[Topic] = []

        def on_fenced(error: TopicError) -> None:  # a cursor's CAS lost: another broker owns the topic
            if holder:
                asyncio.get_running_loop().create_task(self.fence_topic(str(name), error.message))

        async def open_cursor(subscription: str, initial_position: str, create: bool):
            return await self._open_cursor(ml, name, subscription, initial_position, on_fenced)

        topic = Topic(name, ml=ml, open_cursor=open_cursor, clock=self._clock, policies=policies, config=self.config,
                      log=self._log)
        holder.append(topic)
        try:
            await topic.load()
        except BaseException:
            await topic.fence("loading failed")
            await self._release(name)
            raise
        self.topics[str(name)] = topic
        self.stats["topics_loaded"] += 1
        self._log(f"topic {name}: now served by {self.broker_id}")
        return topic

    async def _watch_ownership(self) -> None:
        while not self._closing:
            await self._clock.sleep_ms(OWNERSHIP_CHECK_MS)
            await self._refresh_policies()
            await release_deleting(self)
            for key, topic in list(self.topics.items()):
                if topic.fenced is not None:
                    self.topics.pop(key, None)
                    continue
                try:
                    owner = await self._owner(topic.name)
                except TopicError:
                    continue  # ZooKeeper unreachable: the session decides; a new owner fences our ledger anyway
                if owner is None or owner[0] != self.broker_id:
                    await self.fence_topic(key, f"ownership znode {'gone' if owner is None else 'taken by ' + owner[0]}")

    async def unload_for_deletion(self, key: str) -> None:
        """A partition of a topic being deleted: unloaded (producers and consumers dropped; they are refused when
        they come back), its ownership znode released."""
        topic = self.topics.pop(key, None)
        if topic is None:
            return
        self._log(f"topic {key}: unloaded, its partitioned topic is being deleted")
        await self._unload(key, topic)  # an ownership znode left (ZooKeeper unreachable): the deleter waits, bounded

    async def _unload(self, key: str, topic: Topic) -> None:
        """Close `topic` cleanly (final cursor state, ledger closed) and release its ownership znode."""
        try:
            await topic.close()
        except TopicError as e:
            self._log(f"topic {key}: not closed cleanly ({e})")
        await self._release(topic.name)

    async def _release(self, name: TopicName) -> None:
        """Delete the topic's ownership znode if it is still this instance's, by compare-and-set on the version
        read. A close can end long after the ownership went (the session expired meanwhile, and was renewed):
        the znode may then be another broker's, and deleting it would let a third take the topic while that one
        serves it. Any failure leaves the znode: ours goes with our session at worst."""
        path = name.ownership_path
        try:
            data, version = await self.store.get(path)
            d = znode_object(data, path)
            if d.get("broker_id") != self.broker_id or d.get("instance") != self.instance:
                return
            await self.store.delete(path, version)
        except (MetadataError, TopicError):
            pass

    async def fence_topic(self, key: str, reason: str) -> None:
        topic = self._lose(key, reason)
        if topic is not None:
            await topic.fence(reason)

    def _lose(self, key: str, reason: str) -> Topic | None:
        """The topic is no longer served here (taken out of `topics`, every call refused), without waiting."""
        topic = self.topics.pop(key, None)
        if topic is not None:
            self.stats["topics_lost"] += 1
            self._log(f"topic {key}: lost ownership ({reason}); fenced here")
            topic.stop_serving(reason)
        return topic

    async def session_lost(self) -> None:
        """ZooKeeper session expired: every ownership znode went with it, and other brokers may serve those topics
        already. Every topic stops being served here before anything is waited on (the store may already be on a
        new session: nothing it serves may be a topic of the old one), then each is fenced."""
        reason = "ZooKeeper session expired"
        lost = [topic for topic in (self._lose(key, reason) for key in list(self.topics)) if topic is not None]
        for topic in lost:
            await topic.fence(reason)

    async def close(self) -> None:
        """Clean shutdown: unload every topic (final cursor state, ledgers closed), release ownership."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        for key, topic in list(self.topics.items()):
            await self._unload(key, topic)
        self.topics.clear()
