"""The bookie's identity cookie (PROTOCOL.md §2, "Identity (cookie)"): what it holds and when it agrees.

A cookie names the bookie, the cluster instance it belongs to and its directories. On first start the
bookie writes the same cookie into its journal directory, its ledger directory (file ``COOKIE``) and
into ZooKeeper (``/ledgers/cookies/<bookie id>``). On every start all copies MUST agree with each other
and with the configuration; otherwise the bookie refuses to start, because a bookie whose directories
were wiped, swapped or moved would answer NO_ENTRY for entries it acknowledged ("unknown is never no").

Pure: this module decides; the CLI reads the files and ZooKeeper and writes new cookies. Writing order
for a new bookie (the CLI's job): directory cookies first (atomically), then ZooKeeper. A crash between
the two leaves directories holding only the expected cookie and no data; `verify` treats that as an
unfinished first start ("new"), which is safe because a bookie serves nothing before both are written.

Incarnation. A cookie also carries `incarnation` (1 for a bookie's first start; a cookie written before the
field existed reads as 1). `bksim bookie format` (the operator's re-initialisation: directories emptied,
ZooKeeper's cookie deleted) writes a cookie with the next incarnation into the emptied directories, so the
bookie that starts on them is a new bookie with the same id and records that incarnation in ZooKeeper
(`cookie_to_write`). All copies must agree on it: a directory of an earlier incarnation (restored from a
backup) or a re-initialised directory facing the old incarnation's ZooKeeper cookie is refused like a swapped
one. The audit reads it from the directory cookies: a bookie of incarnation > 1 lost what its earlier
incarnations held (audit/inputs.py). The count covers re-initialisations done through `bksim bookie format`;
a bookie whose cookie was deleted by hand starts again at 1.

Limbo. A re-initialised bookie must not deny what its earlier incarnations held ("unknown is never no",
PROTOCOL.md §2.1): with Qw = Qa one NO_ENTRY proves an entry absent, so a formatted bookie's "no" would let a
recovery close a ledger below acknowledged entries. `bksim bookie format` therefore records in the cookie
`limbo_ledger_id_max`: an id it draws from the ledger-id generator (/ledgers/idgen) at format time. The
generator never hands out an id twice, so every ledger that existed before the format has a smaller id, and
every ledger created after it a larger one. The bookie answers UNKNOWN_STATE, never NO_LEDGER / NO_ENTRY, for
what it lacks of a ledger whose id is <= the bound (BookKeeper's limbo state); a ledger above the bound answers
normally. Limbo lasts as long as the incarnation: nothing in bksim re-replicates a formatted bookie's lost
copies yet, so nothing could prove that it holds everything again. A first incarnation has nothing in limbo
(-1); a re-initialised cookie written before the field existed reads as "every ledger" (`LIMBO_EVERY_LEDGER`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Literal, Mapping

from bksim.model.errors import CookieError

COOKIE_FILE = "COOKIE"
COOKIE_VERSION = 1
FIRST_INCARNATION = 1
NO_LIMBO = -1  # limbo_ledger_id_max of a bookie that was never re-initialised: no ledger is in limbo
LIMBO_EVERY_LEDGER = 2**63 - 1  # the largest ledger id: a re-initialised cookie that does not say its bound

Verdict = Literal["new", "ok"]


@dataclass(frozen=True, slots=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dir: str
    ledger_dir: str
    version: int = COOKIE_VERSION
    incarnation: int = FIRST_INCARNATION  # 1, then one more per `bksim bookie format` (module docstring)
    limbo_ledger_id_max: int = NO_LIMBO  # ledgers with ids <= this may predate the format (module docstring)

    def __post_init__(self) -> None:
        if not self.bookie_id:
            raise CookieError("a cookie needs a bookie id")
        if not self.instance_id:
            raise CookieError(f"cookie of bookie {self.bookie_id}: empty instance id")
        if not self.journal_dir or not self.ledger_dir:
            raise CookieError(f"cookie of bookie {self.bookie_id}: empty directory name")
        if type(self.incarnation) is not int or self.incarnation < FIRST_INCARNATION:
            raise CookieError(f"cookie of bookie {self.bookie_id}: incarnation {self.incarnation!r} is not an "
                              f"integer >= {FIRST_INCARNATION}")
        if type(self.limbo_ledger_id_max) is not int or not NO_LIMBO <= self.limbo_ledger_id_max <= LIMBO_EVERY_LEDGER:
            raise CookieError(f"cookie of bookie {self.bookie_id}: limbo_ledger_id_max {self.limbo_ledger_id_max!r} "
                              f"is not an integer in [{NO_LIMBO}, {LIMBO_EVERY_LEDGER}]")
        if self.incarnation == FIRST_INCARNATION and self.limbo_ledger_id_max != NO_LIMBO:
            raise CookieError(f"cookie of bookie {self.bookie_id}: a first incarnation has nothing in limbo, but "
                              f"limbo_ledger_id_max is {self.limbo_ledger_id_max}")

    def in_limbo(self, ledger_id: int) -> bool:
        """Whether the bookie cannot tell if an earlier incarnation held `ledger_id` (module docstring)."""
        return ledger_id <= self.limbo_ledger_id_max


def encode(cookie: Cookie) -> bytes:
    return json.dumps(asdict(cookie), sort_keys=True).encode()


def decode(data: bytes, source: str = "cookie") -> Cookie:
    """Parse cookie bytes; CookieError (naming `source`) if they are not a cookie of a known version."""
    try:
        raw = json.loads(data.decode())
    except ValueError as e:  # not UTF-8, not JSON, or an integer of more digits than Python converts
        raise CookieError(f"{source} is not a valid cookie ({e}); refusing to start with unknown identity") from None
    except RecursionError:
        raise CookieError(f"{source} is not a valid cookie (JSON nested too deeply); refusing to start with unknown "
                          f"identity") from None
    if not isinstance(raw, dict):
        raise CookieError(f"{source} is not a valid cookie (not a JSON object)")
    version = raw.get("version")
    if version != COOKIE_VERSION:
        raise CookieError(f"{source} has cookie version {version!r}; this bksim understands version {COOKIE_VERSION}")
    incarnation = raw.get("incarnation", FIRST_INCARNATION)
    unsaid = LIMBO_EVERY_LEDGER if incarnation != FIRST_INCARNATION else NO_LIMBO
    try:
        return Cookie(bookie_id=str(raw["bookie_id"]), instance_id=str(raw["instance_id"]),
                      journal_dir=str(raw["journal_dir"]), ledger_dir=str(raw["ledger_dir"]), version=version,
                      incarnation=incarnation, limbo_ledger_id_max=raw.get("limbo_ledger_id_max", unsaid))
    except KeyError as e:
        raise CookieError(f"{source} is not a valid cookie (field {e.args[0]!r} missing)") from None
    except CookieError as e:
        raise CookieError(f"{source} is not a valid cookie: {e}") from None


def cookie_path(directory: str) -> str:
    return os.path.join(directory, COOKIE_FILE)


def verify(bookie_id: str, instance_id: str, dirs: tuple[str, str], zk_cookie: Cookie | None,
           dir_cookies: Mapping[str, Cookie | None], dir_has_data: Mapping[str, bool]) -> Verdict:
    """Decide whether a bookie may start.

    `dirs` = (journal_dir, ledger_dir) as configured (absolute paths; they may be the same directory);
    `zk_cookie` = the cookie stored in ZooKeeper for `bookie_id` (None if absent); `dir_cookies[d]` =
    the COOKIE found in directory d (None if absent); `dir_has_data[d]` = d holds anything besides its
    COOKIE. Returns "new" (write the cookies, then start) or "ok"; raises CookieError saying why not.
    """
    journal_dir, ledger_dir = dirs
    expected = Cookie(bookie_id, instance_id, journal_dir, ledger_dir)
    unique_dirs = list(dict.fromkeys(dirs))
    role = {ledger_dir: "ledger directory", journal_dir: "journal directory"}

    if zk_cookie is not None:
        _check_zk_cookie(zk_cookie, bookie_id, instance_id)
    # identity first (the most specific diagnosis: another bookie's or another cluster's directory), then paths
    for check in (_check_dir_identity, _check_dir_paths):
        for d in unique_dirs:
            found = dir_cookies.get(d)
            if found is not None:
                check(expected, found, d, role[d])

    _check_dir_incarnations(dir_cookies, unique_dirs, role, bookie_id)

    if zk_cookie is None:
        with_cookie = [d for d in unique_dirs if dir_cookies.get(d) is not None]
        with_data = [d for d in unique_dirs if dir_has_data.get(d, False)]
        if with_cookie and with_data:
            raise CookieError(
                f"ZooKeeper has no cookie for bookie {bookie_id} (instance {instance_id}) but "
                f"{role[with_cookie[0]]} {with_cookie[0]} has one and holds data: ZooKeeper lost the cookie "
                f"(or this bookie points at another ZooKeeper); refusing to start because the cluster no "
                f"longer records what this bookie stored. Restore /ledgers/cookies/{bookie_id}")
        if with_data:
            raise CookieError(
                f"{role[with_data[0]]} {with_data[0]} is not empty but has no cookie, and ZooKeeper has none "
                f"for bookie {bookie_id}: these are not this bookie's directories (or were written by "
                f"something else); refusing to start on unknown data. Use empty directories for a new bookie")
        return "new"

    for d in unique_dirs:
        if dir_cookies.get(d) is None:
            raise CookieError(
                f"{role[d]} {d} has no cookie but ZooKeeper has one for bookie {bookie_id}: the directory was "
                f"wiped or replaced; refusing to start because this bookie would answer NO_ENTRY for entries "
                f"it acknowledged")
    for d in unique_dirs:
        _check_incarnation_against_zk(dir_cookies[d], zk_cookie, d, role[d])
    if (zk_cookie.journal_dir, zk_cookie.ledger_dir) != (journal_dir, ledger_dir):
        raise CookieError(
            f"ZooKeeper's cookie for bookie {bookie_id} records journal_dir={zk_cookie.journal_dir} "
            f"ledger_dir={zk_cookie.ledger_dir}, but the configuration says journal_dir={journal_dir} "
            f"ledger_dir={ledger_dir}: the directories were moved or reconfigured; refusing to start")
    return "ok"


def cookie_to_write(bookie_id: str, instance_id: str, dirs: tuple[str, str],
                    dir_cookies: Mapping[str, Cookie | None]) -> Cookie:
    """The cookie a bookie writes when `verify` said "new": the one its directories already hold (written by
    `bksim bookie format` with the next incarnation, or by a first start that crashed before ZooKeeper), else
    a first-incarnation cookie. Call only after `verify`, which checked that the directory cookies agree."""
    found = [c for c in (dir_cookies.get(d) for d in dirs) if c is not None]
    if found:
        return found[0]
    return Cookie(bookie_id, instance_id, dirs[0], dirs[1])


def next_incarnation(known: list[Cookie | None]) -> int:
    """The incarnation a re-initialised bookie gets: one above every cookie still known of it (1 if none)."""
    return max((c.incarnation for c in known if c is not None), default=FIRST_INCARNATION - 1) + 1


def _check_dir_incarnations(dir_cookies: Mapping[str, Cookie | None], dirs: list[str], role: dict[str, str],
                            bookie_id: str) -> None:
    found = [(d, dir_cookies[d]) for d in dirs if dir_cookies.get(d) is not None]
    if len({(c.incarnation, c.limbo_ledger_id_max) for _, c in found}) > 1:
        (d1, c1), (d2, c2) = found[0], found[1]
        if c1.incarnation == c2.incarnation:
            raise CookieError(
                f"{role[d1]} {d1} and {role[d2]} {d2} hold cookies of incarnation {c1.incarnation} of bookie "
                f"{bookie_id} with different limbo_ledger_id_max ({c1.limbo_ledger_id_max}, {c2.limbo_ledger_id_max}):"
                f" a cookie was edited; refusing to start")
        raise CookieError(
            f"{role[d1]} {d1} holds the cookie of incarnation {c1.incarnation} of bookie {bookie_id}, but "
            f"{role[d2]} {d2} that of incarnation {c2.incarnation}: one directory was re-initialised (or "
            f"restored) and the other not; refusing to start on a mix of two bookies' data")


def _check_incarnation_against_zk(found: Cookie, zk_cookie: Cookie, d: str, role: str) -> None:
    if found.incarnation > zk_cookie.incarnation:
        raise CookieError(
            f"{role} {d} was re-initialised as incarnation {found.incarnation} of bookie {zk_cookie.bookie_id}, "
            f"but ZooKeeper still holds the cookie of incarnation {zk_cookie.incarnation}: the cluster still "
            f"counts on what the old incarnation stored; refusing to start. Delete /ledgers/cookies/"
            f"{zk_cookie.bookie_id} (bksim bookie format --delete-cookie) to start it as a new bookie")
    if found.incarnation == zk_cookie.incarnation and found.limbo_ledger_id_max != zk_cookie.limbo_ledger_id_max:
        raise CookieError(
            f"{role} {d} records limbo_ledger_id_max {found.limbo_ledger_id_max} for incarnation {found.incarnation} "
            f"of bookie {zk_cookie.bookie_id}, but ZooKeeper's cookie records {zk_cookie.limbo_ledger_id_max}: a "
            f"cookie was edited; refusing to start (the bound decides which ledgers this bookie may deny)")
    if found.incarnation < zk_cookie.incarnation:
        raise CookieError(
            f"{role} {d} holds the cookie of incarnation {found.incarnation} of bookie {zk_cookie.bookie_id}, but "
            f"ZooKeeper's cookie is of incarnation {zk_cookie.incarnation}: the directory belongs to an earlier "
            f"incarnation of this bookie (restored from a backup?); refusing to start because this bookie would "
            f"answer NO_ENTRY for entries its current incarnation acknowledged")


def _check_zk_cookie(zk_cookie: Cookie, bookie_id: str, instance_id: str) -> None:
    if zk_cookie.bookie_id != bookie_id:
        raise CookieError(f"ZooKeeper's cookie at /ledgers/cookies/{bookie_id} names bookie {zk_cookie.bookie_id}: "
                          f"the cookie znode was copied or edited; refusing to start")
    if zk_cookie.instance_id != instance_id:
        raise CookieError(
            f"ZooKeeper's cookie for bookie {bookie_id} belongs to cluster instance {zk_cookie.instance_id}, "
            f"but /ledgers/INSTANCEID is {instance_id}: the cluster metadata was re-created; refusing to start")


def _check_dir_identity(expected: Cookie, found: Cookie, d: str, role: str) -> None:
    if found.bookie_id != expected.bookie_id:
        raise CookieError(
            f"{role} {d} holds the cookie of bookie {found.bookie_id}, not of bookie {expected.bookie_id}: "
            f"directories were swapped or copied between bookies; refusing to start because this bookie "
            f"would serve another bookie's data and miss its own")
    if found.instance_id != expected.instance_id:
        raise CookieError(
            f"{role} {d} holds a cookie of cluster instance {found.instance_id}, but this cluster is "
            f"{expected.instance_id}: the directory comes from another cluster; refusing to start")


def _check_dir_paths(expected: Cookie, found: Cookie, d: str, role: str) -> None:
    if (found.journal_dir, found.ledger_dir) != (expected.journal_dir, expected.ledger_dir):
        raise CookieError(
            f"{role} {d} holds a cookie for journal_dir={found.journal_dir} ledger_dir={found.ledger_dir}, "
            f"but the configuration says journal_dir={expected.journal_dir} ledger_dir={expected.ledger_dir}: "
            f"directories were moved, swapped or reconfigured; refusing to start")
