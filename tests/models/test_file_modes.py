"""Saved models, checkpoints and plots get the permissions an ordinary open()/mkdir gives under the
process umask, not the private modes of temporary files (0600 / 0700) or of safetensors' writer."""

from __future__ import annotations

import json
import os
import stat

import pytest

from comlrl.models.saving import apply_umask, current_umask, make_temp_dir, make_temp_file
from comlrl.cli.plot import plot_reward_curve
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def modes(root):
    """``{relative path: permission bits}`` of ``root`` and everything under it."""
    found = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def expect_ordinary(root, mask):
    """Every directory 0777 & ~mask, every file 0666 & ~mask, as mkdir()/open() would create them."""
    for relative, mode in modes(root).items():
        path = os.path.join(root, relative)
        wanted = (0o777 if os.path.isdir(path) else 0o666) & ~mask
        assert mode == wanted, f"{relative}: {oct(mode)}, expected {oct(wanted)}"


def test_umask_is_read_without_changing_it(umask):
    assert current_umask() == umask
    assert os.umask(umask) == umask  # still the same afterwards


def test_temp_helpers_and_apply_umask(tmp_path, umask):
    directory = make_temp_dir(str(tmp_path), ".stage.")
    file = make_temp_file(directory, ".plot.", ".png")
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(os.stat(file).st_mode) == 0o666 & ~umask
    script = os.path.join(directory, "run.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(script, 0o700)
    apply_umask(directory)
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o777 & ~umask  # execute bits are kept


def test_saved_models_checkpoints_and_plots_get_ordinary_modes(tiny_paths, prompts_dataset, tmp_path, umask):
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, eval_interval=0,
                          logging_steps=1, verbose=False, output_dir=str(tmp_path / "run"))
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                            train_dataset=prompts_dataset.select(range(2)), args=config)
    trainer.train(checkpoint_dir=str(tmp_path / "checkpoints"))
    trainer.save_model(str(tmp_path / "agents"))
    trainer.close()
    plot = plot_reward_curve(str(tmp_path / "run"))

    assert any(name.endswith(".safetensors") for name in modes(str(tmp_path / "agents")))
    expect_ordinary(str(tmp_path / "agents"), umask)
    checkpoints = str(tmp_path / "checkpoints")
    assert any(name.endswith(".safetensors") for name in modes(checkpoints))  # model shards of the checkpoint
    expect_ordinary(checkpoints, umask)
    assert stat.S_IMODE(os.stat(plot).st_mode) == 0o666 & ~umask
    expect_ordinary(str(tmp_path / "run"), umask)  # metrics.jsonl, config.json, run_summary.json, the plot
