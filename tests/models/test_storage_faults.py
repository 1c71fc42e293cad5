"""Storage faults (a read-only folder, a full disk) are one clear error with the path, the cause and the
fix, never a raw library error, and never lose what was saved before.

A full disk is injected at the lowest write call (safetensors' ``save_file`` raising what it raises on
ENOSPC, or ``torch.save`` raising OSError(ENOSPC)); a read-only folder is real: a read-only bind mount
as root (chmod does not stop root), a 0555 folder otherwise.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
from datasets import Dataset

from comlrl.checkpoint import layout
from comlrl.models.storage import StorageError, check_writable, storage_fault
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio, no_signal_expected

DISK_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    path = tmp_path / "read-only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield str(path)
        path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True).returncode == 0
    if mounted and os.access(str(path), os.W_OK):  # an older mount(8) ignores -o ro on the first bind
        mounted = subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], capture_output=True).returncode == 0
    if not mounted:  # root without CAP_SYS_ADMIN: the kernel's answer for a read-only mount, injected
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.path.abspath(p).startswith(str(path)) else real_access(p, mode, **kw))
    try:
        yield str(path)
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)


def tiny_trainer(tiny_paths, **fields):
    args = MAGRPOConfig(**{**dict(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False,
                                  eval_interval=0, rollout_buffer_size=1), **fields})
    return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                         train_dataset=Dataset.from_dict({"prompt": ["Tell a joke", "Describe a city", "Invent a fruit"]}), args=args)


def test_a_read_only_folder_is_refused_before_anything_starts(read_only_dir, tiny_paths):
    with pytest.raises(StorageError) as info:
        check_writable(os.path.join(read_only_dir, "run", "deeper"), "--output-dir")
    message = str(info.value)
    assert read_only_dir in message and "--output-dir" in message and "cannot be written" in message
    assert info.value.errno in (errno.EROFS, errno.EACCES) and "Fix: choose a folder" in message
    with pytest.raises(StorageError, match="output_dir"):
        MAGRPOConfig(output_dir=os.path.join(read_only_dir, "run"))


def test_the_cli_refuses_a_read_only_output_dir_in_one_line(read_only_dir, capsys):
    from comlrl.cli.main import main

    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--offline", "--output-dir", os.path.join(read_only_dir, "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--output-dir" in err and read_only_dir in err and "cannot be written" in err


def test_the_three_shapes_of_a_full_disk_are_recognised(tmp_path):
    from safetensors import SafetensorError

    assert storage_fault(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path)) == errno.ENOSPC
    assert storage_fault(SafetensorError(DISK_FULL), str(tmp_path)) == errno.ENOSPC
    assert storage_fault(RuntimeError("[Errno 30] Read-only file system: '/x'"), str(tmp_path)) == errno.EROFS
    # torch's zip writer says "unexpected pos": a full disk only when the disk has no room left
    assert storage_fault(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), str(tmp_path)) is None
    assert storage_fault(ValueError("bad value"), str(tmp_path)) is None


def test_a_full_disk_during_save_model_names_the_path_and_leaves_nothing_behind(tiny_paths, tmp_path, monkeypatch):
    from safetensors import SafetensorError
    from transformers import modeling_utils

    trainer = tiny_trainer(tiny_paths)
    target = tmp_path / "new" / "agents"
    calls = []

    def full_disk(state, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:  # agent_0 is written, agent_1 hits the full disk half way
            with open(filename, "wb") as handle:
                handle.write(b"\0" * 100)
            raise SafetensorError(DISK_FULL)
        return original(state, filename, metadata=metadata)

    original = modeling_utils.safe_save_file
    monkeypatch.setattr(modeling_utils, "safe_save_file", full_disk)
    with pytest.raises(StorageError) as info:
        trainer.save_model(str(target))
    message = str(info.value)
    assert str(target / "agent_1") in message and "the disk is full" in message and "free some space" in message
    assert "Traceback" not in message and "os error" not in message.split("(")[0]
    assert not (tmp_path / "new").exists()  # no half team (agent_0 removed again) and no empty folder
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC


def test_a_full_disk_during_save_model_keeps_what_the_folder_held(tiny_paths, tmp_path, monkeypatch):
    from transformers import modeling_utils

    trainer = tiny_trainer(tiny_paths)
    target = tmp_path / "agents"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    monkeypatch.setattr(modeling_utils, "safe_save_file", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(StorageError, match="the disk is full"):
        trainer.save_model(str(target))
    assert sorted(os.listdir(target)) == ["notes.txt"] and (target / "notes.txt").read_text() == "mine"


def test_save_model_none_is_a_value_error_naming_the_argument(tiny_paths):
    trainer = tiny_trainer(tiny_paths)
    with pytest.raises(ValueError, match=r"save_model\(output_dir\) must be a folder path \(a non-empty str\), got None"):
        trainer.save_model(None)


@no_signal_expected  # tiny or scripted models: a step's answers may all score alike
def test_a_full_disk_at_a_checkpoint_keeps_the_earlier_ones_and_resume_works(tiny_paths, tmp_path, monkeypatch):
    import torch

    checkpoints = tmp_path / "ck"
    trainer = tiny_trainer(tiny_paths)
    original, saves = torch.save, []

    def full_disk(value, target, *args, **kwargs):
        saves.append(target)
        if ".checkpoint-2." in str(getattr(target, "name", target)):  # the first checkpoint is whole, the second finds the disk full
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(value, target, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(StorageError) as info:
        trainer.train(checkpoint_dir=str(checkpoints), checkpoint_steps=1)
    message = str(info.value)
    first = layout.latest_checkpoint(str(checkpoints))
    assert first is not None and "checkpoint" in message and str(checkpoints) in message and "the disk is full" in message
    assert f"latest: {first}" in message and "partial checkpoint was removed" in message
    assert not [name for name in os.listdir(checkpoints) if name.endswith(".staging")]  # the partial one is gone
    assert layout.read_checkpoint_metadata(first)["progress"]["global_step"] == 1  # the earlier one is whole
    monkeypatch.setattr(torch, "save", original)
    resumed = tiny_trainer(tiny_paths)
    resumed.train(resume_from_checkpoint=first)
    assert resumed.state.epoch == 1


def test_a_full_disk_in_the_cli_is_one_line(tiny_paths, tmp_path, monkeypatch, capsys):
    import importlib

    cli = importlib.import_module("comlrl.cli.main")

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))

    monkeypatch.setitem(cli.COMMANDS, "plot", (cli.add_plot_parser, full))
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No space left on device" in err and "metrics.jsonl" in err
