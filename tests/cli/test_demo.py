"""`comlrl demo` end to end with tiny models, plus its reward, flags and output-directory rules."""

from __future__ import annotations

import json
import math
import os

import pytest

from comlrl.cli.main import main
from comlrl.cli.demo import OUTPUTS, epoch_means, length_ratio_reward

SMALL = ["--epochs", "2", "--num-prompts", "2", "--num-generations", "2", "--max-new-tokens", "6", "--threads", "1"]


def read_rows(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def check_run(out, sources):
    """The saved agents load and keep their own tokenizer and architecture; the log, plot and summary exist."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    for index, source in enumerate(sources):
        folder = os.path.join(out, f"agent_{index}")
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(source).get_vocab()
        assert model.config.model_type == AutoConfig.from_pretrained(source).model_type
    with open(os.path.join(out, "reward_curve.png"), "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    rows = read_rows(os.path.join(out, "metrics.jsonl"))
    steps = [row["env_step"] for row in rows]
    assert steps == sorted(steps) and steps[-1] == 2 * 2 * 2  # non-decreasing, ends at epochs * prompts * K
    rewards = [row["turn_1/reward_mean"] for row in rows]
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)
    assert all(isinstance(row[key], (int, float)) and math.isfinite(row[key]) for row in rows for key in row)
    with open(os.path.join(out, "demo_summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert len(summary["epoch_reward_mean"]) == 2 and all(0.0 <= r <= 1.0 for r in summary["epoch_reward_mean"])
    assert sorted(os.listdir(out)) == sorted([*OUTPUTS, "agent_0", "agent_1"])  # what `comlrl demo --help` lists
    return rows


def test_reward_by_hand():
    # ratios 2.5 (inside), 0.5 (1.5 below 2), 4.0 (1.0 above 3), empty agent 1, exactly 3
    got = length_ratio_reward(["ab", "abcd", "ab", "", "a"], ["abcde", "ab", "abcdefgh", "xyz", "abc"])
    assert got == pytest.approx([1.0, math.exp(-1.5), math.exp(-1.0), 0.0, 1.0])


def test_epoch_means_are_read_from_the_epoch_rows():
    rows = [{"env_step": 4, "turn_1/reward_mean": 0.2}, {"env_step": 8, "turn_1/reward_mean": 0.4, "epoch": 1.0,
            "epoch/turn_1/reward_mean": 0.3}, {"env_step": 12, "eval/turn_1/reward_mean": 0.5},
            {"env_step": 16, "turn_1/reward_mean": 0.9, "epoch": 2.0, "epoch/turn_1/reward_mean": 0.9}]
    assert epoch_means(rows) == pytest.approx([0.3, 0.9])


def test_demo_homogeneous_tiny(tiny_paths, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["demo", "--model", tiny_paths["llama"], "--output-dir", out, "--quiet", *SMALL]) == 0
    captured = capsys.readouterr()  # before check_run loads the saved agents (with their own bars)
    check_run(out, [tiny_paths["llama"]] * 2)
    assert "mean reward per epoch:" in captured.out and "agent_1" in captured.out
    for bar in ("Loading weights", "Writing model shards", "epoch 1/2", "first step took"):
        assert bar not in captured.err  # --quiet: no bar of ours or of transformers


def test_demo_heterogeneous_tiny_with_progress_bar(tiny_paths, tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["demo", "--agent-model", tiny_paths["llama"], "--agent-model", tiny_paths["gpt2"], "--output-dir", out]
    assert main(argv + SMALL) == 0
    captured = capsys.readouterr()
    rows = check_run(out, [tiny_paths["llama"], tiny_paths["gpt2"]])
    assert "epoch 2/2" in captured.err  # the progress bar (one line per epoch: capsys is not a terminal)
    # two steps in all: the first is reported (it carries the warm-up); an estimate needs a second one before the end
    assert "MAGRPO: first step took" in captured.err and "(warm-up included)" in captured.err
    means = [row["epoch/turn_1/reward_mean"] for row in rows if "epoch" in row]
    assert f"mean reward per epoch: {means[0]:.3f} -> {means[1]:.3f}" in captured.out  # what the bar and the plot show


def test_help_states_the_measured_time_and_the_files_written(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "measured 1 min 53 s" in text
    written = text.split("Writes ", 1)[1].split(" into --output-dir")[0]
    assert written.replace(" and", ",").split(", ") == ["agent_0/", "agent_1/", *OUTPUTS]
    assert "run_config.json" in written and " config.json" not in written


def test_prompts_file_and_overwrite(tiny_paths, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Describe a city\n\nTell a joke\nInvent a fruit\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["demo", "--model", tiny_paths["llama"], "--output-dir", str(out), "--prompts-file", str(prompts),
            "--epochs", "1", "--num-generations", "2", "--max-new-tokens", "4", "--quiet"]
    assert main(argv) == 2
    assert "not empty" in capsys.readouterr().err
    assert os.listdir(out) == ["keep.txt"]
    assert main(argv + ["--overwrite"]) == 0
    first = [row["env_step"] for row in read_rows(out / "metrics.jsonl")]
    assert first[-1] == 3 * 2  # the three prompts of the file, K=2
    assert main(argv + ["--overwrite"]) == 0  # a second overwrite replaces the log instead of appending to it
    assert [row["env_step"] for row in read_rows(out / "metrics.jsonl")] == first
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--agent-model", "a"], "given 1 time"),
        (["--model", "m", "--num-prompts", "99"], "--num-prompts 99 is more than"),
        (["--model", "m", "--prompts-file", "/nonexistent/prompts.txt"], "--prompts-file"),
        (["--model", "m", "--epochs", "0"], "--epochs must be >= 1"),
        (["--model", "m", "--num-generations", "1"], "--num-generations must be >= 2"),
        (["--model", "m", "--lr", "-1"], "--lr must be a positive number"),
        (["--model", "m", "--wheel", "w.whl"], "--wheel builds the default model"),
    ],
)
def test_bad_flags_fail_before_loading(tmp_path, capsys, extra, message):
    assert main(["demo", "--output-dir", str(tmp_path / "run"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_model_and_agent_model_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "a", "--agent-model", "b"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
