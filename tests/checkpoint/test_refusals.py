"""Checkpoints refuse what they cannot resume exactly, before anything is changed, and name what differs."""

import json
import os
import shutil

import pytest
from comlrl.rollout.rewards import RewardFunctionError
from tests.helpers.checkpoint_runs import CrashingReward, assert_same_run, make_dataset, make_magrpo, run_summary, seed_everything
from tests.helpers.common import length_ratio
from transformers import AutoTokenizer

from comlrl.trainers.reinforce import MAGRPOTrainer, MARLOOTrainer
from comlrl.checkpoint.files import CheckpointCorruptError, CheckpointError
from comlrl.checkpoint.layout import read_checkpoint_metadata


@pytest.fixture(scope="module")
def dataset():
    return make_dataset(4)


@pytest.fixture(scope="module")
def saved(tiny_paths, dataset, tmp_path_factory):
    """A checkpoint one step into the second epoch (the run crashed in the step after it)."""
    directory = tmp_path_factory.mktemp("saved")
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, dataset, reward=CrashingReward(23))
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        trainer.train(checkpoint_dir=str(directory), checkpoint_steps=1)
    meta = read_checkpoint_metadata(str(directory))
    assert meta["progress"]["epoch"] == 1 and meta["progress"]["position"] == 1
    return meta["path"]


def copy_of(path, tmp_path):
    target = tmp_path / "copy" / os.path.basename(path)
    shutil.copytree(path, target)
    return str(target)


def refused_without_change(trainer, path, error, match, **train_kwargs):
    before = run_summary(trainer)
    with pytest.raises(error, match=match):
        trainer.train(resume_from_checkpoint=path, **train_kwargs)
    assert_same_run(before, run_summary(trainer))


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"checkpoint_interval": 0}, "checkpoint_interval must be an integer >= 1"),
        ({"checkpoint_interval": True}, "checkpoint_interval"),
        ({"checkpoint_interval": 1.5}, "checkpoint_interval"),
        ({"checkpoint_total_limit": 0}, "checkpoint_total_limit must be a positive integer"),
        ({"checkpoint_steps": -2}, "checkpoint_steps must be a positive integer"),
        ({"checkpoint_dir": 3}, "checkpoint_dir must be a path"),
        ({"resume_from_checkpoint": True}, "give checkpoint_dir"),
        ({"resume_from_checkpoint": 7}, "resume_from_checkpoint must be"),
    ],
)
def test_checkpoint_arguments_are_checked_before_anything_else(kwargs, match):
    trainer = MAGRPOTrainer.__new__(MAGRPOTrainer)  # no attributes at all: nothing else may run first
    with pytest.raises(ValueError, match=match):
        trainer.train(**kwargs)


# ----------------------------------------------------------------------------- what differs
def test_other_trainer_class_is_refused(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, dataset, cls=MARLOOTrainer)
    refused_without_change(trainer, saved, CheckpointError, r"written by comlrl\.trainers\.reinforce\.magrpo\.MAGRPOTrainer; this trainer is .*MARLOOTrainer")


def test_incompatible_config_is_refused_with_the_fields_named(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, dataset, agent_learning_rate=1e-3, num_generations=3)
    refused_without_change(
        trainer, saved, CheckpointError,
        r"configuration does not match: agent_learning_rate \(checkpoint 0\.002, this run 0\.001\); num_generations "
        r"\(checkpoint 2, this run 3\)\. Only these fields may change on resume: .*num_train_epochs",
    )


def test_a_field_newer_than_the_checkpoint_is_accepted_at_its_default(tiny_paths, dataset, saved, tmp_path):
    """A checkpoint of an older comlrl lacks the fields added since: they match while this run keeps
    their defaults (the older behaviour) and are named when it does not."""
    path = copy_of(saved, tmp_path)
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    for name in ("optimizer", "vllm_gpu_memory_utilization"):  # fields the GPU path added
        del manifest["config"]["fields"][name]
    json.dump(manifest, open(manifest_path, "w"))
    trainer = make_magrpo(tiny_paths, dataset)
    trainer.load_checkpoint(path)
    assert trainer.state.epoch == 1 and trainer.state.position == 1
    refused_without_change(make_magrpo(tiny_paths, dataset, vllm_gpu_memory_utilization=0.5), path, CheckpointError,
                           r"vllm_gpu_memory_utilization \(checkpoint '<absent>', this run 0\.5\)")


def test_other_model_dtype_is_refused(tiny_paths, dataset, saved):
    with pytest.warns(UserWarning, match=r"agents\[[01]\] will train with bfloat16 weights and optimizer state"):
        trainer = make_magrpo(tiny_paths, dataset, model_config={"dtype": "bfloat16"})
    refused_without_change(trainer, saved, CheckpointError, r"Model 'agents\.0' differs .*float32\[.*\] in the checkpoint, bfloat16\[")


def test_other_model_architecture_is_refused(tiny_paths, dataset, saved, tmp_path):
    from tests.helpers.tiny_models import make_llama, save

    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    wider = save(make_llama(tok, hidden=48), tok, str(tmp_path / "wider"))
    trainer = make_magrpo({"llama": wider, "gpt2": tiny_paths["gpt2"]}, dataset)
    refused_without_change(trainer, saved, CheckpointError, r"Model 'agents\.0' differs .*\[300, 32\] in the checkpoint, float32\[300, 48\] here")


def test_other_tokenizer_is_refused(tiny_paths, dataset, saved):
    toks = [AutoTokenizer.from_pretrained(tiny_paths[name]) for name in ("llama", "gpt2")]
    toks[1].chat_template = "{{ messages[0]['content'] }}"
    trainer = make_magrpo(tiny_paths, dataset, tokenizer=toks)
    refused_without_change(trainer, saved, CheckpointError, r"tokenizer of agents\.1 differs from the checkpoint's")


def test_cursor_beyond_num_train_epochs_is_refused(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, dataset, num_train_epochs=1)
    refused_without_change(trainer, saved, CheckpointError, r"num_train_epochs is 1; set num_train_epochs >= 2")


def test_other_dataset_length_is_refused(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, make_dataset(3))
    refused_without_change(trainer, saved, CheckpointError, r"training dataset has 3 items; the checkpoint's had 4")


def test_other_generation_settings_are_refused(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, dataset)
    refused_without_change(trainer, saved, CheckpointError, r"generation settings differ.*max_time", max_time=60.0)


class CountingReward:
    def __init__(self):
        self.calls = 0
        self.__wrapped__ = length_ratio  # the same reward, counted (a resume checks the reward function)

    def __call__(self, c1, c2):
        self.calls += 1
        return length_ratio(c1, c2)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_a_callback_state_missing_from_the_checkpoint_is_refused(tiny_paths, dataset, saved):
    trainer = make_magrpo(tiny_paths, dataset, reward=CountingReward())
    refused_without_change(trainer, saved, CheckpointError, r"runtime states do not match.*only in this trainer: \['callbacks\.reward_func'\]")


def test_callback_states_are_saved_and_restored(tiny_paths, dataset, tmp_path):
    reward = CountingReward()
    trainer = make_magrpo(tiny_paths, dataset, reward=reward, num_train_epochs=1)
    trainer.train(checkpoint_dir=str(tmp_path))
    other = CountingReward()
    resumed = make_magrpo(tiny_paths, dataset, reward=other, num_train_epochs=1)
    resumed.load_checkpoint(str(tmp_path))
    assert other.calls == reward.calls > 0


# ----------------------------------------------------------------------------- damaged files
def _truncate(path):
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def _flip_byte(path):
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    "relative, damage, match",
    [
        ("models/agents.1/model-00001-of-00001.safetensors", _truncate, r"model-00001-of-00001\.safetensors is truncated"),
        ("optimizers/optimizers.1.pt", _flip_byte, r"optimizers\.1\.pt is corrupted: its SHA-256 differs"),
        ("rng_state.pt", os.remove, r"rng_state\.pt is missing"),
        ("manifest.json", _truncate, r"manifest\.json is truncated or corrupted"),
    ],
)
def test_damaged_files_are_named_and_nothing_is_loaded(tiny_paths, dataset, saved, tmp_path, relative, damage, match):
    path = copy_of(saved, tmp_path)
    damage(os.path.join(path, relative))
    trainer = make_magrpo(tiny_paths, dataset)
    refused_without_change(trainer, path, CheckpointCorruptError, match)


def test_unsupported_version_and_foreign_folders(tiny_paths, dataset, saved, tmp_path):
    path = copy_of(saved, tmp_path)
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["version"] = 1
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(CheckpointError, match="Unsupported checkpoint version 1"):
        read_checkpoint_metadata(path)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "training_state.pt").write_bytes(b"1.4.3")
    with pytest.raises(CheckpointError, match="CoMLRL 1.4.3 checkpoint"):
        read_checkpoint_metadata(str(legacy))
    with pytest.raises(CheckpointError, match="none is readable; the newest: Unsupported checkpoint version 1"):
        make_magrpo(tiny_paths, dataset).load_checkpoint(str(tmp_path / "copy"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a comlrl checkpoint: it has no manifest.json"):
        read_checkpoint_metadata(str(tmp_path / "empty"))
    manifest["version"] = 2
    manifest["models"]["agents.0"]["folder"] = "../../elsewhere"
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(CheckpointError, match="names a path outside the checkpoint: '../../elsewhere'"):
        make_magrpo(tiny_paths, dataset).load_checkpoint(path)
    del manifest["states"]
    json.dump(manifest, open(manifest_path, "w"))
    assert read_checkpoint_metadata(path)["sequence"] == manifest["sequence"]  # the identity is still readable
    with pytest.raises(CheckpointError, match=r"Incomplete checkpoint manifest .*missing \['states'\]"):
        make_magrpo(tiny_paths, dataset).load_checkpoint(path)


# ----------------------------------------------------------------------------- ownership and refusals to save
def test_a_new_run_never_writes_into_another_runs_checkpoint_dir(tiny_paths, dataset, saved, tmp_path):
    directory = os.path.dirname(saved)
    before = sorted(os.listdir(directory))
    trainer = make_magrpo(tiny_paths, dataset)
    with pytest.raises(FileExistsError, match="already contains another run's checkpoints: checkpoint-"):
        trainer.train(checkpoint_dir=directory)
    assert sorted(os.listdir(directory)) == before
    foreign = tmp_path / "foreign"
    (foreign / "checkpoint-7").mkdir(parents=True)  # no manifest: unknown owner
    with pytest.raises(FileExistsError, match="checkpoint-7 \\(no readable ownership metadata\\)"):
        trainer.train(checkpoint_dir=str(foreign))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        trainer.train(checkpoint_dir=str(afile))


def test_resuming_into_a_directory_of_another_run_is_refused(tiny_paths, dataset, saved, tmp_path):
    other = make_magrpo(tiny_paths, dataset, num_train_epochs=1)
    other.save_checkpoint(str(tmp_path / "checkpoint-1"))  # another run id
    trainer = make_magrpo(tiny_paths, dataset)
    refused_without_change(trainer, saved, FileExistsError, "contains checkpoints of another run", checkpoint_dir=str(tmp_path))


def test_saving_is_refused_after_a_failed_run_and_over_existing_folders(tiny_paths, dataset, tmp_path):
    trainer = make_magrpo(tiny_paths, dataset, reward=CrashingReward(4))
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        trainer.train()
    with pytest.raises(RuntimeError, match="save_checkpoint refused: the last train\\(\\) call raised during epoch 1"):
        trainer.save_checkpoint(str(tmp_path / "late"))
    with pytest.raises(RuntimeError, match="train\\(checkpoint_dir=...\\) refused"):
        trainer.train(checkpoint_dir=str(tmp_path / "dir"))
    assert not (tmp_path / "late").exists() and not (tmp_path / "dir").exists()

    fresh = make_magrpo(tiny_paths, dataset)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        fresh.save_checkpoint(str(tmp_path / "busy"))
    (tmp_path / "empty").mkdir()
    assert fresh.save_checkpoint(str(tmp_path / "empty")) == str(tmp_path / "empty")
    assert read_checkpoint_metadata(str(tmp_path / "empty"))["progress"]["global_step"] == 0


def test_an_exception_during_a_save_leaves_no_partial_checkpoint(tiny_paths, dataset, tmp_path, monkeypatch):
    import comlrl.checkpoint.folder as checkpoint

    original, calls = checkpoint.save_torch, []

    def failing(path, value):
        calls.append(path)
        if path.endswith("training_state.pt") and len([c for c in calls if c.endswith("training_state.pt")]) == 3:
            raise OSError("disk full")
        original(path, value)

    monkeypatch.setattr(checkpoint, "save_torch", failing)
    trainer = make_magrpo(tiny_paths, dataset)
    with pytest.raises(OSError, match="disk full"):
        trainer.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-step-1", "checkpoint-step-2", "run.json"]  # no third, no staging folder
    monkeypatch.undo()
    resumed = make_magrpo(tiny_paths, dataset)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-step-2"))
    assert resumed.state.epoch == 2


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("sequence", -1, "sequence must be a non-negative integer"),
        ("sequence", True, "sequence must be a non-negative integer"),
        ("run_id", "ABC", "run identity 'ABC' is not 32 lowercase hex digits"),
        ("trainer_class", "", "trainer class must be a non-empty string"),
        ("wandb", {"id": ""}, "W&B identity must be"),
        ("wandb", {"id": "x", "api_key": "secret"}, "W&B identity must be"),
        ("format", "other", "format is 'other'"),
        ("run_id", None, "missing \\['run_id'\\]"),
    ],
)
def test_read_checkpoint_metadata_checks_the_identity(saved, tmp_path, field, value, match):
    path = copy_of(saved, tmp_path)
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    if value is None:
        del manifest[field]
    else:
        manifest[field] = value
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint_metadata(path)
