"""Every secret a secured local cluster needs, made under one directory: the benchmarks' `--tls --auth` runs,
`bksim chaos run --secure` and the secret-leak test use it.

`SecurityKit.create(out_dir, tls=..., auth=..., zk_digest=...)` writes, each part only when asked for:

    <out_dir>/tls/                 the CA and per-process certificates (security/certs.py; LocalCluster(tls_dir=...)
                                   adds one certificate per bookie and broker when it declares them)
    <out_dir>/token-secret.key     an HS256 secret (mode 0600) the brokers check tokens with
    <out_dir>/super-user.token     a token for SUPER_USER_ROLE signed with it (mode 0600)
    <out_dir>/zk-credentials       USER:PASSWORD for ZooKeeper digest ACLs (mode 0600), a random password

`child_env()` is what every bookie and broker of the cluster gets on top of LocalCluster's own variables:
authentication and authorization on (super-user SUPER_USER_ROLE, which also holds the raw ledger API), the
secret key file, the super-user token file (security.token_file: what a broker presents when it calls a
broker), and the ZooKeeper credentials file. Only file names go into the environment, never a secret.
`token()` / `zk_password()` read the secrets back for the caller's own clients and for tests that look for them.

Must not: put a secret in an environment variable, an argv, a repr or a log line.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from bksim.security.tokens import SigningKey, create_secret_key, create_token, read_token_file, write_private

SUPER_USER_ROLE = "bksim-admin"
ZK_USER = "bksim"
TLS_DIR = "tls"
SECRET_KEY_FILE = "token-secret.key"
TOKEN_FILE = "super-user.token"
ZK_CREDENTIALS_FILE = "zk-credentials"
ZK_PASSWORD_BYTES = 24


@dataclass(frozen=True)
class SecurityKit:
    """The files of a secured cluster under `out_dir` (see the module docstring); a part not asked for is ""."""
    out_dir: str
    tls_dir: str = ""
    secret_key_file: str = ""
    token_file: str = ""
    zk_credentials_file: str = ""

    @staticmethod
    def create(out_dir: str, *, tls: bool = True, auth: bool = True, zk_digest: bool = True) -> "SecurityKit":
        """Make the asked-for parts under `out_dir` (created; files already there are refused, never replaced)."""
        out_dir = os.path.abspath(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        tls_dir = os.path.join(out_dir, TLS_DIR) if tls else ""
        secret_key_file = token_file = zk_file = ""
        if auth:
            secret_key_file = os.path.join(out_dir, SECRET_KEY_FILE)
            create_secret_key(secret_key_file)
            token_file = os.path.join(out_dir, TOKEN_FILE)
            write_private(token_file, create_token(SigningKey.from_secret_file(secret_key_file),
                                                   SUPER_USER_ROLE).encode() + b"\n")
        if zk_digest:
            zk_file = os.path.join(out_dir, ZK_CREDENTIALS_FILE)
            write_private(zk_file, f"{ZK_USER}:{secrets.token_urlsafe(ZK_PASSWORD_BYTES)}\n".encode())
        return SecurityKit(out_dir, tls_dir, secret_key_file, token_file, zk_file)

    @staticmethod
    def keep_or_create(out_dir: str, *, auth: bool = True, zk_digest: bool = True) -> "SecurityKit":
        """The token and ZooKeeper parts under `out_dir`: the files already there, the missing parts made as
        `create` makes them (a cluster started again on its run directory keeps its secrets: its znodes carry
        the old digest ACL)."""
        out_dir = os.path.abspath(out_dir)
        secret_key_file, token_file = os.path.join(out_dir, SECRET_KEY_FILE), os.path.join(out_dir, TOKEN_FILE)
        zk_file = os.path.join(out_dir, ZK_CREDENTIALS_FILE)
        SecurityKit.create(out_dir, tls=False, auth=auth and not os.path.exists(token_file),
                           zk_digest=zk_digest and not os.path.exists(zk_file))
        return SecurityKit(out_dir, "", secret_key_file if auth else "", token_file if auth else "",
                           zk_file if zk_digest else "")

    @property
    def auth(self) -> bool:
        return bool(self.token_file)

    def child_env(self) -> dict[str, str]:
        """BKSIM_ variables of every bookie and broker (file names only)."""
        env: dict[str, str] = {}
        if self.auth:
            env.update({"BKSIM_SECURITY_AUTH_ENABLED": "true", "BKSIM_SECURITY_AUTHORIZATION_ENABLED": "true",
                        "BKSIM_SECURITY_TOKEN_SECRET_KEY_FILE": self.secret_key_file,
                        "BKSIM_SECURITY_SUPER_USER_ROLES": SUPER_USER_ROLE,
                        "BKSIM_SECURITY_TOKEN_FILE": self.token_file})
        if self.zk_credentials_file:
            env["BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"] = self.zk_credentials_file
        return env

    def token(self) -> str | None:
        """The super-user's token (None without auth)."""
        return read_token_file(self.token_file) if self.token_file else None

    def zk_password(self) -> str | None:
        """The ZooKeeper digest password (None without digest credentials)."""
        if not self.zk_credentials_file:
            return None
        with open(self.zk_credentials_file) as f:
            return f.read().strip().split(":", 1)[1]

    def __repr__(self) -> str:  # file names only
        return f"SecurityKit({self.out_dir!r}, tls={bool(self.tls_dir)}, auth={self.auth}, " \
               f"zk_digest={bool(self.zk_credentials_file)})"
