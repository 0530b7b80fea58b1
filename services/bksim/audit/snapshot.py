"""The metadata snapshot: every ledger's metadata and the /managed-ledgers tree, as one JSON document.

`export_snapshot(store, ...)` reads it through the MetadataStore port (the CLI passes a ZooKeeper store:
`bksim metadata export --out FILE`, or `bksim audit --zookeeper HOST:PORT` in memory); `load_snapshot(doc)`
validates a document and gives the audit a `LedgerView` per ledger.

Document (format "bksim-metadata-snapshot", version 1):

    {"format", "version", "source", "exported_at_ms", "instance_id" (or null), "passwords": "omitted",
     "ledgers": [{"ledger_id", "path", "version", "metadata": <the znode's JSON without "password">}
                 | {"ledger_id", "path", "version", "error", "raw_base64"}   (not valid ledger metadata)],
     "managed_ledgers": [{"path", "version", "json": ...} | {"path", "version", "base64": ...}
                         | {"path", "version", "empty": true}],
     "managed_ledgers_truncated": bool}

Ledger passwords are secrets (PROTOCOL.md §8): the export never writes them. Ledgers and nodes are sorted by
id and path, so the same metadata always gives the same document (apart from exported_at_ms). A ledger
deleted while the export walks is skipped; one created meanwhile may be missed. The /managed-ledgers tree is
exported as raw values (JSON where the bytes are JSON, else base64): the topic layer owns its format.
"""
from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field

from bksim.metadata import ledger_metadata
from bksim.metadata.paths import INSTANCEID, MANAGED_LEDGERS_ROOT, ledger_path
from bksim.metadata.ledger_manager import list_ledger_ids
from bksim.model.errors import BksimError, MetadataFormatError, NoNodeError
from bksim.ports.metadata import MetadataStore

from bksim.audit.rules import LedgerView

SNAPSHOT_FORMAT = "bksim-metadata-snapshot"
SNAPSHOT_VERSION = 1
EXPORT_CONCURRENCY = 64  # metadata reads in flight at once during an export
MANAGED_LEDGER_NODES_MAX = 1_000_000  # /managed-ledgers nodes exported at most (then "truncated")


class AuditInputError(BksimError):
    """The audit's input cannot be used (exit status 2): a missing path, an unreadable snapshot, files whose
    bookie cannot be told."""


async def _gather(coros, concurrency: int = EXPORT_CONCURRENCY) -> list:
    out = []
    coros = list(coros)
    for i in range(0, len(coros), concurrency):
        out += await asyncio.gather(*coros[i:i + concurrency])
    return out


async def export_snapshot(store: MetadataStore, source: str, exported_at_ms: int,
                          nodes_max: int = MANAGED_LEDGER_NODES_MAX) -> dict:
    """Read every ledger's metadata and the /managed-ledgers tree through `store`."""
    try:
        data, _ = await store.get(INSTANCEID)
        instance_id = bytes(data).decode("utf-8", "replace").strip() or None
    except NoNodeError:
        instance_id = None

    async def one_ledger(ledger_id: int):
        path = ledger_path(ledger_id)
        try:
            data, version = await store.get(path)
        except NoNodeError:
            return None  # maybe: deleted while we walked
        entry: dict = {"ledger_id": ledger_id, "path": path, "version": version}
        try:
            ledger_metadata.decode(data, source=path)
            doc = json.loads(bytes(data).decode("utf-8"))
            doc.pop("password", None)  # a secret: never exported
            entry["metadata"] = doc
        except MetadataFormatError as e:
            entry["error"] = str(e)
            entry["raw_base64"] = base64.b64encode(bytes(data)).decode("ascii")
        return entry

    ledgers = [e for e in await _gather(one_ledger(i) for i in await list_ledger_ids(store)) if e is not None]
    nodes, truncated = await _walk(store, MANAGED_LEDGERS_ROOT, nodes_max)
    return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "source": source,
            "exported_at_ms": exported_at_ms, "instance_id": instance_id, "passwords": "omitted",
            "ledgers": ledgers, "managed_ledgers": nodes, "managed_ledgers_truncated": truncated}


async def _walk(store: MetadataStore, root: str, nodes_max: int) -> tuple[list[dict], bool]:
    """Every node under `root` (itself included when it exists), breadth first, sorted by path."""
    out: list[dict] = []
    level = [root]
    truncated = False

    async def visit(path: str):
        try:
            data, version = await store.get(path)
            children = await store.children(path)
        except NoNodeError:
            return None, []  # maybe: deleted while we walked
        return _node(path, bytes(data), version), [f"{path.rstrip('/')}/{c}" for c in children]

    while level:
        room = nodes_max - len(out)
        if len(level) > room:
            truncated, level = True, level[:room]
        results = await _gather(visit(p) for p in level)
        level = []
        for node, children in results:
            if node is not None:
                out.append(node)
                level += children
    out.sort(key=lambda n: n["path"])
    return out, truncated


def _node(path: str, data: bytes, version: int) -> dict:
    node: dict = {"path": path, "version": version}
    if not data:
        node["empty"] = True
        return node
    try:
        node["json"] = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        node["base64"] = base64.b64encode(data).decode("ascii")
    return node


def encode_snapshot(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")


@dataclass(slots=True)
class Snapshot:
    source: str
    instance_id: str | None
    ledgers: dict[int, LedgerView]
    problems: list[str] = field(default_factory=list)  # ledgers whose metadata could not be read
    managed_ledger_nodes: int = 0
    exported_at_ms: int = 0

    def summary(self) -> dict:
        states: dict[str, int] = {}
        for view in self.ledgers.values():
            states[view.state] = states.get(view.state, 0) + 1
        return {"source": self.source, "instance_id": self.instance_id, "ledgers": len(self.ledgers),
                "states": dict(sorted(states.items())), "unreadable": len(self.problems),
                "managed_ledger_nodes": self.managed_ledger_nodes}


def load_snapshot(doc: object, source: str = "metadata snapshot") -> Snapshot:
    """Validate a snapshot document; AuditInputError naming the problem when it is not one."""
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise AuditInputError(f"{source} is not a bksim metadata snapshot (no \"format\": \"{SNAPSHOT_FORMAT}\"; "
                              f"make one with `bksim metadata export --out FILE`)")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise AuditInputError(f"{source} is snapshot version {doc.get('version')!r}; this bksim reads version "
                              f"{SNAPSHOT_VERSION}")
    ledgers: dict[int, LedgerView] = {}
    problems: list[str] = []
    seen: set[int] = set()
    raw = doc.get("ledgers")
    if not isinstance(raw, list):
        raise AuditInputError(f"{source}: \"ledgers\" is not a list")
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("ledger_id"), int):
            raise AuditInputError(f"{source}: ledger entry {str(entry)[:80]} has no integer ledger_id")
        ledger_id = entry["ledger_id"]
        if ledger_id in seen:
            raise AuditInputError(f"{source}: ledger {ledger_id} appears twice")
        seen.add(ledger_id)
        if "metadata" not in entry:
            problems.append(f"ledger {ledger_id}: {entry.get('error', 'no metadata')}")
            continue
        metadata = entry["metadata"]
        if not isinstance(metadata, dict):
            problems.append(f"ledger {ledger_id}: metadata is not a JSON object")
            continue
        try:
            decoded = ledger_metadata.decode(json.dumps({**metadata, "password": ""}).encode("utf-8"),
                                             source=f"{source} ledger {ledger_id}")
        except MetadataFormatError as e:
            problems.append(str(e))
            continue
        ledgers[ledger_id] = LedgerView.of(decoded)
    managed = doc.get("managed_ledgers", [])
    return Snapshot(str(doc.get("source", source)), doc.get("instance_id"), ledgers, problems,
                    len(managed) if isinstance(managed, list) else 0, int(doc.get("exported_at_ms", 0) or 0))


def read_snapshot_file(path: str) -> Snapshot:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise AuditInputError(f"cannot read the metadata snapshot {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AuditInputError(f"metadata snapshot {path} is not JSON: {e}") from None
    return load_snapshot(doc, source=path)
