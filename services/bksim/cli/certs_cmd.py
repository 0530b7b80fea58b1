"""`bksim certs create`: a CA and certificates for a local cluster (security/certs.py), no openssl needed.

Writes under --out: ca.pem and ca-key.pem, bookie-<i>.pem / -key.pem (role "bookie"), broker-<i>.pem /
-key.pem (role "broker"), client.pem / client-key.pem (the CLI's and tools' certificate; roles --role, default
"client"). Keys are mode 0600. Files already there are kept (so a CA is not replaced under a running
cluster) unless --force, which issues the process and client certificates again from the same CA.
Counts and hosts default to the configuration (cluster.bookies, cluster.brokers, bookie.host, broker.host).
"""
from __future__ import annotations

import os

from bksim.cli import config as cfgload


def register(subparsers) -> None:
    parser = subparsers.add_parser("certs", help="certificates for TLS: a CA and per-process certificates",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="certs_command", required=True)
    create = sub.add_parser("create", help="write a CA, bookie/broker certificates and a client certificate",
                            description=__doc__)
    create.add_argument("--out", required=True, help="directory to write into (created if absent)")
    create.add_argument("--bookies", type=int, help="bookie certificates bookie-1..N (default cluster.bookies)")
    create.add_argument("--brokers", type=int, help="broker certificates broker-1..N (default cluster.brokers)")
    create.add_argument("--role", action="append", default=[],
                        help="a role of the client certificate (repeatable; the first is the one a bookie's "
                             "security.bookie_authorized_roles checks); default: client")
    create.add_argument("--host", help="host name or IP the bookies and brokers listen on, added to their "
                                       "certificates besides localhost and 127.0.0.1 (default bookie.host and "
                                       "broker.host)")
    create.add_argument("--force", action="store_true",
                        help="issue the process and client certificates again (same CA)")
    create.set_defaults(func=cmd_create)


def cmd_create(args) -> int:
    from bksim.model.errors import ConfigError
    from bksim.security import certs

    config = cfgload.load(getattr(args, "config", None))
    bookies = config.cluster.bookies if args.bookies is None else args.bookies
    brokers = config.cluster.brokers if args.brokers is None else args.brokers
    if bookies < 0 or brokers < 0:
        raise ConfigError("--bookies and --brokers must be >= 0")
    roles = tuple(r.strip() for value in args.role for r in value.split(",") if r.strip())
    names = certs.cluster_names(bookies, brokers, args.host or config.bookie.host, args.host or config.broker.host,
                                roles)
    issued = certs.ensure(args.out, names, replace=args.force)
    print(f"{os.path.join(args.out, certs.CA_FILE)}  CA (its key {certs.CA_KEY_FILE}, mode 0600)")
    for name, pair in issued.items():
        with open(pair.cert_file, "rb") as f:
            roles_now = certs.roles_of_pem(f.read())  # a kept certificate keeps its roles
        print(f"{pair.cert_file}  CN={name} roles={','.join(roles_now) or '-'} key {os.path.basename(pair.key_file)}")
    print(f"use: BKSIM_SECURITY_TLS_ENABLED=true BKSIM_SECURITY_TLS_CA_FILE={os.path.join(args.out, certs.CA_FILE)} "
          f"and each process's own BKSIM_SECURITY_TLS_CERT_FILE / BKSIM_SECURITY_TLS_KEY_FILE")
    return 0
