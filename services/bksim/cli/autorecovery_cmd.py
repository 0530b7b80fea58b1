"""`bksim autorecovery run|status|list-underreplicated|enable|disable|check-all`: autorecovery's composition root
and its commands (PROTOCOL.md §6; the parts: autorecovery/auditor.py, worker.py, admin.py).

`run_daemon` is what runs inside every `bksim bookie run` (when `autorecovery.enabled`, as BookKeeper's
autoRecoveryDaemonEnabled) and alone as `bksim autorecovery run`: one auditor candidate and one replication
worker over a ZooKeeper session of their own (RenewingZkMetadataStore), a GrpcBookieTransport and a
LedgerService (the broker's ledger client: placement with quarantine, recovery of a ledger left OPEN).

    connect ZooKeeper -> store, transport, LedgerService, marks
    -> auditor loop (Auditor.run; SessionExpiredError: its vote died with the session: a new Auditor votes
       again on the new session) and ReplicationWorker.run, until `stop`
    -> stop both (they return at their next wait; after DAEMON_TASK_STOP_S they are cancelled: an abandoned
       copy is a harmless extra copy, its lock dies with the session) -> close the transport
    -> close the ZooKeeper session (bounded by the session timeout on a daemon thread)

A failure of any step (ZooKeeper unreachable, an unexpected error in a loop) is logged and the whole daemon
starts again after a back-off (RESTART_BACKOFF_S doubling to RESTART_BACKOFF_S_MAX): it never ends the process
it runs in. Log lines start with "autorecovery:".

The other commands connect to ZooKeeper once, act through autorecovery/admin.py and the marks, and exit:
`status [--json]`, `list-underreplicated [--json]`, `enable`, `disable` (the /ledgers/underreplication/disable
switch) and `check-all` (Auditor.trigger_check_all: the elected auditor, in whatever process, runs the check
of all ledgers at its next turn; with `--verify-percentage N` the command runs the check itself, now, reading
N% of the entries' copies instead of the configured ledger_verification_percentage, and prints what it found
and marked: admin.check_all). `bookie decommission` and `ledger replicas` (registered by bookie_cmd and
ledger_cmd) run here too: `cmd_decommission`, `cmd_replicas`.

Progress (cli/progress.py; on a terminal, without --json): `check-all --verify-percentage` counts the ledgers
looked at of N on stderr; `bookie decommission` keeps a spinner with the seconds waited under its progress lines.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
from datetime import datetime
from typing import AsyncIterator, Callable

from bksim.cli import config as cfgload
from bksim.model.config import Config, parse_address_overrides
from bksim.model.errors import SessionExpiredError
from bksim.security.tls import channel_security

DAEMON_TASK_STOP_S = 2.0  # the auditor and worker loops end at their next wait; past this they are cancelled
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_S_MAX = 30.0
DECOMMISSION_TIMEOUT_S = 600.0


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    family = subparsers.add_parser("autorecovery", help="the auditor and replication workers: run them, see and "
                                                        "switch what they do")
    sub = family.add_subparsers(dest="autorecovery_command", required=True)
    p = sub.add_parser("run", parents=[common], help="run an auditor candidate and a replication worker in the "
                                                     "foreground until SIGTERM/SIGINT",
                       description="Run autorecovery alone (BookKeeper's `bookkeeper autorecovery`): vote in the "
                                   "auditor election and run one replication worker. Every bookie runs the same "
                                   "when autorecovery.enabled is true.")
    p.add_argument("--id", dest="owner_id", default="",
                   help="the name in its vote and locks (default autorecovery-<hostname>-<pid>)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", parents=[common], help="the auditor, the candidates, the marks, lost ledgers, "
                                                        "whether autorecovery is disabled")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("list-underreplicated", parents=[common],
                       help="the marked ledgers: missing bookies, who copies them, age, lost entries")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_list)
    for name, func, text in (("enable", cmd_enable, "resume marking and replication cluster-wide"),
                             ("disable", cmd_disable, "pause marking and replication cluster-wide")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.set_defaults(func=func)
    p = sub.add_parser("check-all", parents=[common], help="ask the auditor to check all ledgers' replicas now",
                       description="Without --verify-percentage: ask the elected auditor to run the check of all "
                                   "ledgers at its next turn. With it: run the check here and now, reading that "
                                   "percentage of every closed ledger's entries from every replica (digest, same "
                                   "bytes) instead of autorecovery.ledger_verification_percentage; print what it "
                                   "found and marked.")
    p.add_argument("--verify-percentage", type=_percentage, default=None, metavar="N",
                   help="run the check in this process, verifying N%% (0..100) of the entries' copies")
    p.add_argument("--json", action="store_true", help="with --verify-percentage: print the check's report as one "
                                                       "JSON object")
    p.set_defaults(func=cmd_check_all)


def _percentage(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer percentage") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is not within 0..100")
    return value


def make_log(owner_id: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        stamp = datetime.now().astimezone().isoformat(timespec="milliseconds")
        sys.stderr.write(f"{stamp} autorecovery {owner_id} {message}\n")
        sys.stderr.flush()
    return log


# -- the daemon ----------------------------------------------------------------------------------------------

async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_daemon(config: Config, owner_id: str, stop: asyncio.Event, log: Callable[[str], None]) -> None:
    """The auditor candidate and one replication worker until `stop` (see the module docstring). Never raises
    but for cancellation."""
    backoff = RESTART_BACKOFF_S
    while not stop.is_set():
        try:
            await _run_session(config, owner_id, stop, log)
            backoff = RESTART_BACKOFF_S
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - autorecovery must never take its process down: retry
            log(f"autorecovery: {type(e).__name__}: {e}; starting again in {backoff:.0f} s")
            await _wait(stop, backoff)
            backoff = min(2 * backoff, RESTART_BACKOFF_S_MAX)


async def _run_session(config: Config, owner_id: str, stop: asyncio.Event, log: Callable[[str], None]) -> None:
    from bksim.adapters import registration
    from bksim.adapters.bookie_transport import GrpcBookieTransport, registration_resolver
    from bksim.adapters.clock import SystemClock
    from bksim.adapters.zk_metadata import RenewingZkMetadataStore
    from bksim.autorecovery.marks import UnderReplicationMarks
    from bksim.autorecovery.worker import ReplicationWorker
    from bksim.broker.ledgers import LedgerService
    from bksim.cli.bookie_cmd import ZK_CONNECT_TIMEOUT_S, _close_zk

    zk_bound_s = config.zookeeper.session_timeout_ms / 1000
    connecting = asyncio.ensure_future(registration.call_bounded(
        lambda: registration.connect_config(config, ZK_CONNECT_TIMEOUT_S),
        ZK_CONNECT_TIMEOUT_S + zk_bound_s))
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if not connecting.done():  # stopping: a client that connects after this lives on a daemon thread until exit
        connecting.cancel()
        return
    client = connecting.result()
    store = transport = None
    tasks: list[asyncio.Task] = []
    halt = asyncio.Event()  # the loops' stop: `stop`, or one loop failed
    try:
        store = RenewingZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                        read_tries_max=config.zookeeper.read_tries_max)
        r, a = config.broker, config.autorecovery
        transport = GrpcBookieTransport(
            registration_resolver(store, overrides=parse_address_overrides(r.bookie_address_overrides)),
            timeout_ms=r.bookie_timeout_ms, add_window_max=r.add_window_max,
            tls=channel_security(config.security))
        clock, rng = SystemClock(), random.SystemRandom()
        ledgers = LedgerService(store=store, transport=transport, rng=rng, clock=clock, config=r, log=log)
        marks = UnderReplicationMarks(store, clock)
        worker = ReplicationWorker(store=store, transport=transport, ledgers=ledgers, marks=marks, clock=clock,
                                   rng=rng, config=a, owner_id=owner_id, log=log)
        log(f"autorecovery: {owner_id} runs an auditor candidate and a replication worker (ZooKeeper session "
            f"0x{store.session_id:x})")
        tasks = [asyncio.create_task(_audit(store, transport, marks, clock, config, owner_id, halt, log)),
                 asyncio.create_task(worker.run(halt))]
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in tasks:
            if task in done and not stop.is_set():
                task.result()  # raises the loop's failure (the caller starts again)
                raise RuntimeError("an autorecovery loop ended before it was stopped")
    finally:
        halt.set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=DAEMON_TASK_STOP_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if transport is not None:
            await transport.close()
        if store is not None:
            store.close()
        try:
            await registration.call_bounded(lambda: _close_zk(client), zk_bound_s)
            log("autorecovery: stopped; its ZooKeeper session is closed")
        except TimeoutError:
            log(f"autorecovery: closing its ZooKeeper session gave up after {zk_bound_s:.1f} s")


async def _audit(store, transport, marks, clock, config: Config, owner_id: str, stop: asyncio.Event,
                 log: Callable[[str], None]) -> None:
    """Auditor.run until `stop`; a SessionExpiredError (the vote died with the session) makes a new Auditor
    that votes again once the store has bound the client's new session."""
    from bksim.autorecovery.auditor import Auditor

    while not stop.is_set():
        auditor = Auditor(store, transport, marks, clock, config.autorecovery, owner_id, log)
        try:
            await auditor.run(stop)
        except SessionExpiredError as e:
            log(f"autorecovery: the auditor's ZooKeeper session expired ({e}); voting again on a new session")
            await _wait(stop, config.autorecovery.bookie_check_interval_ms / 1000)


def cmd_run(args) -> int:
    config = cfgload.load(getattr(args, "config", None))
    owner_id = args.owner_id or f"autorecovery-{socket.gethostname()}-{os.getpid()}"
    log = make_log(owner_id)
    cfgload.print_effective(config, f"autorecovery {owner_id}")

    async def main() -> int:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run_daemon(config, owner_id, stop, log)
        log("bye")
        return 0

    return asyncio.run(main())


# -- one-shot commands ---------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def tools(config: Config) -> AsyncIterator[dict]:
    """A ZooKeeper session, its store, a bookie transport, the marks and the clock for one command."""
    from bksim.adapters import registration
    from bksim.adapters.bookie_transport import GrpcBookieTransport, registration_resolver
    from bksim.adapters.clock import SystemClock
    from bksim.adapters.zk_metadata import ZkMetadataStore
    from bksim.autorecovery.marks import UnderReplicationMarks
    from bksim.cli.bookie_cmd import ZK_CONNECT_TIMEOUT_S, _close_zk

    client = await asyncio.to_thread(registration.connect_config, config, ZK_CONNECT_TIMEOUT_S)
    store = transport = None
    try:
        store = ZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                read_tries_max=config.zookeeper.read_tries_max)
        r = config.broker
        transport = GrpcBookieTransport(
            registration_resolver(store, overrides=parse_address_overrides(r.bookie_address_overrides)),
            timeout_ms=r.bookie_timeout_ms, add_window_max=r.add_window_max,
            tls=channel_security(config.security))
        clock = SystemClock()
        yield {"store": store, "transport": transport, "clock": clock, "marks": UnderReplicationMarks(store, clock)}
    finally:
        if transport is not None:
            await transport.close()
        if store is not None:
            store.close()
        await registration.call_bounded(lambda: _close_zk(client), config.zookeeper.session_timeout_ms / 1000)


def _admin_auditor(t: dict, config: Config, owner: str):
    """An Auditor that never votes: for its cluster-wide actions (mark_ledgers_of, trigger_check_all)."""
    from bksim.autorecovery.auditor import Auditor

    return Auditor(t["store"], t["transport"], t["marks"], t["clock"], config.autorecovery, owner)


def _run(args, action) -> object:
    config = cfgload.load(getattr(args, "config", None))

    async def main():
        async with tools(config) as t:
            return await action(t, config)

    return asyncio.run(main())


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}s" if value < 120_000 else f"{value / 60_000:.1f}m"


def cmd_status(args) -> int:
    from bksim.autorecovery import admin

    doc = _run(args, lambda t, c: admin.status(t["store"], t["marks"], t["clock"]))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"autorecovery: {'DISABLED (`bksim autorecovery enable` resumes it)' if doc['disabled'] else 'enabled'}")
    print(f"auditor: {doc['auditor'] or 'none (no autorecovery daemon runs)'}")
    print(f"candidates: {', '.join(doc['candidates']) or '-'}")
    b = doc["bookies"]
    print(f"bookies: {len(b['known'])} known, {len(b['writable'])} writable, {len(b['readonly'])} read-only, "
          f"missing: {', '.join(b['missing']) or '-'}")
    ctime = doc["check_all_ctime_ms"]
    print("last check of all ledgers: " + ("never" if ctime is None else "requested" if ctime == 0 else
                                           datetime.fromtimestamp(ctime / 1000).astimezone().isoformat(
                                               timespec="seconds") if ctime > 0 else "unreadable"))
    print(f"under-replicated ledgers: {doc['underreplicated']} ({len(doc['claimed'])} being copied); lost ledgers: "
          f"{', '.join(map(str, doc['lost_ledgers'])) or '-'}")
    if doc["marks"]:
        print(_marks_table(doc["marks"]))
    return 0


def _marks_table(rows: list[dict]) -> str:
    lines = [f"{'LEDGER':>8}  {'MISSING':<40} {'CLAIMED BY':<24} {'AGE':>7} {'LOST':>6}  NOTE"]
    for r in rows:
        lines.append(f"{r['ledger_id']:>8}  {','.join(r['missing']) or '?':<40} {r['claimed_by'] or '-':<24} "
                     f"{_ms(r['age_ms']):>7} {r['lost_entries']:>6}  {r['note']}")
    return "\n".join(lines)


def cmd_list(args) -> int:
    from bksim.autorecovery import admin

    rows = _run(args, lambda t, c: admin.underreplicated(t["marks"], t["clock"]))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    elif not rows:
        print("no under-replicated ledgers")
    else:
        print(_marks_table(rows))
    return 0


def cmd_enable(args) -> int:
    _run(args, lambda t, c: t["marks"].enable())
    print("autorecovery enabled: the auditor marks and the workers copy again")
    return 0


def cmd_disable(args) -> int:
    _run(args, lambda t, c: t["marks"].disable())
    print("autorecovery disabled: nothing is marked or copied until `bksim autorecovery enable`")
    return 0


def cmd_check_all(args) -> int:
    if args.verify_percentage is not None:
        return _check_all_here(args)
    if args.json:
        print("bksim: error: --json needs --verify-percentage (a requested check reports to the auditor's log)",
              file=sys.stderr)
        return 2

    async def action(t, config):
        auditor = _admin_auditor(t, config, "check-all")
        await auditor.trigger_check_all()
        return await auditor.current_auditor()

    current = _run(args, action)
    print("check of all ledgers requested: " + (f"the auditor {current} runs it at its next turn" if current
                                                else "no auditor runs now; the next one elected runs it"))
    return 0


def _check_all_here(args) -> int:
    from bksim.autorecovery import admin

    from bksim.cli.progress import Progress

    with Progress("check of all ledgers", unit="ledgers", json=args.json) as status:
        def checked(done: int, total: int) -> None:
            status.set_total(total)
            status.update(done)

        report = _run(args, lambda t, c: admin.check_all(_admin_auditor(t, c, "check-all"), args.verify_percentage,
                                                         on_checked=checked))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    if report["disabled"]:
        print("autorecovery is disabled (`bksim autorecovery enable`): nothing was checked or marked")
        return 0
    print(f"check of all ledgers (verifying {report['verify_percentage']}% of the entries): {report['ledgers']} "
          f"ledgers, {report['checked']} closed ones checked, {report['copies_verified']} copies verified, "
          f"{report['copies_unjudged']} not judged; {len(report['marked'])} marked under-replicated")
    for ledger_id, missing in report["marked"].items():
        damaged = report["damaged"].get(ledger_id, {})
        print(f"  ledger {ledger_id}: " + ", ".join(
            f"{bookie} misses {count}" + (f" ({damaged[bookie]} damaged)" if bookie in damaged else "")
            for bookie, count in missing.items()))
    for ledger_id, bookies in report["unreachable"].items():
        print(f"  ledger {ledger_id}: no answer from {', '.join(bookies)} (left to the bookie check)")
    for error in report["errors"]:
        print(f"  error: {error}")
    return 0


# -- bookie decommission, ledger replicas (registered by bookie_cmd and ledger_cmd) -------------------------

def cmd_decommission(args) -> int:
    from bksim.autorecovery import admin

    def progress(line: str) -> None:
        print(f"decommission {args.bookie_id}: {line}", flush=True)

    async def action(t, config):
        return await admin.decommission(t["store"], t["marks"], _admin_auditor(t, config, "decommission"),
                                        t["clock"], args.bookie_id, timeout_ms=args.timeout_s * 1000,
                                        progress=progress)

    from bksim.cli.progress import Progress

    with Progress(f"decommission {args.bookie_id}", json=args.json, ticking=True) as status:
        status.phase("waiting until no ledger names it")  # under its progress lines: a spinner and the seconds
        done = _run(args, action)
    if args.json:
        print(json.dumps(done, sort_keys=True))
    return 0


def cmd_replicas(args) -> int:
    from bksim.autorecovery import admin

    doc = _run(args, lambda t, c: admin.replicas(t["store"], t["transport"], args.ledger_id))
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    last = doc["last_entry_id"]
    print(f"ledger {doc['ledger_id']}: {doc['state']} E={doc['ensemble_size']} Qw={doc['write_quorum_size']} "
          f"Qa={doc['ack_quorum_size']} last entry {last}")
    for s in doc["segments"]:
        end = "open" if s["last_entry_id"] is None else s["last_entry_id"]
        print(f"segment from entry {s['first_entry_id']} to {end}")
        print(f"  {'BOOKIE':<24} {'STATUS':<14} {'HOLDS':>7} {'SHOULD':>7} {'MISSING':>7}  RANGES")
        for r in s["replicas"]:
            ranges = "-" if r["holds"] is None else _ranges(r["holds"])
            print(f"  {r['bookie']:<24} {r['status']:<14} {_n(r['holds_count']):>7} {_n(r['should_hold']):>7} "
                  f"{_n(r['missing']):>7}  {ranges}")
    return 0


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def _ranges(ranges: list[list[int]], shown_max: int = 6) -> str:
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in ranges[:shown_max])
    return (text or "none") + (f", ... ({len(ranges)} ranges)" if len(ranges) > shown_max else "")
