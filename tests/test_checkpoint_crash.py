"""Crash safety: a training process killed with SIGKILL (at random moments, or in the middle of writing a
checkpoint) resumes from its latest checkpoint and ends bit-identical to a run that was never killed."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from checkpoint_helpers import assert_same_run, make_dataset, make_magrpo, run_summary, seed_everything

from comlrl.training.checkpoint_layout import list_entries
from comlrl.utils import read_checkpoint_metadata
from comlrl.utils.checkpoint import latest_checkpoint

TESTS = os.path.dirname(os.path.abspath(__file__))
OVERRIDES = {"num_train_epochs": 2}
SAVES = 10  # 8 step checkpoints + 2 epoch ends

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import conftest  # offline settings, one thread: exactly what the parent process uses
    import comlrl.training.checkpoint as checkpoint
    from checkpoint_helpers import make_dataset, make_magrpo, seed_everything
    from comlrl.utils.checkpoint import latest_checkpoint

    paths, directory, overrides, pause_at_save = json.loads(sys.argv[1])
    if pause_at_save:
        original, saves = checkpoint.save_torch, []

        def paused(path, value):
            original(path, value)
            if path.endswith("training_state.pt"):
                saves.append(path)
                if len(saves) == pause_at_save:  # half of this checkpoint is on disk, in its staging folder
                    print("paused", flush=True)
                    time.sleep(600)

        checkpoint.save_torch = paused
    seed_everything(0)
    trainer = make_magrpo(paths, make_dataset(4), **overrides)
    resume = True if os.path.isdir(directory) and latest_checkpoint(directory) else None
    print("ready", flush=True)
    trainer.train(checkpoint_dir=directory, checkpoint_steps=1, resume_from_checkpoint=resume)
    print("done", flush=True)
    """
)


@pytest.fixture(scope="module")
def straight(tiny_paths):
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, make_dataset(4), **OVERRIDES)
    trainer.train()
    return run_summary(trainer)


@pytest.fixture
def child(tmp_path, tiny_paths):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=TESTS))
    processes = []

    def start(directory, pause_at_save=0):
        argument = json.dumps([tiny_paths, str(directory), OVERRIDES, pause_at_save])
        proc = subprocess.Popen([sys.executable, str(script), argument], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(proc)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        return proc

    yield start
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sequences(directory):
    """The sequence numbers of the readable checkpoints in ``directory`` (the order they were saved)."""
    return sorted(e.sequence for e in list_entries(str(directory)) if e.sequence is not None)


def kill_after(proc, directory, target, jitter):
    """SIGKILL ``proc`` a random moment after its checkpoint ``target`` appears (or when it ends)."""
    deadline = time.monotonic() + 120
    while (not sequences(directory) or sequences(directory)[-1] < target) and proc.poll() is None:
        assert time.monotonic() < deadline, "the training process made no progress"
        time.sleep(0.005)
    time.sleep(jitter)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def resume_in_process(tiny_paths, directory):
    seed_everything(99)  # anything: the checkpoint's RNG state replaces it
    trainer = make_magrpo(tiny_paths, make_dataset(4), **OVERRIDES)
    trainer.train(checkpoint_dir=str(directory), checkpoint_steps=1, resume_from_checkpoint=True)
    return trainer


def test_sigkill_at_random_moments_then_resume_is_bit_identical(tiny_paths, straight, child, tmp_path):
    directory = tmp_path / "ckpts"
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    targets = sorted(rng.sample(range(1, SAVES - 1), 3))
    for target in targets:
        jitter = rng.uniform(0.0, 0.08)  # lands anywhere in the next step, sometimes inside a save
        kill_after(child(directory), directory, target, jitter)
        assert sequences(directory)[-1] >= target, (targets, jitter)
    trainer = resume_in_process(tiny_paths, directory)
    assert_same_run(straight, run_summary(trainer))
    assert not [n for n in os.listdir(directory) if n.startswith(".")], "leftover staging folders were not removed"


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_usable(tiny_paths, straight, child, tmp_path):
    directory = tmp_path / "ckpts"
    proc = child(directory, pause_at_save=3)
    assert proc.stdout.readline().strip() == "paused", proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    hidden, *names = sorted(os.listdir(directory))
    assert names == ["checkpoint-step-1", "checkpoint-step-2"]
    assert hidden.startswith(".checkpoint-3.") and hidden.endswith(".staging")  # the half-written one, out of sight
    assert latest_checkpoint(str(directory)) == str(directory / "checkpoint-step-2")
    assert read_checkpoint_metadata(str(directory))["progress"]["global_step"] == 2
    trainer = resume_in_process(tiny_paths, directory)
    assert_same_run(straight, run_summary(trainer))
    assert sequences(directory) == list(range(1, SAVES + 1)) and not [n for n in os.listdir(directory) if n.startswith(".")]
