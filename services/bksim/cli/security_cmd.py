"""`bksim tokens ...` and the permission commands of `bksim namespace|topic` (PROTOCOL.md §8, docs/security.md).

    bksim tokens create-secret-key --output FILE
    bksim tokens create-key-pair --private-key-file F --public-key-file F [--algorithm RS256|ES256]
    bksim tokens create --subject ROLE [--expiry 1h] (--secret-key-file F | --private-key-file F)
    bksim namespace grant-permission TENANT/NS --role R --actions produce,consume
    bksim namespace revoke-permission TENANT/NS --role R
    bksim namespace permissions TENANT/NS
    bksim topic grant-permission TOPIC --role R --actions ... | revoke-permission TOPIC --role R
    bksim tenant get TENANT | set-admin-roles TENANT --admin-roles R1,R2

Key files are written mode 0600 and never overwritten. `tokens create` prints the token on stdout (as Pulsar's
`tokens create` does): redirect it to a file and pass that with `--token-file`. A token is never taken from the
command line: clients read it from `bksim --token-file FILE`, else $BKSIM_TOKEN, else security.token_file
(`client_token`).
"""
from __future__ import annotations

import json

from bksim.cli import config as cfgload


def register(subparsers) -> None:
    tokens = subparsers.add_parser("tokens", help="create token keys and signed tokens (JWT, role = subject)")
    fam = tokens.add_subparsers(dest="tokens_command", required=True)
    p = fam.add_parser("create-secret-key", help="a new random HS256 secret key (base64, mode 0600)")
    p.add_argument("--output", required=True, metavar="FILE", help="file to create (must not exist)")
    p.set_defaults(func=cmd_create_secret_key)
    p = fam.add_parser("create-key-pair", help="a new RS256 or ES256 key pair (PEM, mode 0600)")
    p.add_argument("--private-key-file", required=True, metavar="FILE", help="private key to create (signs tokens)")
    p.add_argument("--public-key-file", required=True, metavar="FILE",
                   help="public key to create (brokers check tokens with it: security.token_public_key_file)")
    p.add_argument("--algorithm", choices=("RS256", "ES256"), default="RS256", help="default RS256 (RSA 2048)")
    p.set_defaults(func=cmd_create_key_pair)
    p = fam.add_parser("create", help="a signed token for a role, printed on stdout")
    p.add_argument("--subject", required=True, metavar="ROLE", help="the role (the token's sub claim)")
    p.add_argument("--expiry", metavar="N[smhdwy]", help="expires after this long (e.g. 1h, 7d); default: never")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--secret-key-file", metavar="FILE", help="sign with this HS256 secret key")
    key.add_argument("--private-key-file", metavar="FILE", help="sign with this RS256/ES256 private key")
    p.set_defaults(func=cmd_create_token)


def register_permissions(tenant_family, namespace_family, topic_family, common) -> None:
    """The tenant admin and grant commands, added to the `tenant`, `namespace` and `topic` families
    (cli/topic_cmd.py); `common` is their --broker/--json/--config parent parser."""
    p = tenant_family.add_parser("get", parents=[common], help="a tenant's admin roles")
    p.add_argument("tenant")
    p.set_defaults(func=cmd_tenant_get)
    p = tenant_family.add_parser("set-admin-roles", parents=[common],
                                 help="replace a tenant's admin roles (a super-user's command)")
    p.add_argument("tenant")
    p.add_argument("--admin-roles", required=True, metavar="R1,R2", help="comma-separated roles ('' = none)")
    p.set_defaults(func=cmd_tenant_set_admin_roles)
    for family, what, metavar in ((namespace_family, "namespace", "TENANT/NS"), (topic_family, "topic", "TOPIC")):
        p = family.add_parser("grant-permission", parents=[common],
                              help=f"grant produce/consume on a {what} to a role (a tenant admin's command)")
        p.add_argument("target", metavar=metavar)
        p.add_argument("--role", required=True)
        p.add_argument("--actions", required=True, metavar="produce,consume")
        p.set_defaults(func=cmd_grant, scope=what)
        p = family.add_parser("revoke-permission", parents=[common], help=f"revoke a role's grant on a {what}")
        p.add_argument("target", metavar=metavar)
        p.add_argument("--role", required=True)
        p.set_defaults(func=cmd_revoke, scope=what)
    p = namespace_family.add_parser("permissions", parents=[common],
                                    help="the grants of a namespace and of its topics")
    p.add_argument("target", metavar="TENANT/NS")
    p.set_defaults(func=cmd_permissions, scope="namespace")


def client_token(args) -> str | None:
    """The token a CLI command presents: --token-file, else $BKSIM_TOKEN, else security.token_file."""
    from bksim.security.tokens import client_token as resolve

    token_file = getattr(args, "token_file", None) or ""
    if token_file:
        return resolve(token_file)
    return resolve("", config_token_file=cfgload.load(getattr(args, "config", None)).security.token_file)


# -- tokens -----------------------------------------------------------------------------------------------------

def cmd_create_secret_key(args) -> int:
    from bksim.security.tokens import create_secret_key

    create_secret_key(args.output)
    print(f"secret key written to {args.output} (mode 0600): security.token_secret_key_file = {args.output!r}")
    return 0


def cmd_create_key_pair(args) -> int:
    from bksim.security.tokens import create_key_pair

    create_key_pair(args.private_key_file, args.public_key_file, args.algorithm)
    print(f"{args.algorithm} key pair written: private {args.private_key_file}, public {args.public_key_file} "
          f"(mode 0600); brokers: security.token_public_key_file = {args.public_key_file!r}")
    return 0


def cmd_create_token(args) -> int:
    from bksim.security.tokens import SigningKey, create_token, parse_expiry

    key = SigningKey.from_secret_file(args.secret_key_file) if args.secret_key_file \
        else SigningKey.from_private_key_file(args.private_key_file)
    print(create_token(key, args.subject, expiry_s=parse_expiry(args.expiry) if args.expiry else None))
    return 0


# -- tenants and grants -----------------------------------------------------------------------------------------

def _client(args):
    from bksim.cli.topic_cmd import _client as topic_client

    return topic_client(args)


def _print(args, value: dict, text: str) -> None:
    print(json.dumps(value, indent=2, sort_keys=True) if args.json else text)


def cmd_tenant_get(args) -> int:
    with _client(args) as c:
        info = c.get_tenant(args.tenant)
    _print(args, info, f"tenant {info['tenant']}: admin roles {', '.join(info['admin_roles']) or '(none)'}")
    return 0


def cmd_tenant_set_admin_roles(args) -> int:
    roles = [r.strip() for r in args.admin_roles.split(",") if r.strip()]
    with _client(args) as c:
        info = c.set_tenant_admin_roles(args.tenant, roles)
    _print(args, info, f"tenant {info['tenant']}: admin roles {', '.join(info['admin_roles']) or '(none)'}")
    return 0


def _namespace_and_topic(args) -> tuple[str, str]:
    if args.scope == "namespace":
        return args.target, ""
    from bksim.topics.names import TopicName

    return TopicName.parse(args.target).ns, args.target


def _grants_text(policies: dict) -> str:
    lines = [f"namespace: {role}: {', '.join(actions)}" for role, actions in policies["namespace_auth"].items()]
    lines += [f"{topic}: {role}: {', '.join(actions)}"
              for topic, roles in policies["destination_auth"].items() for role, actions in roles.items()]
    return "\n".join(lines) if lines else "(no grants)"


def cmd_grant(args) -> int:
    namespace, topic = _namespace_and_topic(args)
    actions = [a.strip() for a in args.actions.split(",") if a.strip()]
    with _client(args) as c:
        policies = c.grant_permission(namespace, args.role, actions, topic)
    _print(args, policies, f"granted {', '.join(actions)} on {args.target} to {args.role}")
    return 0


def cmd_revoke(args) -> int:
    namespace, topic = _namespace_and_topic(args)
    with _client(args) as c:
        policies = c.revoke_permission(namespace, args.role, topic)
    _print(args, policies, f"revoked the grant of {args.role} on {args.target}")
    return 0


def cmd_permissions(args) -> int:
    with _client(args) as c:
        policies = c.permissions(args.target)
    _print(args, policies, _grants_text(policies))
    return 0
