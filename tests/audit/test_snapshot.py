"""The metadata snapshot (audit/snapshot.py) over the in-memory MetadataStore (ZooKeeper's semantics): what the
export writes (ledgers, never passwords, the raw /managed-ledgers tree), and what loading accepts or refuses.
The same export against a real ZooKeeper runs in test_corpus.py (`bksim metadata export`)."""
from __future__ import annotations

import asyncio
import base64
import json

import pytest

from bksim.audit.snapshot import (AuditInputError, encode_snapshot, export_snapshot, load_snapshot,
                                  read_snapshot_file)
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import INSTANCEID, ledger_path
from bksim.metadata.ledger_manager import create_ledger_metadata

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def export(store, **kw) -> dict:
    return asyncio.run(export_snapshot(store, "memory", 1234, **kw))


@pytest.fixture
def store():
    async def fill():
        tree = InMemoryMetadataStore()
        await tree.create(INSTANCEID, b"5b3c7c57-2a5e-4f7b-9d36-9f0a6a2d8c11", make_parents=True)
        await create_ledger_metadata(tree, 3, LedgerMetadata.new(BOOKIES, 2, 2, password=b"secret").closed(9, 900))
        await create_ledger_metadata(tree, 12, LedgerMetadata.new(BOOKIES, 3, 2, password=b"secret"))
        await tree.create(ledger_path(20), b"not json", make_parents=True)
        topic = "/managed-ledgers/public/default/persistent/orders"
        await tree.create(topic, json.dumps({"ledgers": [3, 12]}).encode(), make_parents=True)
        await tree.create(f"{topic}/sub-1", b"\x00\x01binary")
        return tree
    return asyncio.run(fill())


def test_the_export_holds_every_ledger_without_its_password_and_the_raw_managed_ledger_tree(store):
    doc = export(store)
    assert (doc["format"], doc["version"], doc["source"], doc["exported_at_ms"]) == ("bksim-metadata-snapshot", 1,
                                                                                     "memory", 1234)
    assert doc["instance_id"] == "5b3c7c57-2a5e-4f7b-9d36-9f0a6a2d8c11" and doc["passwords"] == "omitted"
    assert [e["ledger_id"] for e in doc["ledgers"]] == [3, 12, 20]
    closed, open_, bad = doc["ledgers"]
    assert closed["path"] == ledger_path(3) and closed["metadata"]["state"] == "CLOSED"
    assert "password" not in closed["metadata"] and "password" not in open_["metadata"]
    assert b"secret" not in encode_snapshot(doc) and base64.b64encode(b"secret") not in encode_snapshot(doc)
    assert "error" in bad and base64.b64decode(bad["raw_base64"]) == b"not json"
    nodes = {n["path"]: n for n in doc["managed_ledgers"]}
    assert nodes["/managed-ledgers/public/default/persistent/orders"]["json"] == {"ledgers": [3, 12]}
    assert base64.b64decode(nodes["/managed-ledgers/public/default/persistent/orders/sub-1"]["base64"]) == b"\x00\x01binary"
    assert nodes["/managed-ledgers"]["empty"] is True and doc["managed_ledgers_truncated"] is False
    assert [n["path"] for n in doc["managed_ledgers"]] == sorted(nodes)


def test_the_managed_ledger_tree_is_bounded(store):
    doc = export(store, nodes_max=3)
    assert len(doc["managed_ledgers"]) == 3 and doc["managed_ledgers_truncated"] is True


def test_loading_gives_ledger_views_and_names_what_it_cannot_read(store, tmp_path):
    path = tmp_path / "snapshot.json"
    path.write_bytes(encode_snapshot(export(store)))
    snapshot = read_snapshot_file(str(path))
    assert sorted(snapshot.ledgers) == [3, 12]
    view = snapshot.ledgers[3]
    assert (view.state, view.last_entry_id, view.write_quorum_size, view.ack_quorum_size) == ("CLOSED", 9, 2, 2)
    assert view.segments == ((0, BOOKIES),) and snapshot.ledgers[12].state == "OPEN"
    assert len(snapshot.problems) == 1 and "ledger 20" in snapshot.problems[0]
    assert snapshot.summary()["states"] == {"CLOSED": 1, "OPEN": 1}


@pytest.mark.parametrize("doc, message", [
    ({"ledgers": []}, "not a bksim metadata snapshot"),
    ({"format": "bksim-metadata-snapshot", "version": 2, "ledgers": []}, "version 2"),
    ({"format": "bksim-metadata-snapshot", "version": 1, "ledgers": {}}, "is not a list"),
    ({"format": "bksim-metadata-snapshot", "version": 1, "ledgers": [{"ledger_id": 1, "metadata": {}},
                                                                    {"ledger_id": 1, "metadata": {}}]}, "twice"),
])
def test_a_document_that_is_no_snapshot_is_unusable_input(doc, message):
    with pytest.raises(AuditInputError, match=message):
        load_snapshot(doc)


def test_a_snapshot_file_that_is_missing_or_not_json_is_unusable_input(tmp_path):
    with pytest.raises(AuditInputError, match="cannot read"):
        read_snapshot_file(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(AuditInputError, match="not JSON"):
        read_snapshot_file(str(tmp_path / "bad.json"))
