"""``comlrl train`` end to end: the issue's commands with tiny local models and tiny settings, per
algorithm and task family, offline; one run through ``python -m comlrl`` in a shell, checkpoints and
resume, the run-directory protections and the W&B switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from comlrl.cli.main import main
from tests.helpers.cli_runs import merged, read_jsonl, tiny, train
from tests.helpers.common import REPO_ROOT, bundled_bf16_expected, no_signal_expected

# Every run here trains a bundled config on tiny random models: all answers of a step may score alike
# (the trainer says so), and the configs load their models in bfloat16 as CoMLRL's do (the loader says so).
pytestmark = [no_signal_expected, bundled_bf16_expected]


def check_run(run_dir, detail_keys, agents=2):
    """Every artifact of a run: resolved config, metrics, eval rows with the env's details, agents, curve."""
    for name in ("config.yaml", "resolved_config.yaml", "metrics.jsonl", "eval_rows.jsonl", "reward_curve.png"):
        assert os.path.getsize(run_dir / name) > 0, name
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert any("turn_1/reward_mean" in row for row in metrics)
    assert any(key.startswith("eval/") for row in metrics for key in row)
    rows = read_jsonl(run_dir / "eval_rows.jsonl")
    assert rows and all(set(detail_keys) <= set(row["details"]) for row in rows)
    assert all(len(row["completions"]) == 2 for row in rows)
    for i in range(agents):
        assert os.path.exists(run_dir / f"agent_{i}" / "config.json")
    return metrics, rows


def saved_dtype(path):
    with open(os.path.join(path, "config.json")) as handle:
        config = json.load(handle)
    return config.get("dtype") or config.get("torch_dtype")


# ----------------------------------------------------------------------------- writing


def test_magrpo_tldr_heterogeneous(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("configs/magrpo_tldr_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None", "magrpo.num_agents=2",
                "magrpo.num_turns=1", "magrpo.num_generations=2", *tiny("magrpo")], tmp_path / "run")
    metrics, rows = check_run(run, ["level_1", "level_2", "level_3", "level_4", "reward"])
    # torch_dtype: auto keeps each checkpoint's dtype: bfloat16 for the Qwen-like, float32 for the Llama-like
    assert (saved_dtype(run / "agent_0"), saved_dtype(run / "agent_1")) == ("bfloat16", "float32")
    assert any("agent_0/loss" in row for row in metrics) and any("agent_1/loss" in row for row in metrics)


def test_the_saved_config_repeats_the_run(chat_models, tmp_path, capsys):
    run = train("magrpo_tldr_config.yaml", [f"agent_model.name={chat_models['llama']}", "magrpo.num_generations=2", *tiny("magrpo")],
                tmp_path / "run")
    import yaml

    resolved = yaml.safe_load((run / "resolved_config.yaml").read_text())
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--output-dir", str(run), "--dry-run", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in again.items() if k != "source"} == {k: v for k, v in resolved.items() if k not in ("source", "data")}  # data: the rows the run used


@pytest.mark.parametrize("algorithm", ["mareinforce", "marloo", "maremax"])
def test_magrpo_variants_on_arxiv(algorithm, chat_models, tmp_path):
    run = train("magrpo_arxiv_config.yaml", [f"agent_model.name={chat_models['llama']}", "magrpo.num_generations=2", *tiny("magrpo")],
                tmp_path / "run", extra=["--algorithm", algorithm])
    check_run(run, ["level_1", "reward"])
    with open(run / "resolved_config.yaml") as handle:
        assert f"algorithm: {algorithm}" in handle.read()


def test_maac_tldr(chat_models, tmp_path):
    qwen = chat_models["qwen"]
    run = train("configs/maac_tldr_config.yaml", ["agents=None", f"agent_model.name={qwen}", f"critic_model.name={qwen}",
                "agent_model.torch_dtype=float32", "critic_model.torch_dtype=float32", *tiny("maac")], tmp_path / "run")
    metrics, _ = check_run(run, ["level_1", "reward"])
    assert os.path.exists(run / "critic" / "value_head.pt")
    assert saved_dtype(run / "agent_0") == "float32"  # an explicit torch_dtype wins over the checkpoint's bfloat16
    assert any("critic/value_loss" in row for row in metrics)


def test_iac_tldr_separate_critics(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("configs/iac_tldr_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None", f'critics=["{qwen}","{llama}"]',
                "critic_model.name=None", "iac.use_separate_critic=true", *tiny("iac")], tmp_path / "run")
    check_run(run, ["level_1", "reward"])
    assert os.path.exists(run / "agent_0" / "critic" / "value_head.pt") and os.path.exists(run / "agent_1" / "critic" / "value_head.pt")


def test_iac_tldr_value_heads(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("configs/iac_tldr_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None", "critics=None",
                "critic_model.name=None", "iac.use_separate_critic=false", *tiny("iac")], tmp_path / "run")
    metrics, _ = check_run(run, ["level_1", "reward"])
    assert os.path.exists(run / "agent_1" / "value_head.pt") and not os.path.exists(run / "agent_1" / "critic")
    assert any("agent_0/value_loss" in row for row in metrics)


# ----------------------------------------------------------------------------- code


def test_magrpo_humaneval_two_turns(chat_models, tmp_path):
    run = train("magrpo_he_config.yaml", [f"agent_model.name={chat_models['qwen']}", "magrpo.num_generations=2",
                "agent_model.torch_dtype=float32", *tiny("magrpo", turns=2)], tmp_path / "run")
    metrics, rows = check_run(run, ["level_1", "level_2", "level_3", "level_4", "passed_tests", "total_tests", "reward"])
    # a two-turn evaluation logs both turns; the shift of -4 applies to the trained rewards
    assert {row["turn"] for row in rows} == {1, 2}
    assert any("eval/turn_2/reward_mean" in row for row in metrics)
    assert all(row["turn_1/reward_mean"] <= -4.0 + 4.0 for row in metrics if "turn_1/reward_mean" in row)
    # the isolation the code reward actually ran with is in both records of the run
    record = json.loads((run / "run_config.json").read_text())
    sandbox = record["reward"]["sandbox"]
    assert sandbox["level"] == "bwrap" and sandbox["contained"] is True and sandbox["candidate_host_uid"] != 0
    resolved = yaml.safe_load((run / "resolved_config.yaml").read_text())
    assert resolved["data"]["sandbox"]["level"] == sandbox["level"]


def test_magrpo_che_heterogeneous(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("configs/magrpo_che_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None",
                "magrpo.num_generations=2", "magrpo.rollout_buffer_size=1", "magrpo.train_batch_size=1", *tiny("magrpo", turns=2)], tmp_path / "run")
    check_run(run, ["passed_tests", "total_tests"])


def test_iac_mbpp(chat_models, tmp_path):
    run = train("iac_mbpp_config.yaml", [f"agent_model.name={chat_models['llama']}", f"critic_model.name={chat_models['llama']}",
                *tiny("iac", turns=2)], tmp_path / "run")
    check_run(run, ["passed_tests", "total_tests"])


def test_maac_coophumaneval(chat_models, tmp_path):
    run = train("maac_che_config.yaml", [f"agent_model.name={chat_models['qwen']}", f"critic_model.name={chat_models['qwen']}",
                "agent_model.torch_dtype=float32", *tiny("maac", turns=2)], tmp_path / "run")
    check_run(run, ["passed_tests", "total_tests", "level_4"])


# ----------------------------------------------------------------------------- Minecraft


def test_magrpo_str_build(chat_models, tmp_path):
    run = train("str_build_magrpo_config.yaml", [f"agent_model.name={chat_models['qwen']}", "agent_model.dtype=fp32", "seed=5",
                *tiny("magrpo", turns=2, generations=2)], tmp_path / "run")
    _, rows = check_run(run, ["coverage", "iou", "level_1", "level_2", "level_3", "level_4"])
    assert {row["task_id"] for row in rows} == {"str_build_0009"}  # the eval split [8:] starts at ICML


def test_maac_house_build(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("house_build/configs/house_build_maac_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None",
                f"critic_model.name={qwen}", "seed=11", *tiny("maac", turns=2)], tmp_path / "run")
    _, rows = check_run(run, ["iou", "level_1", "level_2"])
    import yaml

    with open(run / "resolved_config.yaml") as handle:
        resolved = yaml.safe_load(handle)
    assert resolved["seed"] == 11 and resolved["environment_options"]["seed"] == 11


def test_iac_house_build_value_heads(chat_models, tmp_path):
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    run = train("house_build/configs/house_build_iac_config.yaml", [f'agents=["{qwen}","{llama}"]', "agent_model.name=None",
                "critic_model.name=None", "iac.use_separate_critic=false", "seed=11", *tiny("iac", turns=2)], tmp_path / "run")
    check_run(run, ["iou", "level_1"])
    assert os.path.exists(run / "agent_0" / "value_head.pt")


# ----------------------------------------------------------------------------- the command line itself


@pytest.mark.slow
def test_python_dash_m_with_the_published_quoting(chat_models, tmp_path):
    """The pasted form: single-quoted JSON lists with backslash-escaped quotes, through a real shell."""
    qwen, llama = chat_models["qwen"], chat_models["llama"]
    settings = " ".join(tiny("magrpo"))
    command = (
        f"{sys.executable} -m comlrl train --config configs/magrpo_tldr_config.yaml --output-dir {tmp_path / 'run'} --override "
        f"agents='[\\\"{qwen}\\\",\\\"{llama}\\\"]' agent_model.name=None magrpo.num_agents=2 magrpo.num_turns=1 "
        f"magrpo.num_generations=2 wandb.name='magrpo_tldr_1.5_1.7' {settings}"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "W&B is off" in done.stdout
    check_run(tmp_path / "run", ["level_1"])


def test_run_directory_is_protected(chat_models, tmp_path, capsys):
    overrides = [f"agent_model.name={chat_models['llama']}", "magrpo.num_generations=2", *tiny("magrpo")]
    train("magrpo_tldr_config.yaml", overrides, tmp_path / "run")
    first = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(tmp_path / "run"), "--override", *overrides]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == first  # nothing touched
    train("magrpo_tldr_config.yaml", overrides, tmp_path / "run", extra=["--overwrite"])
    assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == len(first.splitlines())  # replaced, not appended
    # agents saved by an earlier run are refused before training, even when resuming, unless --overwrite
    elsewhere = overrides + [f"output.save_path={tmp_path / 'run'}"]
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(tmp_path / "other"), "--override", *elsewhere]) == 2
    assert "already holds saved models (agent_0, agent_1)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_checkpoints_and_resume_from_the_command_line(chat_models, tmp_path):
    overrides = [f"agent_model.name={chat_models['llama']}", "magrpo.num_generations=2", *tiny("magrpo")]
    checkpoints = tmp_path / "checkpoints"
    train("magrpo_tldr_config.yaml", overrides, tmp_path / "run", extra=["--checkpoint-dir", str(checkpoints)])
    saved = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("checkpoint-"))
    assert saved
    more = [o for o in overrides if "num_train_epochs" not in o] + ["magrpo.num_train_epochs=2"]
    train("magrpo_tldr_config.yaml", more, tmp_path / "run", extra=["--checkpoint-dir", str(checkpoints), "--resume", "--overwrite"])
    from comlrl.checkpoint.layout import read_checkpoint_metadata

    latest = sorted(checkpoints.iterdir(), key=lambda p: p.stat().st_mtime)[-1]
    assert read_checkpoint_metadata(str(latest))["progress"]["epoch"] == 2


def test_wandb_is_used_only_when_a_project_is_set(chat_models, tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional dependency")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [f"agent_model.name={chat_models['llama']}", "magrpo.num_generations=2", *tiny("magrpo")]
    try:
        train("magrpo_tldr_config.yaml", overrides + ["wandb.project=comlrl-test", f"wandb.dir={tmp_path / 'wandb'}"], tmp_path / "with")
    finally:
        wandb.teardown()  # leave no W&B process state to later tests
    assert "W&B is off" not in capsys.readouterr().out
    assert any(name.startswith("offline-run-") for name in os.listdir(tmp_path / "wandb" / "wandb"))
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    train("magrpo_tldr_config.yaml", overrides + ["wandb.project=comlrl-test"], tmp_path / "without")
    assert "the wandb package is not installed" in capsys.readouterr().out


@pytest.mark.slow
def test_comlrl_train_under_torchrun(chat_models, tmp_path):
    """`torchrun --nproc_per_node=2 -m comlrl train ...`: two ranks train one team; rank 0 alone writes the
    run directory (one metrics row per step, not two) and the saved agents."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_dir = tmp_path / "run"
    overrides = merged(tiny("magrpo"), ["magrpo.rollout_buffer_size=2", "magrpo.train_batch_size=2", "magrpo.eval_interval=0",
                                        f'agents=["{chat_models["qwen"]}","{chat_models["llama"]}"]', "agent_model.name=None"])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", "-m", "comlrl", "train", "--config", "magrpo_tldr_config.yaml",
               "--output-dir", str(run_dir), "--override", *overrides]
    root = REPO_ROOT
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    steps = [row["env_step"] for row in metrics]
    assert steps == sorted(set(steps)) and len(steps) == 1  # 2 items, 2 per step: one step, logged once
    assert all(os.path.exists(run_dir / f"agent_{i}" / "config.json") for i in range(2))
    assert done.stdout.count("comlrl train: agents saved") == 1
