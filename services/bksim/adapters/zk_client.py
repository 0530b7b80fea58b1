"""The one place a kazoo client of the cluster is built: ZooKeeper digest authentication, digest ACLs and TLS.

Owns: reading the digest credentials file (`zookeeper.digest_credentials_file`, one line ``USER:PASSWORD``;
BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE names it from the environment), the ACL every znode the cluster
creates gets (`digest:USER:base64(sha1(USER:PASSWORD))` with all permissions, nothing for `world`), the
TLS files a client presents on ZooKeeper's secure client port (`zookeeper.secure_port`, the `security.tls_*`
files), and the `KazooClient(...)` call itself (`new_client`): every ZooKeeper client of bksim (bookies,
brokers, autorecovery, the CLI, the local cluster's probes) is made here.

Invariants:
- With credentials configured, a client authenticates before its first request (kazoo sends `auth_data` on
  every (re)connection) and creates every znode (create, ensure_path, makepath, transactions) with the digest
  ACL (kazoo's `default_acl`); an anonymous client gets NoAuth on reading or writing those znodes.
- The password is never in argv, never logged, never in an error message or a repr: errors about the file
  name the file and what is wrong with its shape, not its content.
- TLS to ZooKeeper is TLS 1.2+ (Python's client context), checks the server's certificate against
  `security.tls_ca_file`, and the server's name when `security.tls_hostname_verification` is on.

`secure_tree` gives an existing tree (made without credentials) the digest ACL, node by node, depth first:
idempotent (a node already holding exactly that ACL is left alone), a node deleted meanwhile is skipped.
ZooKeeper's root `/` keeps its open ACL (ZooKeeper's own `/zookeeper` lives there); each bksim root below it
is secured.

Every call blocks (kazoo is thread based).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import make_digest_acl

from bksim.model.config import Config
from bksim.model.errors import ConfigError

CREDENTIALS_ENV = "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"  # zookeeper.digest_credentials_file from the environment
CREDENTIALS_BYTES_MAX = 4096  # a USER:PASSWORD line; a larger file is not a credentials file


@dataclass(frozen=True, slots=True)
class ZkTls:
    """PEM files of a TLS client of ZooKeeper's secure port."""
    ca_file: str
    cert_file: str
    key_file: str
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class ZkSecurity:
    """How a client authenticates to ZooKeeper and protects what it creates. Default: anonymous, open ACLs."""
    user: str = ""
    password: str = field(default="", repr=False)
    tls: ZkTls | None = None

    @property
    def digest(self) -> bool:
        return bool(self.user)

    def acl(self) -> list | None:
        """The ACL of every znode this client creates: all permissions for the digest user only (None = open)."""
        return [make_digest_acl(self.user, self.password, all=True)] if self.digest else None

    def kazoo_args(self) -> dict:
        args: dict = {}
        if self.digest:
            args["auth_data"] = [("digest", f"{self.user}:{self.password}")]
            args["default_acl"] = self.acl()
        if self.tls is not None:
            args.update(use_ssl=True, ca=self.tls.ca_file, certfile=self.tls.cert_file, keyfile=self.tls.key_file,
                        verify_certs=True, check_hostname=self.tls.check_hostname)
        return args


OPEN = ZkSecurity()


def read_credentials(path: str) -> tuple[str, str]:
    """(user, password) from a file holding one line USER:PASSWORD. ConfigError naming the file (never its content)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CREDENTIALS_BYTES_MAX + 1)
    except OSError as e:
        raise ConfigError(f"zookeeper.digest_credentials_file {path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > CREDENTIALS_BYTES_MAX:
        raise ConfigError(f"zookeeper.digest_credentials_file {path}: larger than {CREDENTIALS_BYTES_MAX} bytes; "
                          f"expected one line USER:PASSWORD")
    try:
        lines = [line.strip() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise ConfigError(f"zookeeper.digest_credentials_file {path}: not UTF-8 text") from None
    user, sep, password = (lines[0] if len(lines) == 1 else "").partition(":")
    if len(lines) != 1 or not sep or not user or not password:
        raise ConfigError(f"zookeeper.digest_credentials_file {path}: expected exactly one line USER:PASSWORD "
                          f"with a non-empty user and password")
    return user, password


def security_from_config(config: Config) -> ZkSecurity:
    """The cluster's ZooKeeper client security: digest credentials when the file is configured, TLS when
    `zookeeper.secure_port` is set."""
    user = password = ""
    if config.zookeeper.digest_credentials_file:
        user, password = read_credentials(config.zookeeper.digest_credentials_file)
    tls = None
    if config.zookeeper.secure_port:
        sec = config.security
        tls = ZkTls(sec.tls_ca_file, sec.tls_cert_file, sec.tls_key_file, sec.tls_hostname_verification)
    return ZkSecurity(user, password, tls)


def client_hosts(config: Config) -> str:
    """The connect string clients use: zookeeper.connect when set, else every server of the cluster's ensemble
    (cluster.zookeepers of them on consecutive ports from the secure port when one is configured, else from the
    plaintext port)."""
    z = config.zookeeper
    if z.connect:
        return z.connect
    first = z.secure_port or z.port
    return ",".join(f"{z.host}:{first + i}" for i in range(config.cluster.zookeepers))


def new_client(hosts: str, security: ZkSecurity = OPEN, **kazoo_args) -> KazooClient:
    """A kazoo client (not started) on `hosts` with `security`'s authentication, ACL and TLS."""
    for name in ("auth_data", "default_acl", "use_ssl"):
        assert name not in kazoo_args, f"{name} comes from the ZkSecurity"
    return KazooClient(hosts=hosts, **security.kazoo_args(), **kazoo_args)



@dataclass(slots=True)
class SecureCounts:
    """What `secure_tree` did: roots found / absent, znodes given the ACL, znodes that already had it."""
    roots: int = 0
    roots_missing: int = 0
    secured: int = 0
    unchanged: int = 0
    vanished: int = 0  # deleted by someone else during the walk

    @property
    def nodes(self) -> int:
        return self.secured + self.unchanged


def secure_tree(client: KazooClient, roots: tuple[str, ...], security: ZkSecurity) -> SecureCounts:
    """Set `security`'s digest ACL on every znode under (and including) each root. `client` must be started with
    the same credentials (`new_client(..., security)`). ConfigError without credentials."""
    if not security.digest:
        raise ConfigError("securing ZooKeeper needs digest credentials: set zookeeper.digest_credentials_file "
                          "(or BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE) to a file holding USER:PASSWORD")
    acl = security.acl()
    counts = SecureCounts()
    for root in roots:
        if client.retry(client.exists, root) is None:
            counts.roots_missing += 1
            continue
        counts.roots += 1
        pending = [root]
        while pending:
            path = pending.pop()
            try:
                current, _ = client.retry(client.get_acls, path)
                if list(current) == acl:
                    counts.unchanged += 1
                else:
                    client.retry(client.set_acls, path, acl)
                    counts.secured += 1
                children = client.retry(client.get_children, path)
            except NoNodeError:
                counts.vanished += 1
                continue
            pending.extend(f"{path.rstrip('/')}/{child}" for child in children)
    return counts
