"""Runs that outlive a job's time limit: time-based checkpoints and the soft deadline, on the store's
clock (a test clock here: every reward call takes 10 s of it, no sleeps), and
``resume_from_checkpoint="auto"``, which takes this run's newest usable checkpoint and names every one it
skips. Each resumed run ends bit-identical to the run that never stopped."""

import json
import os
import shutil

import pytest
from tests.helpers.checkpoint_runs import CrashingReward, assert_same_run, make_magrpo, run_summary, seed_everything
from tests.helpers.common import length_ratio

from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.interrupt import TrainingPreempted
from comlrl.checkpoint.layout import read_checkpoint_metadata
from comlrl.rollout.rewards import RewardFunctionError


class Clock:
    """Seconds of a test: each reward call advances it by 10 (the work of a step takes time)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class ClockedReward:
    def __init__(self, clock):
        self.clock = clock
        self.__wrapped__ = length_ratio  # the reward it stands for (a resume checks the reward function)

    def __call__(self, c1, c2):
        self.clock.now += 10.0
        return length_ratio(c1, c2)


# The timeline of the MAGRPO run of checkpoint_runs (4 items, 1 per step, 2 epochs): a step makes 3
# reward calls (turn 1: one call; turn 2: one per turn-1 sample, 2), an evaluation 2 (one per turn),
# and evaluations run before items 0 and 3 of every epoch (eval_interval=3). So the step boundaries
# fall at (seconds): step 1: 20 + 30 = 50, step 2: 80, step 3: 110, step 4: 110 + 20 + 30 = 160,
# end of epoch 1: 160, step 5: 160 + 20 + 30 = 210, step 6: 240, step 7: 270, step 8: 320.
# A time-based save happens at the first boundary >= every_s after the last save of any kind.
TIMED_CASES = [
    # every_s=100 alone (checkpoint_interval=5: only the final epoch checkpoint besides): saves at
    # 110 (step 3, 110 >= 100), 210 (step 5, 210 - 110 = 100), 320 (step 8, 110); then the final one.
    (dict(checkpoint_every_s=100, checkpoint_interval=5), ["checkpoint-step-3", "checkpoint-step-5", "checkpoint-step-8", "checkpoint-2"]),
    # every_s=60 beside checkpoint_steps=3 and an epoch checkpoint every epoch: step 2 (80 >= 60),
    # step 3 (the steps rule; 110), epoch 1 (160), step 6 (the steps rule; 240), step 8 (320 - 240 = 80)
    (dict(checkpoint_every_s=60, checkpoint_steps=3),
     ["checkpoint-step-2", "checkpoint-step-3", "checkpoint-1", "checkpoint-step-6", "checkpoint-step-8", "checkpoint-2"]),
]


def clocked(tiny_paths, dataset, **overrides):
    clock = Clock()
    trainer = make_magrpo(tiny_paths, dataset, reward=ClockedReward(clock), **overrides)
    trainer.run.checkpoints.clock = clock
    return trainer


def saved_in_order(directory):
    names = [n for n in os.listdir(directory) if n.startswith("checkpoint-")]
    return sorted(names, key=lambda n: read_checkpoint_metadata(str(directory / n))["sequence"])


@pytest.mark.parametrize("settings, expected", TIMED_CASES)
def test_time_based_checkpoints_land_at_the_first_boundary_after_every_s(tiny_paths, dataset, straight, tmp_path, settings, expected):
    seed_everything(0)
    trainer = clocked(tiny_paths, dataset)
    trainer.train(checkpoint_dir=str(tmp_path), **settings)
    assert saved_in_order(tmp_path) == expected
    assert_same_run(straight, run_summary(trainer))  # saving on the clock changes nothing the run computes


def test_a_time_based_checkpoint_resumes_bit_identically(tiny_paths, dataset, straight, tmp_path):
    seed_everything(0)
    clocked(tiny_paths, dataset).train(checkpoint_dir=str(tmp_path), checkpoint_every_s=100, checkpoint_interval=5)
    seed_everything(99)  # the checkpoint's random state wins
    resumed = make_magrpo(tiny_paths, dataset)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-step-5"))  # mid-epoch 2, buffers not empty
    assert_same_run(straight, run_summary(resumed))


def test_the_soft_deadline_stops_before_a_step_would_cross_it(tiny_paths, dataset, straight, tmp_path):
    """stop_after_s=200: the longest step so far is 50 s (step 1), so at step 3 (110 + 50 < 200) the run
    goes on and at step 4 (160 + 50 >= 200) it checkpoints and stops; auto then continues it."""
    seed_everything(0)
    trainer = clocked(tiny_paths, dataset, output_dir=str(tmp_path / "run"))
    with pytest.raises(TrainingPreempted) as info:
        trainer.train(checkpoint_dir=str(tmp_path / "ck"), stop_after_s=200, checkpoint_interval=5)
    stop = info.value
    assert (stop.reason, stop.signal_name, stop.exit_code, trainer.state.global_step) == ("time limit", None, 85, 4)
    assert stop.checkpoint == str(tmp_path / "ck" / "checkpoint-step-4") and stop.where == "global step 4 (epoch 1, item 4)"
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["final_checkpoint"]) == ("preempted", "time limit", stop.checkpoint)
    seed_everything(99)
    resumed = make_magrpo(tiny_paths, dataset, output_dir=str(tmp_path / "run"))
    resumed.train(resume_from_checkpoint="auto", checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=5)
    assert_same_run(straight, run_summary(resumed))


@pytest.mark.parametrize("arguments, message", [
    (dict(checkpoint_every_s=0), "checkpoint_every_s must be a positive number"),
    (dict(checkpoint_every_s=float("nan"), checkpoint_dir="x"), "checkpoint_every_s must be a positive number"),
    (dict(checkpoint_every_s=60), "checkpoint_every_s saves into checkpoint_dir"),
    (dict(stop_after_s=-1, checkpoint_dir="x"), "stop_after_s must be a positive number"),
    (dict(stop_after_s=60), "stop_after_s checkpoints the run it stops into checkpoint_dir"),
    (dict(resume_from_checkpoint="auto"), "resume_from_checkpoint='auto' looks for this run's checkpoints in checkpoint_dir"),
    (dict(requeue_exit_code=0, checkpoint_dir="x"), "requeue_exit_code must be an integer from 3 to 125"),
    (dict(requeue_exit_code=143, checkpoint_dir="x"), "Got 143; the default is 85"),
])
def test_bad_long_run_arguments_are_refused_before_training(tiny_paths, dataset, arguments, message):
    trainer = make_magrpo(tiny_paths, dataset)
    with pytest.raises(ValueError, match=message):
        trainer.train(**arguments)
    assert trainer.state.global_step == 0


# ----------------------------------------------------------------------------- resume "auto"


def rewrite_manifest(folder, **changes):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        elif key == "config":
            manifest["config"]["fields"].update(value)
        else:
            manifest[key] = value
    path.write_text(json.dumps(manifest))


def test_auto_skips_torn_and_foreign_checkpoints_and_resumes_the_newest_of_this_run(tiny_paths, dataset, straight, tmp_path, capsys):
    directory = tmp_path / "ck"
    seed_everything(0)
    crashing = make_magrpo(tiny_paths, dataset, reward=CrashingReward(23))  # crashes in step 6
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(directory), checkpoint_steps=1)
    run_id = crashing.run.checkpoints.run_id
    assert saved_in_order(directory)[-2:] == ["checkpoint-1", "checkpoint-step-5"]
    # the newest save fails its hash; newer-looking copies of step 4 are foreign or torn
    shard = next((directory / "checkpoint-step-5" / "models" / "agents.0").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-8] + b"corrupt!")
    for name, changes in [("checkpoint-step-90", dict(run_id="f" * 32, sequence=90)),
                          ("checkpoint-step-91", dict(sequence=91, config={"agent_learning_rate": 0.5})),
                          ("checkpoint-step-92", dict(sequence=92, trainer_class="comlrl.trainers.actor_critic.iac.IACTrainer")),
                          ("checkpoint-step-93", dict(sequence=93, files=None))]:
        shutil.copytree(directory / "checkpoint-step-4", directory / name)
        rewrite_manifest(directory / name, **changes)
    shutil.copytree(directory / "checkpoint-step-4", directory / "checkpoint-step-94")
    (directory / "checkpoint-step-94" / "manifest.json").write_text('{"format": "comlrl-checkp')  # cut off mid-write
    (directory / f".checkpoint-95.{run_id}.x.staging").mkdir()
    capsys.readouterr()

    seed_everything(99)
    resumed = make_magrpo(tiny_paths, dataset)
    resumed.train(resume_from_checkpoint="auto", checkpoint_dir=str(directory))
    assert_same_run(straight, run_summary(resumed))  # from checkpoint-1, the newest intact one of this run
    log = capsys.readouterr().err
    reasons = {
        "checkpoint-step-94": "torn or unreadable (Checkpoint manifest", "checkpoint-step-93": "missing ['files']",
        "checkpoint-step-92": "written by comlrl.trainers.actor_critic.iac.IACTrainer",
        "checkpoint-step-91": "agent_learning_rate (checkpoint 0.5, this run 0.002)",
        "checkpoint-step-90": f"written by run {'f' * 32}, but {directory} belongs to run {run_id}",
        "checkpoint-step-5": "its SHA-256 differs from the one recorded",
    }
    for name, reason in reasons.items():
        line = next(line for line in log.splitlines() if line.startswith(f"comlrl: skipping checkpoint {directory / name}:"))
        assert reason in line, (name, line)
    assert f"comlrl: ignoring {directory}/.checkpoint-95." in log
    assert f"comlrl: resuming from {directory / 'checkpoint-1'} (run {run_id}" in log
    for name in reasons:  # skipped, never removed or overwritten
        assert (directory / name).is_dir()
    assert not (directory / f".checkpoint-95.{run_id}.x.staging").exists()  # this run's unfinished save, removed


def test_auto_starts_fresh_without_checkpoints_and_refuses_when_none_is_usable(tiny_paths, dataset, straight, tmp_path, capsys):
    directory = tmp_path / "new"
    seed_everything(0)
    first = make_magrpo(tiny_paths, dataset)
    first.train(resume_from_checkpoint="auto", checkpoint_dir=str(directory))  # nothing there yet: a new run
    assert_same_run(straight, run_summary(first))
    assert f"comlrl: no checkpoint in {directory}: starting a new run" in capsys.readouterr().err
    owner = json.loads((directory / "run.json").read_text())
    assert owner == {"format": "comlrl-checkpoint-dir", "version": 1, "run_id": first.run.checkpoints.run_id}

    changed = make_magrpo(tiny_paths, dataset, agent_learning_rate=1e-3, num_train_epochs=3)
    with pytest.raises(CheckpointError, match=r"none this run can resume: checkpoint-2: Checkpoint configuration does not match: "
                                              r"agent_learning_rate \(checkpoint 0.002, this run 0.001\).*checkpoint-1: "):
        changed.train(resume_from_checkpoint="auto", checkpoint_dir=str(directory))
    assert changed.state.global_step == 0 and sorted(os.listdir(directory)) == ["checkpoint-1", "checkpoint-2", "run.json"]


def test_a_new_run_refuses_a_directory_another_run_owns_with_checkpoints(tiny_paths, dataset, tmp_path):
    directory = tmp_path / "ck"
    make_magrpo(tiny_paths, dataset, num_train_epochs=1).train(checkpoint_dir=str(directory))
    with pytest.raises(FileExistsError, match="already contains another run's checkpoints"):
        make_magrpo(tiny_paths, dataset, num_train_epochs=1).train(checkpoint_dir=str(directory))
