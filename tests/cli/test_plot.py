"""comlrl.cli.plot and `comlrl plot`: PNG from a metrics JSONL, clear errors otherwise."""

from __future__ import annotations

import json
import os

import pytest
from tests.helpers.common import no_signal_expected

from comlrl.cli.main import main
from comlrl.cli.plot import (
    build_figure,
    curve_series,
    plot_reward_curve,
    read_metrics,
    smooth,
    smoothing_weight,
    split_runs,
)

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


def test_existing_png_gets_a_new_name_unless_overwrite(run_dir):
    target = run_dir / "reward_curve.png"
    target.write_bytes(b"mine")
    assert plot_reward_curve(str(run_dir)) == str(run_dir / "reward_curve-2.png")
    assert plot_reward_curve(str(run_dir)) == str(run_dir / "reward_curve-3.png")
    assert target.read_bytes() == b"mine"
    assert plot_reward_curve(str(run_dir), overwrite=True) == str(target)
    assert is_png(target)
    explicit = run_dir / "mine.png"
    explicit.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        plot_reward_curve(str(run_dir), str(explicit))  # a name the user chose is never replaced silently
    assert explicit.read_bytes() == b"mine"


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


# ----------------------------------------------------------------------------- the figure, read back


def lines_by_gid(axes):
    return {line.get_gid(): line for line in axes.get_lines()}


def points(line):
    return list(zip(line.get_xdata(), line.get_ydata()))


VALUES = [0.2, 0.4, 0.3, 0.5, 0.7, 0.6] * 4  # 2 epochs x 12 steps


def single_turn_rows(values=VALUES):
    """One run of 2 epochs, single-turn (reward_mean == expected_return), per-agent metrics."""
    rows, per_epoch = [], len(values) // 2
    for index, value in enumerate(values, start=1):
        row = {"env_step": 4 * index, "turn_1/reward_mean": value, "turn_1/expected_return": value,
               "agent_0/loss": -value, "agent_1/loss": value, "agent_0/entropy": 1.0 + value, "agent_1/completion_length": 3.0 + index,
               "agent_0/frac_zero_signal_groups": 0.0, "agents/credit_correlation": 1.0}
        if index % per_epoch == 0:  # the epoch's last row carries its means
            mean = sum(values[index - per_epoch : index]) / per_epoch
            row.update({"epoch": index / per_epoch, "epoch/turn_1/reward_mean": mean, "epoch/turn_1/expected_return": mean})
        rows.append(row)
    return rows


def test_identical_series_are_drawn_once_with_both_names():
    figure = build_figure(single_turn_rows(), "run")
    reward = figure.axes[0]
    gids = lines_by_gid(reward)
    assert set(gids) == {"raw:turn_1/reward_mean|turn_1/expected_return:1", "smooth:turn_1/reward_mean|turn_1/expected_return:1",
                         "epoch:turn_1/reward_mean|turn_1/expected_return:1"}
    legend = [text.get_text() for text in reward.get_legend().get_texts()]
    assert "turn_1/reward_mean = expected_return (smoothed)" in legend
    assert points(gids["raw:turn_1/reward_mean|turn_1/expected_return:1"]) == [(4 * i, v) for i, v in enumerate(VALUES, 1)]


def test_different_series_keep_their_own_lines(run_dir):
    figure = build_figure(read_metrics(str(run_dir / "metrics.jsonl")), "run")
    gids = set(lines_by_gid(figure.axes[0]))
    assert {"raw:turn_1/reward_mean:1", "raw:turn_1/expected_return:1", "raw:turn_2/reward_mean:1",
            "eval:eval/turn_1/reward_mean|eval/turn_1/expected_return:1"} == gids  # 2 points each: no smoothing yet
    assert len(figure.axes) == 2  # the reward panel and the loss panel (agent_0/loss is present)


def test_smoothed_line_is_the_debiased_moving_average():
    # w = 0.6: m1 = 0.4 * 1 = 0.4 -> 0.4 / (1 - 0.6) = 1.0; m2 = 0.6 * 0.4 + 0 = 0.24 -> 0.24 / 0.64 = 0.375;
    # m3 = 0.6 * 0.24 + 0.4 * 1 = 0.544 -> 0.544 / (1 - 0.216) = 0.69388
    assert smooth([1.0, 0.0, 1.0]) == pytest.approx([1.0, 0.375, 0.544 / 0.784])
    assert [smoothing_weight(n) for n in (9, 10, 16, 20, 200)] == pytest.approx([0.0, 0.2, 0.5, 0.6, 0.6])  # 1 - 8/n, capped
    figure = build_figure(single_turn_rows(), "run")
    line = lines_by_gid(figure.axes[0])["smooth:turn_1/reward_mean|turn_1/expected_return:1"]
    assert list(line.get_ydata()) == pytest.approx(smooth(VALUES, 0.6))
    short = lines_by_gid(build_figure(single_turn_rows(VALUES[:6]), "run").axes[0])
    assert not any(gid.startswith("smooth:") for gid in short)  # 6 points are drawn as they are


def test_epoch_means_are_markers_at_the_end_of_their_epochs():
    figure = build_figure(single_turn_rows(), "run")
    markers = lines_by_gid(figure.axes[0])["epoch:turn_1/reward_mean|turn_1/expected_return:1"]
    # epoch 1 covers env_steps (0, 48], epoch 2 (48, 96]: each mean is known at its epoch's last step; each
    # holds VALUES' six numbers twice, so both means are (0.2 + 0.4 + 0.3 + 0.5 + 0.7 + 0.6) / 6 = 0.45
    assert [x for x, _ in points(markers)] == [48, 96]
    assert [y for _, y in points(markers)] == pytest.approx([0.45, 0.45])
    assert markers.get_linestyle() == "None" and markers.get_marker() == "D"


def test_credit_correlation_has_no_panel_in_cross_mode():
    rows = single_turn_rows()
    for index, row in enumerate(rows):
        row["agents/credit_correlation"] = 0.5 + 0.3 * (-1) ** index  # (in cross mode it would be 0 by construction)
    drawn = [axes.get_ylabel() for axes in build_figure(rows, "run", {"joint_mode": "cross"}).axes[1:]]
    assert "agents' credit correlation" not in drawn
    assert "agents' credit correlation" in [axes.get_ylabel() for axes in build_figure(rows, "run", {"joint_mode": "aligned"}).axes[1:]]


def test_small_panels_have_few_compact_ticks_that_do_not_overlap(tmp_path):
    rows = [{"env_step": 32 * step, "turn_1/reward_mean": 0.01 * step, **{f"agent_{a}/{name}": float(step % 7 + a)
            for a in range(2) for name in ("loss", "entropy", "completion_length", "grad_norm", "advantage_abs_mean")}}
            for step in range(1, 181)]
    figure = build_figure(rows, "run")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # lays the ticks out
    renderer = canvas.get_renderer()
    for axes in figure.axes:
        labels = [label for label in axes.get_xticklabels() if label.get_text() and label.get_visible()]
        visible = [label for label in labels if axes.get_xlim()[0] <= label.get_position()[0] <= axes.get_xlim()[1]]
        assert 2 <= len(visible) <= 11
        assert all(len(label.get_text()) <= 4 for label in visible), [label.get_text() for label in visible]  # "5.6k", not "5600"
        boxes = sorted((label.get_window_extent(renderer) for label in visible), key=lambda box: box.x0)
        assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:]))  # no two labels touch


def test_compact_tick_labels():
    from comlrl.cli.plot import _compact

    assert [_compact(v) for v in (0, 12, 950, 1000, 1200, 12500, 3_400_000)] == ["0", "12", "950", "1k", "1.2k", "12.5k", "3.4M"]


def test_env_step_ticks_are_integers():
    rows = [{"env_step": step, "turn_1/reward_mean": 0.1 * step} for step in (1, 2, 3)]
    figure = build_figure(rows, "run")
    ticks = [t for t in figure.axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_per_agent_panels():
    figure = build_figure(single_turn_rows(), "run")
    labels = [axes.get_ylabel() for axes in figure.axes[1:]]
    assert labels == ["loss", "entropy", "completion length (tokens)"]  # zero-signal 0 and correlation 1 throughout: no panel
    note = [text.get_text() for text in figure.texts if text.get_gid() == "left-out"]
    assert note == ["not drawn: zero-signal groups (= 0 throughout); agents' credit correlation (= 1 throughout)"]
    loss = lines_by_gid(figure.axes[1])
    assert set(loss) == {"agent:agent_0/loss:1", "agent:agent_1/loss:1"}
    assert points(loss["agent:agent_1/loss:1"])[0] == (4, 0.2)


def test_runs_sharing_a_file_are_drawn_apart():
    rows = [{"env_step": s, "turn_1/reward_mean": 0.1} for s in (4, 8, 12)] + [{"env_step": s, "turn_1/reward_mean": 0.9} for s in (4, 8)]
    assert [len(run) for run in split_runs(rows)] == [3, 2]
    figure = build_figure(rows, "run")
    gids = lines_by_gid(figure.axes[0])
    assert points(gids["raw:turn_1/reward_mean:2"]) == [(4, 0.9), (8, 0.9)]
    assert {line.get_color() for gid, line in gids.items() if gid.endswith(":1")} != {gids["raw:turn_1/reward_mean:2"].get_color()}
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert "turn_1/reward_mean (run 2)" in legend


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_a_real_run_plot_marks_the_epoch_means_the_log_holds(tiny_paths, prompts_dataset, tmp_path):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from tests.helpers.common import length_ratio

    config = MAGRPOConfig(num_turns=1, num_train_epochs=2, num_generations=2, max_new_tokens=3, eval_interval=0, logging_steps=1,
                          rollout_buffer_size=1, verbose=False, output_dir=str(tmp_path))
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                            train_dataset=prompts_dataset, args=config)
    trainer.train()
    trainer.close()
    figure = build_figure(read_metrics(str(tmp_path / "metrics.jsonl")), "run")
    markers = lines_by_gid(figure.axes[0])["epoch:turn_1/reward_mean|turn_1/expected_return:1"]
    logged = [row["epoch/turn_1/reward_mean"] for row in trainer.log_history if "epoch" in row]
    assert list(markers.get_ydata()) == pytest.approx(logged) and len(logged) == 2
    assert is_png(plot_reward_curve(str(tmp_path)))
