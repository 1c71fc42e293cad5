"""``comlrl train`` with the preference trainers: their sections, entity rules and runs end to end
(tiny local models, offline)."""

from __future__ import annotations

import json
import os
import re

import pytest

from comlrl.cli.main import main


def tiny(section: str, tokens: int = 32, candidates: int = 6):
    # 32 new tokens and 6 candidates give the tiny models' TLDR summaries different rewards, so pairs exist
    return [
        "dataset.offline=true", "dataset.num_train_items=2", "dataset.num_eval_items=1", f"{section}.num_train_epochs=1",
        f"{section}.max_new_tokens={tokens}", f"{section}.preference_num_candidates={candidates}", f"{section}.eval_interval=1",
        f"{section}.eval_num_samples=1", f"{section}.logging_steps=1", "output.verbose=false",
    ]


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def dry_run(args, capsys):
    assert main(["train", *args, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_madpo_runs_through_comlrl_train(chat_models, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--algorithm", "madpo", "--output-dir", str(run), "--override",
                 f"agent_model.name={chat_models['llama']}", *tiny("madpo")]) == 0
    metrics = read_jsonl(run / "metrics.jsonl")
    collected = [row for row in metrics if "collect/pairs_per_item" in row]
    assert collected and collected[0]["collect/pairs_per_item"] > 0
    assert any("madpo/loss" in row and "agent_1/logp_margin" in row for row in metrics)  # the pairs were learned from
    assert any("eval/turn_1/reward_mean" in row for row in metrics)  # evaluation uses the task reward
    for name in ("reward_curve.png", "run_config.json", "resolved_config.yaml", "agent_0/config.json", "agent_1/config.json"):
        assert os.path.getsize(run / name) > 0, name
    with open(run / "run_config.json") as handle:
        assert json.load(handle)["trainer"] == "MADPOTrainer"


def test_marlhf_with_an_actor_critic_backend_runs_and_exports_its_reward_model(chat_models, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--algorithm", "marlhf", "--output-dir", str(run), "--override",
                 f"agent_model.name={chat_models['llama']}", "marlhf.rl_algorithm=iac", "marlhf.reward_model_device=None",
                 "marlhf.reward_num_train_epochs=1", *tiny("marlhf")]) == 0
    metrics = read_jsonl(run / "metrics.jsonl")
    assert any("reward_model/loss" in row for row in metrics)  # reward learning ran on the collected pairs
    assert any("turn_1/reward_mean" in row for row in metrics)  # then online RL against the learned reward
    assert os.path.isfile(run / "reward_model" / "config.json") and os.path.isfile(run / "agent_1" / "config.json")


def test_preference_sections_and_fallbacks(capsys):
    d = dry_run(["--config", "madpo_iter_che_config.yaml"], capsys)
    assert d["trainer"] == "MADPOIterTrainer" and d["environment"] == "coophumaneval"
    c = d["config"]["MADPOIterConfig"]
    assert (c["num_iterations"], c["num_train_epochs"], c["preference_num_candidates"], c["preference_pairs_per_sample"],
            c["dpo_beta"]) == (4, 2, 20, 4, 0.1)
    # the iterative trainers read their base's section when theirs is absent
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--algorithm", "madpo_iter", "--override", "madpo.dpo_beta=0.3"], capsys)
    assert d["config"]["MADPOIterConfig"]["dpo_beta"] == 0.3
    # MARLHF's actor-critic backends take critic entities (default: the first actor, so none is required)
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--algorithm", "marlhf", "--override", "marlhf.rl_algorithm=maac",
                 "critic_model.name=Qwen/C"], capsys)
    assert d["entities"]["critic_model"] == "Qwen/C" and d["config"]["MARLHFConfig"]["rl_algorithm"] == "maac"


PREFERENCE_REFUSALS = [
    (["--algorithm", "madpo", "--override", "critic_model.name=Qwen/C"], r"madpo trains no critic, but critic_model\.name is set"),
    (["--algorithm", "marlhf", "--override", "critic_model.name=Qwen/C"],
     r"marlhf with rl_algorithm='magrpo' trains no critic, but critic_model\.name is set"),
    (["--algorithm", "marlhf", "--override", "marlhf.rl_algorithm=maac", 'critics=["A","B"]'], r"critics lists 2 models but marlhf needs 1"),
    (["--algorithm", "madpo", "--override", "madpo.reward_model_name=x"], r"madpo\.reward_model_name"),
    (["--algorithm", "madpo", "--override", "madpo.num_turns=2"], r"num_turns=1 only"),
    (["--algorithm", "madpo_iter", "--override", "madpo_iter.comparator_api_format=soap"], r"comparator_api_format"),
]


@pytest.mark.parametrize("args, message", PREFERENCE_REFUSALS)
def test_preference_refusals_name_the_key(args, message, capsys):
    assert main(["train", "--config", "magrpo_tldr_config.yaml", *args]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
