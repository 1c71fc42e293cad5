"""Console output: quiet means quiet, the epoch bar ends on the epoch mean, one line per epoch off a
terminal, an estimate after the first step."""

from __future__ import annotations

import io
import re

import pytest

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.telemetry.progress import (
    ProgressBar,
    RunClock,
    format_duration,
    library_bars,
    remaining_evaluations,
    remaining_steps,
)
from tests.helpers.common import length_ratio, no_signal_expected


def make(tiny_paths, dataset, **overrides):
    fields = dict(num_turns=1, num_train_epochs=2, num_generations=2, max_new_tokens=3, eval_interval=0, logging_steps=1,
                  rollout_buffer_size=1)
    fields.update(overrides)
    return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, train_dataset=dataset,
                         args=MAGRPOConfig(**fields))


class Terminal(io.StringIO):
    def isatty(self):
        return True


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_epoch_means_are_the_mean_of_the_epochs_steps(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, verbose=False)
    trainer.train()
    rows = trainer.log_history
    assert [row["env_step"] for row in rows] == [2, 4, 6, 8, 10, 12, 14, 16]  # the epoch's last row is not doubled
    for epoch, epoch_rows in ((1, rows[:4]), (2, rows[4:])):
        last = epoch_rows[-1]
        assert last["epoch"] == epoch and all("epoch" not in row for row in epoch_rows[:-1])
        # logging_steps=1: each row is one step, so the epoch mean is the plain mean of the four rows
        for key in ("turn_1/reward_mean", "turn_1/expected_return"):
            assert last[f"epoch/{key}"] == pytest.approx(sum(row[key] for row in epoch_rows) / 4)


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_off_a_terminal_one_line_per_epoch_with_its_mean_and_an_estimate(tiny_paths, prompts_dataset, capsys):
    trainer = make(tiny_paths, prompts_dataset, verbose=True)
    capsys.readouterr()  # the loading bars of transformers (verbose)
    trainer.train()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    means = [row["epoch/turn_1/reward_mean"] for row in trainer.log_history if "epoch" in row]
    assert re.fullmatch(r"MAGRPO: first step took \d+ s \(warm-up included\); the estimate of the remaining time follows "
                        r"the second step", lines[0])
    assert re.fullmatch(r"MAGRPO: about \d+ s left for the 6 remaining steps \(estimate\)", lines[1])
    assert len(lines) == 4 and "100%" not in err and "\r" not in err
    for epoch, (line, mean) in enumerate(zip(lines[2:], means), start=1):
        left = "; about \\d+ s left" if epoch == 1 else ""  # the second epoch's line comes after the last step
        assert re.fullmatch(rf"MAGRPO epoch {epoch}/2: 4/4 items in [\w ]+; epoch mean reward_mean={mean:.3f}, "
                            rf"expected_return=\d\.\d{{3}}{left}", line), line


def test_on_a_terminal_the_final_postfix_is_the_epoch_mean():
    stream = Terminal()
    bar = ProgressBar(total=4, initial=0, enabled=True, desc="MAGRPO epoch 1/1", stream=stream)
    bar.update(2, {"turn_1/reward_mean": 0.9})
    bar.update(2, None)
    bar.finish({"turn_1/reward_mean": 0.1, "epoch": 1.0, "epoch/turn_1/reward_mean": 0.5, "epoch/turn_1/expected_return": 0.25})
    bar.close()
    final = stream.getvalue().split("\r")[-1]
    assert "4/4" in final and "epoch mean reward_mean=0.500, expected_return=0.250" in final


def test_disabled_bar_prints_nothing():
    stream = Terminal()
    bar = ProgressBar(total=4, initial=0, enabled=False, desc="x", stream=stream)
    bar.update(4, {"turn_1/reward_mean": 1.0})
    bar.note("estimate")
    bar.finish({"epoch/turn_1/reward_mean": 1.0})
    bar.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize("verbose", [True, False])
def test_quiet_silences_the_loading_and_saving_bars_of_transformers(tiny_paths, prompts_dataset, tmp_path, capsys, verbose):
    trainer = make(tiny_paths, prompts_dataset, verbose=verbose, num_train_epochs=1)
    trainer.save_model(str(tmp_path / "agents"))
    err = capsys.readouterr().err
    for bar in ("Loading weights", "Writing model shards"):
        assert (bar in err) is verbose
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()  # restored after the quiet block


def test_library_bars_restore_a_disabled_state():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with library_bars(False):
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()  # it was off before: it stays off
    finally:
        hf_logging.enable_progress_bar()


def test_remaining_steps_and_durations():
    # 10 items, 3 per step -> 4 steps per epoch; from item 6 of epoch 0 (of 3): 2 + 4 + 4
    assert remaining_steps(10, 3, epoch=0, position=6, epochs=3) == 10
    assert remaining_steps(None, 3, epoch=0, position=0, epochs=3) is None
    assert [format_duration(s) for s in (4.4, 95, 3725)] == ["4 s", "1 min 35 s", "1 h 2 min"]
    # 10 items, 3 per step (starts 0, 3, 6, 9), an evaluation before each step covering a multiple of 4
    # (0, 4 in 3..5, 8 in 6..8): 3 per epoch; from item 6 of epoch 0: 1 + 3 + 3
    assert remaining_evaluations(10, 3, epoch=0, position=6, epochs=3, interval=4) == 7
    assert remaining_evaluations(10, 3, epoch=0, position=0, epochs=3, interval=0) == 0


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def simulate(durations, evaluation_before, evaluation_s, clock, timer):
    """Run ``durations`` (seconds per step) with an evaluation before the steps in ``evaluation_before``;
    return, after each step, (the estimate, the real time left)."""
    ends, notes = [], []
    for index, duration in enumerate(durations):
        if index in evaluation_before:
            with timer.evaluating():
                clock.now += evaluation_s * (4 if index == 0 else 1)  # the first evaluation warms up too
        clock.now += duration
        notes.append(timer.step_done())
        ends.append((clock.now, timer.remaining_seconds()))
    total = clock.now
    return [(estimate, total - now) for now, estimate in ends], notes


@pytest.mark.parametrize("first, evaluation_s, jitter", [(10.0, 3.0, 0.15), (4.0, 0.0, 0.1), (15.0, 8.0, 0.25)])
def test_the_estimate_is_within_one_and_a_half_times_the_real_remaining_time_from_the_second_step(first, evaluation_s, jitter):
    import random

    rng = random.Random(0)
    steps, interval_steps = 40, 4
    durations = [first] + [2.0 * (1 + rng.uniform(-jitter, jitter)) for _ in range(steps - 1)]
    evaluation_before = set(range(0, steps, interval_steps))
    clock = FakeClock()
    timer = RunClock(steps, remaining_evaluations(steps, 1, 0, 0, 1, interval_steps), clock=clock)
    pairs, notes = simulate(durations, evaluation_before, evaluation_s, clock, timer)
    assert pairs[0][0] is None  # after the first step: no extrapolation of a warm-up step
    assert notes[0].startswith("first step took") and notes[1].startswith("about ") and not any(notes[2:])
    for step, (estimate, real) in enumerate(pairs[1:-1], start=2):
        assert real / 1.5 <= estimate <= real * 1.5, (step, estimate, real)
    assert pairs[-1] == (0.0, 0.0)
    # what extrapolating the first step (the old estimate) would have said: several times too long
    old = (first + evaluation_s * 4) * (steps - 1)
    assert old > 1.5 * pairs[0][1]


def test_the_estimate_follows_a_change_of_speed_within_a_few_steps():
    """The load of a shared machine changes (a real demo: steps of 160-245 s, then 12-15 s): three steps
    after the change the estimate is within 1.5x again."""
    steps, change = 30, 10
    durations = [30.0] + [20.0] * (change - 1) + [2.0] * (steps - change)
    clock = FakeClock()
    timer = RunClock(steps, clock=clock)
    pairs, _ = simulate(durations, set(), 0.0, clock, timer)
    for step, (estimate, real) in enumerate(pairs[change + timer.WINDOW - 1:-1], start=change + timer.WINDOW):
        assert real / 1.5 <= estimate <= real * 1.5, (step, estimate, real)


def test_a_real_demo_trace_is_tracked_once_the_speed_settles():
    """Step times of one `comlrl demo` on two shared cores (load average 3.6 to 4.7, then the other work ended)."""
    durations = [161.8, 233.5, 175.2, 163.4, 244.5, 65.3, 12.3, 13.7, 15.4, 13.8]
    clock = FakeClock()
    timer = RunClock(len(durations), clock=clock)
    pairs, _ = simulate(durations, set(), 0.0, clock, timer)
    ratios = [estimate / real for estimate, real in pairs[1:-1]]
    assert all(0.5 <= ratio <= 3.5 for ratio in ratios[:3])  # the load stayed: within 3.5x while nothing can know it ends
    assert 1 / 1.5 <= ratios[-1] <= 1.5  # three steps at the new speed (12-15 s): within 1.5x again


def test_the_bar_and_the_epoch_line_show_the_run_estimate():
    stream = io.StringIO()
    bar = ProgressBar(total=4, initial=0, enabled=True, desc="MAGRPO epoch 1/2", stream=stream)
    bar.estimate("about 2 min left")
    bar.update(4, None)
    bar.finish({"epoch/turn_1/reward_mean": 0.5})
    assert stream.getvalue().strip().endswith("epoch mean reward_mean=0.500; about 2 min left")
    terminal = Terminal()
    bar = ProgressBar(total=4, initial=0, enabled=True, desc="MAGRPO epoch 1/2", stream=terminal)
    bar.estimate("about 2 min left")
    bar.update(1, {"turn_1/reward_mean": 0.25})
    bar.close()
    shown = terminal.getvalue()
    assert "run=about 2 min left" in shown and "<" not in shown  # tqdm's own epoch "remaining" is not shown
