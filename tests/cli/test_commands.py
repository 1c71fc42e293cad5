"""The `comlrl` command line: subcommands, version, errors, and the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import comlrl
from comlrl.cli.main import COMMANDS, build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"comlrl {comlrl.__version__}"


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_demo_defaults_are_the_documented_ones():
    args = build_parser().parse_args(["demo"])
    assert (args.model, args.agent_models, args.epochs, args.num_generations, args.max_new_tokens) == (None, [], 5, 4, 32)
    assert args.output_dir == "runs/comlrl-demo" and args.lr == pytest.approx(2e-5) and not args.overwrite


def test_console_script_runs(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "comlrl")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "comlrl.cli.main"]
    done = subprocess.run(command + ["plot", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "comlrl plot: error" in done.stderr and "does not exist" in done.stderr
