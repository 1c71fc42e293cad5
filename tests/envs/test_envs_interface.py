"""The public interface of comlrl.envs, dataset loaders (sample, local "real" folder, fallback) and transitions."""

from __future__ import annotations

import json

import pytest

from comlrl.envs import get_environment, list_environments
from comlrl.envs.sources import DATASETS_DIR_ENV

ALL = ["arxiv", "classeval", "coophumaneval", "housebuild", "humaneval", "mbpp", "strbuild", "tldr"]
FIELDS = {
    "tldr": ["prompt"], "arxiv": ["abstract_text"], "humaneval": ["task_id", "prompt", "test", "entry_point"],
    "coophumaneval": ["task_id", "prompt", "test", "entry_point"], "mbpp": ["task_id", "prompt", "test", "entry_point"],
    "classeval": ["task_id", "skeleton", "test", "class_name", "prompt"],
    "strbuild": ["task_id", "string", "difficulty", "local_bbox_from", "local_bbox_to", "target_rows_topdown"],
    "housebuild": ["task_id", "inventory", "count", "target_spec", "local_bbox_from", "local_bbox_to", "layers_by_y"],
}


def test_list_environments():
    assert list_environments() == ALL


@pytest.mark.parametrize("name", ALL)
def test_every_environment_has_the_interface(name):
    env = get_environment(name)
    assert env.name == name and env.num_agents == 2 and len(env.formatters) == 2
    train = env.load_dataset("train", offline=True)
    evaluation = env.load_dataset("eval", offline=True)
    assert len(train) >= 2 and len(evaluation) >= 2
    for field in FIELDS[name]:
        assert field in train.column_names
    row = train[0]
    prompts = [formatter(row) for formatter in env.formatters]
    assert all(isinstance(p, str) and p for p in prompts) and prompts[0] != prompts[1]
    rewards = env.reward_func(["x", "y"], ["z", "w"], batch_items=[row])
    assert len(rewards) == 2 and all(isinstance(r, float) for r in rewards)
    details = env.reward_details(["x"], ["z"], batch_items=[row])
    assert details[0]["reward"] == rewards[0]
    assert "level_1" in details[0] or "ce_reward/level1_syntax" in details[0]  # ClassEval: the task repository's eval names
    assert (env.external_transition is None) == (env.num_turns == 1)
    if env.external_transition is not None:
        nxt = env.external_transition(prompt=row["prompt"], agent_completions=["x", "z"], num_agents=2,
                                      prompt_history_per_agent=[[prompts[0]], [prompts[1]]], response_history_per_agent=[["x"], ["z"]])
        assert len(nxt) == 2 and all(isinstance(p, str) and p for p in nxt)
        # the formatters pass a transition prompt through unchanged
        assert env.formatters[0](row, external_prompts=nxt[0]) == nxt[0]


def test_unknown_names_and_options_are_refused():
    with pytest.raises(ValueError, match="Unknown environment 'tdlr'.*did you mean 'tldr'"):
        get_environment("tdlr")
    with pytest.raises(ValueError, match="Unknown option.*'externl_mode'.*did you mean 'external_mode'"):
        get_environment("humaneval", externl_mode="plain")
    with pytest.raises(ValueError, match="external_mode"):
        get_environment("strbuild", external_mode="level_feedback")
    assert get_environment("str_build").name == "strbuild"  # the task repositories' dataset.type


def test_single_and_multi_turn():
    assert get_environment("humaneval", num_turns=1).external_transition is None
    assert get_environment("humaneval", num_turns=2).external_transition is not None
    assert get_environment("housebuild", num_turns=1, seed=0).external_transition is None


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_real_dataset_path_with_the_original_slices(tmp_path, monkeypatch):
    # a local stand-in for openai/openai_humaneval: 40 rows in a "test" split
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    pass\n", "canonical_solution": "", "test": "def check(candidate):\n    assert candidate(1) == 1\n",
             "entry_point": f"f{i}"} for i in range(40)]
    write_jsonl(tmp_path / "openai" / "openai_humaneval" / "test.jsonl", rows)
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path))
    env = get_environment("humaneval")
    train = env.load_dataset("train", offline=False)
    evaluation = env.load_dataset("eval", offline=False)
    # original slices: train test[33:163] (here 33..39), eval test[:32]
    assert train["task_id"] == [f"HumanEval/{i}" for i in range(33, 40)]
    assert evaluation["task_id"] == [f"HumanEval/{i}" for i in range(32)]
    assert env.load_dataset("train", offline=False, hf_split="test[:3]", limit=2)["task_id"] == ["HumanEval/0", "HumanEval/1"]
    # None prefers the real data when it loads
    assert env.load_dataset("eval")["task_id"][0] == "HumanEval/0"
    # the transition knows the rows it loaded
    nxt = env.external_transition(prompt=rows[35]["prompt"], agent_completions=["", ""], num_agents=2)
    assert "f35" in nxt[1]


def test_real_dataset_with_the_wrong_schema_is_refused(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "trl-lib" / "tldr" / "train.jsonl", [{"text": "no prompt field"}])
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="no field.*'prompt'"):
        get_environment("tldr").load_dataset("train", offline=False)


def test_unreachable_real_dataset(tmp_path, monkeypatch, capsys):
    from comlrl.envs import sources

    monkeypatch.setattr(sources, "_NOTICES", set())  # the notice prints once per process: not yet in this test
    monkeypatch.setenv(DATASETS_DIR_ENV, str(tmp_path))  # empty: falls through to the hub, which is offline in tests
    env = get_environment("tldr")
    with pytest.raises(ValueError, match="Could not load the tldr dataset 'trl-lib/tldr'.*offline=True"):
        env.load_dataset("train", offline=False)
    with pytest.raises(ValueError, match="allow_sample_fallback=True"):  # None: the real data, never silently the sample
        env.load_dataset("train", offline=None)
    sample = env.load_dataset("train", offline=None, allow_sample_fallback=True)
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "using the bundled sample instead of trl-lib/tldr" in notice
    assert sample["prompt"] == env.load_dataset("train", offline=True)["prompt"]


def test_load_dataset_argument_checks():
    env = get_environment("tldr")
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        env.load_dataset("test")
    with pytest.raises(ValueError, match="limit"):
        env.load_dataset("train", offline=True, limit=0)


def test_minecraft_splits():
    env = get_environment("strbuild")
    assert env.load_dataset("train")["string"] == ["I", "C", "M", "L", "MC", "CM", "LI", "LLM"]
    assert env.load_dataset("eval")["string"] == ["ICML", "CLIM"]
    assert env.load_dataset("train", hf_split="[2:4]")["string"] == ["M", "L"]
    with pytest.raises(ValueError, match=r"\[start:stop\]"):
        env.load_dataset("train", hf_split="train[:2]")


def test_a_transition_refuses_an_unknown_prompt():
    env = get_environment("humaneval")
    with pytest.raises(ValueError, match="matches no row"):
        env.external_transition(prompt="never seen", agent_completions=["", ""], num_agents=2)
