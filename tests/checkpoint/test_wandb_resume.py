"""The W&B run identity travels with checkpoints, so a resumed run continues the same W&B run."""

import pytest
from tests.helpers.checkpoint_runs import make_dataset, make_magrpo, seed_everything

from comlrl.checkpoint.layout import read_checkpoint_metadata


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb", reason="wandb is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"project": "comlrl-checkpoints", "mode": "offline", "dir": str(tmp_path / "wandb")}
    try:
        run = wandb.init(**config)
        run.finish()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"wandb cannot start an offline run on this machine: {exc}")
    yield wandb, config
    if wandb.run is not None:
        wandb.run.finish()


def test_read_checkpoint_metadata_returns_the_wandb_identity_for_resuming(tiny_paths, offline_wandb, tmp_path):
    wandb, config = offline_wandb
    dataset = make_dataset(2)
    directory = str(tmp_path / "ckpts")
    seed_everything(0)
    first = make_magrpo(tiny_paths, dataset, wandb_config=dict(config), num_train_epochs=1)
    run_id = wandb.run.id
    first.train(checkpoint_dir=directory)
    first.close()
    assert wandb.run is None  # the trainer finished the run it opened

    meta = read_checkpoint_metadata(directory)
    assert meta["wandb"] == {"id": run_id, "project": "comlrl-checkpoints", "entity": None}

    # the documented recipe: merge the identity into wandb_config before building the trainer
    wandb_config = {**config, "id": meta["wandb"]["id"], "resume": "allow"}
    resumed = make_magrpo(tiny_paths, dataset, wandb_config=wandb_config, num_train_epochs=2)
    assert wandb.run.id == run_id
    resumed.train(resume_from_checkpoint=meta["path"], checkpoint_dir=directory)
    assert read_checkpoint_metadata(directory)["wandb"]["id"] == run_id
    assert read_checkpoint_metadata(directory)["progress"]["epoch"] == 2
    resumed.close()

    # without the merge, the trainer's own fresh run is replaced by the checkpoint's on load
    third = make_magrpo(tiny_paths, dataset, wandb_config=dict(config), num_train_epochs=2)
    assert wandb.run.id != run_id
    third.load_checkpoint(directory)
    assert wandb.run.id == run_id and third.wandb_config["resume"] == "allow"
    third.close()


def test_without_wandb_the_identity_is_none(tiny_paths, tmp_path):
    trainer = make_magrpo(tiny_paths, make_dataset(2), num_train_epochs=1)
    assert read_checkpoint_metadata(trainer.save_checkpoint(str(tmp_path / "ck")))["wandb"] is None
