"""The task repositories' single-agent baselines: ``num_agents=1`` environments (writing: one completion
split at ``[PARAGRAPH_SPLIT]``; code: the entry point alone), the ``grpo`` / ``ac`` algorithms, their
bundled configs resolved field by field, and one end-to-end run per algorithm and task family."""

from __future__ import annotations

import json
import os

import pytest
from tests.helpers.common import bundled_bf16_expected, no_signal_expected

from comlrl.cli.main import main
from comlrl.envs import get_environment
from comlrl.envs.writing.single import SPLIT_LABEL, SPLIT_MARKER, SPLIT_THIRD, split_paragraphs

from tests.helpers.cli_runs import read_jsonl, tiny, train
from tests.envs.test_writing_rewards import C1, C2

# ----------------------------------------------------------------------------- the split


def test_split_at_the_marker_label_or_one_third():
    assert split_paragraphs(f"Paragraph 1: {C1}\n[PARAGRAPH_SPLIT]\nParagraph 2: {C2}") == (C1, C2, SPLIT_MARKER)
    # only the first marker splits; the rest stays in part 2
    assert split_paragraphs("a [PARAGRAPH_SPLIT] b [PARAGRAPH_SPLIT] c") == ("a", "b [PARAGRAPH_SPLIT] c", SPLIT_MARKER)
    # no marker: before the first "Paragraph 2:" (any case), its trailing whitespace dropped
    assert split_paragraphs(f"paragraph 1:  {C1}\n\nPARAGRAPH 2:\n{C2}") == (C1, C2, SPLIT_LABEL)
    # neither: at len // 3 of the stripped text: 30 characters -> cut after 10
    text = "abcdefghij" * 3
    assert split_paragraphs(f"  {text}  ") == ("abcdefghij", "abcdefghij" * 2, SPLIT_THIRD)
    # a 2-character text: 2 // 3 = 0 -> at least 1
    assert split_paragraphs("xy") == ("x", "y", SPLIT_THIRD)
    assert split_paragraphs("") == ("", "", SPLIT_THIRD)


# ----------------------------------------------------------------------------- the environments


def test_tldr_single_agent_scores_the_halves_with_the_two_agent_reward():
    single, pair = get_environment("tldr", num_agents=1), get_environment("tldr")
    row = single.load_dataset("train", offline=True)[0]
    assert single.num_agents == 1 and len(single.formatters) == 1 and single.external_transition is None
    prompt = single.formatters[0](row)
    assert row["prompt"] in prompt and "[PARAGRAPH_SPLIT]" in prompt and "Paragraph 2:" in prompt
    d = single.reward_details([f"Paragraph 1: {C1}\n[PARAGRAPH_SPLIT]\nParagraph 2: {C2}"], batch_items=[row])[0]
    # C1 (8 tokens, 33 chars, 7 words; 5 without stopwords) and C2 (15 tokens, 60 chars, 15 words, "thus"):
    # level 1 0.5; level 2 ratio 60/33 = 1.82 on the plateau 1.6..3.2 -> 1.0; level 3 15/7 = 2.14 >= 2.0 -> 0.5;
    # level 4: T = 0.4 (one category); J = |{cat}| / |5 + 15 - 1| = 1/19 >= cap 0.03 -> 0.4 * 0.4 + 0.6 = 0.76
    assert (d["level_1"], d["level_2"], d["level_3"]) == (0.5, 1.0, 0.5)
    assert d["level_4"] == pytest.approx(0.76) and d["reward"] == pytest.approx(2.76) and d["split"] == SPLIT_MARKER
    assert single.reward_func([f"{C1}\nParagraph 2: {C2}"], batch_items=[row]) == pair.reward_func([C1], [C2], batch_items=[row])
    # no marker, no label: 33 + 1 + 60 = 94 characters, cut at 94 // 3 = 31, inside C1's last word
    joined = C1 + " " + C2
    d = single.reward_details([joined], batch_items=[row])[0]
    assert joined[:31] == "The cat sat on the warm mat tod" and d["split"] == SPLIT_THIRD
    assert d["reward"] == pair.reward_func([joined[:31]], [joined[31:]], batch_items=[row])[0]


def test_arxiv_single_agent_prompt():
    env = get_environment("arxiv", num_agents=1)
    row = env.load_dataset("eval", offline=True)[0]
    prompt = env.formatters[0](row)
    assert row["abstract_text"] in prompt and "[PARAGRAPH_SPLIT]" in prompt and "background and the motivation" in prompt


CODE_ROW = {
    "task_id": "t/0", "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n    assert candidate(2, 2) == 4\n",
    "entry_point": "add",
}


def test_code_single_agent_reward_and_prompt():
    env = get_environment("humaneval", num_agents=1, num_turns=1, test_timeout_s=1.0)
    prompt = env.formatters[0](CODE_ROW)
    assert "def add(a, b):" in prompt and "aux" not in prompt
    d = env.reward_details(["def add(a, b):\n    return a + b"], batch_items=[CODE_ROW])[0]
    # no aux: 0.6 (main defined) + 0.5 (syntax) + 3/3 tests = 2.1, and no cooperation level without aux
    assert d["reward"] == pytest.approx(2.1) and d["level_1"] == pytest.approx(0.6) and d["level_4"] == 0.0
    # an aux written in the same completion is not the helper agent's: only the entry point is kept, so its call fails
    both = "def aux(a, b):\n    return a + b\n\ndef add(a, b):\n    return aux(a, b)"
    d = env.reward_details([both], batch_items=[CODE_ROW])[0]
    assert d["passed_tests"] == 0 and d["reward"] == pytest.approx(1.1)


@pytest.mark.parametrize("mode", ["level_feedback", "level_passed", "passed", "plain"])
def test_code_single_agent_feedback_speaks_of_the_entry_point_only(mode):
    env = get_environment("mbpp", num_agents=1, external_mode=mode, test_timeout_s=1.0, original_prompt=True)
    env.rows.add([CODE_ROW])
    first = env.formatters[0](CODE_ROW)
    wrong = "def add(a, b):\n    return a - b"
    (nxt,) = env.external_transition(prompt=CODE_ROW["prompt"], agent_completions=[wrong], num_agents=1,
                                     prompt_history_per_agent=[[first]], response_history_per_agent=[[wrong]])
    assert "aux" not in nxt.lower() and "add(...)" in nxt
    if mode == "level_feedback":
        # sandbox_slice 1: the first assert only; 1 - 2 != 3
        assert "Main definition: FOUND" in nxt and "Tests: 0/1 passed" in nxt and "Failed: assert add(1, 2) == 3" in nxt
        assert "- Turn 1 prompt:\n" + first in nxt and "- Turn 1 response:\n" + wrong in nxt
    with pytest.raises(ValueError, match="1 agent"):
        env.external_transition(prompt=CODE_ROW["prompt"], agent_completions=[wrong, wrong], num_agents=2)


def test_team_sizes_are_checked():
    with pytest.raises(ValueError, match="num_agents must be 1 or 2"):
        get_environment("tldr", num_agents=3)
    with pytest.raises(ValueError, match="num_agents must be 1 or 2"):
        get_environment("humaneval", num_agents=0)
    with pytest.raises(ValueError, match="Unknown option.*'num_agents'"):
        get_environment("housebuild", num_agents=1)  # the Minecraft tasks are two-agent only


# ----------------------------------------------------------------------------- resolution


def dry_run(args, capsys):
    assert main(["train", *args, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_grpo_tldr_resolves_to_magrpo_with_one_agent(capsys):
    d = dry_run(["--config", "configs/grpo_tldr_config.yaml"], capsys)
    assert (d["algorithm"], d["trainer"], d["environment"]) == ("grpo", "MAGRPOTrainer", "tldr")
    assert d["entities"] == {"agent_model": "Qwen/Qwen3-1.7B", "agents": None, "critic_model": None, "critics": None, "num_agents": 1}
    c = d["config"]["MAGRPOConfig"]
    # OpenMLRL/LLM_Collab_Writing configs/grpo_tldr_config.yaml; sampling from agent_model; -0.2 from train_grpo.py
    expected = {"num_agents": 1, "num_turns": 1, "num_train_epochs": 1, "agent_learning_rate": 5e-6, "logging_steps": 400,
                "num_generations": 4, "max_new_tokens": 256, "joint_mode": "aligned", "rollout_buffer_size": 2, "train_batch_size": 2,
                "advantage_normalization": True, "eval_interval": 4, "eval_num_samples": 4, "eval_batch_size": 1,
                "temperature": 0.6, "top_p": 0.6, "top_k": None, "early_termination_threshold": -0.2, "output_dir": "output_grpo_tldr"}
    assert {k: c[k] for k in expected} == expected
    assert d["environment_options"] == {"num_turns": 1, "num_agents": 1}
    assert d["dataset"]["train_split"] == "train[:1000]" and d["dataset"]["eval_split"] == "test[:1000]"
    assert d["reward_processor"] == {"scale_factor": 1.0, "shift": 0.0}


def test_ac_arxiv_resolves_to_iac_with_one_agent(capsys):
    d = dry_run(["--config", "ac_arxiv_config.yaml"], capsys)
    assert (d["algorithm"], d["trainer"], d["environment"]) == ("ac", "IACTrainer", "arxiv")
    assert d["entities"] == {"agent_model": "Qwen/Qwen3-1.7B", "agents": None, "critic_model": "Qwen/Qwen3-1.7B", "critics": None,
                             "num_agents": 1, "use_separate_critic": True}
    c = d["config"]["IACConfig"]
    expected = {"num_agents": 1, "num_turns": 1, "num_train_epochs": 4, "agent_learning_rate": 5e-6, "critic_learning_rate": 5e-6,
                "value_loss_coef": 0.6, "value_clip_range": 0.2, "advantage_normalization": True, "rollout_buffer_size": 4,
                "max_new_tokens": 512, "num_generations": 1, "discount": 0.9, "eval_interval": 20, "eval_num_samples": 4,
                "logging_steps": 100, "temperature": 0.7, "top_p": 0.9, "use_separate_critic": True}
    assert {k: c[k] for k in expected} == expected
    assert d["seed"] == 42 and d["dataset"]["eval_split"] == "val[:1000]"


@pytest.mark.parametrize("task, split, epochs, lr", [("he", "test[:32]", 6, 2e-5), ("che", "train[:16]", 20, 2e-5), ("mbpp", "test[:15]", 8, 3e-5)])
def test_grpo_code_configs(task, split, epochs, lr, capsys):
    d = dry_run(["--config", f"grpo_{task}_config.yaml"], capsys)
    c = d["config"]["MAGRPOConfig"]
    # OpenMLRL/LLM_Collab_Code_Generation configs/grpo_*_config.yaml at 09408c8: the section's sampling wins
    expected = {"num_agents": 1, "num_turns": 2, "num_train_epochs": epochs, "agent_learning_rate": lr, "logging_steps": 50,
                "num_generations": 4, "max_new_tokens": 256, "temperature": 0.8, "top_p": 0.95, "top_k": None, "discount": 0.9,
                "early_termination_threshold": -0.1, "rollout_buffer_size": 2, "train_batch_size": 2, "eval_interval": 4,
                "eval_num_samples": 4}
    assert {k: c[k] for k in expected} == expected
    assert d["environment_options"] == {"external_mode": "level_feedback", "sandbox_slice": 1, "num_turns": 2, "num_agents": 1}
    assert d["reward_processor"] == {"scale_factor": 1.0, "shift": -2.1} and d["dataset"]["eval_split"] == split
    assert d["model_config"] == {"torch_dtype": "bfloat16"}


@pytest.mark.parametrize("task", ["he", "che", "mbpp"])
def test_ac_code_configs(task, capsys):
    d = dry_run(["--config", f"ac_{task}_config.yaml"], capsys)
    c = d["config"]["IACConfig"]
    expected = {"num_agents": 1, "num_turns": 2, "num_train_epochs": 80, "agent_learning_rate": 5e-6, "critic_learning_rate": 5e-6,
                "value_loss_coef": 0.6, "rollout_buffer_size": 4, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6,
                "discount": 0.9, "early_termination_threshold": -0.2, "eval_interval": 40, "eval_num_samples": 4,
                "num_generations": 1, "value_clip_range": 0.2}
    assert {k: c[k] for k in expected} == expected
    assert d["entities"]["critic_model"] == "Qwen/Qwen2.5-Coder-3B" and d["entities"]["num_agents"] == 1
    assert d["reward_processor"]["shift"] == -4.0 and d["seed"] == 42
    assert d["model_config"] == {"torch_dtype": "bfloat16", "critic_model_kwargs": {"torch_dtype": "bfloat16"}}


def test_grpo_on_a_minecraft_config_is_refused(capsys):
    assert main(["train", "--config", "str_build_magrpo_config.yaml", "--algorithm", "grpo", "--dry-run"]) == 2
    assert "grpo trains 1 agent" in capsys.readouterr().err


# ----------------------------------------------------------------------------- end to end


def check_single_run(run_dir, detail_keys, layout="agent_0"):
    """``layout``: where the agent is saved: ``agent_0/`` (MAGRPO's export) or the run directory itself
    (IAC with one agent, CoMLRL 1.4.3's layout)."""
    for name in ("config.yaml", "resolved_config.yaml", "metrics.jsonl", "eval_rows.jsonl", "reward_curve.png"):
        assert os.path.getsize(run_dir / name) > 0, name
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    keys = {key for row in metrics for key in row}
    assert any(k.startswith("agent_0/") for k in keys) and not any(k.startswith("agent_1/") for k in keys)
    rows = read_jsonl(run_dir / "eval_rows.jsonl")
    assert rows and all(len(row["completions"]) == 1 and set(detail_keys) <= set(row["details"]) for row in rows)
    saved = run_dir / "agent_0" if layout == "agent_0" else run_dir
    assert os.path.exists(saved / "config.json") and os.path.exists(saved / "model.safetensors") and not os.path.exists(run_dir / "agent_1")
    return metrics, rows


# tiny random models: all answers of a step may score alike, and the trainer says so
# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@no_signal_expected
@bundled_bf16_expected
def test_grpo_tldr_end_to_end(chat_models, tmp_path):
    run = train("configs/grpo_tldr_config.yaml", [f"agent_model.name={chat_models['qwen']}", "grpo.num_generations=2", *tiny("grpo")],
                tmp_path / "run")
    _, rows = check_single_run(run, ["level_1", "reward", "split"])
    # the eval row's details are the split completion's: the same reward as scoring its halves with two agents
    pair = get_environment("tldr")
    first, second, _ = split_paragraphs(rows[0]["completions"][0])
    assert rows[0]["details"]["reward"] == pair.reward_func([first], [second], batch_items=[{"prompt": "p"}])[0]


# tiny random models: all answers of a step may score alike, and the trainer says so
# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@no_signal_expected
@bundled_bf16_expected
def test_ac_humaneval_end_to_end_two_turns(chat_models, tmp_path):
    llama = chat_models["llama"]
    run = train("ac_he_config.yaml", [f"agent_model.name={llama}", f"critic_model.name={llama}", *tiny("ac", turns=2)], tmp_path / "run")
    metrics, rows = check_single_run(run, ["level_1", "passed_tests", "total_tests", "reward"], layout="root")
    assert {row["turn"] for row in rows} == {1, 2}
    assert os.path.exists(run / "critic" / "value_head.pt")
    assert any("critic_0/value_loss" in row for row in metrics)


# tiny random models: all answers of a step may score alike, and the trainer says so
# a bundled config: its models load in bfloat16 (as CoMLRL's), and the loader says so
@no_signal_expected
@bundled_bf16_expected
def test_grpo_mbpp_two_turns_and_ac_tldr_value_head(chat_models, tmp_path):
    qwen = chat_models["qwen"]
    run = train("grpo_mbpp_config.yaml", [f"agent_model.name={qwen}", "grpo.num_generations=2", "grpo.rollout_buffer_size=1",
                "grpo.train_batch_size=1", *tiny("grpo", turns=2)], tmp_path / "grpo")
    _, rows = check_single_run(run, ["passed_tests", "total_tests"])
    assert {row["turn"] for row in rows} == {1, 2}
    run = train("ac_tldr_config.yaml", [f"agent_model.name={qwen}", "critic_model.name=None", "ac.use_separate_critic=false",
                *tiny("ac")], tmp_path / "ac")
    check_single_run(run, ["level_1", "split"], layout="root")
    assert os.path.exists(run / "value_head.pt") and not os.path.exists(run / "critic")


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_an_agent_saved_into_the_folder_itself_is_refused_before_training(chat_models, tmp_path, capsys):
    llama = chat_models["llama"]
    overrides = [f"agent_model.name={llama}", "critic_model.name=None", "ac.use_separate_critic=false", *tiny("ac")]
    first = train("ac_tldr_config.yaml", overrides, tmp_path / "first")
    weights = (first / "model.safetensors").read_bytes()
    # another run saving where the first one's agent lies (value-head layout: no agent_i/ or critic/ folder)
    args = ["train", "--config", "ac_tldr_config.yaml", "--output-dir", str(tmp_path / "second"), "--override", *overrides,
            f"output.save_path={first}"]
    assert main(args) == 2
    assert "already holds saved models (model.safetensors, value_head.pt)" in capsys.readouterr().err
    assert not (tmp_path / "second").exists() and (first / "model.safetensors").read_bytes() == weights
