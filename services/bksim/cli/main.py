"""`bksim` command line. Each sub-command family lives in its own module exposing `register(subparsers)`.

Exit statuses every command shares: 0 success; 2 an operating error (`bksim: error: ...` on stderr); 130
interrupted (Ctrl-C); 141 (128 + SIGPIPE, what a shell reports for `seq 1 100000 | head`) when the reader of
stdout went away: the command stops quietly, without a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from bksim.model.errors import BksimError

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the status of a command killed by the signal, as `head` leaves it

# family modules, in help order; each defines register(subparsers) -> None
FAMILIES = ("audit_cmd", "autorecovery_cmd", "bookie_cmd", "broker_cmd", "certs_cmd", "chaos_cmd", "cluster_cmd",
            "compose_cmd", "dump_cmd", "ledger_cmd", "metadata_cmd", "monitor_cmd", "perf_cmd", "security_cmd",
            "sim_cmd", "topic_cmd")
# the top-level commands each family registers where the family's name does not say it
COMMANDS = {"journal": "dump_cmd", "entrylog": "dump_cmd", "lastmark": "dump_cmd", "tokens": "security_cmd",
            "tenant": "topic_cmd", "namespace": "topic_cmd", "produce": "topic_cmd", "consume": "topic_cmd",
            "read": "topic_cmd"}
_GLOBAL_WITH_VALUE = ("--config", "--token-file")  # global options that take the next word as their value


def family_of(argv: list[str]) -> str | None:
    """The family module of the command `argv` names (its first word that is not a global option), or None
    (no command, help, or a word no family registers: then every family is registered, for argparse's full
    usage and its list of choices)."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            family = COMMANDS.get(word, f"{word}_cmd")
            return family if family in FAMILIES else None
    return None


def build_parser(families: tuple[str, ...] = FAMILIES) -> argparse.ArgumentParser:
    """The `bksim` parser with the commands of `families` (all by default). A process that runs one command
    builds only its family: a bookie does not import the simulator and the benchmarks, nor fail on them."""
    import importlib

    parser = argparse.ArgumentParser(prog="bksim", description="A faithful, runnable Apache BookKeeper cluster")
    parser.add_argument("--config", help="TOML configuration file (default: $BKSIM_CONFIG or deploy/bksim.toml)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="file of the token to present to brokers (default: $BKSIM_TOKEN, then "
                             "security.token_file); a token is never given on the command line")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress line on the terminal (as BKSIM_PROGRESS=0; off anyway when stderr is "
                             "not a terminal or with --json)")
    # built for one family, the usage names no command list (it would be that family's alone)
    subparsers = parser.add_subparsers(dest="command", required=True,
                                       metavar=None if families == FAMILIES else "COMMAND")
    for name in families:
        importlib.import_module(f"bksim.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    family = family_of(sys.argv[1:] if argv is None else argv)
    parser = build_parser(FAMILIES if family is None else (family,))
    args = parser.parse_args(argv)
    if args.no_progress:
        from bksim.cli import progress

        progress.silence()
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe fails here, not at interpreter exit
        return status
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a pipe of the command's own (a child's stdin, a socket) broke: a real error
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except BksimError as e:
        print(f"bksim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe or socket whose reading end is closed (poll reports an error or hang-up)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """The reader of stdout is gone: point the descriptor at /dev/null, so the interpreter's final flush of what
    is still buffered has somewhere to go instead of raising BrokenPipeError again (the recipe of Python's
    `signal` documentation)."""
    fd = sys.stdout.fileno()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
