"""Exact resume (MAGRPO family): a run stopped or crashed and resumed from its checkpoint ends bit-identical
to the run that was never interrupted: parameters, optimizer moments, logged metrics, progress, RNG."""

import os
import random

import pytest
import torch
from comlrl.rollout.rewards import RewardFunctionError
from tests.helpers.checkpoint_runs import CrashingReward, assert_same_run, make_magrpo, run_summary, seed_everything

from comlrl.trainers.reinforce import MARLOOTrainer
from comlrl.checkpoint.layout import read_checkpoint_metadata
from comlrl.checkpoint.layout import latest_checkpoint


def test_checkpoints_do_not_change_the_run(tiny_paths, dataset, straight, tmp_path):
    """Saving after every step draws no random numbers and changes nothing the run computes."""
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, dataset)
    trainer.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert_same_run(straight, run_summary(trainer))
    # 8 step checkpoints + 2 epoch-end checkpoints, named after the global step or the epochs done
    expected = [f"checkpoint-step-{i}" for i in range(1, 9)] + ["checkpoint-1", "checkpoint-2"]
    assert sorted(os.listdir(tmp_path)) == sorted(expected + ["run.json"])  # run.json: the directory's owner
    order = [os.path.basename(read_checkpoint_metadata(str(tmp_path / n))["path"]) for n in expected]
    sequences = [read_checkpoint_metadata(str(tmp_path / n))["sequence"] for n in expected]
    assert sorted(sequences) == list(range(1, 11)) and order == expected
    assert any(row for row in straight["log"] if "eval/turn_1/reward_mean" in row)  # eval rows are compared too


class NoisyStateReward:
    """A reward whose state_dict draws from every RNG: saving must still leave the run unchanged."""

    def __call__(self, c1, c2):
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]

    def state_dict(self):
        import numpy as np

        return {"noise": (random.random(), float(np.random.rand()), float(torch.rand(1)))}

    def load_state_dict(self, state):
        pass


def test_saving_never_perturbs_the_random_streams(tiny_paths, dataset, tmp_path):
    seed_everything(0)
    plain = make_magrpo(tiny_paths, dataset, reward=NoisyStateReward(), num_train_epochs=1)
    plain.train()
    seed_everything(0)
    saving = make_magrpo(tiny_paths, dataset, reward=NoisyStateReward(), num_train_epochs=1)
    saving.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert len(os.listdir(tmp_path)) == 5 + 1  # and run.json
    assert_same_run(run_summary(plain), run_summary(saving))


@pytest.mark.parametrize("crash_at", [7, 23])  # in steps 2 and 6 (3 reward calls per step, 2 per evaluation)
def test_crash_mid_epoch_then_resume_is_bit_identical(tiny_paths, dataset, straight, tmp_path, crash_at):
    """The reward raises in step k; a new trainer resumes the latest step checkpoint and finishes."""
    seed_everything(0)
    crashing = make_magrpo(tiny_paths, dataset, reward=CrashingReward(crash_at))
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    latest = latest_checkpoint(str(tmp_path))
    meta = read_checkpoint_metadata(latest)
    assert meta["progress"]["global_step"] == crashing.state.global_step  # the last completed step was saved
    # buffers hold a leftover group between steps, so the cursor alone would not be enough
    assert any(crashing.rollout_buffers)

    random.seed(1234)
    torch.manual_seed(1234)  # whatever happened since: the checkpoint's RNG state wins
    resumed = make_magrpo(tiny_paths, dataset)
    resumed.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1, resume_from_checkpoint=True)
    assert_same_run(straight, run_summary(resumed))


def test_epoch_checkpoint_and_more_epochs_on_resume(tiny_paths, dataset, straight, tmp_path):
    """1 epoch with checkpoint_interval=1, then num_train_epochs raised to 2 on resume."""
    seed_everything(0)
    first = make_magrpo(tiny_paths, dataset, num_train_epochs=1)
    first.train(checkpoint_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "run.json"]
    assert read_checkpoint_metadata(str(tmp_path))["progress"] == {"epoch": 1, "position": 0, "env_step": 24, "global_step": 4}

    # num_train_epochs and output_dir are among the fields that may change on resume
    resumed = make_magrpo(tiny_paths, dataset, num_train_epochs=2, output_dir=str(tmp_path / "logs"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"), checkpoint_dir=str(tmp_path))
    assert_same_run(straight, run_summary(resumed))
    assert (tmp_path / "logs" / "metrics.jsonl").exists()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-2", "logs", "run.json"]
    # a finished run resumed with the same epoch count has nothing left to do
    again = make_magrpo(tiny_paths, dataset)
    again.train(resume_from_checkpoint=str(tmp_path))
    assert_same_run(straight, run_summary(again), rng=False)


def test_save_checkpoint_and_load_checkpoint_round_trip(tiny_paths, dataset, straight, tmp_path):
    """The public methods: save mid-run state after a stop, load into a fresh trainer, continue."""
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, dataset, num_train_epochs=1)
    trainer.train()
    path = trainer.save_checkpoint(str(tmp_path / "after-epoch-1"))
    assert read_checkpoint_metadata(path)["sequence"] == 1

    fresh = make_magrpo(tiny_paths, dataset)
    progress = fresh.load_checkpoint(path)
    assert progress == {"epoch": 1, "position": 0, "env_step": 24, "global_step": 4}
    assert fresh.log_history == trainer.log_history
    fresh.train()  # continues from the restored cursor without resume_from_checkpoint
    assert_same_run(straight, run_summary(fresh))


def test_variant_trainers_resume_exactly(tiny_paths, dataset, tmp_path):
    """A MAGRPO-family variant with off-policy buffers (old log-probs in the buffered records)."""
    overrides = dict(num_turns=1, buffers_per_generation=2, rollout_buffer_size=1, num_train_epochs=1)
    seed_everything(3)
    reference = make_magrpo(tiny_paths, dataset, cls=MARLOOTrainer, **overrides)
    reference.train()
    seed_everything(3)
    crashing = make_magrpo(tiny_paths, dataset, cls=MARLOOTrainer, reward=CrashingReward(5), **overrides)
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    resumed = make_magrpo(tiny_paths, dataset, cls=MARLOOTrainer, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path))
    assert_same_run(run_summary(reference), run_summary(resumed))


def test_iterable_dataset_resumes_at_the_same_item(tiny_paths, dataset, tmp_path):
    """An iterable dataset is re-iterated and the consumed items skipped (its own state is not restored)."""
    stream = dataset.to_iterable_dataset()
    assert hasattr(stream, "state_dict") and not hasattr(stream, "__len__")
    overrides = dict(num_turns=1, rollout_buffer_size=1)
    seed_everything(5)
    reference = make_magrpo(tiny_paths, stream, **overrides)
    reference.train()
    seed_everything(5)
    crashing = make_magrpo(tiny_paths, stream, reward=CrashingReward(6), **overrides)
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert read_checkpoint_metadata(str(tmp_path))["progress"]["position"] == 3
    resumed = make_magrpo(tiny_paths, stream, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path))
    assert_same_run(run_summary(reference), run_summary(resumed))
