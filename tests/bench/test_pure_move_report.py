"""bench/pure_move_report.py: the side-by-side table of a refactoring (docs/benchmarks.md)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_report():
    spec = importlib.util.spec_from_file_location("pure_move_report", os.path.join(ROOT, "bench", "pure_move_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.report


def row(side, algo, seed, cpu, wall, tokens=100, reward=0.5):
    result = {"generated_tokens": tokens, "reward_mean_all": reward, "reward_mean_last_quarter": reward, "joint_responses": 8,
              "train_wall_s": wall}
    return {"side": side, "algo": algo, "seed": seed, "cpu_s": cpu, "result": result}


def test_same_results_and_median_ratios():
    rows = [row("old", "magrpo", 1, 10.0, 8.0), row("new", "magrpo", 1, 11.0, 8.0),
            row("old", "magrpo", 2, 10.0, 8.0), row("new", "magrpo", 2, 9.0, 6.0),
            row("old", "magrpo", 3, 20.0, 8.0), row("new", "magrpo", 3, 21.0, 10.0),
            row("old", "iac", 1, 10.0, 5.0)]  # an unpaired run is left out
    lines = load_report()(rows).splitlines()
    assert lines[2] == "| magrpo | 1,2,3 | yes | 1.050 | 1.000 |"
    assert len(lines) == 3  # no row for iac: none of its seeds ran on both sides


def test_a_different_token_count_or_reward_is_reported():
    for changed in (dict(tokens=101), dict(reward=0.25)):
        rows = [row("old", "maac", 1, 10.0, 8.0), row("new", "maac", 1, 10.0, 8.0, **changed)]
        assert load_report()(rows).splitlines()[2] == "| maac | 1 | NO | 1.000 | 1.000 |"
