"""A resumed run's log files (metrics.jsonl and TensorBoard, read back with TensorBoard's own
reader) hold each row once: rows written after the checkpoint are dropped."""

import json

import pytest
from comlrl.rollout.rewards import RewardFunctionError
from tests.helpers.checkpoint_runs import CrashingReward, make_dataset, make_magrpo, seed_everything
from tests.helpers.sink_readers import expected_scalars, tensorboard_scalars

from comlrl.telemetry.metrics import JsonlSink


def rows_of(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row.pop("time")
    return rows


def test_resume_drops_rows_of_the_abandoned_continuation(tiny_paths, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional dependency")
    dataset = make_dataset(4)
    seed_everything(0)
    straight = make_magrpo(tiny_paths, dataset, output_dir=str(tmp_path / "straight"))
    straight.train()
    expected = rows_of(tmp_path / "straight" / "metrics.jsonl")

    logs, checkpoints = tmp_path / "run", tmp_path / "checkpoints"
    seed_everything(0)
    crashing = make_magrpo(tiny_paths, dataset, reward=CrashingReward(23), output_dir=str(logs), tensorboard=True)
    with pytest.raises(RewardFunctionError, match="simulated crash"):
        crashing.train(checkpoint_dir=str(checkpoints), checkpoint_steps=2)  # rows after the last save exist
    crashing.close()
    written = rows_of(logs / "metrics.jsonl")
    probe = make_magrpo(tiny_paths, dataset, output_dir=str(tmp_path / "probe"), tensorboard=True)  # its own log folder
    probe.load_checkpoint(str(checkpoints))
    saved = probe.log_history
    probe.close()
    assert written[: len(saved)] == saved and len(written) > len(saved)  # rows after the last save exist
    assert tensorboard_scalars(str(logs / "tensorboard")) == expected_scalars(crashing.log_history)

    resumed = make_magrpo(tiny_paths, dataset, output_dir=str(logs), tensorboard=True)
    resumed.train(checkpoint_dir=str(checkpoints), checkpoint_steps=2, resume_from_checkpoint=True)
    resumed.close()
    assert rows_of(logs / "metrics.jsonl") == expected == resumed.log_history
    # the checkpoint was taken at an epoch end, and the next epoch's first evaluation, logged after
    # it at the same env_step, is purged too (a purge from env_step + 1 would keep it twice)
    assert tensorboard_scalars(str(logs / "tensorboard")) == expected_scalars(expected)


def test_jsonl_rewind_leaves_a_foreign_file_alone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(str(path))
    sink.write({"x": 1.0}, 1)
    sink.write({"x": 2.0}, 2)
    sink.rewind([{"env_step": 9, "x": 5.0}], 9)  # not in the file: nothing is cut
    assert len(rows_of(path)) == 2
    sink.rewind([{"env_step": 1, "x": 1.0}], 1)
    sink.write({"x": 3.0}, 3)
    sink.close()
    assert rows_of(path) == [{"env_step": 1, "x": 1.0}, {"env_step": 3, "x": 3.0}]
