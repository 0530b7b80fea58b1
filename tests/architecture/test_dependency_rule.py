"""The dependency rule of ARCHITECTURE.md, held by an `ast` scan of services/bksim.

Layers, bottom to top (a module imports only from its own row or below):

    cli                                       composition roots: may import anything
    adapters | sim | audit | chaos | perf     siblings do not import each other; EXCEPTIONS: perf may
      | client                                import adapters (benchmarks measure the real adapters), perf
                                              and chaos may import client (the topic client over gRPC), and
                                              chaos may import adapters (it drives real processes), and client
                                              may import adapters (shared gRPC channel helpers)
    security                                  certificates, TLS credentials, tokens, authorization (touches
                                              files and grpc, so not pure)
    topics | autorecovery                     managed ledgers, cursors, subscriptions over the ledger client;
                                              the auditor and replication workers (autorecovery never
                                              imports bookie or topics)
    bookie | metadata | broker                bookie never imports broker, and broker never imports bookie
    formats | ports | ledger
    model

`gen` (generated gRPC/protobuf code) may be imported only by adapters, client, perf and cli.

The pure layers (model, formats, ports, ledger, bookie, metadata, broker, topics, autorecovery) import none of grpc,
google.protobuf, kazoo, rocksdict, pyspark, py4j, socket, threading, time, random, subprocess,
multiprocessing (stdlib ones are allowed under `if TYPE_CHECKING:` for annotations), and never read a wall
or monotonic clock (`time.time()`, `time.monotonic()`, `datetime.now()`, ...): time and randomness are
passed in through ports. A new top-level package under bksim/ fails this test until it is given a layer.
"""
from __future__ import annotations

import ast
import os
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(REPO, "services", "bksim")

RANK = {
    "model": 0,
    "formats": 1, "ports": 1, "ledger": 1,
    "bookie": 2, "metadata": 2, "broker": 2,
    "topics": 3, "autorecovery": 3,
    "security": 3.5,  # its own row between topics|autorecovery and adapters: adapters, client and cli use it
    "adapters": 4, "sim": 4, "audit": 4, "chaos": 4, "perf": 4, "gen": 4, "client": 4,
    "cli": 5, "<root>": 5,  # bksim/__init__.py, bksim/__main__.py
}
PURE = {"model", "formats", "ports", "ledger", "bookie", "metadata", "broker", "topics", "autorecovery"}
NEVER = {("bookie", "broker"), ("broker", "bookie"), ("topics", "bookie"), ("autorecovery", "bookie"),
         ("autorecovery", "topics")}
SIBLINGS = {"adapters", "sim", "audit", "chaos", "perf", "client"}
SIBLING_EXCEPTIONS = {("perf", "adapters"), ("perf", "client"), ("chaos", "client"), ("chaos", "adapters"),
                      ("client", "adapters")}
GEN_IMPORTERS = {"adapters", "perf", "cli", "<root>", "gen", "client"}

WORLD_THIRD_PARTY = ("grpc", "google.protobuf", "kazoo", "rocksdict", "pyspark", "py4j")
WORLD_STDLIB = ("socket", "threading", "time", "random", "subprocess", "multiprocessing")
CLOCK_READS = {
    "time": {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time"},
    "datetime": {"now", "utcnow", "today"},
    "date": {"today"},
}


def layer_of(module: str) -> str | None:
    """'bksim.bookie.journal' -> 'bookie'; 'bksim' / 'bksim.__main__' -> '<root>'; None outside bksim."""
    parts = module.split(".")
    if parts[0] != "bksim":
        return None
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return "<root>"
    return parts[1]


def _matches(module: str, prefixes) -> str | None:
    for prefix in prefixes:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def imported_modules(tree: ast.AST, module: str, is_package: bool):
    """Yield (absolute module name, line, under TYPE_CHECKING) for every import in `tree`."""
    def walk(node, type_checking):
        for child in ast.iter_child_nodes(node):
            guarded = type_checking
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    yield from walk_one(sub, True)
                for sub in child.orelse:
                    yield from walk_one(sub, type_checking)
                continue
            yield from walk_one(child, guarded)

    def walk_one(node, type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, type_checking
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            yield base, node.lineno, type_checking
            if base == "bksim":
                for alias in node.names:
                    yield f"bksim.{alias.name}", node.lineno, type_checking
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from walk(node, type_checking)

    yield from walk(tree, False)


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def clock_reads(tree: ast.AST):
    """Yield (text, line) for `time.monotonic`, `datetime.now`, `datetime.datetime.now`, ... (called or not)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
            if name in CLOCK_READS and node.attr in CLOCK_READS[name]:
                yield f"{name}.{node.attr}", node.lineno


def violations_in_source(source: str, module: str, is_package: bool = False, where: str | None = None) -> list[str]:
    """Every break of the rule in one module's source (module = its dotted name, e.g. 'bksim.bookie.x')."""
    where = where or module
    layer = layer_of(module)
    if layer is None:
        return []
    if layer not in RANK:
        return [f"{where}: bksim.{layer} is not in the layer table of tests/architecture/test_dependency_rule.py "
                f"(give it a layer in ARCHITECTURE.md's rule, or move the code into an existing layer)"]
    tree = ast.parse(source)
    found = []
    for target, line, type_checking in imported_modules(tree, module, is_package):
        at = f"{where}:{line}"
        other = layer_of(target)
        if other is not None:
            if other not in RANK:
                found.append(f"{at}: imports {target}, which is in no layer")
                continue
            if other == "gen" and layer not in GEN_IMPORTERS:
                found.append(f"{at}: {layer} imports {target}: generated gRPC code is for adapters, perf and cli only")
            elif RANK[other] > RANK[layer]:
                found.append(f"{at}: {layer} imports {target} from a higher layer ({other})")
            elif (layer, other) in NEVER:
                why = ("the bookie is reached only through the BookieTransport port, never imported by broker, "
                       "topics or autorecovery") if other == "bookie" else f"{layer} and {other} are separate"
                found.append(f"{at}: {layer} imports {target}: {why}")
            elif (layer != other and layer in SIBLINGS and other in SIBLINGS
                  and (layer, other) not in SIBLING_EXCEPTIONS):
                found.append(f"{at}: {layer} imports {target}: {layer} and {other} are siblings and do not "
                             f"import each other")
            continue
        if layer in PURE:
            bad = _matches(target, WORLD_THIRD_PARTY)
            if bad:
                found.append(f"{at}: pure layer {layer} imports {target}: only adapters and cli touch the world")
            bad = _matches(target, WORLD_STDLIB)
            if bad and not type_checking:
                found.append(f"{at}: pure layer {layer} imports {target}: pass time, randomness, threads and "
                             f"sockets in through ports")
    if layer in PURE:
        for text, line in clock_reads(tree):
            found.append(f"{where}:{line}: pure layer {layer} reads the clock ({text}): use the Clock port")
    return found


def scan_tree(package_dir: str) -> list[str]:
    """Violations in every .py file under `package_dir` (the directory of the `bksim` package)."""
    found = []
    root = os.path.dirname(package_dir)
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, root)
            parts = rel[:-3].split(os.sep)
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            with open(path, encoding="utf-8") as f:
                found += violations_in_source(f.read(), module, is_package, where=rel)
    return found


# -- the rule holds for the real code -------------------------------------------------------------------

def test_services_follow_the_dependency_rule():
    assert os.path.isdir(os.path.join(PACKAGE_DIR, "model"))
    violations = scan_tree(PACKAGE_DIR)
    assert not violations, "dependency rule broken (see ARCHITECTURE.md):\n" + "\n".join(violations)


def test_the_scan_sees_the_real_modules():
    # guard against a scanner that silently scans nothing
    modules = []
    for dirpath, _, filenames in os.walk(PACKAGE_DIR):
        modules += [f for f in filenames if f.endswith(".py")]
    assert len(modules) >= 10
    engine = os.path.join(PACKAGE_DIR, "bookie", "__init__.py")
    assert violations_in_source("import grpc\n", "bksim.bookie", is_package=True, where=engine)


# -- the scanner itself: it must catch what it is for -----------------------------------------------------

def _v(source: str, module: str, is_package: bool = False) -> list[str]:
    return violations_in_source(textwrap.dedent(source), module, is_package)


def test_scanner_catches_world_imports_in_pure_layers():
    assert _v("import grpc\n", "bksim.bookie.journal")
    assert _v("from google.protobuf import message\n", "bksim.formats.entry")
    assert _v("from kazoo.client import KazooClient\n", "bksim.metadata.ledger_manager")
    assert _v("import rocksdict\n", "bksim.bookie.index")
    assert _v("from pyspark.sql import SparkSession\n", "bksim.ledger.protocol")
    assert _v("import socket\n", "bksim.broker.topic")
    assert _v("import threading\n", "bksim.bookie.engine")
    assert _v("import time\n", "bksim.model.ids")
    assert _v("from random import randint\n", "bksim.ledger.ensemble")
    assert _v("def lazy():\n    import grpc\n", "bksim.bookie.engine")  # imports inside functions count
    assert _v("try:\n    import kazoo\nexcept ImportError:\n    pass\n", "bksim.metadata.ledger_manager")
    assert _v("if TYPE_CHECKING:\n    import grpc\n", "bksim.bookie.engine")  # third-party: even for types


def test_scanner_catches_clock_reads_in_pure_layers():
    assert _v("def f(t):\n    return t.time.monotonic()\n", "bksim.bookie.engine")
    assert _v("from datetime import datetime\nx = datetime.now()\n", "bksim.metadata.layout")
    assert _v("import datetime\nx = datetime.datetime.utcnow()\n", "bksim.formats.journal")
    assert _v("from datetime import date\nx = date.today()\n", "bksim.model.ids")


def test_scanner_catches_upward_and_sideways_imports():
    assert _v("from bksim.adapters import rocks\n", "bksim.bookie.index")
    assert _v("from bksim.cli import config\n", "bksim.model.config")
    assert _v("from bksim.gen import bookie_pb2\n", "bksim.bookie.engine")
    assert _v("from bksim.gen import bookie_pb2\n", "bksim.sim.world")
    assert _v("from bksim.bookie import engine\n", "bksim.formats.entry")
    assert _v("from bksim.broker import topic\n", "bksim.bookie.engine")
    assert _v("from ..broker import topic\n", "bksim.bookie.engine")
    assert _v("from ..bookie.engine import BookieEngine\n", "bksim.broker.managed_ledger")
    assert _v("from bksim import adapters\n", "bksim.ledger.protocol")
    assert _v("import bksim.adapters.clock\n", "bksim.sim.world")
    assert _v("from bksim.sim import world\n", "bksim.adapters.grpc_server")
    assert _v("from bksim.chaos import faults\n", "bksim.audit.job")
    assert _v("from bksim.perf import stats\n", "bksim.adapters.localdisk")
    assert _v("x = 1\n", "bksim.newthing.x")  # unknown layer
    assert _v("from bksim.topics.topic import Topic\n", "bksim.broker.ledgers")  # topics sits above broker
    assert _v("from bksim.bookie.engine import BookieEngine\n", "bksim.topics.topic")
    assert _v("from bksim.adapters import rocks\n", "bksim.topics.topic")
    assert _v("import time\n", "bksim.topics.cursor_state")
    assert _v("from bksim.bookie.engine import BookieEngine\n", "bksim.autorecovery.auditor")
    assert _v("from ..bookie import engine\n", "bksim.autorecovery.worker")
    assert _v("from bksim.topics.managed_ledger import ManagedLedger\n", "bksim.autorecovery.auditor")
    assert _v("from bksim.adapters.zk_metadata import ZkMetadataStore\n", "bksim.autorecovery.marks")
    assert _v("from bksim.autorecovery.marks import UnderReplicationMarks\n", "bksim.broker.ledgers")
    assert _v("import kazoo\n", "bksim.autorecovery.marks")
    assert _v("import asyncio, time\n", "bksim.autorecovery.auditor")
    assert _v("import time\nx = time.monotonic()\n", "bksim.autorecovery.worker")


def test_scanner_allows_what_the_rule_allows():
    assert not _v("import asyncio, os, struct, hashlib\nfrom bksim.model.errors import BookieError\n",
                  "bksim.bookie.engine")
    assert not _v("from bksim.formats import entry\nfrom bksim.ports.disk import Disk\n", "bksim.bookie.journal")
    assert not _v("from bksim.metadata import layout\n", "bksim.bookie.cookie")
    assert not _v("from . import journal\nfrom .journal import Journal\n", "bksim.bookie.engine")
    assert not _v("from .errors import ConfigError\n", "bksim.model", is_package=True)
    assert not _v("from bksim.broker.ledgers import LedgerService\n", "bksim.topics.managed_ledger")
    assert not _v("from bksim.broker.ledgers import LedgerService\nfrom bksim.ledger.quorum import covered\n"
                  "from bksim.metadata import paths\nfrom bksim.formats.entry import Entry\n"
                  "from bksim.ports.clock import Clock\nfrom bksim.model.config import AutoRecoveryConfig\n"
                  "from .marks import Mark\n", "bksim.autorecovery.auditor")
    assert not _v("from bksim.autorecovery.auditor import Auditor\n", "bksim.cli.autorecovery_cmd")
    assert not _v("from bksim.autorecovery.marks import UnderReplicationMarks\n", "bksim.sim.ledger_scenario")
    assert not _v("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import random\n", "bksim.ledger.x")
    assert not _v("import grpc, kazoo, time, threading\nfrom bksim.bookie import engine\n"
                  "from bksim.gen import bookie_pb2\n", "bksim.adapters.bookie_server")
    assert not _v("from bksim.adapters.localdisk import LocalDisk\nimport time\nt = time.monotonic()\n",
                  "bksim.perf.journal_append")
    assert not _v("from bksim.adapters import processes\nfrom bksim.sim import world\n", "bksim.cli.main")
    assert not _v("import time\nfrom bksim.ledger import protocol\n", "bksim.sim.world")


def test_scan_tree_reports_a_grpc_import_added_to_the_bookie(tmp_path):
    package = tmp_path / "bksim"
    (package / "bookie").mkdir(parents=True)
    (package / "model").mkdir()
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "bookie" / "__init__.py").write_text("from bksim.model import errors\n")
    (package / "bookie" / "engine.py").write_text("import os\n")
    assert scan_tree(str(package)) == []
    (package / "bookie" / "engine.py").write_text("import os\nimport grpc\n")
    assert scan_tree(str(package)) == [
        f"{os.path.join('bksim', 'bookie', 'engine.py')}:2: pure layer bookie imports grpc: "
        f"only adapters and cli touch the world"]
