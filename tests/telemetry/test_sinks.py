"""What the metric sinks hold, read back with the sinks' own readers: TensorBoard scalars (after a
resume: test_checkpoint_logs.py), W&B offline history, and an external W&B run that a trainer
adopts but never replaces or finishes."""

import os

import pytest
from tests.helpers.checkpoint_runs import make_dataset, make_magrpo, seed_everything
from tests.helpers.sink_readers import expected_scalars, history_rows, merged_by_step, tensorboard_scalars

from comlrl.trainers.reinforce import MAGRPOConfig
from comlrl.checkpoint.files import CheckpointError


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
