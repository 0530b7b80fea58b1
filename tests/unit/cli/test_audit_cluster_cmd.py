"""`bksim audit cluster up|status|down` beside `bksim audit`'s own options (cli/audit_cmd.py): the subcommand parses
without the audit's options, and the audit still parses, and still asks for them, as before."""
from __future__ import annotations

import pytest

from bksim.cli import audit_cmd
from bksim.cli.main import build_parser


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_the_cluster_subcommands_need_none_of_the_audit_options():
    args = parse("audit", "cluster", "up", "--port", "17077", "--workers", "3", "--worker-memory", "2g")
    assert (args.func, args.port, args.workers, args.worker_memory, args.run_dir) == \
        (audit_cmd.cmd_cluster_up, 17077, 3, "2g", audit_cmd.RUN_DIR_DEFAULT)
    assert parse("audit", "cluster", "down", "--run-dir", "r").func is audit_cmd.cmd_cluster_down
    assert parse("audit", "cluster", "status", "--json").func is audit_cmd.cmd_cluster_status


def test_the_audit_parses_as_before_and_still_requires_its_options(capsys):
    args = parse("audit", "--journals", "a", "b", "--metadata", "s.json", "--out", "o", "--master", "spark://h:7077")
    assert (args.func, args.journals, args.master, args.audit_command) == \
        (audit_cmd.cmd_audit, ["a", "b"], "spark://h:7077", None)
    args = parse("audit", "--journals", "a", "--out", "o")
    with pytest.raises(SystemExit) as exit_:
        args.func(args)
    assert exit_.value.code == 2
    assert "the following arguments are required: --metadata or --zookeeper" in capsys.readouterr().err
