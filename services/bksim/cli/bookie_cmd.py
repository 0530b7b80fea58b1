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
[-force] [-deleteCookie]`), with the same configuration as `run`. Every refusal (exit 2) happens before anything
is changed: the bookie is registered (`/ledgers/available[/readonly]/<id>` exists: it runs, or a killed one's
session has not expired yet); a directory holds another bookie's cookie (the configuration points at someone
else's data); a directory (journal, ledger, journal archive) is not empty and `--force` was not given. Then,
in this order: the COOKIE files are removed from every directory, the directories are emptied (`--force`; the
directories themselves stay; a file system's lost+found is left alone), the ZooKeeper cookie
is deleted (`--delete-cookie`), and, when ZooKeeper then holds no cookie for the bookie, a cookie of the next
incarnation (bookie/cookie.py) is written into the journal and ledger directories, so the next `bookie run`
starts a new bookie with the same id and records that incarnation in ZooKeeper. That cookie carries the limbo
bound: an id drawn from the ledger-id generator (/ledgers/idgen) just before it is written; every ledger that
existed before has a smaller id, and the new bookie answers UNKNOWN_STATE, never NO_LEDGER / NO_ENTRY, for what
it lacks of them (bookie/cookie.py "Limbo"). A crash part-way leaves a
state `run` refuses (directories wiped, ZooKeeper cookie kept) or starts from as a new bookie (nothing left):
never one where the bookie serves with data it does not have. Run it only while the bookie is stopped: the
registration check cannot see a bookie that is still starting.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
from datetime import datetime
from typing import Callable

from bksim.cli import config as cfgload
from bksim.model.config import BookieConfig, Config
from bksim.model.errors import BksimError, ConfigError

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
    return f"{config.zookeeper.host}:{config.zookeeper.port}"


# -- bookie run -----------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    config = resolve(cfgload.load(getattr(args, "config", None)))
    log = make_log(config.bookie.bookie_id)
    cfgload.print_effective(config, f"bookie {config.bookie.bookie_id}")
    return asyncio.run(_serve(config, log))


def check_cookies(client, b: BookieConfig, instance_id: str, log: Callable[[str], None]):
    """Read the cookies of both directories and ZooKeeper, decide (bookie.cookie.verify), write them if new.
    Returns the bookie's cookie (the directories' and ZooKeeper's, which agree)."""
    from bksim.adapters import registration
    from bksim.bookie import cookie as cookies

    dirs = (b.journal_dir, b.ledger_dir)
    found: dict[str, cookies.Cookie | None] = {}
    has_data: dict[str, bool] = {}
    for d in dict.fromkeys(dirs):
        os.makedirs(d, exist_ok=True)
        path = cookies.cookie_path(d)
        if os.path.exists(path):
            with open(path, "rb") as f:
                found[d] = cookies.decode(f.read(), source=path)
        else:
            found[d] = None
        has_data[d] = any(name not in (cookies.COOKIE_FILE, "lost+found") and not name.startswith(".COOKIE.")
                          for name in os.listdir(d))
    zk_cookie = registration.read_cookie(client, b.bookie_id)
    verdict = cookies.verify(b.bookie_id, instance_id, dirs, zk_cookie, found, has_data)
    if verdict == "new":
        cookie = cookies.cookie_to_write(b.bookie_id, instance_id, dirs, found)
        for d in dict.fromkeys(dirs):
            if found[d] is None:
                _write_durably(cookies.cookie_path(d), cookies.encode(cookie))
        registration.create_cookie(client, cookie)
        log(f"new bookie (incarnation {cookie.incarnation}): cookie written to {', '.join(dict.fromkeys(dirs))} "
            f"and /ledgers/cookies/{b.bookie_id}")
    else:
        cookie = zk_cookie
        log("cookie check passed: directories and ZooKeeper agree")
    if cookie.limbo_ledger_id_max >= 0:
        log(f"limbo: ledgers with ids <= {cookie.limbo_ledger_id_max} may predate this bookie's format; what it "
            f"lacks of them is answered UNKNOWN_STATE, never NO_LEDGER / NO_ENTRY")
    return cookie


def _write_durably(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".COOKIE.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _serve(config: Config, log: Callable[[str], None]) -> int:
    from bksim.adapters import registration
    from bksim.adapters.bookie_server import BookieServer
    from bksim.adapters.clock import SystemClock
    from bksim.adapters.localdisk import LocalDisk
    from bksim.adapters.rocks import open_rocks
    from bksim.bookie.engine import BookieEngine

    b = config.bookie
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    client = engine = server = reg = None
    try:
        connected = await _until_stopped(stop, asyncio.to_thread(
            registration.connect, zk_hosts(config), config.zookeeper.session_timeout_ms, ZK_CONNECT_TIMEOUT_S))
        if connected is _STOPPED:
            return 0
        client = connected
        instance_id = await asyncio.to_thread(registration.ensure_layout, client)
        log(f"ZooKeeper {zk_hosts(config)}: cluster instance {instance_id}")
        cookie = await asyncio.to_thread(check_cookies, client, b, instance_id, log)

        disk, clock = LocalDisk(), SystemClock()
        engine = BookieEngine(b, disk=disk, clock=clock, open_kv=open_rocks, instance_id=instance_id,
                              journal_dir=b.journal_dir, ledger_dir=b.ledger_dir, log=log,
                              limbo_ledger_id_max=cookie.limbo_ledger_id_max)
        if await _until_stopped(stop, engine.start()) is _STOPPED:
            return 0
        reg = registration.Registration(client, b.bookie_id, b.host, b.port,
                                        registration_wait_ms_max=3 * config.zookeeper.session_timeout_ms + 2_000,
                                        log=log)

        async def report_state(read_only: bool) -> None:
            await asyncio.to_thread(reg.switch_state, read_only)

        server = BookieServer(engine, b, b.bookie_id, disk=disk, clock=clock, journal_dir=b.journal_dir,
                              ledger_dir=b.ledger_dir, log=log, on_read_only_change=report_state)
        port = await server.start()
        log(f"gRPC server listening on {b.host}:{port} (health SERVING, reflection on)")
        if await _until_stopped(stop, asyncio.to_thread(reg.register, engine.read_only)) is _STOPPED:
            return 0
        log(f"serving ({engine.info()['state']})")
        await stop.wait()
        log("shutdown requested: draining")
        return 0
    finally:
        await _shutdown(config, log, client, engine, server, reg)


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


async def _shutdown(config: Config, log, client, engine, server, reg) -> None:
    """Stop in order: no new work, drain, checkpoint, deregister, close ZooKeeper. Each step bounded."""
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
    if reg is not None:
        try:
            await asyncio.to_thread(reg.deregister)
        except Exception as e:  # noqa: BLE001 - the session close below removes the ephemeral node anyway
            log(f"deregister failed: {type(e).__name__}: {e}")
        reg.close()
    if client is not None:
        await asyncio.to_thread(_close_zk, client)
        log("ZooKeeper session closed; bye")


def _close_zk(client) -> None:
    try:
        client.stop()
    finally:
        client.close()


# -- bookie format -------------------------------------------------------------------------------------

class BookieFormatError(BksimError):
    """`bksim bookie format` refused; nothing was changed."""


IGNORED_ENTRIES = ("lost+found",)  # a file system's own directory at a mount point: neither data nor deleted


@dataclasses.dataclass
class DirContents:
    role: str  # "journal directory" | "ledger directory" | "journal archive directory"
    path: str
    files: int = 0
    bytes: int = 0
    entries: list[str] = dataclasses.field(default_factory=list)  # top-level names (what gets deleted)

    def describe(self) -> str:
        return f"{self.files} file{'s' if self.files != 1 else ''}, {self.bytes:,} bytes"


def directory_contents(role: str, path: str) -> DirContents:
    """What `path` holds (recursively; missing = empty), without the file system's lost+found."""
    out = DirContents(role, path)
    if not os.path.isdir(path):
        return out
    for name in sorted(os.listdir(path)):
        if name in IGNORED_ENTRIES:
            continue
        out.entries.append(name)
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            for dirpath, _, filenames in os.walk(full):
                for f in filenames:
                    out.files += 1
                    out.bytes += _size_of(os.path.join(dirpath, f))
        else:
            out.files += 1
            out.bytes += _size_of(full)
    return out


def _size_of(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def empty_directory(contents: DirContents) -> None:
    """Delete what `contents` listed in its directory (the directory itself stays), then sync the directory."""
    import shutil

    for name in contents.entries:
        full = os.path.join(contents.path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        elif os.path.lexists(full):
            os.remove(full)
    _sync_dir(contents.path)


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bookie_directories(b: BookieConfig) -> list[tuple[str, str]]:
    """(role, path) of every directory `format` empties, each once."""
    dirs = [("journal directory", b.journal_dir), ("ledger directory", b.ledger_dir)]
    if b.journal_archive_dir:
        dirs.append(("journal archive directory", b.journal_archive_dir))
    seen: dict[str, str] = {}
    for role, path in dirs:
        seen.setdefault(path, role)
    return [(role, path) for path, role in seen.items()]


def _read_dir_cookie(directory: str):
    from bksim.bookie import cookie as cookies

    path = cookies.cookie_path(directory)
    if not os.path.exists(path):
        return None, None
    with open(path, "rb") as f:
        data = f.read()
    try:
        return cookies.decode(data, source=path), None
    except BksimError as e:
        return None, str(e)


def cmd_format(args) -> int:
    from bksim.adapters import registration

    config = resolve(cfgload.load(getattr(args, "config", None)))
    client = registration.connect(zk_hosts(config), config.zookeeper.session_timeout_ms, ZK_CONNECT_TIMEOUT_S)
    try:
        done = format_bookie(client, config, force=args.force, delete_cookie=args.delete_cookie)
    finally:
        _close_zk(client)
    if args.json:
        print(json.dumps(done, sort_keys=True))
    else:
        print("\n".join(done["lines"]))
    return 0


def format_bookie(client, config: Config, *, force: bool, delete_cookie: bool) -> dict:
    """Re-initialise the bookie `config` names (module docstring: refusals first, then the changes in order).

    `client` is a started kazoo client. Returns {"bookie_id", "directories": [{"role", "path", "files",
    "bytes", "removed"}], "cookie_deleted", "zookeeper_cookie_kept", "incarnation" and "limbo_ledger_id_max" (of
    the cookie written to the directories, or None), "notes", "lines" (the report for people)}; raises
    BookieFormatError (exit 2) when it refuses.
    """
    from kazoo.exceptions import NoNodeError

    from bksim.adapters import registration
    from bksim.bookie import cookie as cookies
    from bksim.metadata.paths import COOKIES, INSTANCEID

    b = config.bookie
    bookie_id = b.bookie_id
    for read_only in (False, True):
        path = registration.registration_path(bookie_id, read_only)
        stat = client.retry(client.exists, path)
        if stat is not None:
            doc = registration.read_registration(client, bookie_id, read_only) or {}
            raise BookieFormatError(
                f"bookie {bookie_id} is registered as running ({path}, pid {doc.get('pid', '?')}, session "
                f"{stat.ephemeralOwner:#x}): stop it before formatting. A bookie killed with kill -9 stays "
                f"registered until its ZooKeeper session expires (zookeeper.session_timeout_ms = "
                f"{config.zookeeper.session_timeout_ms} ms); try again then")

    dirs = [directory_contents(role, path) for role, path in bookie_directories(b)]
    known: list = []
    notes: list[str] = []
    for d in dirs:
        found, problem = _read_dir_cookie(d.path)
        if problem:
            notes.append(f"{d.role} {d.path}: unreadable COOKIE ignored ({problem})")
        if found is not None and found.bookie_id != bookie_id:
            raise BookieFormatError(
                f"{d.role} {d.path} holds the cookie of bookie {found.bookie_id}, not of bookie {bookie_id}: the "
                f"configuration points at another bookie's directory; refusing to format it")
        known.append(found)
    full = [d for d in dirs if d.entries]
    if full and not force:
        listing = "; ".join(f"{d.role} {d.path} holds {d.describe()}" for d in full)
        raise BookieFormatError(f"{listing}: `bksim bookie format` deletes them only with --force (what this bookie "
                                f"stored is then gone from it; the audit reports the entries that lose a copy)")
    cookie_path = f"{COOKIES}/{bookie_id}"
    try:
        zk_cookie = registration.read_cookie(client, bookie_id)
    except BksimError as e:
        zk_cookie = None
        notes.append(f"ZooKeeper {cookie_path}: unreadable cookie ({e})")
    zk_cookie_exists = client.retry(client.exists, cookie_path) is not None
    known.append(zk_cookie)
    incarnation = cookies.next_incarnation(known)

    lines = [f"bookie {bookie_id}: format"]
    rows = []
    for d in dirs:  # the cookies go first, from every directory: a crash part-way leaves no cookie beside data
        if cookies.COOKIE_FILE in d.entries:
            os.remove(cookies.cookie_path(d.path))
            _sync_dir(d.path)
    for d in dirs:
        removed = bool(d.entries)
        if removed:
            empty_directory(d)
            lines.append(f"{d.role} {d.path}: removed {d.describe()}")
        else:
            lines.append(f"{d.role} {d.path}: already empty")
        rows.append({"role": d.role, "path": d.path, "files": d.files, "bytes": d.bytes, "removed": removed})

    cookie_deleted = False
    if delete_cookie and zk_cookie_exists:
        try:
            client.retry(client.delete, cookie_path)
        except NoNodeError:
            pass  # maybe: deleted meanwhile by someone else: the outcome is the same
        cookie_deleted = True
        was = f" (incarnation {zk_cookie.incarnation})" if zk_cookie is not None else ""
        lines.append(f"ZooKeeper: deleted {cookie_path}{was}")
    elif not zk_cookie_exists:
        lines.append(f"ZooKeeper: no cookie at {cookie_path}")

    written = limbo = None
    remaining = zk_cookie_exists and not cookie_deleted
    instance = None
    try:
        data, _ = client.retry(client.get, INSTANCEID)
        instance = data.decode().strip() or None
    except NoNodeError:
        pass
    if remaining:
        lines.append(f"ZooKeeper still holds {cookie_path}: `bksim bookie run` will refuse to start this bookie (its "
                     f"directories no longer match it); pass --delete-cookie to start it as a new bookie")
    elif instance is None:
        lines.append(f"ZooKeeper has no {INSTANCEID}: the first `bksim bookie run` starts this bookie afresh")
    else:
        limbo = draw_ledger_id(client)
        cookie = cookies.Cookie(bookie_id, instance, b.journal_dir, b.ledger_dir, incarnation=incarnation,
                                limbo_ledger_id_max=limbo)
        for directory in dict.fromkeys((b.journal_dir, b.ledger_dir)):
            os.makedirs(directory, exist_ok=True)
            _write_durably(cookies.cookie_path(directory), cookies.encode(cookie))
        written = incarnation
        lines.append(f"wrote COOKIE (incarnation {incarnation}) to {', '.join(dict.fromkeys((b.journal_dir, b.ledger_dir)))}: "
                     f"the next `bksim bookie run` starts bookie {bookie_id} as a new bookie; what its earlier "
                     f"incarnation stored is gone (`bksim audit` reports the entries that lost that copy)")
        lines.append(f"limbo: ledgers with ids <= {limbo} (the ledger-id generator now) may predate this format: "
                     f"the new bookie answers UNKNOWN_STATE, never NO_LEDGER / NO_ENTRY, for what it lacks of them")
    lines += [f"note: {n}" for n in notes]
    return {"bookie_id": bookie_id, "directories": rows, "cookie_deleted": cookie_deleted,
            "zookeeper_cookie_kept": remaining, "incarnation": written,
            "limbo_ledger_id_max": limbo,
            "notes": notes, "lines": lines}


def draw_ledger_id(client) -> int:
    """An id drawn from the ledger-id generator, as `metadata.ledger_manager.allocate_ledger_id` draws one (an
    ephemeral-sequential node, created and deleted): above every ledger id handed out before, below every one
    handed out after. The id itself is never used for a ledger."""
    from kazoo.exceptions import NoNodeError

    from bksim.metadata.paths import IDGEN_PREFIX, ledger_id_from_idgen_path

    created = client.retry(client.create, IDGEN_PREFIX, b"", ephemeral=True, sequence=True, makepath=True)
    try:
        client.retry(client.delete, created)
    except NoNodeError:
        pass  # maybe: the session ended in between and took the ephemeral node with it
    return ledger_id_from_idgen_path(created)


# -- bookie list ----------------------------------------------------------------------------------------

def cmd_list(args) -> int:
    from bksim.adapters import registration

    config = cfgload.load(getattr(args, "config", None))
    client = registration.connect(zk_hosts(config), config.zookeeper.session_timeout_ms, ZK_CONNECT_TIMEOUT_S)
    try:
        names = registration.list_bookies(client)
        rows = {kind: [dict(registration.read_registration(client, bookie_id, kind == "readonly")
                            or {"bookie_id": bookie_id}, bookie_id=bookie_id) for bookie_id in ids]
                for kind, ids in names.items()}
    finally:
        _close_zk(client)
    asyncio.run(_fill_info([r for kind in rows.values() for r in kind]))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        print(format_table(rows))
    return 0


async def _fill_info(rows: list[dict]) -> None:
    from bksim.adapters.bookie_client import BookieClient, BookieUnavailable

    async def one(row: dict) -> None:
        host, port = row.get("host"), row.get("port")
        if not host or not port:
            row["info"], row["error"] = None, "registration has no address"
            return
        async with BookieClient(f"{host}:{port}", deadline_s=LIST_INFO_DEADLINE_S) as client:
            try:
                row["info"], row["error"] = await client.info(), None
            except BookieUnavailable as e:
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
