"""``comlrl eval`` end to end on tiny models, offline: saved agents and a training checkpoint, greedy
and sampled, pass@k on HumanEval with the real sandbox (completions written by a script, so the
numbers are known), multi-turn, the three files, and every refusal before any model loads."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import yaml

from comlrl.checkpoint.files import file_record
from comlrl.cli.main import main
from tests.helpers.cli_runs import read_jsonl
from tests.helpers.common import length_ratio, prompt_dataset
from tests.helpers.scripted_generation import ScriptedGenerator, answer, main_agent, needs_bwrap

QUIET = ["--offline", "--quiet", "--max-new-tokens", "4"]


def evaluate(*args):
    return main(["eval", *args])


@pytest.fixture
def no_model_loads(monkeypatch):
    """A refusal must come before any model loads (tokenizers and configs may be read)."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture
def saved_run(tiny_paths, tmp_path):
    """A run directory as comlrl train leaves it: agent_0, agent_1 and its config.yaml (tldr, 2 agents)."""
    run = tmp_path / "run"
    for i in range(2):
        shutil.copytree(tiny_paths["llama"], run / f"agent_{i}")
    config = {"environment": "tldr", "agent_model": {"name": "default", "top_p": 0.8},
              "magrpo": {"num_turns": 1, "num_agents": 2, "max_new_tokens": 8, "temperature": 0.9}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.fixture(scope="module")
def trained(tiny_paths, tmp_path_factory):
    """A MAGRPO team trained one epoch with a checkpoint, its export, and the run config naming its sources."""
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    root = tmp_path_factory.mktemp("trained")
    llama = tiny_paths["llama"]
    trainer = MAGRPOTrainer(agents=[llama, llama], reward_func=length_ratio, train_dataset=prompt_dataset(4),
                            args=MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=5, agent_learning_rate=2e-2, num_train_epochs=1,
                                              verbose=False))
    try:
        trainer.train(checkpoint_dir=str(root / "ckpts"))
        trainer.save_model(str(root / "saved"))
        states = [{k: v.detach().clone() for k, v in agent.state_dict().items()} for agent in trainer.agents]
    finally:
        trainer.close()
    (root / "config.yaml").write_text(yaml.safe_dump({"environment": "tldr", "agents": [llama, llama], "magrpo": {"num_turns": 1}}))
    return root, states


# ----------------------------------------------------------------------------- saved agents


def test_saved_agents_greedy_on_the_eval_split(saved_run, capsys):
    out = saved_run / "eval"
    assert evaluate("--agents", str(saved_run), "--output-dir", str(out), *QUIET) == 0  # the run folder stands for agent_0, agent_1
    record = json.loads((out / "eval.json").read_text())
    s = record["settings"]
    assert (s["environment"], s["algorithm"], s["evaluation"], s["decoding"], s["num_turns"]) == ("tldr", "magrpo", "GroupEvaluation", "greedy", 1)
    assert s["config"] == str(saved_run / "config.yaml") and s["max_new_tokens"] == 4 and s["items"] == record["data"]["rows"] == 12
    assert record["data"]["source"].startswith("bundled")
    for agent, model in enumerate(record["models"]):
        assert model["source"] == str(saved_run / f"agent_{agent}")
        assert model["files"]["model.safetensors"] == file_record(str(saved_run / f"agent_{agent}" / "model.safetensors"))
    m = record["metrics"]
    for key in ("eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_1/agent_0/completion_length",
                "eval/turn_1/agent_1/completion_length", "eval/turn_1/level_1", "eval/reward"):
        assert key in m
    rows = read_jsonl(out / "eval_rows.jsonl")
    assert [r["item"] for r in rows] == list(range(12)) and all("sample" not in r and r["turn"] == 1 for r in rows)
    assert m["eval/reward"] == pytest.approx(sum(r["details"]["reward"] for r in rows) / 12)
    lengths = [r["completions"] for r in rows]
    assert all(len(c) == 2 for c in lengths)
    md = (out / "eval.md").read_text()
    assert "## reward_mean\n\n| turn | value |\n|---|---|\n| 1 |" in md
    assert "## completion_length\n\n| turn | agent_0 | agent_1 |" in md and "| episode |" in md
    assert "eval/turn_1/reward_mean" in capsys.readouterr().out
    # an earlier evaluation is never overwritten without --overwrite
    before = (out / "eval.json").read_text()
    assert evaluate("--agents", str(saved_run), "--output-dir", str(out), *QUIET) == 2
    assert "already holds an evaluation (eval.json, eval.md, eval_rows.jsonl)" in capsys.readouterr().err
    assert (out / "eval.json").read_text() == before
    assert evaluate("--agents", str(saved_run), "--output-dir", str(out), "--num-samples", "2", "--overwrite", *QUIET) == 0
    assert json.loads((out / "eval.json").read_text())["settings"]["items"] == 2 and len(read_jsonl(out / "eval_rows.jsonl")) == 2


def test_a_user_dataset_and_sampled_episodes(saved_run, tmp_path):
    data = tmp_path / "posts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Post number {i}: the quick brown fox."}) for i in range(3)) + "\n")
    out = tmp_path / "eval"
    assert evaluate("--agents", str(saved_run / "agent_0"), str(saved_run / "agent_1"), "--dataset", str(data), "--sample", "2",
                    "--temperature", "1.0", "--seed", "5", "--output-dir", str(out), *QUIET) == 0
    record = json.loads((out / "eval.json").read_text())
    assert record["data"] == {"source": str(data), "rows": 3}
    s = record["settings"]  # the flag's temperature, the run config's top_p (its agent_model section)
    assert (s["decoding"], s["samples_per_item"], s["temperature"], s["top_p"], s["max_new_tokens"]) == ("sampled", 2, 1.0, 0.8, 4)
    assert "eval/turn_1/best_of_2/reward_mean" in record["metrics"]
    rows = read_jsonl(out / "eval_rows.jsonl")
    assert [(r["item"], r["sample"]) for r in rows] == [(i, s) for i in range(3) for s in range(2)]
    again = tmp_path / "again"
    assert evaluate("--agents", str(saved_run), "--dataset", str(data), "--sample", "2", "--temperature", "1.0", "--seed", "5",
                    "--batch-size", "3", "--output-dir", str(again), *QUIET) == 0
    assert [r["completions"] for r in read_jsonl(again / "eval_rows.jsonl")] == [r["completions"] for r in rows]  # seeded, any batch


def test_lora_adapter_folders_evaluate_on_their_base(tiny_paths, tmp_path):
    from peft import LoraConfig

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    llama = tiny_paths["llama"]
    trainer = MAGRPOTrainer(agents=[llama, llama], reward_func=length_ratio, args=MAGRPOConfig(num_turns=1, verbose=False),
                            peft_config=LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    try:
        trainer.save_model(str(tmp_path / "saved"))  # adapter folders: no config.json, the base named in adapter_config.json
    finally:
        trainer.close()
    out = tmp_path / "eval"
    assert evaluate("--agents", str(tmp_path / "saved"), "--env", "tldr", "--num-samples", "2", "--output-dir", str(out), *QUIET) == 0
    models = json.loads((out / "eval.json").read_text())["models"]
    assert set(models[0]["files"]) == {"adapter_model.safetensors"}
    assert len(read_jsonl(out / "eval_rows.jsonl")) == 2


# ----------------------------------------------------------------------------- pass@k, several turns


@needs_bwrap
def test_pass_at_k_through_the_cli_on_two_turns_of_humaneval(tiny_paths, tmp_path, monkeypatch):
    from comlrl.rollout import generation

    scripted = ScriptedGenerator(agent=None, answer=lambda agent, prompt, n: answer(main_agent(prompt), prompt, n))
    monkeypatch.setattr(generation.HFGenerator, "generate", lambda self, *args, **kwargs: scripted.generate(*args, **kwargs))
    out = tmp_path / "eval"
    llama = tiny_paths["llama"]
    assert evaluate("--agents", llama, llama, "--config", "magrpo_he_config.yaml", "--env-option", "isolation=bwrap",
                    "--sample", "4", "--pass-k", "1,2", "--seed", "3", "--output-dir", str(out), *QUIET) == 0
    record = json.loads((out / "eval.json").read_text())
    assert record["settings"]["environment_options"]["isolation"] == "bwrap" and record["settings"]["num_turns"] == 2
    m = record["metrics"]
    # the numbers worked out in tests/trainers/test_evaluation_engine.py (rotate_left c=2 then 4, second_largest c=0 then 1)
    assert m["eval/turn_1/pass@1"] == pytest.approx(0.25) and m["eval/turn_1/pass@2"] == pytest.approx(5 / 12)
    assert m["eval/turn_2/pass@1"] == pytest.approx(0.625) and m["eval/turn_2/pass@2"] == pytest.approx(0.75)
    assert m["eval/pass@2"] == pytest.approx(0.75)
    rows = read_jsonl(out / "eval_rows.jsonl")
    assert len(rows) == 2 * 4 * 2 and {r["turn"] for r in rows} == {1, 2}
    assert all(r["task_id"] and "passed_tests" in r["details"] for r in rows)
    assert "## pass@2\n\n| turn | value |\n|---|---|\n| 1 | 0.4167 |\n| 2 | 0.7500 |\n| episode | 0.7500 |" in (out / "eval.md").read_text()


# ----------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_evaluates_its_own_weights(trained, tmp_path, tiny_paths):
    from comlrl.cli.eval_team import load_checkpoint_agents, read_checkpoint
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    root, states = trained
    fresh = MAGRPOTrainer(agents=[tiny_paths["llama"]] * 2, reward_func=length_ratio, args=MAGRPOConfig(num_turns=1, verbose=False))
    try:
        base = [{k: v.clone() for k, v in agent.state_dict().items()} for agent in fresh.agents]
        assert any(not torch.equal(base[0][k], states[0][k]) for k in base[0])  # training moved the weights
        load_checkpoint_agents(read_checkpoint(str(root / "ckpts")), fresh.agents)
        for agent, state in zip(fresh.agents, states):
            assert all(torch.equal(agent.state_dict()[k], state[k]) for k in state)
    finally:
        fresh.close()
    by_checkpoint, by_export = tmp_path / "ckpt", tmp_path / "export"
    assert evaluate("--checkpoint", str(root / "ckpts"), "--config", str(root / "config.yaml"), "--num-samples", "3",
                    "--output-dir", str(by_checkpoint), *QUIET) == 0
    assert evaluate("--agents", str(root / "saved"), "--env", "tldr", "--num-samples", "3", "--output-dir", str(by_export), *QUIET) == 0
    rows = [read_jsonl(folder / "eval_rows.jsonl") for folder in (by_checkpoint, by_export)]
    assert [r["completions"] for r in rows[0]] == [r["completions"] for r in rows[1]]  # the checkpoint is the exported team
    model = json.loads((by_checkpoint / "eval.json").read_text())["models"][1]
    assert model["model"] == "agents.1" and model["trainer_class"].endswith("MAGRPOTrainer") and model["files"]
    assert model["checkpoint"].endswith("checkpoint-1")


# ----------------------------------------------------------------------------- refusals, before any model loads


def refused(capsys, *args):
    assert evaluate(*args) == 2
    return capsys.readouterr().err


def test_team_size_and_order_are_refused(saved_run, tiny_paths, capsys, no_model_loads):
    a0, a1 = str(saved_run / "agent_0"), str(saved_run / "agent_1")
    err = refused(capsys, "--agents", a1, a0, *QUIET)
    assert f"'{a1}' is given as agent 0, but it is agent 1 of its team" in err and f"--agents {a0} {a1}" in err
    err = refused(capsys, "--agents", a0, "--env", "humaneval", *QUIET)
    assert "--agents gives 1 agents, but their run" in err and "trained a team of 2" in err
    llama = tiny_paths["llama"]
    err = refused(capsys, "--agents", llama, llama, llama, "--env", "tldr", *QUIET)
    assert "--agents gives 3 agent folders, but the tldr environment takes 1 or 2 agents" in err


def test_a_tokenizer_that_does_not_fit_its_model_is_refused(tiny_paths, tmp_path, capsys, no_model_loads):
    mixed = tmp_path / "mixed"  # the llama model with the gpt2 tokenizer (360 tokens for an embedding of about 300)
    shutil.copytree(tiny_paths["llama"], mixed)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (mixed / name).unlink(missing_ok=True)
        if os.path.exists(os.path.join(tiny_paths["gpt2"], name)):
            shutil.copy(os.path.join(tiny_paths["gpt2"], name), mixed)
    err = refused(capsys, "--agents", str(mixed), tiny_paths["llama"], "--env", "tldr", *QUIET)
    assert "agent 0's tokenizer" in err and "tokens but its model's embedding has" in err


def test_checkpoint_refusals(trained, tiny_paths, tmp_path, capsys, no_model_loads):
    root, _ = trained
    ckpts = str(root / "ckpts")
    err = refused(capsys, "--checkpoint", ckpts, "--config", str(root / "config.yaml"), "--algorithm", "iac", *QUIET)
    assert "is a checkpoint of MAGRPOTrainer (reinforce family), but --algorithm asks for iac (actor_critic family)" in err
    other = tmp_path / "other.yaml"
    gpt2 = tiny_paths["gpt2"]
    other.write_text(yaml.safe_dump({"environment": "tldr", "agents": [gpt2, gpt2], "magrpo": {"num_turns": 1}}))
    err = refused(capsys, "--checkpoint", ckpts, "--config", str(other), *QUIET)
    assert "agent 0's tokenizer from" in err and "is not the one the checkpoint was trained with" in err
    lone = tmp_path / "lone"  # without the run directory's config.yaml (found two levels up, where comlrl train puts it)
    shutil.copytree(ckpts, lone)
    err = refused(capsys, "--checkpoint", str(lone), *QUIET)
    assert "no run config (config.yaml, written by comlrl train) was found" in err and "--env NAME" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    err = refused(capsys, "--checkpoint", str(empty), "--env", "tldr", *QUIET)
    assert f"--checkpoint '{empty}'" in err and "not a comlrl checkpoint" in err


def test_data_and_decoding_refusals(saved_run, tmp_path, capsys, no_model_loads):
    run = str(saved_run)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "has no rows to evaluate" in refused(capsys, "--agents", run, "--dataset", str(empty), *QUIET)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"text": "no prompt column"}) + "\n")
    err = refused(capsys, "--agents", run, "--dataset", str(wrong), *QUIET)
    assert "row 1 does not fit the tldr environment" in err
    err = refused(capsys, "--agents", run, "--sample", "4", "--pass-k", "1,2", *QUIET)
    assert "the tldr environment's reward breakdown counts no tests" in err
    assert "pass@k needs 1 <= k <= the samples per item (2); use --sample 5" in refused(capsys, "--agents", run, "--sample", "2",
                                                                                       "--pass-k", "1,5", *QUIET)
    assert "--num-turns 2: num_turns=2: the writing tasks are single-turn" in refused(capsys, "--agents", run, "--num-turns", "2", *QUIET)
    err = refused(capsys, "--agents", run, "--env-option", "externl_mode=plain", *QUIET)
    assert "Unknown option(s) for environment 'tldr': 'externl_mode'" in err
    assert "--env-option 'num_turns=2': num_turns comes from --num-turns" in refused(capsys, "--agents", run, "--env-option", "num_turns=2", *QUIET)
    with pytest.raises(SystemExit) as exit_info:
        evaluate("--agents", run, "--split", "test", *QUIET)
    assert exit_info.value.code == 2 and "invalid choice: 'test'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate("--agents", run, "--greedy", "--sample", "2", *QUIET)


def test_a_split_without_rows_is_refused(saved_run, capsys, no_model_loads):
    from datasets import Dataset

    from comlrl.envs import Environment, register_environment

    def build(options):
        def loader(*, split, **_):
            return Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}] if split == "train" else [])

        fmt = lambda row, external_prompts=None: row["prompt"]  # noqa: E731
        return Environment(name="evaltest_no_eval_rows", num_agents=2, num_turns=1, formatters=[fmt, fmt],
                           reward_func=lambda a, b, batch_items=None: [0.0] * len(a), options=options, loader=loader)

    register_environment("evaltest_no_eval_rows", build, replace=True)
    err = refused(capsys, "--agents", str(saved_run), "--env", "evaltest_no_eval_rows", *QUIET)
    assert "--split eval of evaltest_no_eval_rows has no rows to evaluate; choose another split" in err
