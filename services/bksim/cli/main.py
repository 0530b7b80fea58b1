"""`bksim` command line. Each sub-command family lives in its own module exposing `register(subparsers)`."""
from __future__ import annotations

import argparse
import sys

from bksim.model.errors import BksimError

# family modules, in help order; each defines register(subparsers) -> None
FAMILIES = ("audit_cmd", "bookie_cmd", "broker_cmd", "chaos_cmd", "cluster_cmd", "compose_cmd", "dump_cmd",
            "ledger_cmd", "metadata_cmd", "perf_cmd", "sim_cmd", "topic_cmd")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="bksim", description="A faithful, runnable Apache BookKeeper cluster")
    parser.add_argument("--config", help="TOML configuration file (default: $BKSIM_CONFIG or deploy/bksim.toml)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in FAMILIES:
        importlib.import_module(f"bksim.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BksimError as e:
        print(f"bksim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
