"""bench/learning.py: one environment run end to end with a tiny model, resuming a sweep from its
runs.jsonl, and the summary's statistics worked by hand."""

import importlib.util
import json
import os

import pytest
from torch.testing import assert_close
from tests.helpers.common import REPO_ROOT, no_signal_expected

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("learning_bench", os.path.join(ROOT, "bench", "learning.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interval_by_hand(learning):
    # values 1, 2, 3: mean 2, sample sd 1, t_{0.975, 2} = 4.303, half width 4.303 / sqrt(3) = 2.48434
    out = learning.interval([1.0, 2.0, 3.0])
    assert out["n"] == 3
    assert_close(out["mean"], 2.0)
    assert_close(out["ci95_low"], 2.0 - 4.303 / 3**0.5)
    assert_close(out["ci95_high"], 2.0 + 4.303 / 3**0.5)
    assert learning.interval([0.5])["ci95_low"] is None


def test_summary_pairs_seeds_against_default(learning):
    def row(variant, seed, final):
        return {"task": "t", "variant": variant, "seed": seed, "first_quarter": 0.1, "final_quarter": final,
                "train_wall_s": 10.0, "peak_rss_mib": 100.0 * seed, "curve": [0.1, final]}

    runs = {("t", "default", 1): row("default", 1, 0.5), ("t", "default", 2): row("default", 2, 0.7),
            ("t", "x", 1): row("x", 1, 0.6), ("t", "x", 2): row("x", 2, 0.9), ("t", "x", 3): row("x", 3, 0.0)}
    out = learning.summarise(runs)["t"]
    # paired over seeds 1 and 2 only (seed 3 has no default): differences 0.1 and 0.2, mean 0.15,
    # sd = sqrt(((-0.05)^2 + 0.05^2) / 1) = 0.070711, half width 12.706 * 0.070711 / sqrt(2) = 0.6353
    paired = out["x"]["paired_final_minus_default"]
    assert paired["n"] == 2
    assert_close(paired["mean"], 0.15)
    assert_close(paired["ci95_high"] - paired["mean"], 12.706 * 0.05)
    assert_close(out["x"]["final_quarter"]["mean"], 0.5)  # (0.6 + 0.9 + 0.0) / 3
    assert out["x"]["peak_rss_mib_max"] == 300.0
    assert "paired_final_minus_default" not in out["default"]
    table = learning.markdown_table({"t": out, "_in_progress": {}}).splitlines()
    assert len(table) == 4 and table[2].startswith("| t | default | 1,2 | 0.100 [0.100, 0.100] | 0.600 [")  # default first
    assert table[3].startswith("| t | x | 1,2,3 |") and "| 0.150 [-0.485, 0.785] |" in table[3] and table[3].endswith("| 10 | 300 |")


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("task", ["tldr", "strbuild"])
def test_env_run_records_a_resumable_line(learning, tiny_paths, tmp_path, task):
    class Args:
        out = str(tmp_path)
        model = tiny_paths["llama"]
        env_prompts = 2
        env_epochs = 1
        env_max_new_tokens = 8
        env_buffer = 2
        bench_script = None

    run_dir = learning.run_dir_of(Args.out, task, "scale_batch", 3)
    os.makedirs(run_dir)
    learning.env_run(["--task", task, "--variant", "scale_batch", "--seed", "3", "--model", Args.model,
                      "--run-dir", run_dir, *learning.env_command(Args, task, "scale_batch", 3, run_dir)[-8:], "--threads", "1"])
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    assert result["joint_responses"] == 2 * 4  # 2 prompts x K = 4 aligned joint responses
    assert result["peak_rss_mib"] > 0 and result["train_wall_s"] > 0
    # a result.json without a runs.jsonl line is a finished run: the sweep adopts it instead of rerunning
    learning.run_one(Args, task, "scale_batch", 3)
    runs = learning.load_runs(Args.out)
    line = runs[(task, "scale_batch", 3)]
    assert line["fields"] == {"scale_rewards": "batch"}
    assert len(line["curve"]) == 1 and line["final_quarter"] == result["reward_mean_last_quarter"]
    summary = learning.report(Args.out)
    assert summary[task]["scale_batch"]["seeds"] == [3]
    assert os.path.getsize(os.path.join(Args.out, "curves.png")) > 0


def test_unfinished_runs_are_reported_on_common_steps(learning, tmp_path):
    def metrics(variant, rewards):
        run = tmp_path / "t" / variant / "seed2" / "run"
        run.mkdir(parents=True)
        rows = [{"env_step": 8 * (i + 1), "turn_1/reward_mean": r} for i, r in enumerate(rewards)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    metrics("default", [0.2, 0.4, 0.6])
    metrics("x", [0.3, 0.7])
    partial = learning.in_progress(str(tmp_path), {})
    assert partial["t/default/seed2"]["steps_logged"] == 3
    x = partial["t/x/seed2"]
    # the two steps both logged: x (0.3 + 0.7) / 2 = 0.5 against default (0.2 + 0.4) / 2 = 0.3
    assert x["common_steps"] == 2
    assert_close(x["mean_reward_common_steps"], 0.5)
    assert_close(x["default_mean_reward_common_steps"], 0.3)


@no_signal_expected  # tiny or scripted models: a step's answers may all score alike
@pytest.mark.parametrize("variant", ["dr_grpo", "dapo", "counterfactual", "cross"])
def test_the_sweeps_variants_run_on_tldr(learning, tiny_paths, tmp_path, variant):
    """The variants of the measured sweep (issue 28: DAPO complete, and cross mode as the control of
    counterfactual credit) run through env_run with their fields."""
    run_dir = str(tmp_path / variant)
    os.makedirs(run_dir)
    learning.env_run(["--task", "tldr", "--variant", variant, "--seed", "1", "--model", tiny_paths["llama"], "--run-dir", run_dir,
                      "--env-prompts", "2", "--env-epochs", "1", "--env-max-new-tokens", "12", "--env-buffer", "2", "--threads", "1"])
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    pairs = 4 * 4 if variant in ("counterfactual", "cross") else 4  # cross mode: K^2 joint responses per prompt
    assert result["joint_responses"] == 2 * pairs
    with open(os.path.join(run_dir, "run", "run_config.json")) as f:
        recorded = json.load(f)
    fields = recorded["config"]  # the run record holds the config as resolved
    for name, value in learning.VARIANTS[variant].items():
        assert fields[name] == value, name
