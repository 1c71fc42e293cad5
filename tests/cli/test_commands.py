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


def run_cli(argv, capsys):
    from comlrl.cli.main import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_estimate_refuses_a_team_of_nobody(tiny_paths, capsys):
    code, _, err = run_cli(["estimate", "--num-agents", "0", "--model", tiny_paths["llama"]], capsys)
    assert code == 2 and "--num-agents must be >= 1, got 0" in err


def test_estimate_says_which_critic_it_assumed(tiny_paths, capsys):
    code, out, _ = run_cli(["estimate", "--algorithm", "maac", "--model", tiny_paths["llama"], "--device", "cpu"], capsys)
    assert code == 0 and "predicted peak" in out
    assert f"assumed: one centralized critic, a copy of the agent model {tiny_paths['llama']!r}" in out and "--critic-model" in out
    code, out, _ = run_cli(["estimate", "--algorithm", "maac", "--model", tiny_paths["llama"], "--critic-model", tiny_paths["gpt2"],
                            "--device", "cpu"], capsys)
    assert code == 0 and "assumed" not in out


def test_offline_and_an_explicit_online_dataset_conflict(capsys):
    code, _, err = run_cli(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--dry-run", "--override",
                            "dataset.offline=false"], capsys)
    assert code == 2 and "--offline" in err and "dataset.offline=false" in err and "drop one" in err
    code, out, _ = run_cli(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--dry-run", "--override",
                            "dataset.offline=true"], capsys)
    assert code == 0 and "offline: true" in out


def test_plot_follows_the_extension_or_refuses_one_that_is_no_image(tmp_path, capsys):
    import json

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"env_step": s, "turn_1/reward_mean": 0.1 * s}) + "\n" for s in (1, 2, 3)))
    code, _, err = run_cli(["plot", str(tmp_path), "--out", str(tmp_path / "curve.txt")], capsys)
    assert code == 2 and "curve.txt" in err and ".txt" in err and ".png" in err and not (tmp_path / "curve.txt").exists()
    code, out, _ = run_cli(["plot", str(tmp_path), "--out", str(tmp_path / "curve.pdf")], capsys)
    assert code == 0 and (tmp_path / "curve.pdf").read_bytes()[:5] == b"%PDF-"
    code, _, _ = run_cli(["plot", str(tmp_path), "--out", str(tmp_path / "curve.svg")], capsys)
    assert code == 0 and b"<svg" in (tmp_path / "curve.svg").read_bytes()[:400]
