"""Run records tell the truth: SIGINT (and SIGTERM / SIGUSR1 without checkpoints) end with status
"interrupted", SIGTERM / SIGUSR1 with checkpoints with status "preempted", a checkpoint and the requeue
exit code, run_config.json names the seed, the models and the data, W&B's files stay
in the run folder, and paths that are files are refused with a message, not an OSError."""

from __future__ import annotations

import json
import os
import signal

import pytest
from tests.helpers.common import no_signal_expected
import torch

from comlrl.checkpoint.interrupt import TrainingInterrupted, TrainingPreempted
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

SETTINGS = dict(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=1,
                logging_steps=1, eval_interval=0)


def signalling_reward(number):
    """A reward that sends ``number`` to this process on its first call (a scheduler mid-step)."""
    calls = {"n": 0}

    def reward(c1, c2):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), number)
        return [float(len(b) - len(a)) for a, b in zip(c1, c2)]

    return reward


def trainer_for(tiny_paths, dataset, out, reward, **settings):
    return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward, train_dataset=dataset,
                         args=MAGRPOConfig(output_dir=str(out), **{**SETTINGS, **settings}))


def summary(out):
    return json.loads((out / "run_summary.json").read_text())


@pytest.mark.parametrize("number, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_a_signal_writes_an_interrupted_summary(tiny_paths, prompts_dataset, tmp_path, number, name):
    out = tmp_path / "run"
    trainer = trainer_for(tiny_paths, prompts_dataset, out, signalling_reward(number))
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert signal.getsignal(signal.SIGTERM) is previous  # the handlers are train()'s only
    record = summary(out)
    assert record["status"] == "interrupted" and record["signal"] == name and record["final_checkpoint"] is None


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("number, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGUSR1, "SIGUSR1")])
def test_a_scheduler_signal_with_checkpointing_finishes_the_step_checkpoints_it_and_preempts(tiny_paths, prompts_dataset, tmp_path,
                                                                                            number, name):
    out, ck = tmp_path / "run", tmp_path / "ck"
    trainer = trainer_for(tiny_paths, prompts_dataset, out, signalling_reward(number))
    previous = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(checkpoint_dir=str(ck), requeue_exit_code=42)
    assert signal.getsignal(signal.SIGUSR1) is previous
    stop = info.value
    assert isinstance(stop, SystemExit) and stop.code == stop.exit_code == 42  # uncaught, it exits the process with 42
    assert stop.reason == stop.signal_name == name and stop.checkpoint and os.path.isdir(stop.checkpoint)
    record = summary(out)
    assert record["status"] == "preempted" and record["signal"] == name and record["reason"] == name
    assert record["final_checkpoint"] == stop.checkpoint and record["exit_code"] == 42 and record["attempt"] == 1
    assert record["progress"]["global_step"] == 1  # the step in flight was completed, then saved
    trainer.save_checkpoint(str(tmp_path / "after"))  # a preempted trainer is whole (not a failed one)
    resumed = trainer_for(tiny_paths, prompts_dataset, out, signalling_reward(0))  # the same reward (signal 0 sends nothing)
    resumed.train(resume_from_checkpoint="auto", checkpoint_dir=str(ck))
    record = summary(out)
    assert record["status"] == "completed" and resumed.state.global_step == len(prompts_dataset)
    assert record["attempt"] == 2 and record["resumed_from"] == stop.checkpoint and record["run_id"] == summary_run_id(ck)


def summary_run_id(ck):
    return json.loads((ck / "run.json").read_text())["run_id"]


@no_signal_expected
def test_a_second_signal_does_not_cut_the_step_short(tiny_paths, prompts_dataset, tmp_path):
    """torchrun forwards the signal Slurm also delivers: the same signal twice still finishes the step."""
    calls = {"n": 0}

    def reward(c1, c2):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGTERM)
        return [float(len(b) - len(a)) for a, b in zip(c1, c2)]

    trainer = trainer_for(tiny_paths, prompts_dataset, tmp_path / "run", reward)
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(checkpoint_dir=str(tmp_path / "ck"))
    assert info.value.reason == "SIGUSR1" and info.value.exit_code == 85 and trainer.state.global_step == 1


@no_signal_expected
def test_without_checkpoints_a_scheduler_signal_stops_at_once(tiny_paths, prompts_dataset, tmp_path):
    trainer = trainer_for(tiny_paths, prompts_dataset, tmp_path / "run", signalling_reward(signal.SIGUSR1))
    with pytest.raises(TrainingInterrupted) as info:
        trainer.train()
    assert info.value.signal_name == "SIGUSR1" and trainer.state.global_step == 0
    assert summary(tmp_path / "run")["status"] == "interrupted"


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_run_config_records_the_seed_models_and_data(tiny_paths, prompts_dataset, tmp_path):
    out = tmp_path / "run"
    trainer = trainer_for(tiny_paths, prompts_dataset, out, lambda a, b: [0.0] * len(a))
    torch.manual_seed(1234)
    trainer.train()
    record = json.loads((out / "run_config.json").read_text())
    assert record["seed"] == 1234
    assert [m["source"] for m in record["models"]] == [os.path.abspath(tiny_paths["llama"]), os.path.abspath(tiny_paths["gpt2"])]
    assert record["data"]["train"] == {"rows": len(prompts_dataset)} and record["data"]["eval"] is None


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_wandb_files_go_under_the_run_folder(tiny_paths, prompts_dataset, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional dependency")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [0.0] * len(a),
                            train_dataset=prompts_dataset, wandb_config={"project": "p", "mode": "offline"},
                            args=MAGRPOConfig(output_dir=str(out), **SETTINGS))
    try:
        trainer.train()
    finally:
        trainer.close()
        wandb.teardown()  # W&B keeps its settings (the directory among them) for the process otherwise
    assert (out / "wandb").is_dir() and not (tmp_path / "wandb").exists()


def test_output_dir_and_save_model_paths_that_are_files(tiny_paths, prompts_dataset, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    with pytest.raises(ValueError, match="output_dir .* is a file"):
        MAGRPOConfig(output_dir=str(blocker), **SETTINGS)
    with pytest.raises(ValueError, match="output_dir .* lies under the file"):
        MAGRPOConfig(output_dir=str(blocker / "run"), **SETTINGS)
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [0.0] * len(a),
                            train_dataset=prompts_dataset, args=MAGRPOConfig(**SETTINGS))
    with pytest.raises(ValueError, match=r"save_model\(output_dir\) .* is a file"):
        trainer.save_model(str(blocker))
    assert blocker.read_text() == "mine"


def test_the_cli_reports_a_signal_in_one_line(tmp_path, monkeypatch, capsys):
    import comlrl.cli.train as train_cli
    from comlrl.cli.main import main

    def stopped(plan, **kwargs):
        raise TrainingInterrupted("SIGTERM", "/ck/checkpoint-1")

    monkeypatch.setattr(train_cli, "run", stopped)
    monkeypatch.setattr(train_cli, "load_data", lambda plan: None)
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", str(tmp_path / "unused-run"),
                 "--override", "agent_model.name=default"])
    assert code == 143
    assert capsys.readouterr().err.strip() == "comlrl train: interrupted by SIGTERM: training stopped by SIGTERM; final checkpoint /ck/checkpoint-1"


def test_python_api_refuses_wandb_online_without_a_login_before_loading(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional dependency")
    import comlrl.trainers.reinforce.magrpo as magrpo

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setattr(magrpo, "load_agents", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ValueError) as info:
        MAGRPOTrainer(agents=["/x/a", "/x/b"], reward_func=lambda a, b: [0.0] * len(a), wandb_config={"project": "p"},
                      args=MAGRPOConfig(**SETTINGS))
    message = str(info.value)
    assert "`wandb login`" in message and "wandb_config['mode']='offline'" in message and "'disabled'" in message
