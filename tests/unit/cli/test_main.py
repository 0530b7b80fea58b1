"""The `bksim` entry point (cli/main.py): a command builds only its own family's parser, so a bookie process
imports neither the benchmarks nor the simulator; no command, help or an unknown word registers every family."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bksim.cli.main import COMMANDS, FAMILIES, build_parser, family_of


@pytest.mark.parametrize("argv, family", [
    (["bookie", "run"], "bookie_cmd"),
    (["--config", "x.toml", "perf", "targets"], "perf_cmd"),
    (["--token-file", "t", "--no-progress", "produce", "topic"], "topic_cmd"),
    (["--config=x.toml", "journal", "dump", "f"], "dump_cmd"),
    (["tokens", "create"], "security_cmd"),
    ([], None),
    (["--help"], None),
    (["--config", "bookie"], None),  # "bookie" is the option's value here, not a command
    (["nosuch"], None),
])
def test_the_family_of_a_command_line(argv, family):
    assert family_of(argv) == family


def test_every_top_level_command_belongs_to_the_family_named_for_it():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(COMMANDS.values()) <= set(FAMILIES)
    for command in commands:
        assert family_of([command]) is not None, command
        alone = next(a for a in build_parser((family_of([command]),))._actions if a.dest == "command").choices
        assert command in alone


def test_a_bookie_command_imports_neither_the_benchmarks_nor_the_simulator():
    script = ("import sys\nfrom bksim.cli.main import main\n"
              "try:\n    main(['bookie', '--help'])\nexcept SystemExit:\n    pass\n"
              "print(sorted(m for m in sys.modules if m.startswith(('bksim.perf', 'bksim.sim'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]


def test_a_one_family_parser_names_no_partial_command_list_in_its_usage():
    usage = build_parser(("bookie_cmd",)).format_usage()
    assert "COMMAND" in usage and "{" not in usage
    assert "{audit," in build_parser().format_usage()
