"""FSDP2 sharding of agents under torchrun on the CPU (gloo): 2 processes with ``fsdp=True`` train the
same team as one process, export loadable Hugging Face folders, write checkpoints in the unsharded
layout and resume them exactly; and the refusals of settings that cannot work with it."""

import os

import pytest
import torch
from datasets import Dataset
from tests.helpers.dp_scenarios import PROMPTS, magrpo, reward, seed_everything
from tests.helpers.fsdp_scenarios import SCENARIOS
from tests.parallel.test_data_parallel import assert_close_runs, torchrun

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.checkpoint.folder import LoadPlan, validate_components
from comlrl.checkpoint.layout import read_manifest
from comlrl.parallel.fsdp import decoder_layers
from comlrl.checkpoint.layout import read_checkpoint_metadata


def exported(folder):
    """Parameters of a ``save_model`` folder loaded back with ``from_pretrained``, and its file names."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    return [p.detach() for p in model.parameters()], sorted(os.listdir(folder))


@pytest.mark.slow
def test_two_sharded_ranks_train_and_export_the_same_team_as_one_process(tiny_paths, tmp_path):
    (tmp_path / "single").mkdir()
    seed_everything(0)
    with pytest.warns(UserWarning, match="fsdp=True has no effect in a single process"):
        single = SCENARIOS["fsdp_train"](tiny_paths, str(tmp_path / "single"))
    (tmp_path / "double").mkdir()
    double = torchrun("fsdp_train", tiny_paths, tmp_path / "double", module="tests.helpers.fsdp_scenarios")
    for name in ("magrpo", "iac"):
        assert single[name]["sharded"] == [False] * len(single[name]["sharded"])
        assert double[name]["sharded"] == [True] * len(double[name]["sharded"])
        assert_close_runs(single[name], double[name])
    assert double["magrpo"]["eval_rows"] and len(double["magrpo"]["eval_rows"]) == len(single["magrpo"]["eval_rows"])
    for r1, r2 in zip(single["magrpo"]["eval_rows"], double["magrpo"]["eval_rows"]):
        assert r1 == pytest.approx(r2, abs=1e-4)
    # training moved the weights (the comparison above is not between two untouched models)
    seed_everything(0)
    untouched = magrpo(tiny_paths, str(tmp_path / "untouched"), output_dir=None)
    start = [p.detach() for m in untouched.agents for p in m.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, double["magrpo"]["parameters"]))
    # save_model under FSDP: rank 0 writes the gathered weights in the usual layout
    params = iter(double["magrpo"]["parameters"])
    for agent in ("agent_0", "agent_1"):
        loaded, files = exported(tmp_path / "double" / "magrpo-export" / agent)
        assert files == sorted(os.listdir(tmp_path / "single" / "magrpo-export" / agent))
        for tensor in loaded:
            assert torch.equal(tensor, next(params))
    params = iter(double["iac"]["parameters"])  # each actor's backbone, then its value head
    for agent in ("agent_0", "agent_1"):
        folder = tmp_path / "double" / "iac-export" / agent
        loaded, files = exported(folder)
        assert "value_head.pt" in files and files == sorted(os.listdir(tmp_path / "single" / "iac-export" / agent))
        head = torch.load(folder / "value_head.pt", weights_only=True)
        for tensor in loaded + list(head.values()):
            assert torch.equal(tensor, next(params))


@pytest.mark.slow
def test_a_sharded_checkpoint_has_the_unsharded_layout_and_resumes_exactly(tiny_paths, tmp_path):
    result = torchrun("fsdp_checkpointed", tiny_paths, tmp_path, module="tests.helpers.fsdp_scenarios")
    for run in (result, result["iac"]):
        straight, resumed = run["straight"], run["resumed"]
        assert resumed["sharded"] == [True, True]
        for a, b in zip(straight["parameters"], resumed["parameters"]):
            assert torch.equal(a, b)
        assert straight["env_step"] == resumed["env_step"]
        assert straight["rows"] == resumed["rows"]
    assert any("reference_kl_mean" in key for row in result["straight"]["rows"] for key in row)
    folder = tmp_path / "ckpts" / "checkpoint-step-1"
    assert read_checkpoint_metadata(str(folder))["progress"]["global_step"] == 1
    manifest = read_manifest(str(folder))
    assert manifest["models"]["agents.0"]["class"] == "LlamaForCausalLM"
    # The files are those of an unsharded run: a one-process trainer (the accumulate schedule, one
    # parameter group per optimizer) accepts every model and optimizer file of the checkpoint.
    seed_everything(0)
    plain = magrpo(tiny_paths, str(tmp_path / "plain"), output_dir=None, max_grad_norm=1.0, reference_kl_enabled=True)
    components = plain.run.contents.checkpoint_components()
    manifest = dict(manifest, states=sorted(components.states))  # without the per-rank buffers of 2 processes
    plan = LoadPlan(str(folder), manifest, components)
    validate_components(plan)  # tensor names, shapes, dtypes, classes; optimizer groups and moments
    optimizer = plan.optimizers["optimizers.0"]
    assert sorted(optimizer["state"]) == list(range(len(list(plain.agents[0].parameters()))))
    embedding = optimizer["state"][0]["exp_avg"]
    assert embedding.shape == plain.agents[0].get_input_embeddings().weight.shape and embedding.abs().sum() > 0


def test_fsdp_refusals_name_the_setting_before_anything_loads(tiny_paths):
    with pytest.raises(ValueError, match="fsdp=True steps sharded parameters after backward.*optimizer_in_backward"):
        MAGRPOConfig(fsdp=True, optimizer_in_backward=True)
    with pytest.raises(ValueError, match="fsdp must be True or False"):
        MAGRPOConfig(fsdp="yes")
    args = MAGRPOConfig(fsdp=True, parallel_training="mp", agent_devices=["cpu", "cpu"], num_turns=1)
    with pytest.raises(ValueError, match="fsdp=True .* parallel_training='mp'.*use one of them"):
        MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward, args=args)


def test_fsdp_in_one_process_warns_and_trains_unsharded(tiny_paths):
    args = MAGRPOConfig(fsdp=True, num_turns=1, num_generations=2, max_new_tokens=3, rollout_buffer_size=2,
                        num_train_epochs=1, verbose=False, eval_interval=0)
    with pytest.warns(UserWarning, match="torchrun --nproc_per_node=N"):
        trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], reward_func=lambda c: [float(len(x)) for x in c],
                                args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}))
    trainer.train()
    assert trainer.env_step > 0 and trainer.team.sharding is None
    assert trainer.policies[0].optimizer.in_backward  # the schedule of an unsharded run


def test_the_units_are_the_decoder_layers_or_the_root_alone(tiny_paths):
    from transformers import AutoModelForCausalLM

    llama = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    assert decoder_layers(llama) == list(llama.model.layers)  # LlamaDecoderLayer, from _no_split_modules
    gpt2 = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    assert decoder_layers(gpt2) == list(gpt2.transformer.h)
    assert decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []  # no names: the root is the only unit
