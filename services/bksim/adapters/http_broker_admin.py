"""Pulsar's admin REST API (`/admin/v2/...`) on a broker's HTTP port (adapters/http_server.py), for what bksim
has, with Pulsar's paths, methods, status codes and JSON shapes (docs/observability.md lists every endpoint):

    GET    /admin/v2/tenants                                   ["t1", ...]
    GET    /admin/v2/tenants/{tenant}                          {"adminRoles": [...], "allowedClusters": []}
    PUT    /admin/v2/tenants/{tenant}      {"adminRoles": [...], "allowedClusters": [...]}   204
    POST   /admin/v2/tenants/{tenant}      same body: replaces the admin roles               204
    GET    /admin/v2/namespaces/{tenant}                       ["t/ns", ...]
    GET    /admin/v2/namespaces/{tenant}/{ns}                  Pulsar's Policies (retention, ttl, dedup, grants)
    PUT    /admin/v2/namespaces/{tenant}/{ns}  [Policies]      204
    DELETE /admin/v2/namespaces/{tenant}/{ns}                  204; 409 while it has topics
    GET    /admin/v2/namespaces/{tenant}/{ns}/permissions      {role: [actions]}
    POST   /admin/v2/namespaces/{tenant}/{ns}/permissions/{role}  ["produce", "consume"]  204
    DELETE /admin/v2/namespaces/{tenant}/{ns}/permissions/{role}                        204
    GET    /admin/v2/namespaces/{tenant}/{ns}/backlogQuotaMap  {type: {"limitSize", "limitTime", "policy"}}
    POST   /admin/v2/namespaces/{tenant}/{ns}/backlogQuota?backlogQuotaType=T  [BacklogQuota]  204
    DELETE /admin/v2/namespaces/{tenant}/{ns}/backlogQuota?backlogQuotaType=T                204
    GET    /admin/v2/persistent/{tenant}/{ns}                  ["persistent://t/ns/topic", ...]
    PUT    /admin/v2/persistent/{tenant}/{ns}/{topic}          204 (non-partitioned)
    DELETE /admin/v2/persistent/{tenant}/{ns}/{topic}?force=   204
    PUT    /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions   N   204 (partitioned)
    GET    /admin/v2/persistent/{tenant}/{ns}/{topic}/partitions   {"partitions": N}
    GET    /admin/v2/persistent/{tenant}/{ns}/{topic}/stats        Pulsar's TopicStats
    GET    /admin/v2/persistent/{tenant}/{ns}/{topic}/internalStats  Pulsar's PersistentTopicInternalStats

Every endpoint calls the broker's gRPC Topics servicer (adapters/topic_server.py) through http_calls.CallContext,
so validation, admission (broker.requests_inflight_max), refusals while draining and the permission rules are
the gRPC API's. Stats come from the topic layer (Topic.stats / stats_internal), loading the topic here as the
gRPC call does.

Authentication (security.auth_enabled): `Authorization: Bearer <token>`, checked with the gRPC server's
TokenVerifier; 401 without one or with one that does not verify; the role then goes to the servicer as the gRPC
interceptor passes it (broker_auth.CALLER_ROLE), so security.authorization_enabled applies the same rules:
403 naming the role and the action.

Errors: {"reason": "..."} as Pulsar answers them; 400 bad body, 401, 403, 404 unknown tenant, namespace or topic,
409 already exists or not empty, 412 bad name or argument and a refused deletion, 429 too many requests, 503
unavailable. A topic served by another broker: 307 to that broker's HTTP port (Pulsar redirects the same way),
or 503 naming the broker when its HTTP port is unknown.

Must not: log or echo a token; block the event loop (every ZooKeeper read goes through the async metadata port).
"""
from __future__ import annotations

import json

from aiohttp import web

from bksim.adapters.http_calls import Answer, CallContext, CallRefused, answering
from bksim.adapters.http_server import ProcessParts, json_response
from bksim.gen import topic_pb2
from bksim.metadata.paths import BROKERS_AVAILABLE
from bksim.model.errors import MetadataError, NoNodeError, NotEmptyError
from bksim.model.status import TopicStatus
from bksim.security.broker_auth import CALLER_ROLE
from bksim.security.tokens import TokenError, token_from_metadata
from bksim.topics.names import policies_path

HTTP_OF_TOPIC_STATUS = {
    TopicStatus.BAD_REQUEST: 412, TopicStatus.MESSAGE_TOO_LARGE: 412, TopicStatus.INVALID_ACK: 412,
    TopicStatus.TENANT_NOT_FOUND: 404, TopicStatus.NAMESPACE_NOT_FOUND: 404, TopicStatus.TOPIC_NOT_FOUND: 404,
    TopicStatus.SUBSCRIPTION_NOT_FOUND: 404, TopicStatus.ALREADY_EXISTS: 409, TopicStatus.CONSUMER_BUSY: 412,
    TopicStatus.NOT_ALLOWED: 412, TopicStatus.NOT_OWNER: 503, TopicStatus.TOPIC_FENCED: 503,
    TopicStatus.SERVICE_UNAVAILABLE: 503, TopicStatus.METADATA_ERROR: 503, TopicStatus.TOO_MANY_REQUESTS: 429,
    TopicStatus.TIMEOUT: 504, TopicStatus.INTERNAL: 500, TopicStatus.UNAUTHENTICATED: 401,
    TopicStatus.PERMISSION_DENIED: 403, TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED: 412,
    TopicStatus.CONSUMER_ASSIGN_ERROR: 412,
}
MINUTE_MS = 60_000
MIB = 1024 * 1024


def reason(status: int, text: str) -> web.Response:
    """An error as Pulsar's admin API answers one: {"reason": ...}."""
    return json_response({"reason": text}, status)


def no_content() -> web.Response:
    return web.Response(status=204)


def _exact(value: int, unit: int):
    """`value` in `unit`s: an int when exact (and for -1, "no limit"), else a float."""
    if value == -1 or value % unit == 0:
        return value // unit if value != -1 else -1
    return value / unit


def policies_json(info: topic_pb2.NamespaceInfo, auth: dict) -> dict:
    """Pulsar's Policies for a namespace (the fields bksim has)."""
    p = info.policies
    return {
        "auth_policies": {"namespace_auth": auth.get("namespace_auth", {}),
                          "destination_auth": auth.get("destination_auth", {}),
                          "subscription_auth_roles": {}},
        "retention_policies": {"retentionTimeInMinutes": _exact(p.retention_ms, MINUTE_MS),
                               "retentionSizeInMB": _exact(p.retention_bytes, MIB)},
        "message_ttl_in_seconds": _exact(p.ttl_ms, 1000),
        "deduplicationEnabled": p.dedup,
        "backlog_quota_map": backlog_quota_map_json(p.backlog_quotas),
        "deleted": False,
    }


def policies_from_json(doc: dict) -> topic_pb2.NamespacePolicies:
    """NamespacePolicies from Pulsar's Policies JSON (absent fields: bksim's defaults); ValueError if malformed."""
    retention = doc.get("retention_policies") or {}
    if not isinstance(retention, dict):
        raise ValueError("retention_policies must be an object")

    def scaled(value, unit: int, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{value!r} is not a number")
        return -1 if value == -1 else int(value * unit)
    return topic_pb2.NamespacePolicies(
        retention_ms=scaled(retention.get("retentionTimeInMinutes"), MINUTE_MS, 0),
        retention_bytes=scaled(retention.get("retentionSizeInMB"), MIB, -1),
        ttl_ms=scaled(doc.get("message_ttl_in_seconds"), 1000, 0),
        dedup=bool(doc.get("deduplicationEnabled", False)))


QUOTA_TYPE_OF_NAME = {"destination_storage": topic_pb2.DESTINATION_STORAGE, "message_age": topic_pb2.MESSAGE_AGE}
QUOTA_POLICY_OF_NAME = {"producer_request_hold": topic_pb2.PRODUCER_REQUEST_HOLD,
                        "producer_exception": topic_pb2.PRODUCER_EXCEPTION,
                        "consumer_backlog_eviction": topic_pb2.CONSUMER_BACKLOG_EVICTION}


def backlog_quota_map_json(quotas) -> dict:
    """Pulsar's backlog quota map: {type: {"limitSize": bytes, "limitTime": seconds, "policy"}} (-1: not that
    kind of limit)."""
    types = {v: k for k, v in QUOTA_TYPE_OF_NAME.items()}
    policies = {v: k for k, v in QUOTA_POLICY_OF_NAME.items()}
    return {types[q.type]: {"limitSize": q.limit_bytes if q.type == topic_pb2.DESTINATION_STORAGE else -1,
                            "limitTime": _exact(q.limit_time_ms, 1000) if q.type == topic_pb2.MESSAGE_AGE else -1,
                            "policy": policies[q.policy]} for q in quotas}


def backlog_quota_from_json(kind: str, doc) -> topic_pb2.BacklogQuota:
    """A BacklogQuota of `kind` from Pulsar's JSON (limitSize bytes / limitTime seconds, policy); ValueError."""
    if kind not in QUOTA_TYPE_OF_NAME:
        raise ValueError(f"backlogQuotaType {kind!r} is not one of {list(QUOTA_TYPE_OF_NAME)}")
    if not isinstance(doc, dict) or doc.get("policy") not in QUOTA_POLICY_OF_NAME:
        raise ValueError(f"the body must be {{\"limitSize\" or \"limitTime\", \"policy\": one of "
                         f"{list(QUOTA_POLICY_OF_NAME)}}}")
    key = "limitSize" if kind == "destination_storage" else "limitTime"
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{kind} needs {key} (a number)")
    quota = topic_pb2.BacklogQuota(type=QUOTA_TYPE_OF_NAME[kind], policy=QUOTA_POLICY_OF_NAME[doc["policy"]])
    if kind == "destination_storage":
        quota.limit_bytes = int(value)
    else:
        quota.limit_time_ms = int(value * 1000)
    return quota


def topic_stats_json(stats: dict) -> dict:
    """Pulsar's TopicStats from Topic.stats() (which already uses its names), with the derived fields."""
    rate = stats.get("msgRateIn", 0.0)
    return stats | {"averageMsgSize": round(stats.get("msgThroughputIn", 0.0) / rate, 1) if rate else 0.0,
                    "replication": {}}


class BrokerHttpAdmin:
    """The handlers over one broker's running parts (module docstring)."""

    def __init__(self, parts: ProcessParts) -> None:
        self.parts = parts
        self.store = parts.store
        self.server = parts.server

    # -- the call path -----------------------------------------------------------------------------------
    def _role(self, request: web.Request) -> str | None:
        auth = getattr(self.server, "auth", None)
        if auth is None:
            return None
        header = request.headers.get("Authorization")
        try:
            token = token_from_metadata([("authorization", header)]) if header is not None else None
            return auth.verifier.verify(token)
        except TokenError as e:
            auth.refused[e.reason] += 1
            hint = ": send the header 'Authorization: Bearer <token>'" if e.reason == "missing" else ""
            raise Answer(reason(401, f"authentication failed: {e.message}{hint}")) from None

    async def _call(self, request: web.Request, method: str, message):
        """The Topics servicer's `method` with the caller's role; a refusal becomes Pulsar's answer."""
        servicer = self.server.topics_servicer
        if servicer is None:
            raise Answer(reason(503, "this broker serves no topics"))
        role = self._role(request)
        token = CALLER_ROLE.set(role)
        try:
            return await getattr(servicer, method)(message, CallContext())
        except CallRefused as e:
            raise Answer(await self._refusal(request, e)) from None
        finally:
            CALLER_ROLE.reset(token)

    async def _refusal(self, request: web.Request, e: CallRefused) -> web.Response:
        if e.status == TopicStatus.NOT_OWNER and e.owner_address:
            location = await self._http_address_of(e.owner_address)
            if location:
                raise web.HTTPTemporaryRedirect(f"http://{location}{request.path_qs}")
        status = HTTP_OF_TOPIC_STATUS.get(e.status, e.http_status)
        return reason(status, e.details)

    async def _http_address_of(self, address: str) -> str:
        """host:http_port of the registered broker whose gRPC address is `address` ("" when unknown)."""
        try:
            names = await self.store.children(BROKERS_AVAILABLE)
        except MetadataError:
            return ""
        for name in names:
            try:
                data, _ = await self.store.get(f"{BROKERS_AVAILABLE}/{name}")
                row = json.loads(data or b"{}")
            except (MetadataError, ValueError):
                continue
            if isinstance(row, dict) and f"{row.get('host')}:{row.get('port')}" == address \
                    and int(row.get("http_port") or 0) > 0:
                return f"{row['host']}:{row['http_port']}"
        return ""

    async def _body(self, request: web.Request, default=None):
        text = (await request.text()).strip()
        if not text:
            return default
        try:
            return json.loads(text)
        except ValueError:
            raise Answer(reason(400, "the body is not JSON")) from None

    @staticmethod
    def _namespace(request: web.Request) -> str:
        return f"{request.match_info['tenant']}/{request.match_info['namespace']}"

    @staticmethod
    def _topic(request: web.Request) -> str:
        m = request.match_info
        return f"persistent://{m['tenant']}/{m['namespace']}/{m['topic']}"

    # -- tenants -------------------------------------------------------------------------------------------
    async def list_tenants(self, request: web.Request) -> web.Response:
        r = await self._call(request, "ListTenants", topic_pb2.ListTenantsRequest())
        return json_response(list(r.tenants))

    async def get_tenant(self, request: web.Request) -> web.Response:
        r = await self._call(request, "GetTenant", topic_pb2.GetTenantRequest(tenant=request.match_info["tenant"]))
        return json_response({"adminRoles": list(r.admin_roles), "allowedClusters": []})

    async def _tenant_roles(self, request: web.Request) -> list[str]:
        body = await self._body(request, {})
        roles = body.get("adminRoles", []) if isinstance(body, dict) else None
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise Answer(reason(400, 'the body must be {"adminRoles": ["role", ...], "allowedClusters": [...]}'))
        return roles

    async def create_tenant(self, request: web.Request) -> web.Response:
        roles = await self._tenant_roles(request)
        await self._call(request, "CreateTenant",
                         topic_pb2.CreateTenantRequest(tenant=request.match_info["tenant"], admin_roles=roles))
        return no_content()

    async def update_tenant(self, request: web.Request) -> web.Response:
        roles = await self._tenant_roles(request)
        await self._call(request, "SetTenantAdminRoles",
                         topic_pb2.SetTenantAdminRolesRequest(tenant=request.match_info["tenant"], admin_roles=roles))
        return no_content()

    # -- namespaces ----------------------------------------------------------------------------------------
    async def list_namespaces(self, request: web.Request) -> web.Response:
        r = await self._call(request, "ListNamespaces",
                             topic_pb2.ListNamespacesRequest(tenant=request.match_info["tenant"]))
        return json_response(list(r.namespaces))

    async def get_namespace(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        info = await self._call(request, "GetNamespace", topic_pb2.GetNamespaceRequest(namespace=namespace))
        auth = await self._call(request, "GetPermissions", topic_pb2.GetPermissionsRequest(namespace=namespace))
        return json_response(policies_json(info, json.loads(auth.json or "{}")))

    async def create_namespace(self, request: web.Request) -> web.Response:
        body = await self._body(request, {})
        if not isinstance(body, dict):
            raise Answer(reason(400, "the body must be a Policies object"))
        try:
            policies = policies_from_json(body)
        except ValueError as e:
            raise Answer(reason(400, f"policies: {e}")) from None
        await self._call(request, "CreateNamespace",
                         topic_pb2.CreateNamespaceRequest(namespace=self._namespace(request), policies=policies))
        return no_content()

    async def delete_namespace(self, request: web.Request) -> web.Response:
        """Pulsar refuses to delete a namespace that still has topics (409); the check and the deletion are two
        steps, as the topic listing and the policies znode are two znodes."""
        namespace = self._namespace(request)
        topics = await self._call(request, "ListTopics", topic_pb2.ListTopicsRequest(namespace=namespace))
        if topics.topics:
            return reason(409, f"Cannot delete non empty namespace {namespace}: {len(topics.topics)} topics")
        tenant, ns = namespace.split("/", 1)
        try:
            await self.store.delete(policies_path(tenant, ns))
        except NoNodeError:
            return reason(404, f"namespace {namespace} does not exist")
        except NotEmptyError:
            return reason(409, f"Cannot delete non empty namespace {namespace}")
        except MetadataError as e:
            return reason(503, f"deleting namespace {namespace}: {e}")
        return no_content()

    async def get_permissions(self, request: web.Request) -> web.Response:
        r = await self._call(request, "GetPermissions",
                             topic_pb2.GetPermissionsRequest(namespace=self._namespace(request)))
        return json_response(json.loads(r.json or "{}").get("namespace_auth", {}))

    async def grant(self, request: web.Request) -> web.Response:
        actions = await self._body(request, [])
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise Answer(reason(400, 'the body must be a list of actions: ["produce", "consume"]'))
        await self._call(request, "GrantPermission", topic_pb2.GrantPermissionRequest(
            namespace=self._namespace(request), role=request.match_info["role"], actions=actions))
        return no_content()

    async def revoke(self, request: web.Request) -> web.Response:
        await self._call(request, "RevokePermission", topic_pb2.RevokePermissionRequest(
            namespace=self._namespace(request), role=request.match_info["role"]))
        return no_content()

    async def get_backlog_quotas(self, request: web.Request) -> web.Response:
        r = await self._call(request, "GetBacklogQuotas",
                             topic_pb2.GetBacklogQuotasRequest(namespace=self._namespace(request)))
        return json_response(backlog_quota_map_json(r.quotas))

    async def set_backlog_quota(self, request: web.Request) -> web.Response:
        try:
            quota = backlog_quota_from_json(request.query.get("backlogQuotaType", "destination_storage"),
                                            await self._body(request, {}))
        except ValueError as e:
            raise Answer(reason(400, f"backlog quota: {e}")) from None
        await self._call(request, "SetBacklogQuota",
                         topic_pb2.SetBacklogQuotaRequest(namespace=self._namespace(request), quota=quota))
        return no_content()

    async def remove_backlog_quota(self, request: web.Request) -> web.Response:
        kind = request.query.get("backlogQuotaType", "destination_storage")
        if kind not in QUOTA_TYPE_OF_NAME:
            raise Answer(reason(400, f"backlogQuotaType {kind!r} is not one of {list(QUOTA_TYPE_OF_NAME)}"))
        await self._call(request, "RemoveBacklogQuota", topic_pb2.RemoveBacklogQuotaRequest(
            namespace=self._namespace(request), type=QUOTA_TYPE_OF_NAME[kind]))
        return no_content()

    # -- topics --------------------------------------------------------------------------------------------
    async def list_topics(self, request: web.Request) -> web.Response:
        r = await self._call(request, "ListTopics", topic_pb2.ListTopicsRequest(namespace=self._namespace(request)))
        return json_response(list(r.topics))

    async def create_topic(self, request: web.Request) -> web.Response:
        await self._call(request, "CreateTopic", topic_pb2.CreateTopicRequest(topic=self._topic(request)))
        return no_content()

    async def create_partitioned(self, request: web.Request) -> web.Response:
        n = await self._body(request)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise Answer(reason(412, "the body must be the number of partitions (an integer >= 1)"))
        await self._call(request, "CreateTopic", topic_pb2.CreateTopicRequest(topic=self._topic(request),
                                                                             partitions=n))
        return no_content()

    async def get_partitions(self, request: web.Request) -> web.Response:
        r = await self._call(request, "GetTopic", topic_pb2.TopicRequest(topic=self._topic(request)))
        return json_response({"partitions": r.partitions})

    async def delete_topic(self, request: web.Request) -> web.Response:
        force = request.query.get("force", "false").lower() == "true"
        await self._call(request, "DeleteTopic", topic_pb2.DeleteTopicRequest(topic=self._topic(request),
                                                                             force=force))
        return no_content()

    async def stats(self, request: web.Request) -> web.Response:
        r = await self._call(request, "TopicStats", topic_pb2.TopicRequest(topic=self._topic(request)))
        return json_response(topic_stats_json(json.loads(r.json)))

    async def internal_stats(self, request: web.Request) -> web.Response:
        r = await self._call(request, "TopicStatsInternal", topic_pb2.TopicRequest(topic=self._topic(request)))
        return json_response(json.loads(r.json))


def routes(parts: ProcessParts) -> list[web.RouteDef]:
    a = BrokerHttpAdmin(parts)
    ns = "/admin/v2/namespaces/{tenant}/{namespace}"
    topic = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
    table = [
        ("GET", "/admin/v2/tenants", a.list_tenants),
        ("GET", "/admin/v2/tenants/{tenant}", a.get_tenant),
        ("PUT", "/admin/v2/tenants/{tenant}", a.create_tenant),
        ("POST", "/admin/v2/tenants/{tenant}", a.update_tenant),
        ("GET", "/admin/v2/namespaces/{tenant}", a.list_namespaces),
        ("GET", ns, a.get_namespace),
        ("PUT", ns, a.create_namespace),
        ("DELETE", ns, a.delete_namespace),
        ("GET", f"{ns}/permissions", a.get_permissions),
        ("POST", f"{ns}/permissions/{{role}}", a.grant),
        ("DELETE", f"{ns}/permissions/{{role}}", a.revoke),
        ("GET", f"{ns}/backlogQuotaMap", a.get_backlog_quotas),
        ("POST", f"{ns}/backlogQuota", a.set_backlog_quota),
        ("DELETE", f"{ns}/backlogQuota", a.remove_backlog_quota),
        ("GET", "/admin/v2/persistent/{tenant}/{namespace}", a.list_topics),
        ("PUT", topic, a.create_topic),
        ("DELETE", topic, a.delete_topic),
        ("PUT", f"{topic}/partitions", a.create_partitioned),
        ("GET", f"{topic}/partitions", a.get_partitions),
        ("GET", f"{topic}/stats", a.stats),
        ("GET", f"{topic}/internalStats", a.internal_stats),
    ]
    return [web.route(method, path, answering(handler)) for method, path, handler in table]
