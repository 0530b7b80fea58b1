"""The broker's live dashboard: `/dashboard` (one HTML page, its script and the shared stylesheet, all served by
the broker: no build step, no external URL) and `/dashboard/api/state` (the JSON the page polls every 1.5 s).

What the JSON holds (every list capped; `more` counts what was left out):
- `bookies`: registered in ZooKeeper (writable and read-only), each asked GetBookieInfo over gRPC (state, disk);
  `add_rate` = entries per second this broker striped onto the bookie through the ledgers it writes (the LAC
  advance of each open ledger between two polls, times Qw/E for each bookie of its last segment);
  `journal_sync_p99_ms` is null: the bookie's gRPC API does not export it (its /metrics does).
- `brokers`: registered in ZooKeeper, each with the topics it owns (/ownership/<tenant>/<ns>/<topic>).
- `topics`: the topics this broker serves: rates, backlog, storage, ledgers, and each cursor's mark-delete,
  read position and acked ranges after mark-delete as entry offsets (0 = the entry after mark-delete,
  `span` = entries up to the last confirmed one, `read_offset` = entries delivered: before the read position);
  `holes` = delivered entries not acked (the gaps between acked ranges below the read position).
- `ledgers`: the newest ledgers of those topics with state, LAC, E/Qw/Qa and segments (first entry, ensemble).

Reads go through the process's async metadata store and async gRPC (never blocking the event loop); a bookie
that does not answer within BOOKIE_INFO_DEADLINE_S shows as unreachable. Concurrent polls share one snapshot
for STATE_CACHE_S.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

from aiohttp import web

from bksim.adapters.http_server import ProcessParts, json_response
from bksim.formats.style import STYLESHEET
from bksim.metadata.paths import AVAILABLE, BROKERS_AVAILABLE, READONLY, READONLY_CHILD
from bksim.model.errors import BksimError, MetadataError, NoNodeError

BOOKIES_MAX = 64            # bookies shown (a cluster of more is summarised by `more`)
BROKERS_MAX = 32
OWNED_TOPICS_MAX = 50       # topics listed per broker
OWNERSHIP_READS_MAX = 400   # znode reads walking /ownership per poll
TOPICS_MAX = 40             # topics of this broker with full stats
LEDGERS_PER_TOPIC_MAX = 4   # newest ledgers of each topic shown with their segments
LEDGERS_MAX = 60
CURSORS_PER_TOPIC_MAX = 8
RANGES_PER_CURSOR_MAX = 64  # acked ranges drawn on a cursor's strip
SEGMENTS_MAX = 16
BOOKIE_INFO_DEADLINE_S = 1.0
STATE_CACHE_S = 0.5
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard_static")
OWNERSHIP_ROOT = "/ownership"


def dashboard_routes(parts: ProcessParts) -> list[web.RouteDef]:
    """The dashboard's routes on a broker's HTTP server (broker_cmd.broker_http_routes)."""
    state = DashboardState(parts)
    with open(os.path.join(STATIC_DIR, "dashboard.html"), encoding="utf-8") as f:
        page = f.read()
    with open(os.path.join(STATIC_DIR, "dashboard.js"), encoding="utf-8") as f:
        script = f.read()

    async def get_page(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def get_script(request: web.Request) -> web.Response:
        return web.Response(text=script, content_type="application/javascript", charset="utf-8")

    async def get_style(request: web.Request) -> web.Response:
        return web.Response(text=STYLESHEET, content_type="text/css", charset="utf-8")

    async def get_state(request: web.Request) -> web.Response:
        return json_response(await state.snapshot())

    return [web.get("/dashboard", get_page), web.get("/dashboard/", get_page),
            web.get("/dashboard/static/dashboard.js", get_script),
            web.get("/dashboard/static/bksim.css", get_style),
            web.get("/dashboard/api/state", get_state)]


def _capped(items: list, limit: int) -> dict:
    return {"items": items[:limit], "more": max(0, len(items) - limit)}


def _doc(data: bytes) -> dict:
    try:
        d = json.loads(data.decode() or "{}")
        return d if isinstance(d, dict) else {}
    except (UnicodeDecodeError, ValueError):
        return {}


class DashboardState:
    """Builds the dashboard's JSON from one broker's objects and ZooKeeper (module docstring)."""

    def __init__(self, parts: ProcessParts) -> None:
        self.parts = parts
        self.broker_id = parts.config.broker.broker_id
        self._lock = asyncio.Lock()
        self._cached: tuple[float, dict] | None = None
        self._lac_sample: tuple[float, dict[int, tuple[int, tuple[str, ...], int]]] | None = None
        self._add_rates: dict[str, float] = {}

    async def snapshot(self) -> dict:
        async with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < STATE_CACHE_S:
                return self._cached[1]
            self._sample_add_rates(now)
            topics, ledgers = await self._topics()
            bookies, brokers = await asyncio.gather(self._bookies(), self._brokers())
            value = {"broker": {"id": self.broker_id, "address": f"{self.parts.config.broker.host}:"
                                                                 f"{self.parts.config.broker.port}"},
                     "time_ms": int(time.time() * 1000),
                     "bookies": bookies, "brokers": brokers, "topics": topics, "ledgers": ledgers}
            self._cached = (now, value)
            return value

    # -- bookies ------------------------------------------------------------------------------------------------
    def _sample_add_rates(self, now: float) -> None:
        """Per bookie, entries/s this broker's open ledgers striped onto it since the previous poll."""
        current = {}
        for handle in self.parts.service.open_handles:
            m = handle.metadata
            current[handle.ledger_id] = (handle.last_add_confirmed, tuple(m.segments[-1].ensemble),
                                         m.write_quorum_size)
        last, self._lac_sample = self._lac_sample, (now, current)
        if last is None or now <= last[0]:
            return
        dt = now - last[0]
        rates: dict[str, float] = {}
        for lid, (lac, ensemble, qw) in current.items():
            before = last[1].get(lid)
            if before is None or lac <= before[0]:
                continue
            share = (lac - before[0]) * qw / len(ensemble) / dt
            for bookie in ensemble:
                rates[bookie] = rates.get(bookie, 0.0) + share
        self._add_rates = rates

    async def _bookies(self) -> dict:
        store = self.parts.store
        ids: list[tuple[str, bool]] = []
        for path, read_only in ((AVAILABLE, False), (READONLY, True)):
            try:
                ids += [(c, read_only) for c in sorted(await store.children(path)) if c != READONLY_CHILD]
            except (NoNodeError, MetadataError):
                pass
        shown = ids[:BOOKIES_MAX]
        rows = await asyncio.gather(*(self._bookie(b, ro) for b, ro in shown))
        return {"items": list(rows), "more": len(ids) - len(shown)}

    async def _bookie(self, bookie_id: str, read_only: bool) -> dict:
        from bksim.adapters.bookie_client import BookieClient
        from bksim.security.tls import channel_security

        row = {"id": bookie_id, "registered": "read-only" if read_only else "writable", "state": "unreachable",
               "free_bytes": None, "total_bytes": None, "used_ratio": None,
               "add_rate": round(self._add_rates.get(bookie_id, 0.0), 1), "journal_sync_p99_ms": None,
               "error": None}
        try:
            data, _ = await self.parts.store.get(f"{READONLY if read_only else AVAILABLE}/{bookie_id}")
            reg = _doc(data)
            address = f"{reg['host']}:{reg['port']}"
        except (NoNodeError, MetadataError, KeyError) as e:
            row["error"] = f"no registration address ({type(e).__name__})"
            return row
        try:
            async with BookieClient(address, deadline_s=BOOKIE_INFO_DEADLINE_S,
                                    tls=channel_security(self.parts.config.security)) as client:
                info = await client.info()
        except BksimError as e:
            row["error"] = str(e)[:200]
            return row
        total, free = info["total_bytes"], info["free_bytes"]
        row.update(state=info["state"], free_bytes=free, total_bytes=total,
                   used_ratio=round((total - free) / total, 4) if total else None)
        return row

    # -- brokers and ownership ------------------------------------------------------------------------------------
    async def _brokers(self) -> list[dict]:
        store = self.parts.store
        try:
            names = sorted(await store.children(BROKERS_AVAILABLE))
        except (NoNodeError, MetadataError):
            names = []
        owned: dict[str, list[str]] = {}
        reads = 0
        try:
            tenants = sorted(await store.children(OWNERSHIP_ROOT))
        except (NoNodeError, MetadataError):
            tenants = []
        for tenant in tenants:
            for ns in await self._children(f"{OWNERSHIP_ROOT}/{tenant}"):
                for local in await self._children(f"{OWNERSHIP_ROOT}/{tenant}/{ns}"):
                    if reads >= OWNERSHIP_READS_MAX:
                        break
                    reads += 1
                    try:
                        data, _ = await store.get(f"{OWNERSHIP_ROOT}/{tenant}/{ns}/{local}")
                    except (NoNodeError, MetadataError):
                        continue
                    owner = str(_doc(data).get("broker_id", ""))
                    owned.setdefault(owner, []).append(f"persistent://{tenant}/{ns}/{local}")
        rows = []
        for name in names[:BROKERS_MAX]:
            address = ""
            try:
                data, _ = await store.get(f"{BROKERS_AVAILABLE}/{name}")
                d = _doc(data)
                address = f"{d.get('host', '')}:{d.get('port', '')}"
            except (NoNodeError, MetadataError):
                pass
            topics = sorted(owned.get(name, []))
            rows.append({"id": name, "address": address, "self": name == self.broker_id,
                         "topic_count": len(topics), **_capped(topics, OWNED_TOPICS_MAX)})
        return rows

    async def _children(self, path: str) -> list[str]:
        try:
            return sorted(await self.parts.store.children(path))
        except (NoNodeError, MetadataError):
            return []

    # -- topics, cursors, ledgers ---------------------------------------------------------------------------------
    async def _topics(self) -> tuple[dict, dict]:
        served = sorted(self.parts.topics.topics.items())
        rows, ledger_ids = [], []
        for key, topic in served[:TOPICS_MAX]:
            stats = topic.stats()
            ml = topic.ml
            ids = [i.ledger_id for i in ml.info.ledgers]
            ledger_ids += [(key, lid) for lid in ids[-LEDGERS_PER_TOPIC_MAX:]]
            cursors = [self._cursor(name, sub, ml) for name, sub in
                       sorted(topic.subscriptions.items())[:CURSORS_PER_TOPIC_MAX]]
            rows.append({
                "name": str(topic.name), "msg_rate_in": stats["msgRateIn"], "msg_rate_out": stats["msgRateOut"],
                "msg_in_counter": stats["msgInCounter"], "msg_out_counter": stats["msgOutCounter"],
                "backlog": stats["backlogSize"], "storage_size": stats["storageSize"],
                "producers": len(stats["publishers"]), "last_confirmed": str(ml.last_confirmed),
                "state": ml.state.value, "ledgers": ids[-LEDGERS_PER_TOPIC_MAX:],
                "ledgers_more": max(0, len(ids) - LEDGERS_PER_TOPIC_MAX),
                "subscriptions": cursors,
                "subscriptions_more": max(0, len(topic.subscriptions) - CURSORS_PER_TOPIC_MAX),
            })
        ledgers = []
        for key, lid in ledger_ids[-LEDGERS_MAX:]:
            ledgers.append(await self._ledger(key, lid))
        return ({"items": rows, "more": max(0, len(served) - TOPICS_MAX)},
                {"items": ledgers, "more": max(0, len(ledger_ids) - LEDGERS_MAX)})

    @staticmethod
    def _cursor(name: str, sub, ml) -> dict:
        s = sub.cursor.state
        md, lc = s.mark_delete, ml.last_confirmed
        span = ml.entries_between(md, lc) if lc > md else 0
        ranges = []
        for a, b in s.ranges(RANGES_PER_CURSOR_MAX):
            ranges.append([ml.entries_between(md, a), ml.entries_between(md, b)])
        count = s.range_count()
        # entries in (mark-delete, read position): delivered; those of them not acked are the holes
        delivered = min(span, ml.entries_between(md, s.read_position) - 1) if s.read_position > md else 0
        return {"name": name, "type": sub.type, "mark_delete": str(md), "read_position": str(s.read_position),
                "read_offset": max(0, delivered),
                "backlog": s.backlog(), "acked_after_mark_delete": s.acked_count,
                "holes": max(0, delivered - s.acked_count), "span": span,
                "consumers": len(sub.consumers), "unacked": sub.stats()["unackedMessages"],
                "acked_ranges": ranges, "acked_ranges_more": max(0, count - len(ranges))}

    async def _ledger(self, topic: str, ledger_id: int) -> dict:
        service = self.parts.service
        handle = service.handle(ledger_id)
        if handle is not None:
            m, lac, writing = handle.metadata, handle.last_add_confirmed, True
        else:
            try:
                m, _ = await service.metadata(ledger_id)
            except BksimError as e:
                return {"id": ledger_id, "topic": topic, "error": str(e)[:200]}
            lac, writing = m.last_entry_id, False
        segments = [{"first_entry": s.first_entry_id, "ensemble": list(s.ensemble)}
                    for s in m.segments[-SEGMENTS_MAX:]]
        return {"id": ledger_id, "topic": topic, "state": m.state.value if hasattr(m.state, "value") else str(m.state),
                "writing": writing, "lac": lac, "length": m.length, "ensemble_size": m.ensemble_size,
                "write_quorum": m.write_quorum_size, "ack_quorum": m.ack_quorum_size,
                "segments": segments, "segments_more": max(0, len(m.segments) - SEGMENTS_MAX)}
