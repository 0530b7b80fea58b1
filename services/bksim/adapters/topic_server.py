"""The broker's gRPC Topics service (proto/topic.proto) over a TopicService (topics/service.py).

Owns: translating wire messages to topic-layer calls and back; TopicError -> gRPC status (the mapping is at
the top of proto/topic.proto; the TopicStatus name also travels in the trailer "bksim-status", and streams
send it in-band first as an Error response); the Produce pipeline (Sends start in arrival order, receipts
go back in that order; at most `topic.producer_pending_max` Sends are unanswered, then the reader stops
reading and gRPC flow control pushes back); the Subscribe stream's outbox (bounded by the consumer's permits:
the dispatcher never sends beyond them; and at most ANSWERS_PENDING_MAX unwritten AckResults and SeekResults,
then the reader stops reading requests until the client reads). A Subscribe stream delivers entries as stored (DeliveryFormat ENTRY) or
decoded here into ReceivedMessages (MESSAGES: any client with the protos alone); `non_durable` opens a reader
(topics/non_durable_cursor.py), whose subscription goes with the stream.

Authorization (security.authorization_enabled; the caller's role comes from the token, security/broker_auth.py):
every call is checked against its resource before it does anything (security/permissions.py): tenant creation,
tenant admin roles and the tenant list need a super-user; namespaces, topics (create, delete, list, stats) and
grants need an admin of the tenant; Produce needs `produce`, Subscribe `consume`, Lookup and GetTopic either,
on the topic or its namespace. A streamed call is checked when it opens. Refusal: PERMISSION_DENIED naming the
role and the action. Grants can be read and changed with authorization off too (then nothing is enforced).

Must not: block the event loop, log payloads.
"""
from __future__ import annotations

import asyncio
import collections
import json
from typing import Callable

import grpc

from bksim.security.authz import Authorizer
from bksim.security.broker_auth import caller_role
from bksim.security.permissions import Permissions, check_admin_roles
from bksim.adapters.grpc_input import bounded_details
from bksim.topics import backlog_quota as bq
from bksim.topics.errors import TopicError
from bksim.topics.positions import Position
from bksim.topics.service import TopicService
from bksim.topics.subscription import Delivery
from bksim.topics.topic import Policies
from bksim.formats.message import Message, decode_entry
from bksim.gen import topic_pb2, topic_pb2_grpc
from bksim.model.errors import FormatError
from bksim.model.status import TopicStatus
from bksim.topics.positions import MessageId

SERVICE_NAME = topic_pb2.DESCRIPTOR.services_by_name["Topics"].full_name
STATUS_KEY = "bksim-status"
OWNER_KEY = "bksim-owner"  # with NOT_OWNER: the owner's address (host:port), when known
TOPIC_GRPC_CODE_NAME = {
    TopicStatus.BAD_REQUEST: "INVALID_ARGUMENT", TopicStatus.MESSAGE_TOO_LARGE: "INVALID_ARGUMENT",
    TopicStatus.INVALID_ACK: "INVALID_ARGUMENT", TopicStatus.TENANT_NOT_FOUND: "NOT_FOUND",
    TopicStatus.NAMESPACE_NOT_FOUND: "NOT_FOUND", TopicStatus.TOPIC_NOT_FOUND: "NOT_FOUND",
    TopicStatus.SUBSCRIPTION_NOT_FOUND: "NOT_FOUND", TopicStatus.ALREADY_EXISTS: "ALREADY_EXISTS",
    TopicStatus.CONSUMER_BUSY: "FAILED_PRECONDITION", TopicStatus.NOT_ALLOWED: "FAILED_PRECONDITION",
    TopicStatus.NOT_OWNER: "UNAVAILABLE", TopicStatus.TOPIC_FENCED: "UNAVAILABLE",
    TopicStatus.SERVICE_UNAVAILABLE: "UNAVAILABLE", TopicStatus.METADATA_ERROR: "UNAVAILABLE",
    TopicStatus.TOO_MANY_REQUESTS: "RESOURCE_EXHAUSTED", TopicStatus.TIMEOUT: "DEADLINE_EXCEEDED",
    TopicStatus.INTERNAL: "INTERNAL", TopicStatus.UNAUTHENTICATED: "UNAUTHENTICATED",
    TopicStatus.PERMISSION_DENIED: "PERMISSION_DENIED",
    TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED: "FAILED_PRECONDITION",
    TopicStatus.CONSUMER_ASSIGN_ERROR: "FAILED_PRECONDITION",
}
SUB_TYPES = {topic_pb2.EXCLUSIVE: "Exclusive", topic_pb2.SHARED: "Shared", topic_pb2.FAILOVER: "Failover",
             topic_pb2.KEY_SHARED: "Key_Shared"}
DELIVERIES_PER_MESSAGE_MAX = 256
QUOTA_TYPES = {topic_pb2.DESTINATION_STORAGE: bq.DESTINATION_STORAGE, topic_pb2.MESSAGE_AGE: bq.MESSAGE_AGE}
QUOTA_POLICIES = {topic_pb2.PRODUCER_REQUEST_HOLD: bq.PRODUCER_REQUEST_HOLD,
                  topic_pb2.PRODUCER_EXCEPTION: bq.PRODUCER_EXCEPTION,
                  topic_pb2.CONSUMER_BACKLOG_EVICTION: bq.CONSUMER_BACKLOG_EVICTION}


def backlog_quota_of(q: topic_pb2.BacklogQuota) -> bq.BacklogQuota:
    """BAD_REQUEST for an unknown type or policy, or a limit that is not > 0."""
    kind, policy = QUOTA_TYPES.get(q.type), QUOTA_POLICIES.get(q.policy)
    if kind is None or policy is None:
        raise TopicError(TopicStatus.BAD_REQUEST, f"unknown backlog quota type {q.type} or policy {q.policy}")
    return bq.BacklogQuota(kind, q.limit_bytes if kind == bq.DESTINATION_STORAGE else q.limit_time_ms, policy)


def backlog_quota_pb(q: bq.BacklogQuota) -> topic_pb2.BacklogQuota:
    out = topic_pb2.BacklogQuota(type={v: k for k, v in QUOTA_TYPES.items()}[q.type],
                                 policy={v: k for k, v in QUOTA_POLICIES.items()}[q.policy])
    if q.type == bq.DESTINATION_STORAGE:
        out.limit_bytes = q.limit
    else:
        out.limit_time_ms = q.limit
    return out
# AckResults and SeekResults of one Subscribe stream not yet written (the client does not read them): then the
# stream stops reading requests until they are, and gRPC flow control pushes back on the client
ANSWERS_PENDING_MAX = 1024
_ANSWERS = ("ack_result", "seek_result", "last_message_id")


def received_messages(d: Delivery, partition: int) -> list[topic_pb2.ReceivedMessage]:
    """The MESSAGES format of one delivery: its entry decoded, without the acknowledged batch indexes; an entry
    that is not in the message format is one message carrying the whole entry."""
    try:
        header, messages = decode_entry(d.entry)
    except FormatError:
        return [topic_pb2.ReceivedMessage(id=topic_pb2.AckId(ledger_id=d.position.ledger, entry_id=d.position.entry,
                                                             batch_index=-1), partition=partition, payload=d.entry,
                                          redelivery_count=d.redelivery_count)]
    acked = set(d.acked_batch_indexes)
    size = len(messages) if header.is_batch else 0
    out = []
    for i, m in enumerate(messages):
        if i in acked:
            continue
        out.append(topic_pb2.ReceivedMessage(
            id=topic_pb2.AckId(ledger_id=d.position.ledger, entry_id=d.position.entry,
                               batch_index=i if size else -1, batch_size=size),
            partition=partition, payload=m.payload, key=m.key or "", has_key=m.key is not None,
            properties=m.properties, event_time_ms=m.event_time_ms, publish_time_ms=header.publish_time_ms,
            sequence_id=m.sequence_id, producer_name=header.producer_name, redelivery_count=d.redelivery_count,
            deliver_at_ms=m.deliver_at_ms))
    return out


def _ack_indexes(a: topic_pb2.AckId) -> "int | tuple[int, ...]":
    """What an Ack's id acknowledges of its entry: -1 (the whole entry, also when batch_size is 0), one batch
    index, or batch_index with more_batch_indexes as a tuple (Subscription.ack checks each)."""
    if a.batch_size <= 0:
        return -1
    if a.more_batch_indexes:
        return (a.batch_index, *a.more_batch_indexes)
    return a.batch_index


def _error_message(e: TopicError) -> topic_pb2.Error:
    return topic_pb2.Error(status=topic_pb2.TopicStatus.Value(e.status), message=e.message,
                           owner_address=e.owner_address)


async def _abort(context, e: TopicError):
    trailer = ((STATUS_KEY, e.status),) + (((OWNER_KEY, e.owner_address),) if e.owner_address else ())
    context.set_trailing_metadata(trailer)
    await context.abort(getattr(grpc.StatusCode, TOPIC_GRPC_CODE_NAME.get(e.status, "UNKNOWN")),
                        bounded_details(e.message))


class _Admit:
    """Enter the broker's shared RPC bound (broker.requests_inflight_max) with a topic status when full."""

    def __init__(self, admission) -> None:
        self._admission = admission

    def __enter__(self):
        if self._admission.active >= self._admission.limit:
            raise TopicError(TopicStatus.TOO_MANY_REQUESTS, f"{self._admission.active} requests in flight "
                                                            f"(broker.requests_inflight_max = {self._admission.limit})")
        return self._admission.__enter__()

    def __exit__(self, *exc) -> None:
        self._admission.__exit__(*exc)


class _Sink:
    """A consumer's outbox: the dispatcher puts deliveries here (bounded by the consumer's permits), the RPC
    writes them out."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()
        self.ready = asyncio.Event()
        self.answers = 0  # AckResults and SeekResults in `items`
        self.room = asyncio.Event()  # set while answers < ANSWERS_PENDING_MAX
        self.room.set()

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.items.append(deliveries)
        self.ready.set()

    def active_changed(self, active: bool) -> None:
        self.items.append(topic_pb2.ConsumeResponse(active_change=topic_pb2.ActiveConsumerChange(active=active)))
        self.ready.set()

    def drop(self, error: TopicError) -> None:
        self.items.append(error)
        self.ready.set()

    def put(self, response) -> None:
        self.items.append(response)
        self.ready.set()

    def answer(self, response) -> None:
        """An AckResult or SeekResult, counted until written."""
        self.answers += 1
        if self.answers >= ANSWERS_PENDING_MAX:
            self.room.clear()
        self.put(response)

    def answer_written(self) -> None:
        self.answers -= 1
        if self.answers < ANSWERS_PENDING_MAX:
            self.room.set()


class TopicsServicer(topic_pb2_grpc.TopicsServicer):
    def __init__(self, service: TopicService, admission, log: Callable[[str], None]) -> None:
        self.service = service
        self._admission = _Admit(admission)  # shared with the Broker service: one bound on concurrent RPCs
        self._log = log
        self.draining = False
        self.permissions = Permissions(service.store, Authorizer())  # grants are readable with authorization off
        self.enforce = False  # BrokerServer turns it on with security.authorization_enabled

    def authorize_with(self, authorizer: Authorizer) -> None:
        """Check every call against `authorizer` (security.authorization_enabled)."""
        self.permissions = Permissions(self.service.store, authorizer)
        self.enforce = True

    @staticmethod
    def _role() -> str:
        return caller_role() or ""

    async def _admin_of(self, action: str, tenant: str) -> None:
        if self.enforce:
            await self.permissions.require_tenant_admin(self._role(), action, tenant)

    async def _admin_of_namespace(self, action: str, namespace: str) -> None:
        if self.enforce:
            await self.permissions.require_namespace_admin(self._role(), action, namespace)

    async def _admin_of_topic(self, action: str, topic: str) -> None:
        if self.enforce:
            await self.permissions.require_topic_admin(self._role(), action, topic)

    async def _may(self, action: str, topic: str) -> None:
        if self.enforce:
            await self.permissions.require_topic(self._role(), action, topic)

    def _super_user(self, action: str, resource: str) -> None:
        if self.enforce:
            self.permissions.require_super_user(self._role(), action, resource)

    async def _guarded(self, context, call):
        try:
            if self.draining:
                raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, "the broker is shutting down")
            with self._admission:
                return await call()
        except TopicError as e:
            await _abort(context, e)

    # ---- admin ------------------------------------------------------------------------------------------------
    async def CreateTenant(self, request, context):
        async def call():
            self._super_user("create", f"tenant {request.tenant}")
            await self.service.create_tenant(request.tenant, check_admin_roles(request.admin_roles))
            return topic_pb2.ListTenantsResponse(tenants=await self.service.list_tenants())
        return await self._guarded(context, call)

    async def ListTenants(self, request, context):
        async def call():
            self._super_user("list", "the tenants")
            return topic_pb2.ListTenantsResponse(tenants=await self.service.list_tenants())
        return await self._guarded(context, call)

    async def GetTenant(self, request, context):
        async def call():
            await self._admin_of("read", request.tenant)
            return topic_pb2.TenantInfo(tenant=request.tenant,
                                        admin_roles=await self.permissions.tenant_info(request.tenant))
        return await self._guarded(context, call)

    async def SetTenantAdminRoles(self, request, context):
        async def call():
            self._super_user("set the admin roles of", f"tenant {request.tenant}")
            roles = await self.permissions.set_tenant_admin_roles(request.tenant, request.admin_roles)
            self._log(f"tenant {request.tenant}: admin roles set ({len(roles)})")
            return topic_pb2.TenantInfo(tenant=request.tenant, admin_roles=roles)
        return await self._guarded(context, call)

    async def GrantPermission(self, request, context):
        async def call():
            await self._admin_of_namespace("grant permissions on", request.namespace)
            policies = await self.permissions.grant(request.namespace, request.role, list(request.actions),
                                                    request.topic)
            return topic_pb2.JsonResponse(json=json.dumps(policies.to_json(), sort_keys=True))
        return await self._guarded(context, call)

    async def RevokePermission(self, request, context):
        async def call():
            await self._admin_of_namespace("revoke permissions on", request.namespace)
            policies = await self.permissions.revoke(request.namespace, request.role, request.topic)
            return topic_pb2.JsonResponse(json=json.dumps(policies.to_json(), sort_keys=True))
        return await self._guarded(context, call)

    async def GetPermissions(self, request, context):
        async def call():
            await self._admin_of_namespace("read the permissions of", request.namespace)
            await self.service.get_namespace(request.namespace)
            policies = await self.permissions.auth_policies(request.namespace)
            return topic_pb2.JsonResponse(json=json.dumps(policies.to_json(), sort_keys=True))
        return await self._guarded(context, call)

    async def CreateNamespace(self, request, context):
        async def call():
            await self._admin_of_namespace("create namespace", request.namespace)
            p = request.policies
            policies = Policies(p.retention_ms, p.retention_bytes, p.ttl_ms, p.dedup) if request.HasField("policies") \
                else Policies()
            await self.service.create_namespace(request.namespace, policies)
            return self._namespace_info(request.namespace, policies)
        return await self._guarded(context, call)

    @staticmethod
    def _namespace_info(namespace: str, p: Policies) -> topic_pb2.NamespaceInfo:
        return topic_pb2.NamespaceInfo(namespace=namespace, policies=topic_pb2.NamespacePolicies(
            retention_ms=p.retention_ms, retention_bytes=p.retention_bytes, ttl_ms=p.ttl_ms, dedup=p.dedup,
            backlog_quotas=[backlog_quota_pb(q) for q in p.backlog_quotas]))

    async def SetBacklogQuota(self, request, context):
        async def call():
            await self._admin_of_namespace("set the backlog quota of", request.namespace)
            quotas = await self.service.set_backlog_quota(request.namespace, backlog_quota_of(request.quota))
            return topic_pb2.BacklogQuotas(namespace=request.namespace, quotas=[backlog_quota_pb(q) for q in quotas])
        return await self._guarded(context, call)

    async def GetBacklogQuotas(self, request, context):
        async def call():
            await self._admin_of_namespace("read namespace", request.namespace)
            quotas = (await self.service.get_namespace(request.namespace)).backlog_quotas
            return topic_pb2.BacklogQuotas(namespace=request.namespace, quotas=[backlog_quota_pb(q) for q in quotas])
        return await self._guarded(context, call)

    async def RemoveBacklogQuota(self, request, context):
        async def call():
            await self._admin_of_namespace("remove the backlog quota of", request.namespace)
            kind = QUOTA_TYPES.get(request.type)
            if kind is None:
                raise TopicError(TopicStatus.BAD_REQUEST, f"unknown backlog quota type {request.type}")
            quotas = await self.service.remove_backlog_quota(request.namespace, kind)
            return topic_pb2.BacklogQuotas(namespace=request.namespace, quotas=[backlog_quota_pb(q) for q in quotas])
        return await self._guarded(context, call)

    async def GetNamespace(self, request, context):
        async def call():
            await self._admin_of_namespace("read namespace", request.namespace)
            return self._namespace_info(request.namespace, await self.service.get_namespace(request.namespace))
        return await self._guarded(context, call)

    async def ListNamespaces(self, request, context):
        async def call():
            await self._admin_of("list the namespaces of", request.tenant)
            return topic_pb2.ListNamespacesResponse(namespaces=await self.service.list_namespaces(request.tenant))
        return await self._guarded(context, call)

    async def CreateTopic(self, request, context):
        async def call():
            await self._admin_of_topic("create topic", request.topic)
            partitions = await self.service.create_topic(request.topic, request.partitions)
            return topic_pb2.TopicMetadata(topic=request.topic, partitions=partitions)
        return await self._guarded(context, call)

    async def GetTopic(self, request, context):
        async def call():
            await self._may("lookup", request.topic)
            return topic_pb2.TopicMetadata(topic=request.topic, partitions=await self.service.get_topic(request.topic))
        return await self._guarded(context, call)

    async def DeleteTopic(self, request, context):
        async def call():
            await self._admin_of_topic("delete topic", request.topic)
            partitions = await self.service.delete_topic(request.topic, request.force)
            return topic_pb2.TopicMetadata(topic=request.topic, partitions=partitions)
        return await self._guarded(context, call)

    async def ListTopics(self, request, context):
        async def call():
            await self._admin_of_namespace("list the topics of", request.namespace)
            return topic_pb2.ListTopicsResponse(topics=await self.service.list_topics(request.namespace))
        return await self._guarded(context, call)

    async def Lookup(self, request, context):
        async def call():
            await self._may("lookup", request.topic)
            broker_id, address, owned = await self.service.lookup(request.topic)
            return topic_pb2.LookupResponse(topic=request.topic, broker_id=broker_id, address=address, owned=owned)
        return await self._guarded(context, call)

    async def _served(self, topic: str):
        """The topic loaded here; NOT_OWNER (with the owner's address) when another broker serves it."""
        return await self.service.acquire(topic)

    async def TopicStats(self, request, context):
        async def call():
            await self._admin_of_topic("read the stats of", request.topic)
            topic = await self._stats_topic(request.topic)
            return topic_pb2.JsonResponse(json=json.dumps(topic.stats(), sort_keys=True))
        return await self._guarded(context, call)

    async def TopicStatsInternal(self, request, context):
        async def call():
            await self._admin_of_topic("read the stats of", request.topic)
            topic = await self._stats_topic(request.topic)
            return topic_pb2.JsonResponse(json=json.dumps(topic.stats_internal(), sort_keys=True))
        return await self._guarded(context, call)

    async def _stats_topic(self, topic: str):
        partitions = await self.service.get_topic(topic)
        if partitions:
            raise TopicError(TopicStatus.BAD_REQUEST, f"{topic} has {partitions} partitions: ask for one partition "
                                                      f"({topic}-partition-<i>)")
        return await self._served(topic)

    # ---- produce ------------------------------------------------------------------------------------------------
    async def Produce(self, request_iterator, context):
        try:
            if self.draining:
                raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, "the broker is shutting down")
            with self._admission:
                await self._produce(request_iterator, context)
        except TopicError as e:
            await self._end_stream(context, topic_pb2.ProduceResponse(error=_error_message(e)), e)

    async def _end_stream(self, context, response, e: TopicError) -> None:
        try:  # in-band first: the status alone can be lost to a grpc.aio race (grpc/grpc#36066)
            await context.write(response)
        except Exception:  # noqa: BLE001 - the client is gone
            pass
        await _abort(context, e)

    async def _produce(self, request_iterator, context) -> None:
        it = request_iterator.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "open":
            raise TopicError(TopicStatus.BAD_REQUEST, "the first message of a Produce stream must be 'open'")
        await self._may("produce", first.open.topic)
        topic = await self._served(first.open.topic)
        name, last_seq = topic.add_producer(first.open.producer_name, self.service.broker_id)
        try:
            await context.write(topic_pb2.ProduceResponse(ready=topic_pb2.ProducerReady(
                producer_name=name, last_sequence_id=last_seq, partition=topic.partition,
                broker_id=self.service.broker_id)))
            queue: asyncio.Queue = asyncio.Queue(topic.config.producer_pending_max)
            reader = asyncio.get_running_loop().create_task(self._read_sends(it, topic, name, queue))
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, TopicError):
                        raise item
                    request_id, count, task = item
                    pos = await task
                    receipt = topic_pb2.SendReceipt(request_id=request_id, partition=topic.partition,
                                                    batch_size=count)
                    if pos is None:
                        receipt.ledger_id, receipt.entry_id, receipt.duplicate = -1, -1, True
                    else:
                        receipt.ledger_id, receipt.entry_id = pos.ledger, pos.entry
                    await context.write(topic_pb2.ProduceResponse(receipt=receipt))
            finally:
                reader.cancel()
        finally:
            topic.remove_producer(name)

    async def _read_sends(self, it, topic, producer: str, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for request in it:
                if request.WhichOneof("kind") != "send":
                    raise TopicError(TopicStatus.BAD_REQUEST, "a Produce stream takes one 'open', then 'send' messages")
                send = request.send
                messages = [Message(m.payload, m.key if m.has_key else None, dict(m.properties), m.event_time_ms,
                                    m.sequence_id, m.deliver_at_ms) for m in send.messages]
                task = loop.create_task(topic.publish(producer, messages))  # starts in arrival order
                await queue.put((send.request_id, len(messages), task))
            await queue.put(None)
        except TopicError as e:
            await queue.put(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken client stream
            await queue.put(TopicError(TopicStatus.BAD_REQUEST, f"produce stream broke: {e!r}"))

    # ---- subscribe ------------------------------------------------------------------------------------------------
    async def Subscribe(self, request_iterator, context):
        try:
            if self.draining:
                raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, "the broker is shutting down")
            with self._admission:
                await self._subscribe(request_iterator, context)
        except TopicError as e:
            await self._end_stream(context, topic_pb2.ConsumeResponse(error=_error_message(e)), e)

    async def _subscribe(self, request_iterator, context) -> None:
        it = request_iterator.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "open":
            raise TopicError(TopicStatus.BAD_REQUEST, "the first message of a Subscribe stream must be 'open'")
        o = first.open
        if o.type not in SUB_TYPES:
            raise TopicError(TopicStatus.BAD_REQUEST, f"unknown subscription type {o.type}")
        if o.initial_position not in (topic_pb2.LATEST, topic_pb2.EARLIEST):
            raise TopicError(TopicStatus.BAD_REQUEST, f"unknown initial position {o.initial_position}")
        if o.delivery_format not in (topic_pb2.ENTRY, topic_pb2.MESSAGES):
            raise TopicError(TopicStatus.BAD_REQUEST, f"unknown delivery format {o.delivery_format}")
        if o.non_durable and o.type != topic_pb2.EXCLUSIVE:
            raise TopicError(TopicStatus.BAD_REQUEST, "a reader (non_durable) is EXCLUSIVE")
        if not o.non_durable and (not o.subscription or o.HasField("start_message_id")):
            raise TopicError(TopicStatus.BAD_REQUEST, "a subscription name is required" if not o.subscription else
                             "start_message_id is for readers (non_durable); a subscription seeks instead")
        await self._may("consume", o.topic)
        topic = await self._served(o.topic)
        sink = _Sink()
        consumer_name = o.consumer_name or f"{self.service.broker_id}-c{id(sink) & 0xFFFFFF:x}"
        initial = "earliest" if o.initial_position == topic_pb2.EARLIEST else "latest"
        if o.non_durable:
            start = o.start_message_id
            sub, consumer = await topic.create_reader(
                o.subscription, consumer_name, sink, initial_position=initial,
                inclusive=o.start_message_id_inclusive,
                message_id=MessageId(start.ledger_id, start.entry_id, topic.partition, start.batch_index)
                if o.HasField("start_message_id") else None)
        else:
            policy = o.key_shared_policy
            if policy.mode not in (topic_pb2.AUTO_SPLIT, topic_pb2.STICKY):
                raise TopicError(TopicStatus.BAD_REQUEST, f"unknown Key_Shared mode {policy.mode}")
            if policy.mode == topic_pb2.AUTO_SPLIT and policy.hash_ranges:
                raise TopicError(TopicStatus.BAD_REQUEST, "hash_ranges are for the STICKY Key_Shared mode")
            ranges = [(r.start, r.end) for r in policy.hash_ranges] if policy.mode == topic_pb2.STICKY else None
            sub, consumer = await topic.subscribe(o.subscription, SUB_TYPES[o.type], initial, consumer_name,
                                                  o.priority, sink, ranges)
        try:
            subscribed = topic_pb2.Subscribed(consumer_name=consumer_name, broker_id=self.service.broker_id,
                                              partition=topic.partition, subscription=sub.name)
            if not sub.durable:
                subscribed.start_ledger_id, subscribed.start_entry_id = sub.cursor.start
            await context.write(topic_pb2.ConsumeResponse(subscribed=subscribed))
            reader = asyncio.get_running_loop().create_task(self._read_consume(it, topic, sub, consumer, sink))
            try:
                await self._write_consume(context, sink, topic.partition, o.delivery_format == topic_pb2.MESSAGES)
            finally:
                reader.cancel()
        finally:
            await topic.remove_consumer(sub, consumer)

    async def _write_consume(self, context, sink: _Sink, partition: int, decoded: bool) -> None:
        while True:
            await sink.ready.wait()
            sink.ready.clear()
            while sink.items:
                item = sink.items.popleft()
                if item is None:
                    return
                if isinstance(item, TopicError):
                    raise item
                if isinstance(item, list):
                    for i in range(0, len(item), DELIVERIES_PER_MESSAGE_MAX):
                        chunk = item[i:i + DELIVERIES_PER_MESSAGE_MAX]
                        await context.write(topic_pb2.ConsumeResponse(deliveries=topic_pb2.Deliveries(deliveries=[
                            topic_pb2.Delivery(ledger_id=d.position.ledger, entry_id=d.position.entry,
                                               partition=partition, redelivery_count=d.redelivery_count,
                                               acked_batch_indexes=d.acked_batch_indexes,
                                               messages=received_messages(d, partition))
                            if decoded else
                            topic_pb2.Delivery(ledger_id=d.position.ledger, entry_id=d.position.entry,
                                               partition=partition, redelivery_count=d.redelivery_count,
                                               entry=d.entry, acked_batch_indexes=d.acked_batch_indexes)
                            for d in chunk])))
                else:
                    await context.write(item)
                    if item.WhichOneof("kind") in _ANSWERS:
                        sink.answer_written()

    async def _read_consume(self, it, topic, sub, consumer, sink: _Sink) -> None:
        try:
            async for request in it:
                kind = request.WhichOneof("kind")
                if kind == "flow":
                    sub.flow(consumer, request.flow.permits)
                elif kind == "ack":
                    ids = [(Position(a.ledger_id, a.entry_id), _ack_indexes(a), a.batch_size)
                           for a in request.ack.ids]
                    error = None
                    try:
                        sub.ack(consumer, ids, request.ack.cumulative)
                    except TopicError as e:
                        error = e
                    if request.ack.request_id:
                        result = topic_pb2.AckResult(request_id=request.ack.request_id)
                        if error is not None:
                            result.error.CopyFrom(_error_message(error))
                        sink.answer(topic_pb2.ConsumeResponse(ack_result=result))
                    elif error is not None:
                        raise error
                elif kind == "redeliver":
                    ids = [Position(a.ledger_id, a.entry_id) for a in request.redeliver.ids]
                    sub.redeliver(consumer, ids or None)
                elif kind == "seek":
                    result = topic_pb2.SeekResult(request_id=request.seek.request_id)
                    try:
                        if request.seek.WhichOneof("target") == "position":
                            p = request.seek.position
                            await sub.seek(Position(p.ledger_id, p.entry_id))
                        else:
                            await topic.seek_to_time(sub, request.seek.publish_time_ms)
                        result.ledger_id, result.entry_id = sub.cursor.mark_delete
                    except TopicError as e:
                        result.error.CopyFrom(_error_message(e))
                    sink.answer(topic_pb2.ConsumeResponse(seek_result=result))
                elif kind == "get_last_message_id":
                    last = topic.ml.last_confirmed
                    sink.answer(topic_pb2.ConsumeResponse(last_message_id=topic_pb2.LastMessageId(
                        request_id=request.get_last_message_id.request_id, ledger_id=last.ledger,
                        entry_id=last.entry, partition=topic.partition)))
                else:
                    raise TopicError(TopicStatus.BAD_REQUEST, f"unexpected {kind!r} on a Subscribe stream")
                if not sink.room.is_set():  # the client does not read its answers: stop reading its requests
                    await sink.room.wait()
            sink.put(None)  # the client half-closed: end the stream
        except TopicError as e:
            sink.drop(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken client stream
            sink.drop(TopicError(TopicStatus.BAD_REQUEST, f"subscribe stream broke: {e!r}"))

    def begin_drain(self) -> None:
        self.draining = True
