"""`comlrl train` checks everything that needs no model before any model loads, and a run that failed
before training leaves nothing that blocks the corrected command."""

from __future__ import annotations

import os

import pytest
from tests.helpers.common import no_signal_expected
import yaml

from comlrl.cli.main import main

BASE = ["agent_model.name=default", "dataset.num_train_items=2", "magrpo.num_train_epochs=1"]


@pytest.fixture
def no_models(monkeypatch):
    import comlrl.cli.train as train_cli

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr(train_cli, "resolve_model_names", refuse)


def refused(tmp_path, capsys, *extra, overrides=()):
    run = tmp_path / "run"
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(run), *extra,
                 "--override", *BASE, *overrides])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists() or os.listdir(run) == []  # nothing written that would block the fix
    return err


def test_negative_checkpoint_steps(no_models, tmp_path, capsys):
    err = refused(tmp_path, capsys, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-steps", "-3")
    assert "--checkpoint-steps (checkpoint.steps) must be a positive integer" in err and "-3" in err


def test_checkpoint_dir_that_is_a_file(no_models, tmp_path, capsys):
    (tmp_path / "ck").write_text("not a folder")
    err = refused(tmp_path, capsys, "--checkpoint-dir", str(tmp_path / "ck"))
    assert "--checkpoint-dir (checkpoint.dir)" in err and "is a file" in err


def test_resume_path_that_does_not_exist(no_models, tmp_path, capsys):
    err = refused(tmp_path, capsys, "--resume", str(tmp_path / "nope"))
    assert f"--resume '{tmp_path / 'nope'}'" in err and "does not exist" in err


def test_resume_without_a_path_needs_a_checkpoint(no_models, tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    err = refused(tmp_path, capsys, "--checkpoint-dir", str(tmp_path / "ck"), "--resume")
    assert "holds none yet" in err


def test_resume_of_another_algorithm(no_models, tmp_path, capsys, monkeypatch):
    from comlrl.checkpoint import layout

    monkeypatch.setattr(layout, "read_checkpoint_metadata", lambda path: {"trainer_class": "comlrl.trainers.actor_critic.iac.IACTrainer"})
    (tmp_path / "ck").mkdir()
    err = refused(tmp_path, capsys, "--resume", str(tmp_path / "ck"))
    assert "is a checkpoint of IACTrainer, but this run trains MAGRPOTrainer (magrpo)" in err and "--algorithm iac" in err


def test_output_dir_and_save_path_that_are_files(no_models, tmp_path, capsys):
    (tmp_path / "run").write_text("x")
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(tmp_path / "run"), "--override", *BASE])
    err = capsys.readouterr().err
    assert code == 2 and "is a file" in err and "Traceback" not in err
    (tmp_path / "run").unlink()
    (tmp_path / "saved").write_text("x")
    err = refused(tmp_path, capsys, overrides=[f"output.save_path={tmp_path / 'saved'}"])
    assert "output.save_path" in err and "is a file" in err


def test_wandb_without_a_login_is_one_line(no_models, tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional dependency")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    err = refused(tmp_path, capsys, overrides=["wandb.project=mine"])
    assert "`wandb login`" in err and "wandb.mode=offline" in err and "wandb.mode=disabled" in err


def test_wandb_login_found_in_netrc_or_offline_mode_passes_the_check(tmp_path, monkeypatch):
    from comlrl.cli.train import check_wandb_login

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    check_wandb_login({"project": "mine"})
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    check_wandb_login({"project": "mine", "mode": "offline"})
    with pytest.raises(ValueError, match="wandb.mode=sometimes is not a W&B mode"):
        check_wandb_login({"project": "mine", "mode": "sometimes"})


def test_a_run_that_fails_while_loading_does_not_block_the_corrected_command(tmp_path, capsys, monkeypatch):
    import comlrl.cli.train as train_cli

    def broken(*args, **kwargs):
        raise ValueError("agent_model.name 'typo' does not exist")

    monkeypatch.setattr(train_cli, "resolve_model_names", broken)
    run = tmp_path / "run"
    args = ["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(run), "--override", *BASE]
    assert main(args) == 2
    assert "does not exist" in capsys.readouterr().err
    assert [name for name in os.listdir(run) if name in ("config.yaml", "resolved_config.yaml", "metrics.jsonl")] == []
    monkeypatch.undo()
    # the corrected command gets past the run-directory check (a dry run stands in for the real one)
    assert main([*args, "--dry-run"]) == 0


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_config_yaml_records_the_effective_output_dir(chat_models, tmp_path):
    run = tmp_path / "elsewhere"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(run), "--override",
                 f"agent_model.name={chat_models['llama']}", "dataset.num_train_items=1", "dataset.num_eval_items=1",
                 "magrpo.num_train_epochs=1", "magrpo.max_new_tokens=4", "magrpo.num_generations=2", "magrpo.eval_interval=0",
                 "output.verbose=false", "output.save_final_model=false"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["output"]["base_dir"] == str(run)
    from comlrl.runplan.plan import plan_from_args

    assert plan_from_args(str(run / "config.yaml")).run_dir == str(run)  # repeating it writes to the same place
