"""A bookie's presence in ZooKeeper (PROTOCOL.md §3), through kazoo.

Owns: the layout a bookie needs (`/ledgers`, `/ledgers/available`, `/ledgers/available/readonly`,
`/ledgers/cookies`), the cluster's `/ledgers/INSTANCEID` (created with a uuid4 by the first bookie, read by
every later one; race-safe), the bookie's cookie znode `/ledgers/cookies/<bookie id>` (created once,
never overwritten), and its ephemeral registration `/ledgers/available/<bookie id>` or
`/ledgers/available/readonly/<bookie id>` with data {"bookie_id", "host", "port", "state", "pid"} (the pid
lets `bksim cluster up` tell a restarted bookie's node from its dead predecessor's).

Invariants:
- At most one registration node of this bookie exists when calls return; `switch_state` creates the new
  node and deletes the old one in one ZooKeeper transaction, so no reader ever sees the bookie in both
  lists or in neither (when the new path is still held by a previous incarnation's session, it waits that
  out, then creates the new node before deleting the old one).
- A registration node left by a previous incarnation (kill -9: its session is still alive on the server
  until it expires) is waited out, never deleted: deleting it could hide a second process running with
  the same bookie id. The wait is bounded by `registration_wait_ms_max`.
- After a session expiry kazoo reconnects with a new session; the state listener only schedules a
  re-registration on kazoo's handler thread (a listener must never block).

Every call blocks (kazoo is thread based): asyncio callers run them with `asyncio.to_thread`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from bksim.adapters.zk_client import OPEN, ZkSecurity, client_hosts, new_client, security_from_config
from bksim.bookie import cookie as cookies
from bksim.bookie.cookie import Cookie
from bksim.metadata.paths import AVAILABLE, BROKERS_AVAILABLE, COOKIES, INSTANCEID, READONLY, READONLY_CHILD
from bksim.metadata.paths import LEDGERS_ROOT as LEDGERS
from bksim.model.config import Config
from bksim.model.errors import BksimError, CookieError

STATE_WRITABLE = "writable"
STATE_READ_ONLY = "read-only"

RETRY_DELAY_S = 0.1
RETRY_DELAY_S_MAX = 1.0
COMMAND_TRIES_MAX = 20  # per ZooKeeper command: bounded, about 15 s with the back-off above


class RegistrationError(BksimError):
    """ZooKeeper could not be reached or refused the bookie's registration."""


def connect(hosts: str, session_timeout_ms: int, connect_timeout_s: float,
            logger: logging.Logger | None = None, *, security: ZkSecurity = OPEN) -> KazooClient:
    """A started kazoo client: reconnects forever with a short back-off; commands retried a bounded number of times.
    `security`: digest authentication and ACL, TLS (adapters/zk_client.py)."""
    client = new_client(
        hosts, security, timeout=session_timeout_ms / 1000.0,
        connection_retry={"max_tries": -1, "delay": RETRY_DELAY_S, "backoff": 2, "max_delay": RETRY_DELAY_S_MAX},
        command_retry={"max_tries": COMMAND_TRIES_MAX, "delay": RETRY_DELAY_S, "backoff": 2,
                       "max_delay": RETRY_DELAY_S_MAX},
        logger=logger or _quiet_logger())
    try:
        client.start(timeout=connect_timeout_s)
    except KazooTimeoutError:
        client.close()
        raise RegistrationError(f"cannot connect to ZooKeeper at {hosts} within {connect_timeout_s:.1f}s") from None
    try:
        _check_access(client, hosts, security)
    except BaseException:
        client.stop()
        client.close()
        raise
    return client


def _check_access(client: KazooClient, hosts: str, security: ZkSecurity) -> None:
    """RegistrationError naming the credentials option when the cluster's tree refuses this client (its digest
    ACL is for other credentials), instead of a NoAuth at the first real read or write."""
    try:
        if client.retry(client.exists, LEDGERS) is not None:
            client.retry(client.get, LEDGERS)
    except NoAuthError:
        who = (f"the configured credentials (user {security.user}) are not the ones its ACL names" if security.digest
               else "this client has no credentials (zookeeper.digest_credentials_file or "
                    "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE)")
        raise RegistrationError(f"ZooKeeper at {hosts} refuses access to {LEDGERS} (NoAuth): the cluster's znodes "
                                f"have a digest ACL and {who}") from None


def connect_config(config: Config, connect_timeout_s: float, hosts: str | None = None,
                   logger: logging.Logger | None = None) -> KazooClient:
    """`connect` to the configured ZooKeeper (or `hosts`) with the configured digest credentials and TLS."""
    return connect(hosts or client_hosts(config), config.zookeeper.session_timeout_ms, connect_timeout_s, logger,
                   security=security_from_config(config))


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("bksim.kazoo")
    logger.setLevel(logging.ERROR)
    return logger


def registration_path(bookie_id: str, read_only: bool) -> str:
    return f"{READONLY if read_only else AVAILABLE}/{bookie_id}"


def ensure_layout(client: KazooClient) -> str:
    """Create the bookie paths if missing and return the cluster instance id (creating it if absent)."""
    for path in (LEDGERS, AVAILABLE, READONLY, COOKIES):
        client.retry(client.ensure_path, path)
    try:
        client.retry(client.create, INSTANCEID, str(uuid.uuid4()).encode())
    except NodeExistsError:
        pass  # another bookie (or `cluster init`) won the race: read theirs
    data, _ = client.retry(client.get, INSTANCEID)
    instance_id = data.decode().strip()
    if not instance_id:
        raise RegistrationError(f"{INSTANCEID} exists but is empty")
    return instance_id


def read_cookie(client: KazooClient, bookie_id: str) -> Cookie | None:
    path = f"{COOKIES}/{bookie_id}"
    try:
        data, _ = client.retry(client.get, path)
    except NoNodeError:
        return None
    return cookies.decode(data, source=f"ZooKeeper {path}")


def create_cookie(client: KazooClient, cookie: Cookie) -> None:
    """Store `cookie` at /ledgers/cookies/<bookie id>. An existing, different cookie is a CookieError (never overwritten)."""
    path = f"{COOKIES}/{cookie.bookie_id}"
    try:
        client.retry(client.create, path, cookies.encode(cookie))
        return
    except NodeExistsError:
        pass
    existing = read_cookie(client, cookie.bookie_id)
    if existing != cookie:
        raise CookieError(f"ZooKeeper already holds a different cookie at {path} ({existing}); "
                          f"another bookie with id {cookie.bookie_id} exists; refusing to overwrite it")


def list_bookies(client: KazooClient) -> dict[str, list[str]]:
    """{"writable": [...], "readonly": [...]}: bookie ids registered now, sorted."""
    try:
        writable = [c for c in client.retry(client.get_children, AVAILABLE) if c != READONLY_CHILD]
    except NoNodeError:
        writable = []
    try:
        readonly = client.retry(client.get_children, READONLY)
    except NoNodeError:
        readonly = []
    return {"writable": sorted(writable), "readonly": sorted(readonly)}


def read_registration(client: KazooClient, bookie_id: str, read_only: bool) -> dict | None:
    """The registration data of a bookie ({"bookie_id", "host", "port", "state", "pid"}) or None."""
    try:
        data, _ = client.retry(client.get, registration_path(bookie_id, read_only))
    except NoNodeError:
        return None
    try:
        doc = json.loads(data.decode())
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep, an integer of 5,000 digits
        return {"bookie_id": bookie_id}
    return doc if isinstance(doc, dict) else {"bookie_id": bookie_id}


class Registration:
    """One bookie's ephemeral registration, kept alive across session expiry.

    `register()` announces the bookie; `switch_state()` moves it between writable and read-only;
    `deregister()` removes it. `log` receives one line per notable event.
    """

    def __init__(self, client: KazooClient, bookie_id: str, host: str, port: int,
                 registration_wait_ms_max: float, log: Callable[[str], None] = print) -> None:
        self._client = client
        self.bookie_id = bookie_id
        self._host = host
        self._port = port
        self._wait_s_max = registration_wait_ms_max / 1000.0
        self._log = log
        self._lock = threading.Lock()  # one (re-)registration at a time
        self._wanted = False  # should a registration node exist?
        self._read_only = False
        self._session_lost = False
        self.reregistrations = 0
        client.add_listener(self._on_state)

    @property
    def read_only(self) -> bool:
        return self._read_only

    def register(self, read_only: bool = False) -> None:
        with self._lock:
            self._wanted = True
            self._read_only = read_only
            self._ensure_node(read_only)
            self._remove_node(not read_only)
        self._log(f"registered at {registration_path(self.bookie_id, read_only)}")

    def switch_state(self, read_only: bool) -> None:
        """Move the registration to the writable or read-only list: one transaction creates the new node and
        deletes the old."""
        with self._lock:
            self._read_only = read_only
            if not self._wanted:
                return
            if not self._move_node(read_only):
                self._ensure_node(read_only)
                self._remove_node(not read_only)
        self._log(f"registration moved to {registration_path(self.bookie_id, read_only)}")

    def deregister(self) -> None:
        with self._lock:
            self._wanted = False
            for read_only in (False, True):
                self._remove_node(read_only)
        self._log("deregistered")

    def close(self) -> None:
        self._client.remove_listener(self._on_state)

    # -- internals -------------------------------------------------------------------------------------

    def _data(self, read_only: bool) -> bytes:
        return json.dumps({"bookie_id": self.bookie_id, "host": self._host, "port": self._port,
                           "state": STATE_READ_ONLY if read_only else STATE_WRITABLE, "pid": os.getpid()}).encode()

    def _ensure_node(self, read_only: bool) -> None:
        """Make our ephemeral node exist at the right path, owned by our current session."""
        path = registration_path(self.bookie_id, read_only)
        deadline = time.monotonic() + self._wait_s_max
        delay = RETRY_DELAY_S
        while True:
            try:
                self._client.retry(self._client.create, path, self._data(read_only), ephemeral=True)
                return
            except NodeExistsError:
                pass
            stat = self._client.retry(self._client.exists, path)
            if stat is not None and stat.ephemeralOwner == self._client.client_id[0]:
                self._client.retry(self._client.set, path, self._data(read_only))
                return
            if time.monotonic() >= deadline:
                owner = f"0x{stat.ephemeralOwner:x}" if stat is not None else "a racing session"
                raise RegistrationError(
                    f"{path} is held by another ZooKeeper session ({owner}) for more than "
                    f"{self._wait_s_max:.1f}s: another process runs with bookie id {self.bookie_id}")
            if stat is not None and delay == RETRY_DELAY_S:
                self._log(f"{path} still held by a previous session (0x{stat.ephemeralOwner:x}); "
                          f"waiting for it to expire")
            if stat is not None:
                time.sleep(delay)  # bounded by the deadline above
                delay = min(delay * 2, RETRY_DELAY_S_MAX)

    def _move_node(self, read_only: bool) -> bool:
        """Create our node at the `read_only` path and delete ours at the other in one transaction; False (and
        nothing changed) when the old node is not ours or the new path is taken."""
        old = registration_path(self.bookie_id, not read_only)
        stat = self._client.retry(self._client.exists, old)
        if stat is None or stat.ephemeralOwner != self._client.client_id[0]:
            return False

        def commit() -> list:  # a fresh transaction per attempt: kazoo commits one only once
            move = self._client.transaction()
            move.create(registration_path(self.bookie_id, read_only), self._data(read_only), ephemeral=True)
            move.delete(old, version=stat.version)
            return move.commit()

        # a retry after a lost reply finds its own node made: it fails whole, and the caller's fallback sees ours
        return not any(isinstance(r, Exception) for r in self._client.retry(commit))

    def _remove_node(self, read_only: bool) -> None:
        path = registration_path(self.bookie_id, read_only)
        stat = self._client.retry(self._client.exists, path)
        if stat is None or stat.ephemeralOwner != self._client.client_id[0]:
            return  # absent, or someone else's (never delete another session's node)
        try:
            self._client.retry(self._client.delete, path, version=stat.version)
        except NoNodeError:
            pass

    def _on_state(self, state: str) -> None:
        # runs on kazoo's connection thread: never block here (the log is a line written to stderr)
        self._log(f"ZooKeeper connection state: {state}")
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            with self._lock:
                if not self._wanted:
                    return
                self._ensure_node(self._read_only)
                self._remove_node(not self._read_only)
                self.reregistrations += 1
            self._log(f"ZooKeeper session was lost; re-registered at "
                      f"{registration_path(self.bookie_id, self._read_only)}")
        except Exception as e:  # noqa: BLE001 - the next reconnect tries again; say why loudly
            self._log(f"re-registration after session loss FAILED: {type(e).__name__}: {e}")


def registered_brokers(client) -> list[dict]:
    """The brokers under /brokers/available (kazoo client), sorted by id: registration data + "broker_id"."""
    try:
        names = sorted(client.get_children(BROKERS_AVAILABLE))
    except NoNodeError:
        return []
    rows = []
    for name in names:
        try:
            data, _ = client.get(f"{BROKERS_AVAILABLE}/{name}")
            row = json.loads(data or b"{}")
            rows.append((row if isinstance(row, dict) else {}) | {"broker_id": name})
        except NoNodeError:
            continue  # gone meanwhile
        except (ValueError, RecursionError):  # not a JSON document: a broker named by its znode only
            rows.append({"broker_id": name})
    return rows


def broker_address(row: dict) -> str:
    """"host:port" of a broker registration (the id when the data lacks them)."""
    if row.get("host") and row.get("port"):
        return f"{row['host']}:{row['port']}"
    return row["broker_id"]


async def call_bounded(fn: Callable[[], object], timeout_s: float) -> object:
    """`fn()` on a daemon thread, waited for at most `timeout_s` (TimeoutError; the thread is left behind).

    For blocking calls that may never return (kazoo waits for a ZooKeeper that is gone): unlike
    asyncio.to_thread, whose executor asyncio.run joins on exit, a daemon thread cannot keep the process
    from exiting."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    threading.Thread(target=work, name="bounded-call", daemon=True).start()
    return await asyncio.wait_for(done, timeout_s)
