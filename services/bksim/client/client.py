"""`Client`: the entry point of the topic client — admin calls, producers, consumers and readers (like
pulsar-client).

A Client owns one event loop thread (core.LoopThread), a gRPC channel per broker address, and the producers
and consumers it created (close() closes them). `service_url` is one broker address or several
("h1:p1,h2:p2" or a list): admin calls and lookups go to any of them (the next one when one does not
answer); producers and consumers connect to the owner of each topic (or partition) that Lookup names.

Every blocking call is bounded by `operation_timeout_ms` (producing and consuming have their own bounds:
send timeout, receive timeout). Errors: ClientError with the broker's TopicStatus name and text.

TLS: `tls` is a CA file path (the brokers' certificates must chain to it and name the dialled host) or a
security.tls.ChannelSecurity (also a client certificate and key, for brokers with mutual TLS):
`Client("127.0.0.1:6650", tls="run/tls/ca.pem")`.
"""
from __future__ import annotations

import json
import threading

from bksim.client.consumer import (ACK_GROUP_TIME_MS_DEFAULT, NEGATIVE_ACK_DELAY_MS_DEFAULT,
                                   RECEIVER_QUEUE_SIZE_DEFAULT, Consumer)
from bksim.client.dead_letter import DeadLetterPolicy
from bksim.client.core import (BACKOFF_INITIAL_MS_DEFAULT, BACKOFF_MAX_MS_DEFAULT, OPERATION_TIMEOUT_MS_DEFAULT,
                               RECONNECT_ATTEMPTS_MAX_DEFAULT, Backoff, Connections, LoopThread, parse_service_url)
from bksim.client.errors import ClientError
from bksim.client.producer import (BATCHING_MAX_BYTES_DEFAULT, BATCHING_MAX_MESSAGES_DEFAULT,
                                   BATCHING_MAX_PUBLISH_DELAY_MS_DEFAULT, MAX_MESSAGE_BYTES_DEFAULT,
                                   MAX_PENDING_MESSAGES_DEFAULT, SEND_TIMEOUT_MS_DEFAULT, Producer)
from bksim.client.reader import Reader
from bksim.client.types import InitialPosition, KeySharedPolicy, RoutingMode, SubscriptionType
from bksim.gen import topic_pb2
from bksim.model.status import TopicStatus
from bksim.topics.partitioned_stats import aggregate as aggregate_partitioned_stats

SERVICE_URL_DEFAULT = "127.0.0.1:6650"


def _policies(p: topic_pb2.NamespacePolicies) -> dict:
    return {"retention_ms": p.retention_ms, "retention_bytes": p.retention_bytes, "ttl_ms": p.ttl_ms, "dedup": p.dedup,
            "backlog_quotas": _quotas(p.backlog_quotas)}


QUOTA_TYPES = {"destination_storage": topic_pb2.DESTINATION_STORAGE, "message_age": topic_pb2.MESSAGE_AGE}
QUOTA_POLICIES = {"producer_request_hold": topic_pb2.PRODUCER_REQUEST_HOLD,
                  "producer_exception": topic_pb2.PRODUCER_EXCEPTION,
                  "consumer_backlog_eviction": topic_pb2.CONSUMER_BACKLOG_EVICTION}


def _quotas(quotas) -> dict:
    """{"destination_storage": {"limit_bytes", "policy"}, "message_age": {"limit_time_ms", "policy"}} (set ones)."""
    names = {v: k for k, v in QUOTA_TYPES.items()}
    policies = {v: k for k, v in QUOTA_POLICIES.items()}
    out = {}
    for q in quotas:
        kind = names.get(q.type, str(q.type))
        limit = {"limit_bytes": q.limit_bytes} if q.type == topic_pb2.DESTINATION_STORAGE \
            else {"limit_time_ms": q.limit_time_ms}
        out[kind] = limit | {"policy": policies.get(q.policy, str(q.policy))}
    return out


class Client:
    """A connection to a bksim cluster's brokers. Thread-safe; use as a context manager or call close()."""

    def __init__(self, service_url=SERVICE_URL_DEFAULT, *, operation_timeout_ms: int = OPERATION_TIMEOUT_MS_DEFAULT,
                 backoff_initial_ms: int = BACKOFF_INITIAL_MS_DEFAULT, backoff_max_ms: int = BACKOFF_MAX_MS_DEFAULT,
                 reconnect_attempts_max: int = RECONNECT_ATTEMPTS_MAX_DEFAULT, tls=None, token: str | None = None,
                 token_file: str | None = None) -> None:
        """`token` (or the token in `token_file`): the signed token (JWT) presented to brokers that require one
        (security.auth_enabled); its role is what grants are checked against."""
        if operation_timeout_ms <= 0 or backoff_initial_ms <= 0 or backoff_max_ms < backoff_initial_ms \
                or reconnect_attempts_max < 1:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              "need operation_timeout_ms > 0, 0 < backoff_initial_ms <= backoff_max_ms "
                              "and reconnect_attempts_max >= 1")
        self.addresses = parse_service_url(service_url)
        if token is None and token_file:
            from bksim.security.tokens import TokenError, read_token_file
            try:
                token = read_token_file(token_file)
            except TokenError as e:
                raise ClientError(TopicStatus.BAD_REQUEST, e.message) from None
        self._operation_timeout_s = operation_timeout_ms / 1000.0
        self._backoff_args = (backoff_initial_ms / 1000.0, backoff_max_ms / 1000.0, reconnect_attempts_max,
                              self._operation_timeout_s)
        self._lock = threading.Lock()
        self._children: list = []
        self._closed = False
        self._loop = LoopThread()
        self._conns = Connections(self.addresses, self._operation_timeout_s, tls, token)

    def _backoff(self) -> Backoff:
        return Backoff(*self._backoff_args)

    def _call(self, method: str, request, owner: str = ""):
        """A unary call to any broker (`owner`: to the owner of that topic, found by Lookup)."""
        if self._closed:
            raise ClientError(TopicStatus.BAD_REQUEST, "the client is closed")
        call = self._conns.unary_owner(method, request, owner) if owner else self._conns.unary(method, request)
        return self._loop.run(call, self._operation_timeout_s * (len(self.addresses) + 3) + 1)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close every producer (flushing) and consumer, then the channels and the loop thread."""
        if self._closed:
            return
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                child.close()
            except ClientError:
                pass
        self._closed = True
        self._loop.begin_close()  # closing the channels cancels the calls other threads still wait on
        try:
            self._loop.run(self._conns.close(), 5.0)
        except ClientError:
            pass
        self._loop.stop()

    def _forget(self, child) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    # -- admin -------------------------------------------------------------------------------------------------
    def create_tenant(self, tenant: str, admin_roles: list[str] | tuple[str, ...] = ()) -> None:
        """Create a tenant administered by `admin_roles` (a super-user's call when authorization is on)."""
        self._call("CreateTenant", topic_pb2.CreateTenantRequest(tenant=tenant, admin_roles=list(admin_roles)))

    def get_tenant(self, tenant: str) -> dict:
        """{"tenant", "admin_roles"}."""
        r = self._call("GetTenant", topic_pb2.GetTenantRequest(tenant=tenant))
        return {"tenant": r.tenant, "admin_roles": list(r.admin_roles)}

    def set_tenant_admin_roles(self, tenant: str, admin_roles: list[str] | tuple[str, ...]) -> dict:
        r = self._call("SetTenantAdminRoles", topic_pb2.SetTenantAdminRolesRequest(tenant=tenant,
                                                                                   admin_roles=list(admin_roles)))
        return {"tenant": r.tenant, "admin_roles": list(r.admin_roles)}

    def grant_permission(self, namespace: str, role: str, actions, topic: str = "") -> dict:
        """Grant `actions` ("produce", "consume") to `role` on a namespace, or on one of its topics; returns the
        namespace's grants {"namespace_auth": {role: [action]}, "destination_auth": {topic: {role: [action]}}}."""
        actions = [actions] if isinstance(actions, str) else list(actions)
        return json.loads(self._call("GrantPermission", topic_pb2.GrantPermissionRequest(
            namespace=namespace, topic=topic, role=role, actions=actions)).json)

    def revoke_permission(self, namespace: str, role: str, topic: str = "") -> dict:
        return json.loads(self._call("RevokePermission", topic_pb2.RevokePermissionRequest(
            namespace=namespace, topic=topic, role=role)).json)

    def permissions(self, namespace: str) -> dict:
        return json.loads(self._call("GetPermissions", topic_pb2.GetPermissionsRequest(namespace=namespace)).json)

    def list_tenants(self) -> list[str]:
        return list(self._call("ListTenants", topic_pb2.ListTenantsRequest()).tenants)

    def create_namespace(self, namespace: str, *, retention_ms: int = 0, retention_bytes: int = -1, ttl_ms: int = 0,
                         dedup: bool = False) -> dict:
        """Create "tenant/ns" with its policies; returns {"namespace", "retention_ms", "retention_bytes",
        "ttl_ms", "dedup"}. retention_ms -1 = keep forever; retention_bytes -1 = no size limit."""
        r = self._call("CreateNamespace", topic_pb2.CreateNamespaceRequest(
            namespace=namespace, policies=topic_pb2.NamespacePolicies(retention_ms=retention_ms,
                                                                       retention_bytes=retention_bytes,
                                                                       ttl_ms=ttl_ms, dedup=dedup)))
        return {"namespace": r.namespace, **_policies(r.policies)}

    def get_namespace(self, namespace: str) -> dict:
        r = self._call("GetNamespace", topic_pb2.GetNamespaceRequest(namespace=namespace))
        return {"namespace": r.namespace, **_policies(r.policies)}

    def set_backlog_quota(self, namespace: str, policy: str, *, limit_bytes: int | None = None,
                          limit_time_ms: int | None = None) -> dict:
        """Set the namespace's backlog quota of one type: `limit_bytes` (destination_storage) or `limit_time_ms`
        (message_age), with `policy` "producer_request_hold", "producer_exception" or
        "consumer_backlog_eviction"; returns the namespace's quotas (get_backlog_quotas). BAD_REQUEST when the
        quota is not below the namespace's set retention."""
        if (limit_bytes is None) == (limit_time_ms is None):
            raise ClientError(TopicStatus.BAD_REQUEST, "give exactly one of limit_bytes and limit_time_ms")
        if policy not in QUOTA_POLICIES:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              f"backlog quota policy {policy!r} is not one of {list(QUOTA_POLICIES)}")
        if limit_bytes is not None:
            quota = topic_pb2.BacklogQuota(type=topic_pb2.DESTINATION_STORAGE, limit_bytes=limit_bytes,
                                           policy=QUOTA_POLICIES[policy])
        else:
            quota = topic_pb2.BacklogQuota(type=topic_pb2.MESSAGE_AGE, limit_time_ms=limit_time_ms,
                                           policy=QUOTA_POLICIES[policy])
        r = self._call("SetBacklogQuota", topic_pb2.SetBacklogQuotaRequest(namespace=namespace, quota=quota))
        return _quotas(r.quotas)

    def get_backlog_quotas(self, namespace: str) -> dict:
        """{"destination_storage": {"limit_bytes", "policy"}, "message_age": {"limit_time_ms", "policy"}}, the
        quotas that are set (Pulsar's backlogQuotaMap)."""
        return _quotas(self._call("GetBacklogQuotas",
                                  topic_pb2.GetBacklogQuotasRequest(namespace=namespace)).quotas)

    def remove_backlog_quota(self, namespace: str, quota_type: str = "destination_storage") -> dict:
        if quota_type not in QUOTA_TYPES:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              f"backlog quota type {quota_type!r} is not one of {list(QUOTA_TYPES)}")
        return _quotas(self._call("RemoveBacklogQuota", topic_pb2.RemoveBacklogQuotaRequest(
            namespace=namespace, type=QUOTA_TYPES[quota_type])).quotas)

    def list_namespaces(self, tenant: str) -> list[str]:
        return list(self._call("ListNamespaces", topic_pb2.ListNamespacesRequest(tenant=tenant)).namespaces)

    def create_topic(self, topic: str, partitions: int = 0) -> dict:
        """Create a topic (partitions 0 = non-partitioned); returns {"topic", "partitions"}."""
        r = self._call("CreateTopic", topic_pb2.CreateTopicRequest(topic=topic, partitions=partitions))
        return {"topic": r.topic, "partitions": r.partitions}

    def get_topic(self, topic: str) -> dict:
        r = self._call("GetTopic", topic_pb2.TopicRequest(topic=topic))
        return {"topic": r.topic, "partitions": r.partitions}

    def delete_topic(self, topic: str, force: bool = False) -> dict:
        """Delete a topic. A partitioned topic is deleted by one broker, every partition wherever it is served:
        marked deleting first (no producer or consumer is admitted to any partition from then on), then the
        partitions, then its metadata; if that is interrupted, the topic stays marked and calling this again
        finishes it."""
        r = self._call("DeleteTopic", topic_pb2.DeleteTopicRequest(topic=topic, force=force), owner=topic)
        return {"topic": r.topic, "partitions": r.partitions}

    def list_topics(self, namespace: str) -> list[str]:
        return list(self._call("ListTopics", topic_pb2.ListTopicsRequest(namespace=namespace)).topics)

    def lookup(self, topic: str) -> dict:
        """{"topic", "broker_id", "address", "owned"} of a topic or one partition."""
        r = self._call("Lookup", topic_pb2.LookupRequest(topic=topic))
        return {"topic": r.topic, "broker_id": r.broker_id, "address": r.address, "owned": r.owned}

    def topic_stats(self, topic: str, *, follow_owner: bool = True) -> dict:
        """The topic's stats from its owner. follow_owner=False asks the service URL's brokers themselves: one that
        does not own the topic answers NOT_OWNER (naming the owner), and one that finds no owner takes it.
        A partitioned topic: each partition's stats from its owner, summed as Pulsar's PartitionedTopicStats
        (topics/partitioned_stats.py: the sums, "metadata": {"partitions": N}, "partitions": {name: stats})."""
        partitions = self._partitions(topic) if follow_owner else 0
        if not partitions:
            return self._json("TopicStats", topic, follow_owner)
        parts = {f"{topic}-partition-{i}": self._json("TopicStats", f"{topic}-partition-{i}")
                 for i in range(partitions)}
        return aggregate_partitioned_stats(topic, parts)

    def topic_stats_internal(self, topic: str, *, follow_owner: bool = True) -> dict:
        return self._json("TopicStatsInternal", topic, follow_owner)

    def _json(self, method: str, topic: str, follow_owner: bool = True) -> dict:
        r = self._call(method, topic_pb2.TopicRequest(topic=topic), owner=topic if follow_owner else "")
        try:
            return json.loads(r.json)
        except ValueError as e:
            raise ClientError(TopicStatus.INTERNAL,
                              f"{method} of {topic}: the broker's answer is not JSON: {e}") from None

    def _partitions(self, topic: str) -> int:
        try:
            return self.get_topic(topic)["partitions"]
        except ClientError as e:
            if e.status is TopicStatus.TOPIC_NOT_FOUND:
                return 0  # the broker decides on Produce/Subscribe (it may create the topic or refuse)
            raise

    # -- producers and consumers -------------------------------------------------------------------------------
    def create_producer(self, topic: str, producer_name: str | None = None, *, batching_enabled: bool = True,
                        batching_max_messages: int = BATCHING_MAX_MESSAGES_DEFAULT,
                        batching_max_bytes: int = BATCHING_MAX_BYTES_DEFAULT,
                        batching_max_publish_delay_ms: float = BATCHING_MAX_PUBLISH_DELAY_MS_DEFAULT,
                        send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT,
                        max_pending_messages: int = MAX_PENDING_MESSAGES_DEFAULT, block_if_queue_full: bool = False,
                        routing_mode: RoutingMode = RoutingMode.RoundRobinPartition,
                        initial_sequence_id: int | None = None,
                        max_message_bytes: int = MAX_MESSAGE_BYTES_DEFAULT) -> Producer:
        """A producer on `topic` (every partition of a partitioned topic), connected when this returns."""
        partitions = self._partitions(topic)
        producer = Producer(self, topic, partitions, producer_name=producer_name, batching_enabled=batching_enabled,
                            batching_max_messages=batching_max_messages, batching_max_bytes=batching_max_bytes,
                            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
                            send_timeout_ms=send_timeout_ms, max_pending_messages=max_pending_messages,
                            block_if_queue_full=block_if_queue_full, routing_mode=routing_mode,
                            initial_sequence_id=initial_sequence_id, max_message_bytes=max_message_bytes)
        self._open(producer)
        return producer

    def subscribe(self, topic: str, subscription: str,
                  subscription_type: SubscriptionType | str = SubscriptionType.Exclusive, *,
                  consumer_name: str | None = None, priority: int = 0,
                  initial_position: InitialPosition | str = InitialPosition.Latest,
                  receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT, ack_timeout_ms: int = 0,
                  negative_ack_redelivery_delay_ms: int = NEGATIVE_ACK_DELAY_MS_DEFAULT,
                  ack_group_time_ms: int = ACK_GROUP_TIME_MS_DEFAULT,
                  dead_letter_policy: DeadLetterPolicy | None = None, retry_enable: bool = False,
                  key_shared_policy: KeySharedPolicy | None = None) -> Consumer:
        """A consumer of `subscription` on `topic` (every partition), subscribed when this returns. With
        `dead_letter_policy` / `retry_enable`: dead-letter and retry topics (client/dead_letter.py). Key_Shared:
        `key_shared_policy=KeySharedPolicy.sticky([(start, end), ...])` takes those key slots only."""
        try:
            kind = SubscriptionType.parse(subscription_type)
            position = InitialPosition.parse(initial_position)
        except ValueError as e:
            raise ClientError(TopicStatus.BAD_REQUEST, str(e)) from None
        partitions = self._partitions(topic)
        consumer = Consumer(self, topic, partitions, subscription, subscription_type=kind, consumer_name=consumer_name,
                            priority=priority, initial_position=position, receiver_queue_size=receiver_queue_size,
                            ack_timeout_ms=ack_timeout_ms,
                            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                            ack_group_time_ms=ack_group_time_ms, dead_letter_policy=dead_letter_policy,
                            retry_enable=retry_enable, key_shared_policy=key_shared_policy)
        consumer._attach_dead_letter()   # before subscribing: the retry topic must exist
        self._open(consumer)
        return consumer

    def create_reader(self, topic: str, start_message_id, *, start_message_id_inclusive: bool = False,
                      receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT, reader_name: str | None = None) -> Reader:
        """A reader of `topic` from `start_message_id`: a MessageId (the message after it; with
        start_message_id_inclusive, that message), or InitialPosition.Earliest / .Latest ("earliest", "latest").
        A non-durable cursor on the broker (reader.py says how it resumes after a failover); connected when this
        returns. A partitioned topic is read on every partition from earliest or latest."""
        partitions = self._partitions(topic)
        reader = Reader(self, topic, partitions, start_message_id,
                        start_message_id_inclusive=start_message_id_inclusive,
                        receiver_queue_size=receiver_queue_size, reader_name=reader_name)
        self._open(reader)
        return reader

    def _open(self, child) -> None:
        if self._closed:
            raise ClientError(TopicStatus.BAD_REQUEST, "the client is closed")
        # connecting may take the whole reconnect budget (bounded by the operation timeout) per partition
        try:
            self._loop.run(child._start(), self._operation_timeout_s * 2 + 5)
        except BaseException:
            try:
                child.close()
            except ClientError:
                pass
            raise
        with self._lock:
            self._children.append(child)
