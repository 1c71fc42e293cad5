"""comlrl.training.plotting and `comlrl plot`: PNG from a metrics JSONL, clear errors otherwise."""

from __future__ import annotations

import json
import os

import pytest

from comlrl.cli import main
from comlrl.training.plotting import curve_series, plot_reward_curve, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_rows(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return str(path)


@pytest.fixture
def run_dir(tmp_path):
    rows = [
        {"env_step": 0, "eval/turn_1/reward_mean": 0.2, "eval/turn_1/expected_return": 0.2},
        {"env_step": 8, "turn_1/reward_mean": 0.3, "turn_1/expected_return": 0.35, "agent_0/loss": 0.1},
        {"env_step": 16, "turn_1/reward_mean": 0.5, "turn_1/expected_return": 0.55, "turn_2/reward_mean": 0.4},
        {"env_step": 24, "eval/turn_1/reward_mean": 0.7, "eval/turn_1/expected_return": 0.7},
    ]
    write_rows(tmp_path / "metrics.jsonl", rows)
    return tmp_path


def is_png(path):
    with open(path, "rb") as handle:
        return handle.read(8) == PNG_MAGIC and os.path.getsize(path) > 1000


def test_series_pick_reward_and_return_keys_only(run_dir):
    series = curve_series(read_metrics(str(run_dir / "metrics.jsonl")))
    assert series == {
        "eval/turn_1/reward_mean": [(0, 0.2), (24, 0.7)],
        "eval/turn_1/expected_return": [(0, 0.2), (24, 0.7)],
        "turn_1/reward_mean": [(8, 0.3), (16, 0.5)],
        "turn_1/expected_return": [(8, 0.35), (16, 0.55)],
        "turn_2/reward_mean": [(16, 0.4)],
    }


def test_png_from_run_directory_and_from_file(run_dir, tmp_path):
    default = plot_reward_curve(str(run_dir))
    assert default == os.path.join(str(run_dir), "reward_curve.png")
    assert is_png(default)
    explicit = plot_reward_curve(str(run_dir / "metrics.jsonl"), str(tmp_path / "sub" / "curve.png"))
    assert is_png(explicit)


def test_existing_png_is_not_overwritten(run_dir):
    target = run_dir / "reward_curve.png"
    target.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        plot_reward_curve(str(run_dir))
    assert target.read_bytes() == b"mine"
    plot_reward_curve(str(run_dir), overwrite=True)
    assert is_png(target)


def test_missing_source_errors_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_reward_curve(str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        plot_reward_curve(str(tmp_path))


def test_empty_file_errors_clearly(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        plot_reward_curve(str(path))
    assert not (tmp_path / "reward_curve.png").exists()


def test_rows_without_rewards_error_clearly(tmp_path):
    path = write_rows(tmp_path / "metrics.jsonl", [{"env_step": 1, "agent_0/loss": 0.5}])
    with pytest.raises(ValueError, match="none with a reward"):
        plot_reward_curve(path)


def test_malformed_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"env_step": 1, "turn_1/reward_mean": 0.1}) + "\n{oops\n")
    with pytest.raises(ValueError, match="line 2"):
        plot_reward_curve(str(path))
    path.write_text(json.dumps({"turn_1/reward_mean": 0.1}) + "\n")
    with pytest.raises(ValueError, match="env_step"):
        plot_reward_curve(str(path))


def test_cli_plot(run_dir, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert is_png(out)
    assert main(["plot", str(run_dir), "--out", str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "comlrl plot: error" in capsys.readouterr().err
