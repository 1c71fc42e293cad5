"""Checkpoint layout: sharded safetensors per model, a JSON manifest, weights_only torch files, pruning
that only ever removes this run's own checkpoints."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from tests.helpers.checkpoint_runs import make_dataset, make_magrpo
from tests.helpers.common import length_ratio
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from comlrl.rollout.tree import GroupSample
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.checkpoint.files import CheckpointError, load_module, save_module
from comlrl.checkpoint.state import decode_value, encode_value
from comlrl.checkpoint.layout import CHECKPOINT_VERSION, latest_checkpoint, read_checkpoint_metadata


@pytest.fixture(scope="module")
def dataset():
    return make_dataset(4)


def test_layout_manifest_and_weights_only_files(tiny_paths, dataset, tmp_path):
    trainer = make_magrpo(tiny_paths, dataset, num_train_epochs=1)
    trainer.train(checkpoint_dir=str(tmp_path))
    folder = tmp_path / "checkpoint-1"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == [
        "manifest.json",
        "models/agents.0/index.json", "models/agents.0/model-00001-of-00001.safetensors",
        "models/agents.1/index.json", "models/agents.1/model-00001-of-00001.safetensors",
        "models/reference_models.0/index.json", "models/reference_models.0/model-00001-of-00001.safetensors",
        "models/reference_models.1/index.json", "models/reference_models.1/model-00001-of-00001.safetensors",
        "optimizers/optimizers.0.pt", "optimizers/optimizers.1.pt",
        "rng_state.pt", "training_state.pt",
    ]
    for path in folder.rglob("*.pt"):
        torch.load(path, weights_only=True)  # no pickled objects: loadable without trusting the file
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["version"] == CHECKPOINT_VERSION == 2
    assert manifest["trainer_class"] == "comlrl.trainers.reinforce.magrpo.MAGRPOTrainer"
    assert manifest["progress"] == {"epoch": 1, "position": 0, "env_step": 24, "global_step": 4}
    assert set(manifest["files"]) == set(files) - {"manifest.json"}
    assert "num_train_epochs" in manifest["config"]["resumable"] and manifest["config"]["fields"]["num_generations"] == 2
    assert set(manifest["tokenizers"]) == {"agents.0", "agents.1"}
    assert manifest["tokenizers"]["agents.0"]["sha256"] != manifest["tokenizers"]["agents.1"]["sha256"]
    assert manifest["states"] == ["log_history", "metrics", "policy_versions", "progress", "reward_per_response", "rollout_buffers"]
    # the weights are the trainer's, bit for bit, and tied weights are written once
    index = json.loads((folder / "models/agents.0/index.json").read_text())
    assert index["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    weights = load_file(folder / "models/agents.0/model-00001-of-00001.safetensors")
    for name, value in trainer.agents[0].state_dict().items():
        assert torch.equal(weights[index["aliases"].get(name, name)], value), name

    meta = read_checkpoint_metadata(str(folder / "manifest.json"))
    assert meta == {
        "version": 2, "trainer_class": manifest["trainer_class"], "sequence": 1, "run_id": manifest["run_id"],
        "wandb": None, "progress": manifest["progress"], "path": str(folder),
    }
    assert len(meta["run_id"]) == 32


def test_a_shared_reference_is_written_once(tiny_paths, dataset, tmp_path):
    args = MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, reference_kl_enabled=True)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["gpt2"], num_agents=2, reward_func=length_ratio, args=args, train_dataset=dataset)
    assert trainer.reference_models[0] is trainer.reference_models[1]
    trainer.save_checkpoint(str(tmp_path / "ck"))
    manifest = read_checkpoint_metadata(str(tmp_path / "ck"))
    models = json.loads((tmp_path / "ck" / "manifest.json").read_text())["models"]
    assert models["reference_models.1"]["folder"] == models["reference_models.0"]["folder"] == "models/reference_models.0"
    assert sorted(os.listdir(tmp_path / "ck" / "models")) == ["agents.0", "agents.1", "reference_models.0"]
    assert manifest["sequence"] == 1


def test_sharded_weights_with_tied_parameters_round_trip(tiny_paths, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    model.train()
    model.model.layers[0].eval()  # a submodule whose mode differs from the root's
    index = save_module(str(tmp_path / "m"), model, max_shard_bytes=8_000)
    shards = sorted(name for name in os.listdir(tmp_path / "m") if name.endswith(".safetensors"))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"  # split by size
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert index["training_exceptions"] == ["model.layers.0"] + [
        n for n, _ in model.model.layers[0].named_modules(prefix="model.layers.0") if n != "model.layers.0"
    ]

    other = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(1.0)
    load_module(str(tmp_path / "m"), index, other)
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()  # still tied
    assert other.training and not other.model.layers[0].training


def test_runtime_values_are_plain_for_weights_only_loading(tmp_path):
    sample = GroupSample(
        agent_idx=1, turn_idx=0, prompt_ids=torch.tensor([1, 2]), completion_ids=[torch.tensor([3]), torch.tensor([4, 5])],
        returns=torch.tensor([0.5, -0.5]), node_env_step=2, node_mean_reward=0.25, node_mean_return=0.0,
    )
    value = {
        "buffers": [[sample], []], "numpy": np.arange(5, dtype=np.uint32), "scalar": np.float64(2.5),
        "tuple": (1, "a", None), "__kind__": "a user key", 3: float("inf"),
    }
    path = tmp_path / "state.pt"
    torch.save(encode_value(value, records=(GroupSample,)), path)
    restored = decode_value(torch.load(path, weights_only=True), records=(GroupSample,))
    assert restored["numpy"].dtype == np.uint32 and restored["numpy"].tolist() == [0, 1, 2, 3, 4]
    assert type(restored["scalar"]) is np.float64 and restored["scalar"] == 2.5 and restored["tuple"] == (1, "a", None) and restored["__kind__"] == "a user key"
    assert restored[3] == float("inf")
    got = restored["buffers"][0][0]
    assert isinstance(got, GroupSample) and got.agent_idx == 1 and torch.equal(got.completion_ids[1], torch.tensor([4, 5]))
    with pytest.raises(CheckpointError, match="Unsupported checkpoint record 'GroupSample'"):
        decode_value(torch.load(path, weights_only=True))
    with pytest.raises(TypeError, match=r"state\['x'\]\[0\]: a object cannot be checkpointed"):
        encode_value({"x": [object()]})


def test_total_limit_prunes_only_this_runs_checkpoints(tiny_paths, dataset, tmp_path):
    other = make_magrpo(tiny_paths, dataset)
    foreign = tmp_path.parent / f"{tmp_path.name}-foreign"
    other.save_checkpoint(str(foreign))
    directory = tmp_path / "ckpts"
    directory.mkdir()
    (directory / "notes").mkdir()
    (directory / "notes" / "todo.txt").write_text("keep me")
    (directory / "checkpoint-best").mkdir()
    (directory / "checkpoint-3.bak").write_text("keep me")
    (directory / f".checkpoint-2.{'f' * 32}.abc.staging").mkdir()  # another run's leftover

    class ForeignWriter:
        """While the run trains, another run writes checkpoint-1 (the name of this run's first epoch
        checkpoint) and a stray checkpoint-step-6 appears."""

        calls = 0

        def __call__(self, c1, c2):
            ForeignWriter.calls += 1
            if ForeignWriter.calls == 2:
                shutil.copytree(foreign, directory / "checkpoint-1")
                (directory / "checkpoint-step-6").mkdir()
            return length_ratio(c1, c2)

    trainer = make_magrpo(tiny_paths, dataset, reward=ForeignWriter(), num_train_epochs=2)
    trainer.train(checkpoint_dir=str(directory), checkpoint_steps=1, checkpoint_total_limit=2)
    names = sorted(os.listdir(directory))
    own = [n for n in names if n.startswith("checkpoint-") and (directory / n / "manifest.json").exists()
           and read_checkpoint_metadata(str(directory / n))["run_id"] == trainer.run.checkpoints.run_id]
    # 10 saves (8 steps + 2 epoch ends, the taken names becoming checkpoint-1.v2 and checkpoint-step-6.v2);
    # the limit keeps the last two: step 8 and the end of epoch 2
    assert sorted(own) == ["checkpoint-2", "checkpoint-step-8"]
    assert set(names) - set(own) == {"notes", "checkpoint-best", "checkpoint-3.bak", "checkpoint-1", "checkpoint-step-6",
                                     f".checkpoint-2.{'f' * 32}.abc.staging", "run.json"}
    assert (directory / "notes" / "todo.txt").read_text() == "keep me"
    assert read_checkpoint_metadata(str(directory / "checkpoint-1"))["run_id"] == other.run.checkpoints.run_id
    with pytest.raises(CheckpointError, match="checkpoints of 2 different runs"):
        latest_checkpoint(str(directory))


def test_names_say_where_the_run_is_and_a_resume_never_overwrites(tiny_paths, dataset, tmp_path):
    """CoMLRL's names: 3 epochs with checkpoint_interval=2 give checkpoint-2 and checkpoint-3 (epochs
    done). Resuming from checkpoint-2 reaches epoch 3 again: its checkpoint is checkpoint-3.v2, and the
    first run's checkpoint-3 is left as it was."""
    trainer = make_magrpo(tiny_paths, dataset, num_train_epochs=3)
    trainer.train(checkpoint_dir=str(tmp_path), checkpoint_interval=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-3", "run.json"]
    assert read_checkpoint_metadata(str(tmp_path / "checkpoint-2"))["progress"]["epoch"] == 2
    first = (tmp_path / "checkpoint-3" / "manifest.json").read_bytes()
    again = make_magrpo(tiny_paths, dataset, num_train_epochs=3)
    again.train(checkpoint_dir=str(tmp_path), checkpoint_interval=2, resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-3", "checkpoint-3.v2", "run.json"]
    assert (tmp_path / "checkpoint-3" / "manifest.json").read_bytes() == first
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-3.v2")  # the newest save of the run
