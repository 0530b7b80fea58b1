"""`bksim bookie run`, `bksim bookie format` and `bksim bookie list`: the bookie's composition root.

`run` wires the real adapters together and owns the bookie's life cycle:

    load config -> resolve defaults (bookie id, directories) -> print effective config
    -> connect ZooKeeper -> ensure /ledgers layout + INSTANCEID -> cookie check (refuse: exit 2, says why)
    -> BookieEngine.start() (journal replay, checkpoint) -> gRPC server -> register in ZooKeeper
    -> serve until SIGTERM/SIGINT
    -> health NOT_SERVING, stop reading adds, drain accepted ones (shutdown_grace_ms)
    -> engine.close() (drain journal, checkpoint) -> deregister -> close ZooKeeper session

Log lines go to stderr: "<ISO time> bookie <id> <message>".

`format` is the operator's re-initialisation of a bookie (BookKeeper's `bookkeeper shell bookieformat
[-force] [-deleteCookie]`), with the same configuration as `run`: adapters.bookie_cookies.format_bookie (its
refusals exit 2, before anything is changed). The next `bookie run` then starts a new bookie with the same id
and records that incarnation in ZooKeeper. Run it only while the bookie is stopped: the registration check
cannot see a bookie that is still starting.

`gc` and `gc-status` are operator calls to a running bookie's BookieAdmin service (adapters/bookie_admin.py;
BookKeeper's `/api/v1/bookie/gc`): run a garbage collection round now and print what it freed, or print the
collector's last rounds, totals, schedule and the live ratio of each entry log. The bookie is `--bookie HOST:PORT`,
else the configuration's bookie.host:bookie.port (the bookie `bookie run` starts with the same configuration; a
cluster's bookie i listens on cluster.bookie_port_base + i - 1). Exit codes: 0 done; 1 (`gc`) the round stopped
early (the metadata store did not answer: nothing was deleted after that point); 2 an operating error, on stderr:
the bookie did not answer, or refused (its gRPC code and reason: a bookie without garbage collection, too many
rounds asked at once, ...), or a malformed --bookie. With --json, `gc` prints one JSON object (the round's report)
and `gc-status` one JSON object per line, each with a "kind": status (running, disk_full, totals, schedule,
entry_logs_total, message), last (one per kind of round that ran: {"report": ...}), entry_log (one per log).
On a terminal, without --json, `gc` shows a spinner and the round's seconds on stderr until its report comes
(cli/progress.py).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import sys
from datetime import datetime
from typing import Callable

from bksim.adapters.serving_process import settle_process
from bksim.cli import config as cfgload
from bksim.model.config import Config
from bksim.model.errors import BookieUnreachable, ConfigError

ZK_CONNECT_TIMEOUT_S = 15.0
LIST_INFO_DEADLINE_S = 1.0


def register(subparsers) -> None:
    bookie = subparsers.add_parser("bookie", help="run one bookie, or list the bookies registered in ZooKeeper")
    family = bookie.add_subparsers(dest="bookie_command", required=True)

    run = family.add_parser("run", help="run one bookie in the foreground until SIGTERM/SIGINT",
                            description="Run one bookie: journal replay, gRPC server, ZooKeeper registration. "
                                        "Options come from the TOML file and BKSIM_<SECTION>_<OPTION> variables.")
    run.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    run.set_defaults(func=cmd_run)

    fmt = family.add_parser(
        "format", help="re-initialise a stopped bookie: empty its directories, delete its cookie",
        description="Re-initialise this bookie (same configuration as `bookie run`), like BookKeeper's "
                    "`bookieformat`: refuses if the bookie is registered in ZooKeeper; deletes the contents of its "
                    "journal, ledger and journal archive directories (only with --force when they are not empty); "
                    "with --delete-cookie deletes /ledgers/cookies/<id>, so the next `bookie run` starts it as a "
                    "new bookie with the same id (the next cookie incarnation). What it held is gone: `bksim audit` "
                    "reports the entries that lost that copy.")
    fmt.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    fmt.add_argument("--force", action="store_true", help="delete the contents of non-empty directories")
    fmt.add_argument("--delete-cookie", action="store_true",
                     help="delete the bookie's cookie from ZooKeeper (needed to start it again as a new bookie)")
    fmt.add_argument("--json", action="store_true", help="print what was done as one JSON object")
    fmt.set_defaults(func=cmd_format)

    dec = family.add_parser(
        "decommission", help="remove a stopped bookie for good: re-replicate its ledgers, then delete its cookie",
        description="Decommission a stopped bookie (BookKeeper's `decommissionbookie`): refuses while it is "
                    "registered or when it has no cookie (exit 2, nothing changed); otherwise marks every ledger "
                    "that names it under-replicated, waits (printing progress) until the replication workers "
                    "have replaced it in every ledger and no mark lists it, and deletes its cookie.")
    dec.add_argument("bookie_id", metavar="ID", help="the bookie id (host:port)")
    dec.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    dec.add_argument("--timeout-s", type=float, default=600.0, metavar="S",
                     help="give up (exit 2, cookie kept) after this long (default 600)")
    dec.add_argument("--json", action="store_true", help="print what was done as one JSON object at the end")
    dec.set_defaults(func=_cmd_decommission)

    gc = family.add_parser(
        "gc", help="run garbage collection on a bookie now and print what it freed",
        description="Run one garbage collection round on a running bookie now (BookKeeper's /api/v1/bookie/gc): "
                    "local ledgers whose metadata is gone are deleted, then entry logs with no live ledger; with "
                    "--minor or --major, sealed logs whose live ratio is below that threshold are compacted too. "
                    "Waits for a round already running, then runs its own. Prints the ledgers and logs deleted, "
                    "the logs compacted, the bytes freed and copied, and the duration. Exit 1 if the round "
                    "stopped early (nothing deleted after that point), 2 on an operating error.")
    kind = gc.add_mutually_exclusive_group()
    kind.add_argument("--minor", dest="kind", action="store_const", const="minor", default="gc",
                      help="also compact logs below bookie.minor_compaction_threshold (default 0.2)")
    kind.add_argument("--major", dest="kind", action="store_const", const="major",
                      help="also compact logs below bookie.major_compaction_threshold (default 0.5)")
    _admin_options(gc, "print the round's report as one JSON object")
    gc.add_argument("--timeout-s", type=float, default=600.0, metavar="S",
                    help="give up waiting after this long (default 600; the round still finishes on the bookie)")
    gc.set_defaults(func=cmd_gc)

    gcs = family.add_parser(
        "gc-status", help="a bookie's garbage collection: last rounds, totals, schedule, live ratio per entry log",
        description="Ask a running bookie for its garbage collector's state: whether a round is running, the "
                    "last round of each kind (gc, minor, major) since it started, the totals, the schedule (what "
                    "is due next) and, per entry log, its bytes, live bytes and live ratio (at most 1000 logs).")
    _admin_options(gcs, "one JSON object per line (kinds: status, last, entry_log)")
    gcs.set_defaults(func=cmd_gc_status)

    lst = family.add_parser("list", help="writable and read-only bookies registered in ZooKeeper")
    lst.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(func=cmd_list)


# -- configuration --------------------------------------------------------------------------------------

def resolve(config: Config) -> Config:
    """Fill in the bookie's derived defaults: bookie id = host:port; directories under the run dir (absolute)."""
    b = config.bookie
    if not b.bookie_id and b.port <= 0:
        raise ConfigError("bookie.port must be > 0 when bookie.bookie_id is empty (the id is <host>:<port>)")
    home = os.path.join(config.cluster.run_dir, f"bookie-{b.port}")
    b = dataclasses.replace(
        b,
        bookie_id=b.bookie_id or f"{b.host}:{b.port}",
        journal_dir=os.path.abspath(b.journal_dir or os.path.join(home, "journal")),
        ledger_dir=os.path.abspath(b.ledger_dir or os.path.join(home, "ledgers")),
        journal_archive_dir=os.path.abspath(b.journal_archive_dir) if b.journal_archive_dir else "",
    )
    return dataclasses.replace(config, bookie=b)


def make_log(bookie_id: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        stamp = datetime.now().astimezone().isoformat(timespec="milliseconds")
        sys.stderr.write(f"{stamp} bookie {bookie_id} {message}\n")
        sys.stderr.flush()
    return log


def zk_hosts(config: Config) -> str:
    from bksim.adapters.zk_client import client_hosts

    return client_hosts(config)


# -- bookie run -----------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    config = resolve(cfgload.load(getattr(args, "config", None)))
    log = make_log(config.bookie.bookie_id)
    cfgload.print_effective(config, f"bookie {config.bookie.bookie_id}")
    return asyncio.run(_serve(config, log))


async def _serve(config: Config, log: Callable[[str], None]) -> int:
    from bksim.adapters import bookie_cookies, registration
    from bksim.adapters.bookie_server import BookieServer
    from bksim.adapters.clock import SystemClock
    from bksim.adapters.localdisk import LocalDisk
    from bksim.adapters.rocks import index_opener
    from bksim.bookie.engine import BookieEngine

    b = config.bookie
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    client = engine = server = reg = autorecovery = http = None
    autorecovery_stop = asyncio.Event()
    try:
        connected = await _until_stopped(stop, asyncio.to_thread(
            registration.connect_config, config, ZK_CONNECT_TIMEOUT_S))
        if connected is _STOPPED:
            return 0
        client = connected
        instance_id = await asyncio.to_thread(registration.ensure_layout, client)
        log(f"ZooKeeper {zk_hosts(config)}: cluster instance {instance_id}")
        cookie = await asyncio.to_thread(bookie_cookies.check_cookies, client, b, instance_id, log)

        disk, clock = LocalDisk(), SystemClock()
        engine = BookieEngine(b, disk=disk, clock=clock, instance_id=instance_id,
                              open_kv=index_opener(b.index_write_buffer_bytes),
                              journal_dir=b.journal_dir, ledger_dir=b.ledger_dir, log=log,
                              limbo_ledger_id_max=cookie.limbo_ledger_id_max,
                              # bookies started together (a cluster coming up) and written the same entries (an
                              # ensemble) would checkpoint together, every interval and every time their write
                              # caches fill, stalling the same writes at once: each starts both cycles at a random
                              # point (its first periodic checkpoint, how full its first write-cache half gets)
                              first_checkpoint_ms=random.uniform(0.0, b.flush_interval_ms),
                              first_half_fraction=random.uniform(0.25, 1.0))
        if await _until_stopped(stop, engine.start()) is _STOPPED:
            return 0
        reg = registration.Registration(client, b.bookie_id, b.host, b.port,
                                        registration_wait_ms_max=3 * config.zookeeper.session_timeout_ms + 2_000,
                                        log=log)

        async def report_state(read_only: bool) -> None:
            await asyncio.to_thread(reg.switch_state, read_only)

        from bksim.adapters.bookie_gc import MetadataLedgerSource
        from bksim.adapters.zk_metadata import RenewingZkMetadataStore
        from bksim.bookie.gc import GarbageCollector

        gc_store = RenewingZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                           read_tries_max=config.zookeeper.read_tries_max)
        gc = GarbageCollector(engine, MetadataLedgerSource(gc_store, instance_id), b, clock, log)
        server = BookieServer(engine, b, b.bookie_id, disk=disk, clock=clock, journal_dir=b.journal_dir,
                              ledger_dir=b.ledger_dir, log=log, on_read_only_change=report_state, gc=gc,
                              security=config.security)
        port = await server.start()
        log(f"gRPC server listening on {b.host}:{port} (health SERVING, reflection on)")
        if b.http_port:
            from bksim.adapters.http_server import HttpServer, ProcessParts

            http = HttpServer(b.host, b.http_port, log)
            for routes in bookie_http_routes():
                http.add_routes(routes(ProcessParts("bookie", config, dict(
                    engine=engine, server=server, gc=gc, registration=reg, zk=client))))
            await http.start()
        if await _until_stopped(stop, asyncio.to_thread(reg.register, engine.read_only)) is _STOPPED:
            return 0
        log(f"serving ({engine.info()['state']})")
        settle_process()
        if config.autorecovery.enabled:
            from bksim.cli.autorecovery_cmd import run_daemon

            autorecovery = asyncio.create_task(run_daemon(config, b.bookie_id, autorecovery_stop, log))
        await stop.wait()
        log("shutdown requested: draining")
        return 0
    finally:
        autorecovery_stop.set()  # stops alongside the bookie's own steps; awaited (bounded) at their end
        if http is not None:
            await http.stop()
        await _shutdown(config, log, client, engine, server, reg, autorecovery)


def bookie_http_routes() -> list:
    """The features a bookie serves on its HTTP port: each a function of the process's ProcessParts that
    returns aiohttp routes (adapters/http_server.py)."""
    from bksim.adapters import http_bookie_admin
    from bksim.adapters.metrics import bookie_metrics_routes

    return [http_bookie_admin.routes, bookie_metrics_routes]


_STOPPED = object()


async def _until_stopped(stop: asyncio.Event, awaitable):
    """Await `awaitable` unless a stop signal comes first (then cancel it and return _STOPPED)."""
    work = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if work in done:
        return work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - we are stopping anyway
        pass
    return _STOPPED


async def _shutdown(config: Config, log, client, engine, server, reg, autorecovery=None) -> None:
    """Stop in order: no new work, drain, checkpoint, deregister, close ZooKeeper. Each step bounded (the
    ZooKeeper steps by the session timeout: a ZooKeeper that is gone must not keep the process alive). The
    autorecovery daemon (told to stop before this) closes its own session meanwhile; it is awaited before the
    bookie's session is closed, as long as its own bounded steps take, then cancelled."""
    from bksim.adapters import registration
    from bksim.cli.autorecovery_cmd import DAEMON_TASK_STOP_S

    b = config.bookie
    if server is not None:
        await server.stop(b.shutdown_grace_ms)
        log(f"gRPC server stopped ({server.statistics()})")
    if engine is not None:
        try:
            await engine.close()
            log("storage closed (journal drained, checkpoint written)")
        except Exception as e:  # noqa: BLE001 - keep shutting down; the journal replays what is missing
            log(f"storage close failed: {type(e).__name__}: {e}")
    zk_bound_s = config.zookeeper.session_timeout_ms / 1000
    if reg is not None:
        try:
            await registration.call_bounded(reg.deregister, zk_bound_s)
        except TimeoutError:
            log(f"deregister gave up after {zk_bound_s:.1f} s (ZooKeeper unreachable); the registration ends "
                f"with the session")
        except Exception as e:  # noqa: BLE001 - the session close below removes the ephemeral node anyway
            log(f"deregister failed: {type(e).__name__}: {e}")
        reg.close()
    if autorecovery is not None:
        _, pending = await asyncio.wait({autorecovery}, timeout=DAEMON_TASK_STOP_S + zk_bound_s)
        if pending:
            autorecovery.cancel()
            log("autorecovery did not stop within its bounds: cancelled")
        await asyncio.gather(autorecovery, return_exceptions=True)
    if client is not None:
        try:
            await registration.call_bounded(lambda: _close_zk(client), zk_bound_s)
            log("ZooKeeper session closed; bye")
        except TimeoutError:
            log(f"closing the ZooKeeper session gave up after {zk_bound_s:.1f} s; bye")


def _close_zk(client) -> None:
    try:
        client.stop()
    finally:
        client.close()


# -- bookie format -------------------------------------------------------------------------------------

def cmd_format(args) -> int:
    from bksim.adapters import registration
    from bksim.adapters.bookie_cookies import format_bookie

    config = resolve(cfgload.load(getattr(args, "config", None)))
    client = registration.connect_config(config, ZK_CONNECT_TIMEOUT_S)
    try:
        done = format_bookie(client, config, force=args.force, delete_cookie=args.delete_cookie)
    finally:
        _close_zk(client)
    if args.json:
        print(json.dumps(done, sort_keys=True))
    else:
        print("\n".join(done["lines"]))
    return 0


# -- bookie decommission --------------------------------------------------------------------------------

def _cmd_decommission(args) -> int:
    from bksim.cli.autorecovery_cmd import cmd_decommission

    return cmd_decommission(args)


# -- bookie gc, gc-status -------------------------------------------------------------------------------

GC_STATUS_DEADLINE_S = 5.0
IDS_SHOWN_MAX = 20  # ids printed per list in text mode (--json has every id the bookie sent)


def _admin_options(parser, json_help: str) -> None:
    parser.add_argument("--bookie", metavar="HOST:PORT",
                        help="the bookie to ask (default: bookie.host:bookie.port of the configuration)")
    parser.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    parser.add_argument("--json", action="store_true", help=json_help)


def bookie_address(args) -> str:
    """--bookie HOST:PORT, else the configuration's bookie.host:bookie.port; ConfigError when malformed."""
    if args.bookie is None:
        b = cfgload.load(getattr(args, "config", None)).bookie
        return f"{b.host}:{b.port}"
    host, colon, port = args.bookie.rpartition(":")
    if not (host and colon and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--bookie {args.bookie!r}: expected HOST:PORT with a port in 1..65535")
    return args.bookie


def client_tls(args):
    """The TLS of this command's channels from the configuration's security.* (None: plaintext)."""
    from bksim.security.tls import channel_security

    return channel_security(cfgload.load(getattr(args, "config", None)).security)


async def _ask(address: str, call, tls=None):
    from bksim.adapters.bookie_client import BookieClient

    async with BookieClient(address, tls=tls) as client:
        try:
            return await call(client)
        except BookieUnreachable as e:
            raise BookieUnreachable(address, f"{e.why} (is the bookie running? --bookie HOST:PORT names another)",
                                    code=e.code) from None


def cmd_gc(args) -> int:
    from bksim.cli.progress import Progress

    address = bookie_address(args)
    with Progress(f"bookie {address}: garbage collection ({args.kind})", json=args.json, ticking=True) as status:
        status.phase("round running")  # one call: a spinner and its seconds until the report comes
        report = asyncio.run(_ask(address, lambda c: c.run_gc(args.kind, deadline_s=args.timeout_s),
                                  client_tls(args)))
    if args.json:
        print(json.dumps({"bookie": address, **report}, sort_keys=True))
    else:
        print("\n".join(format_gc_report(address, report)))
    return 1 if report["error"] else 0


def format_gc_report(address: str, r: dict) -> list[str]:
    done = (f"STOPPED EARLY after {r['duration_ms']:.0f} ms: {r['error']} (nothing was deleted after that point)"
            if r["error"] else f"done in {r['duration_ms']:.0f} ms")
    return [f"bookie {address}: garbage collection ({r['kind']}) {done}",
            f"  ledgers deleted:      {_ids(r['ledgers_deleted'], r['ledgers_deleted_count'])}",
            f"  entry logs deleted:   {_ids(r['logs_deleted'], r['logs_deleted_count'])}",
            f"  entry logs compacted: {_ids(r['logs_compacted'], r['logs_compacted_count'])}",
            f"  bytes freed:          {r['bytes_freed']} ({_size(r['bytes_freed'])})",
            f"  bytes copied:         {r['bytes_copied']} ({_size(r['bytes_copied'])}, {r['entries_copied']} entries)",
            f"  candidates:           {r['candidates']} local ledgers absent from the metadata, "
            f"{r['kept_by_verify']} kept (found when re-read)"]


def _ids(ids: list[int], count: int) -> str:
    if not count:
        return "0"
    shown = ", ".join(str(i) for i in ids[:IDS_SHOWN_MAX])
    return f"{count} ({shown}{', ...' if count > min(len(ids), IDS_SHOWN_MAX) else ''})"


def cmd_gc_status(args) -> int:
    address = bookie_address(args)
    status = asyncio.run(_ask(address, lambda c: c.gc_status(deadline_s=GC_STATUS_DEADLINE_S), client_tls(args)))
    if args.json:
        head = {k: v for k, v in status.items() if k not in ("last", "entry_logs")}
        print(json.dumps({"kind": "status", "bookie": address, **head}, sort_keys=True))
        for report in status["last"]:
            print(json.dumps({"kind": "last", "report": report}, sort_keys=True))
        for log in status["entry_logs"]:
            print(json.dumps({"kind": "entry_log", **log}, sort_keys=True))
    else:
        print("\n".join(format_gc_status(address, status)))
    return 0


def format_gc_status(address: str, st: dict) -> list[str]:
    s, t = st["schedule"], st["totals"]

    def compaction(name: str, threshold: float, interval_ms: int, next_ms: float) -> str:
        if threshold <= 0:
            return f"  {name} compaction: off"
        return (f"  {name} compaction: logs below {threshold:g} live, every {_duration(interval_ms)}, "
                f"next in {_duration(next_ms)}")

    lines = [f"bookie {address}: garbage collection {'RUNNING' if st['running'] else 'idle'}"
             + (", disk full (read-only: every round compacts at the major threshold)" if st["disk_full"] else ""),
             f"schedule: a round every {_duration(s['gc_wait_time_ms'])} (gc_wait_time_ms={s['gc_wait_time_ms']}), "
             f"metadata re-read before deleting: {'on' if s['gc_verify_metadata'] else 'off'}, compaction rate "
             + (f"{_size(s['compaction_rate_bytes_per_s'])}/s" if s["compaction_rate_bytes_per_s"] else "unlimited"),
             compaction("minor", s["minor_compaction_threshold"], s["minor_compaction_interval_ms"],
                        s["next_minor_in_ms"]),
             compaction("major", s["major_compaction_threshold"], s["major_compaction_interval_ms"],
                        s["next_major_in_ms"]),
             f"totals since start: {t['rounds']} rounds ({t['rounds_failed']} stopped early), {t['ledgers_deleted']} "
             f"ledgers deleted, {t['logs_deleted']} entry logs deleted, {t['logs_compacted']} compacted, "
             f"{_size(t['bytes_freed'])} freed, {_size(t['bytes_copied'])} copied ({t['entries_copied']} entries), "
             f"compaction throttled {t['compaction_throttled_ms']:.0f} ms"]
    last = {r["kind"]: r for r in st["last"]}
    for kind in ("gc", "minor", "major"):
        r = last.get(kind)
        if r is None:
            lines.append(f"last {kind}: none since the bookie started")
            continue
        when = datetime.fromtimestamp(r["started_ms"] / 1000).astimezone().isoformat(timespec="seconds")
        outcome = f"stopped early: {r['error']}" if r["error"] else (
            f"{r['ledgers_deleted_count']} ledgers deleted, {r['logs_deleted_count']} entry logs deleted, "
            f"{r['logs_compacted_count']} compacted, {_size(r['bytes_freed'])} freed")
        lines.append(f"last {kind}: {when}, {r['duration_ms']:.0f} ms: {outcome}")
    lines.append(f"entry logs: {st['entry_logs_total']} (the sealed logs the last round recorded, and the log being "
                 f"written; live = ledgers still in the bookie's index)")
    if st["entry_logs"]:
        lines.append(f"  {'LOG':>12} {'BYTES':>12} {'LIVE BYTES':>12} {'LIVE':>7} {'LEDGERS':>8} {'LIVE':>5}")
        for g in st["entry_logs"]:
            name = f"{g['log_id']:x}.log"
            lines.append(f"  {name:>12} {g['bytes']:>12} {g['live_bytes']:>12} {100.0 * g['live_ratio']:>6.1f}% "
                         f"{g['ledgers']:>8} {g['live_ledgers']:>5}" + ("  (being written)" if g["current"] else ""))
    if st["message"]:
        lines.append(f"  {st['message']}")
    return lines


def _duration(ms: float) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:.1f} {unit}".replace(".0 ", " ")
    return f"{ms:.0f} ms"


# -- bookie list ----------------------------------------------------------------------------------------

def cmd_list(args) -> int:
    from bksim.adapters import registration

    config = cfgload.load(getattr(args, "config", None))
    client = registration.connect_config(config, ZK_CONNECT_TIMEOUT_S)
    try:
        names = registration.list_bookies(client)
        rows = {kind: [dict(registration.read_registration(client, bookie_id, kind == "readonly")
                            or {"bookie_id": bookie_id}, bookie_id=bookie_id) for bookie_id in ids]
                for kind, ids in names.items()}
    finally:
        _close_zk(client)
    from bksim.security.tls import channel_security

    asyncio.run(_fill_info([r for kind in rows.values() for r in kind], channel_security(config.security)))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        print(format_table(rows))
    return 0


async def _fill_info(rows: list[dict], tls=None) -> None:
    from bksim.adapters.bookie_client import BookieClient

    async def one(row: dict) -> None:
        host, port = row.get("host"), row.get("port")
        if not host or not port:
            row["info"], row["error"] = None, "registration has no address"
            return
        async with BookieClient(f"{host}:{port}", deadline_s=LIST_INFO_DEADLINE_S, tls=tls) as client:
            try:
                row["info"], row["error"] = await client.info(), None
            except BookieUnreachable as e:
                row["info"], row["error"] = None, str(e)

    await asyncio.gather(*(one(r) for r in rows))


def format_table(rows: dict[str, list[dict]]) -> str:
    lines = [f"{'BOOKIE':<24} {'LIST':<9} {'STATE':<10} {'USED':>6} {'FREE':>10} {'TOTAL':>10}  INSTANCE"]
    for kind in ("writable", "readonly"):
        for r in rows.get(kind, []):
            info = r.get("info")
            if info:
                total, free = info["total_bytes"], info["free_bytes"]
                used = f"{100.0 * (total - free) / total:.1f}%" if total else "-"
                lines.append(f"{r['bookie_id']:<24} {kind:<9} {info['state']:<10} {used:>6} {_size(free):>10} "
                             f"{_size(total):>10}  {info['instance_id']}")
            else:
                lines.append(f"{r['bookie_id']:<24} {kind:<9} {'?':<10} {'-':>6} {'-':>10} {'-':>10}  "
                             f"(unreachable: {r.get('error')})")
    counts = {kind: len(rows.get(kind, [])) for kind in ("writable", "readonly")}
    lines.append(f"{counts['writable']} writable, {counts['readonly']} read-only")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
