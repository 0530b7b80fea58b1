"""BookKeeper's bookie HTTP admin endpoints on a bookie's HTTP port (adapters/http_server.py), with upstream's
paths and JSON shapes (BookKeeper's `server/http/service/*Service.java`; docs/observability.md lists them):

    GET      /heartbeat                                   "OK" (text), always open
    GET      /api/v1/bookie/info                          {"freeSpace", "totalSpace"}
    GET      /api/v1/bookie/state                         {"running", "readOnly", "shuttingDown",
                                                           "availableForHighPriorityWrites"}
    GET      /api/v1/bookie/list_bookies?type=rw|ro&print_hostnames=true|false
                                                          {bookie id: hostname or null}
    GET      /api/v1/ledger/metadata?ledger_id=N          {"N": ledger metadata, upstream's field names; never
                                                           the password}
    GET      /api/v1/bookie/cluster_info                  {"auditorElected", "auditorId", "clusterUnderReplicated",
                                                           "ledgerReplicationEnabled", "totalBookiesCount",
                                                           "writableBookiesCount", "readonlyBookiesCount",
                                                           "unavailableBookiesCount"} (autorecovery/admin.status)
    GET      /api/v1/bookie/gc                            {"is_in_force_gc": "true"|"false"}
    PUT      /api/v1/bookie/gc   body {"forceMajor"|"forceMinor": true} or none
                                                          runs a round (gc, minor or major) through the bookie's
                                                          BookieAdmin service (same bound and refusals), answers
                                                          "Triggered GC on BookieServer: <id>" once it finished
    GET      /api/v1/bookie/gc_details                    [{upstream's GarbageCollectionStatus fields bksim has,
                                                           plus "lastRounds" and "totals"}]

Security: the reads are open, like upstream's (bind the port to loopback). Running a round changes the bookie, so
with security.tls_client_auth (the gRPC BookieAdmin then needs a client certificate, which plain HTTP does not
carry) PUT /api/v1/bookie/gc answers 403 and `bksim bookie gc` is the way.

Errors: {"message": ...} (http_server.error_response) with 400 for bad input, 404 for an unknown ledger, 405 for
another method; the GC refusals of BookieAdmin mapped by http_calls.HTTP_OF_GRPC (412 no GC, 429 too many
rounds asked, 503 shutting down). A ZooKeeper read that does not answer within zookeeper.operation_timeout_ms
ends with 503.

Must not: block the event loop (ZooKeeper reads run in a thread, bounded by registration.call_bounded); answer
a ledger's password.
"""
from __future__ import annotations

import json

from aiohttp import web
from kazoo.exceptions import NoNodeError

from bksim.adapters import registration
from bksim.adapters.http_calls import Answer, CallContext, CallRefused, answering
from bksim.adapters.http_server import ProcessParts, error_response, json_response
from bksim.gen import bookie_pb2
from bksim.metadata import ledger_metadata
from bksim.metadata.paths import ledger_path
from bksim.model.errors import MetadataError, MetadataFormatError

# BookKeeper's DigestType names (its DUMMY is a ledger without a digest)
DIGEST_NAMES = {"crc32c": "CRC32C", "none": "DUMMY"}
GC_KIND_OF_BODY = (("forceMajor", "major"), ("forceMinor", "minor"))


def metadata_json(ledger_id: int, md: ledger_metadata.LedgerMetadata) -> dict:
    """A ledger's metadata with BookKeeper's LedgerMetadata field names (upstream serialises its Java object
    with Jackson); `password` is left out (upstream prints it)."""
    return {
        "ledgerId": ledger_id,
        "metadataFormatVersion": md.format_version,
        "ensembleSize": md.ensemble_size,
        "writeQuorumSize": md.write_quorum_size,
        "ackQuorumSize": md.ack_quorum_size,
        "lastEntryId": md.last_entry_id,
        "length": md.length,
        "digestType": DIGEST_NAMES.get(md.digest_type, md.digest_type.upper()),
        "state": md.state.value,
        "closed": md.is_closed,
        "allEnsembles": {str(s.first_entry_id): list(s.ensemble) for s in md.segments},
        "ctime": md.ctime_ms,
        "customMetadata": dict(md.custom),
    }


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


class BookieHttpAdmin:
    """The handlers over one bookie's running parts (module docstring)."""

    def __init__(self, parts: ProcessParts) -> None:
        self.parts = parts
        self.config = parts.config
        self.zk_timeout_s = parts.config.zookeeper.operation_timeout_ms / 1000
        self._store = None

    async def _zk(self, fn):
        try:
            return await registration.call_bounded(fn, self.zk_timeout_s)
        except TimeoutError:
            raise Answer(error_response(503, f"ZooKeeper did not answer within {self.zk_timeout_s:.1f} s")) from None

    # -- endpoints ---------------------------------------------------------------------------------------
    async def heartbeat(self, request: web.Request) -> web.Response:
        return web.Response(text="OK\n", content_type="text/plain")

    async def info(self, request: web.Request) -> web.Response:
        info = self.parts.engine.info()
        return json_response({"freeSpace": info["free_bytes"], "totalSpace": info["total_bytes"]})

    async def state(self, request: web.Request) -> web.Response:
        engine = self.parts.engine
        shutting_down = bool(getattr(self.parts.server.servicer, "draining", False))
        read_only = engine.read_only
        journal_failed = read_only and not engine.disk_full
        # recovery adds still go to a bookie read-only for disk usage while free space is above the reserve
        high_priority = not read_only or (not journal_failed and engine.info()["free_bytes"]
                                          > self.config.bookie.recovery_add_reserve_bytes)
        return json_response({"running": not shutting_down, "readOnly": read_only, "shuttingDown": shutting_down,
                              "availableForHighPriorityWrites": high_priority and not shutting_down})

    async def list_bookies(self, request: web.Request) -> web.Response:
        kind = request.query.get("type", "rw")
        if kind not in ("rw", "ro"):
            return error_response(400, f"type {kind[:32]!r}: rw (read-write bookies) or ro (read-only)")
        hostnames = _flag(request, "print_hostnames")
        zk = self.parts.zk
        read_only = kind == "ro"

        def read() -> dict:
            ids = registration.list_bookies(zk)["readonly" if read_only else "writable"]
            out = {}
            for bookie_id in ids:
                host = None
                if hostnames:
                    row = registration.read_registration(zk, bookie_id, read_only) or {}
                    host = row.get("host") or bookie_id.rsplit(":", 1)[0]
                out[bookie_id] = host
            return out
        return json_response(await self._zk(read))

    async def ledger_metadata(self, request: web.Request) -> web.Response:
        text = request.query.get("ledger_id", "")
        try:
            ledger_id = int(text)
            path = ledger_path(ledger_id)
        except ValueError:
            return error_response(400, f"ledger_id {text[:32]!r}: a ledger id (an integer >= 0) is required")
        zk = self.parts.zk
        try:
            data, _ = await self._zk(lambda: zk.retry(zk.get, path))
        except NoNodeError:
            return error_response(404, f"ledger {ledger_id} does not exist")
        try:
            md = ledger_metadata.decode(data, source=f"ledger {ledger_id} ({path})")
        except MetadataFormatError as e:
            return error_response(500, str(e))
        return json_response({str(ledger_id): metadata_json(ledger_id, md)})

    async def cluster_info(self, request: web.Request) -> web.Response:
        from bksim.adapters.clock import SystemClock
        from bksim.adapters.zk_metadata import RenewingZkMetadataStore
        from bksim.autorecovery import admin
        from bksim.autorecovery.marks import UnderReplicationMarks

        if self._store is None:  # the async metadata port over the process's ZooKeeper client, made once
            self._store = RenewingZkMetadataStore(self.parts.zk,
                                                  operation_timeout_ms=self.config.zookeeper.operation_timeout_ms,
                                                  read_tries_max=self.config.zookeeper.read_tries_max)
        try:
            s = await admin.status(self._store, UnderReplicationMarks(self._store, SystemClock()), SystemClock())
        except MetadataError as e:
            return error_response(503, f"reading the cluster's state: {e}")
        bookies = s["bookies"]
        writable, read_only, missing = len(bookies["writable"]), len(bookies["readonly"]), len(bookies["missing"])
        return json_response({
            "auditorElected": s["auditor"] is not None, "auditorId": s["auditor"] or "",
            "clusterUnderReplicated": s["underreplicated"] > 0, "ledgerReplicationEnabled": not s["disabled"],
            "totalBookiesCount": writable + read_only + missing, "writableBookiesCount": writable,
            "readonlyBookiesCount": read_only, "unavailableBookiesCount": missing})

    async def gc(self, request: web.Request) -> web.Response:
        admin = self.parts.server.admin
        if request.method == "GET":
            status = await self._gc_status(admin)
            return json_response({"is_in_force_gc": "true" if status.running else "false"})
        if self.config.security.tls_client_auth:
            return error_response(403, "this bookie's admin calls need a client certificate "
                                       "(security.tls_client_auth), which plain HTTP does not carry: "
                                       "use `bksim bookie gc`")
        body = (await request.text()).strip()
        kind = "gc"
        if body:
            try:
                options = json.loads(body)
                if not isinstance(options, dict):
                    raise ValueError
            except ValueError:
                return error_response(400, 'the body must be a JSON object such as {"forceMajor": true}')
            for key, named in GC_KIND_OF_BODY:
                if str(options.get(key, "false")).lower() == "true":
                    kind = named
                    break
        try:
            await admin.RunGc(bookie_pb2.RunGcRequest(kind=kind), CallContext())
        except CallRefused as e:
            return error_response(e.http_status, e.details)
        return json_response(f"Triggered GC on BookieServer: {self.config.bookie.bookie_id}")

    async def gc_details(self, request: web.Request) -> web.Response:
        status = await self._gc_status(self.parts.server.admin)
        last = {r.kind: r for r in status.last}
        totals = status.totals
        return json_response([{
            "forceCompacting": status.running,
            "lastMajorCompactionTime": last["major"].started_ms if "major" in last else 0,
            "lastMinorCompactionTime": last["minor"].started_ms if "minor" in last else 0,
            "lastRounds": {kind: {"startedMs": r.started_ms, "durationMs": round(r.duration_ms, 3),
                                  "ledgersDeleted": r.ledgers_deleted_count, "logsDeleted": r.logs_deleted_count,
                                  "logsCompacted": r.logs_compacted_count, "bytesFreed": r.bytes_freed,
                                  "error": r.error} for kind, r in sorted(last.items())},
            "totals": {"rounds": totals.rounds, "roundsFailed": totals.rounds_failed,
                       "ledgersDeleted": totals.ledgers_deleted, "logsDeleted": totals.logs_deleted,
                       "logsCompacted": totals.logs_compacted, "bytesFreed": totals.bytes_freed,
                       "bytesCopied": totals.bytes_copied},
        }])

    async def _gc_status(self, admin):
        try:
            return await admin.GcStatus(bookie_pb2.GcStatusRequest(), CallContext())
        except CallRefused as e:
            raise Answer(error_response(e.http_status, e.details)) from None


def routes(parts: ProcessParts) -> list[web.RouteDef]:
    admin = BookieHttpAdmin(parts)
    table = [("GET", "/heartbeat", admin.heartbeat), ("GET", "/api/v1/bookie/info", admin.info),
             ("GET", "/api/v1/bookie/state", admin.state), ("GET", "/api/v1/bookie/list_bookies", admin.list_bookies),
             ("GET", "/api/v1/ledger/metadata", admin.ledger_metadata),
             ("GET", "/api/v1/bookie/cluster_info", admin.cluster_info), ("GET", "/api/v1/bookie/gc", admin.gc),
             ("PUT", "/api/v1/bookie/gc", admin.gc), ("GET", "/api/v1/bookie/gc_details", admin.gc_details)]
    return [web.route(method, path, answering(handler)) for method, path, handler in table]
