"""What the metric sinks hold, read back with the sinks' own readers: TensorBoard scalars (also after
a resume, which purges the abandoned continuation), W&B offline history, and an external W&B run
that a trainer adopts but never replaces or finishes."""

import os

import numpy as np
import pytest
from checkpoint_helpers import CrashingReward, make_dataset, make_magrpo, seed_everything
from wandb_records import history_rows, merged_by_step

from comlrl.trainers.reinforce import MAGRPOConfig
from comlrl.training.checkpoint_files import CheckpointError


def tensorboard_scalars(log_dir):
    """``{tag: [(step, value), ...]}`` as TensorBoard itself loads them (orphaned events purged)."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(log_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def expected_scalars(log_history):
    """The log as TensorBoard stores it: one float32 series per key."""
    out = {}
    for row in log_history:
        for key, value in row.items():
            if key != "env_step":
                out.setdefault(key, []).append((row["env_step"], float(np.float32(value))))
    return out


def test_tensorboard_scalars_read_back_equal_the_log(tiny_paths, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional dependency")
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, make_dataset(2), num_train_epochs=1, output_dir=str(tmp_path), tensorboard=True,
                          logging_steps=1)
    trainer.train()
    trainer.close()
    assert any(key.startswith("eval/") for row in trainer.log_history for key in row)  # eval rows too
    assert tensorboard_scalars(str(tmp_path / "tensorboard")) == expected_scalars(trainer.log_history)
    with pytest.raises(ValueError, match="tensorboard=True writes under output_dir"):
        MAGRPOConfig(tensorboard=True)


def test_tensorboard_after_a_resume_holds_each_step_once(tiny_paths, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional dependency")
    dataset = make_dataset(4)
    seed_everything(0)
    straight = make_magrpo(tiny_paths, dataset)
    straight.train()

    logs, checkpoints = tmp_path / "run", tmp_path / "checkpoints"
    seed_everything(0)
    crashing = make_magrpo(tiny_paths, dataset, reward=CrashingReward(23), output_dir=str(logs), tensorboard=True)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(checkpoints), checkpoint_steps=2)
    crashing.close()
    # the crashed run's events include rows after its last checkpoint (test_checkpoint_logs.py shows
    # they exist in this setup); the resumed run logs those steps again
    assert tensorboard_scalars(str(logs / "tensorboard")) == expected_scalars(crashing.log_history)

    resumed = make_magrpo(tiny_paths, dataset, output_dir=str(logs), tensorboard=True)
    resumed.train(checkpoint_dir=str(checkpoints), checkpoint_steps=2, resume_from_checkpoint=True)
    resumed.close()
    assert tensorboard_scalars(str(logs / "tensorboard")) == expected_scalars(straight.log_history)


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional dependency")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return wandb, {"project": "comlrl-sinks", "mode": "offline", "dir": str(tmp_path / "wandb")}


def test_wandb_offline_history_equals_the_log(tiny_paths, offline_wandb, tmp_path):
    wandb, config = offline_wandb
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, make_dataset(2), num_train_epochs=1, logging_steps=1, wandb_config=config)
    run_dir = os.path.dirname(wandb.run.dir)
    trainer.train()
    trainer.save_model(str(tmp_path / "models"))
    trainer.close()
    assert wandb.run is None
    expected = merged_by_step(trainer.log_history)
    expected[trainer.env_step]["final_model_saved"] = 1.0  # save_model's row
    assert history_rows(run_dir) == expected


def test_an_external_wandb_run_is_adopted_never_finished_or_replaced(tiny_paths, offline_wandb, tmp_path):
    wandb, config = offline_wandb
    seed_everything(0)
    first = make_magrpo(tiny_paths, make_dataset(2), num_train_epochs=1, wandb_config=dict(config))
    first.train(checkpoint_dir=str(tmp_path / "ckpts"))  # a checkpoint that names its own run
    first.close()

    external = wandb.init(**config)
    trainer = make_magrpo(tiny_paths, make_dataset(2), num_train_epochs=2, wandb_config=dict(config))
    assert wandb.run is external  # adopted, not a new run
    with pytest.raises(CheckpointError, match=rf"Cannot replace an external W&B run \({external.id}\)"):
        trainer.load_checkpoint(str(tmp_path / "ckpts"))
    assert wandb.run is external and trainer.state.global_step == 0  # nothing restored
    trainer.close()
    assert wandb.run is external  # the trainer did not open it, so it does not finish it
    external.finish()
