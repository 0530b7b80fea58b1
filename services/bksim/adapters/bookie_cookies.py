"""The bookie's cookies on disk and in ZooKeeper, and `bksim bookie format` (the decisions are bookie/cookie.py's).

- `check_cookies`: at `bookie run`, read the COOKIE files of the journal and ledger directories and the cookie
  in ZooKeeper (/ledgers/cookies/<id>), let bookie.cookie.verify decide, and write the cookie of a new bookie
  (files first, each durably: temp file, fsync, rename, fsync of the directory; then ZooKeeper).
- `format_bookie`: the operator's re-initialisation of a bookie (BookKeeper's `bookkeeper shell bookieformat
  [-force] [-deleteCookie]`). Every refusal (BookieFormatError) happens before anything is changed: the bookie
  is registered (`/ledgers/available[/readonly]/<id>` exists: it runs, or a killed one's session has not expired
  yet); a directory holds another bookie's cookie; a directory (journal, ledger, journal archive) is not empty
  and `force` is not set. Then, in this order: the COOKIE files are removed from every directory, the
  directories are emptied (`force`; the directories themselves stay; a file system's lost+found is left
  alone), the ZooKeeper cookie is deleted (`delete_cookie`), and, when ZooKeeper then holds no cookie for the
  bookie, a cookie of the next incarnation is written into the journal and ledger directories, carrying the
  limbo bound: an id drawn from the ledger-id generator (/ledgers/idgen) just before it is written
  (bookie/cookie.py "Limbo"). A crash part-way leaves a state `run` refuses (directories wiped, ZooKeeper cookie
  kept) or starts from as a new bookie (nothing left): never one where the bookie serves with data it does not
  have.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Callable

from kazoo.exceptions import NoNodeError

from bksim.adapters import registration
from bksim.bookie import cookie as cookies
from bksim.metadata.paths import COOKIES, IDGEN_PREFIX, INSTANCEID, ledger_id_from_idgen_path
from bksim.model.config import BookieConfig, Config
from bksim.model.errors import BksimError


def check_cookies(client, b: BookieConfig, instance_id: str, log: Callable[[str], None]):
    """Read the cookies of both directories and ZooKeeper, decide (bookie.cookie.verify), write them if new.
    Returns the bookie's cookie (the directories' and ZooKeeper's, which agree)."""
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
                write_durably(cookies.cookie_path(d), cookies.encode(cookie))
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


def write_durably(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temp file in its directory, fsync it, rename, fsync the directory."""
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


def read_dir_cookie(directory: str):
    """(the cookie in `directory`, None) or (None, why it is unreadable); (None, None) when it has none."""
    path = cookies.cookie_path(directory)
    if not os.path.exists(path):
        return None, None
    with open(path, "rb") as f:
        data = f.read()
    try:
        return cookies.decode(data, source=path), None
    except BksimError as e:
        return None, str(e)


def format_bookie(client, config: Config, *, force: bool, delete_cookie: bool) -> dict:
    """Re-initialise the bookie `config` names (module docstring: refusals first, then the changes in order).

    `client` is a started kazoo client. Returns {"bookie_id", "directories": [{"role", "path", "files",
    "bytes", "removed"}], "cookie_deleted", "zookeeper_cookie_kept", "incarnation" and "limbo_ledger_id_max" (of
    the cookie written to the directories, or None), "notes", "lines" (the report for people)}; raises
    BookieFormatError (exit 2) when it refuses.
    """
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
        found, problem = read_dir_cookie(d.path)
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
            write_durably(cookies.cookie_path(directory), cookies.encode(cookie))
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
    created = client.retry(client.create, IDGEN_PREFIX, b"", ephemeral=True, sequence=True, makepath=True)
    try:
        client.retry(client.delete, created)
    except NoNodeError:
        pass  # maybe: the session ended in between and took the ephemeral node with it
    return ledger_id_from_idgen_path(created)
