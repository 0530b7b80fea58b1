"""`bksim metadata export --out FILE`: every ledger's metadata and the /managed-ledgers tree, from ZooKeeper, as
one JSON snapshot (the audit's `--metadata FILE`; format in audit/snapshot.py).

`bksim metadata secure`: gives every znode under the cluster's roots (SECURED_ROOTS) the digest ACL of the
configured credentials (zookeeper.digest_credentials_file), so a tree made before credentials were configured
is closed to anonymous clients; idempotent; prints the counts. Exit 0; 2 without credentials or ZooKeeper.

Composition root for the snapshot: a kazoo client and the ZooKeeper MetadataStore (adapters) handed to
`audit.snapshot.export_snapshot`, which reads only through the port. Ledger passwords are never written.
The file is written atomically (temp file, rename). `snapshot_from_zookeeper` is also what
`bksim audit --zookeeper HOST:PORT` uses. Exit 0; 2 when ZooKeeper cannot be reached or the file not written.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from bksim.metadata.paths import BROKERS_ROOT, LEDGERS_ROOT, MANAGED_LEDGERS_ROOT, OWNERSHIP_ROOT
from bksim.model.errors import BksimError
from bksim.topics.names import ADMIN_ROOT

# every top-level znode bksim writes (ZooKeeper's own / and /zookeeper keep their ACLs)
SECURED_ROOTS = (LEDGERS_ROOT, BROKERS_ROOT, MANAGED_LEDGERS_ROOT, OWNERSHIP_ROOT, ADMIN_ROOT)


def register(subparsers) -> None:
    family = subparsers.add_parser("metadata", help="the cluster's metadata in ZooKeeper")
    sub = family.add_subparsers(dest="metadata_command", required=True)
    p = sub.add_parser("export", help="write all ledger metadata and the /managed-ledgers tree as a JSON snapshot",
                       description="Read every ledger's metadata (passwords omitted) and every node under "
                       "/managed-ledgers (JSON values as JSON, other bytes as base64) and write them to FILE. "
                       "`bksim audit --metadata FILE` reads it.")
    p.add_argument("--out", required=True, metavar="FILE", help="the snapshot file to write")
    p.add_argument("--zookeeper", metavar="HOST:PORT",
                   help="ZooKeeper to read (default: zookeeper.host:zookeeper.port of the configuration)")
    p.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    p.add_argument("--json", action="store_true", help="print one JSON object (counts and the file) on stdout")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("secure", help="give every znode of the cluster the digest ACL of the configured credentials",
                       description="Walk " + ", ".join(SECURED_ROOTS) + " and set on each znode the ACL "
                       "digest:USER (all permissions, nothing for anyone else) of the credentials in "
                       "zookeeper.digest_credentials_file. Nodes that already have it are left alone (idempotent).")
    p.add_argument("--zookeeper", metavar="HOST:PORT",
                   help="ZooKeeper to secure (default: the configured one; its TLS port when zookeeper.secure_port)")
    p.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    p.add_argument("--json", action="store_true", help="print one JSON object (the counts) on stdout")
    p.set_defaults(func=cmd_secure)


def snapshot_from_zookeeper(hosts: str | None, config_path: str | None) -> dict:
    """Export the snapshot document from ZooKeeper (`hosts`, else the configured one)."""
    from bksim.adapters import registration
    from bksim.adapters.zk_client import client_hosts
    from bksim.adapters.zk_metadata import ZkMetadataStore
    from bksim.audit.snapshot import export_snapshot
    from bksim.cli import config as cfgload
    from bksim.cli.bookie_cmd import ZK_CONNECT_TIMEOUT_S, _close_zk

    config = cfgload.load(config_path)
    hosts = hosts or client_hosts(config)
    client = registration.connect_config(config, ZK_CONNECT_TIMEOUT_S, hosts)
    try:
        async def export() -> dict:
            store = ZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                    read_tries_max=config.zookeeper.read_tries_max)
            try:
                return await export_snapshot(store, f"zookeeper {hosts}", int(time.time() * 1000))
            finally:
                store.close()

        return asyncio.run(export())
    finally:
        _close_zk(client)


def cmd_export(args) -> int:
    from bksim.audit.snapshot import encode_snapshot

    doc = snapshot_from_zookeeper(args.zookeeper, getattr(args, "config", None))
    out = os.path.abspath(args.out)
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(encode_snapshot(doc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        raise BksimError(f"cannot write the snapshot {out}: {e.strerror or e}") from None
    unreadable = sum(1 for entry in doc["ledgers"] if "metadata" not in entry)
    summary = {"file": out, "source": doc["source"], "ledgers": len(doc["ledgers"]), "unreadable": unreadable,
               "managed_ledger_nodes": len(doc["managed_ledgers"]),
               "managed_ledgers_truncated": doc["managed_ledgers_truncated"], "instance_id": doc["instance_id"]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"exported {summary['ledgers']} ledgers ({unreadable} unreadable) and "
              f"{summary['managed_ledger_nodes']} /managed-ledgers nodes from {doc['source']} to {out} "
              f"(passwords omitted)")
        if doc["managed_ledgers_truncated"]:
            print("warning: the /managed-ledgers tree was truncated (too many nodes)", file=sys.stderr)
    return 0


def cmd_secure(args) -> int:
    from bksim.adapters import registration
    from bksim.adapters.zk_client import client_hosts, secure_tree, security_from_config
    from bksim.cli import config as cfgload
    from bksim.cli.bookie_cmd import ZK_CONNECT_TIMEOUT_S, _close_zk

    config = cfgload.load(getattr(args, "config", None))
    security = security_from_config(config)
    if not security.digest:
        raise BksimError("bksim metadata secure needs digest credentials: set zookeeper.digest_credentials_file "
                         "(or BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE) to a file holding USER:PASSWORD")
    hosts = args.zookeeper or client_hosts(config)
    started = time.monotonic()
    client = registration.connect_config(config, ZK_CONNECT_TIMEOUT_S, hosts)
    try:
        counts = secure_tree(client, SECURED_ROOTS, security)
    finally:
        _close_zk(client)
    summary = {"zookeeper": hosts, "user": security.user, "roots": counts.roots,
               "roots_missing": counts.roots_missing, "nodes": counts.nodes, "secured": counts.secured,
               "unchanged": counts.unchanged, "vanished": counts.vanished,
               "seconds": round(time.monotonic() - started, 3)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"secured {counts.secured} znodes, {counts.unchanged} already had the ACL "
              f"(digest user {security.user}; {counts.roots} roots, {counts.roots_missing} absent, "
              f"{counts.vanished} deleted meanwhile) on ZooKeeper {hosts} in {summary['seconds']:.2f}s")
    return 0
