"""`bksim compose render|check`: the docker-compose deployment's tooling, deploy/compose.py, wired to the CLI.

- `render [--host] [--secure] [--zookeepers 3] --out FILE`: the merged configuration of docker-compose.yml (with
  --host also deploy/docker-compose.host.yml, without `ports:`; --zookeepers 3 the ensemble override), as JSON.
- `check [--run-dir DIR] [--base-image TAG] [--audit] [--secure] [--zookeepers 3]`: the end-to-end check behind
  `make compose-check` on a private dockerd (deploy/compose.py says what it does).

deploy/compose.py is loaded from the checkout this package runs from (the compose files are there too).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPLOY_MODULE = os.path.join(REPO, "deploy", "compose.py")


def deploy_compose():
    """deploy/compose.py as a module (loaded once)."""
    name = "bksim_deploy_compose"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DEPLOY_MODULE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def register(subparsers) -> None:
    compose = subparsers.add_parser("compose", help="the docker-compose deployment: render its files, check it "
                                                    "end to end")
    family = compose.add_subparsers(dest="compose_command", required=True)
    p = family.add_parser("render", help="docker-compose config of docker-compose.yml [+ the host override], "
                                         "without ports for --host (v1 refuses them on host networking)")
    p.add_argument("--host", action="store_true", help="merge deploy/docker-compose.host.yml and drop ports")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the rendered file (JSON)")
    p.add_argument("--secure", action="store_true", help="merge deploy/docker-compose.secure.yml (TLS, tokens, "
                   "ZooKeeper digest ACLs; secrets from $BKSIM_SECRETS_DIR)")
    _zookeepers_arg(p)
    p.set_defaults(func=cmd_render)
    p = family.add_parser("secrets", help="the files deploy/docker-compose.secure.yml mounts: CA and a certificate "
                                          "per service, HS256 secret, super-user token, ZooKeeper credentials")
    p.add_argument("--out", required=True, metavar="DIR", help="where to make them (then BKSIM_SECRETS_DIR=DIR; "
                   "the override's default is ./.run/compose-secrets)")
    p.set_defaults(func=cmd_secrets)
    p = family.add_parser("check", help="end to end on a private dockerd: build, up, write/read, kill a "
                                        "bookie, no loss, down (make compose-check)")
    p.add_argument("--run-dir", default=None, help="where dockerd keeps its state (default <cluster.run_dir>/compose)")
    p.add_argument("--base-image", default=None,
                   help="base image tag; built with debootstrap when missing (default $BKSIM_BASE_IMAGE, else "
                        "deploy/compose.py's BASE_IMAGE_DEFAULT)")
    p.add_argument("--audit", action="store_true",
                   help="also build the audit image (pyspark) and run the audit service (profile audit) over the "
                        "bookies' volumes before down; its verdict must be clean")
    p.add_argument("--secure", action="store_true",
                   help="the stack with deploy/docker-compose.secure.yml (TLS on every gRPC link, tokens and "
                        "authorization, ZooKeeper digest ACLs; secrets made under RUN_DIR/secrets); the check's "
                        "clients present the CA, a client certificate and the super-user token, and it checks "
                        "that a call without a token and a plaintext call are refused")
    _zookeepers_arg(p, " (the check also kills the ZooKeeper leader with the bookie)")
    p.set_defaults(func=cmd_check)


def _zookeepers_arg(p, more: str = "") -> None:
    p.add_argument("--zookeepers", type=int, choices=(1, 3), default=1,
                   help="3 = a ZooKeeper ensemble: merge deploy/docker-compose.ensemble.yml (with --host or in the "
                        "check also deploy/docker-compose.ensemble-host.yml)" + more)


def cmd_render(args) -> int:
    config = deploy_compose().render(args.host, args.out, secure=args.secure, zookeepers=args.zookeepers)
    print(f"{args.out}: {len(config.get('services', {}))} services "
          f"({'host networking, no published ports' if args.host else 'bridge network'}"
          f"{', secured' if args.secure else ''}{', ZooKeeper ensemble' if args.zookeepers > 1 else ''})")
    return 0


def cmd_secrets(args) -> int:
    made = deploy_compose().make_secrets(args.out)
    print(f"{args.out}: {', '.join(made)}")
    return 0


def cmd_check(args) -> int:
    from bksim.cli import config as cfgload

    run_dir = args.run_dir or os.path.join(cfgload.load(getattr(args, "config", None)).cluster.run_dir, "compose")
    compose = deploy_compose()
    base_image = args.base_image or os.environ.get("BKSIM_BASE_IMAGE") or compose.BASE_IMAGE_DEFAULT
    return compose.check(run_dir, base_image, args.audit, args.secure, args.zookeepers)


def main(argv: list[str] | None = None) -> int:
    from bksim.model.errors import BksimError

    parser = argparse.ArgumentParser(prog="bksim")
    parser.add_argument("--config", help="TOML configuration file")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["compose", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except BksimError as e:
        print(f"bksim compose: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
