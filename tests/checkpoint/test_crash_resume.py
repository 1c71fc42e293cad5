"""Crash safety: a training process killed with SIGKILL (at seeded, deterministic kill points: inside a
training step or in the middle of writing a checkpoint) resumes from its latest checkpoint and ends bit-identical to a run that was never killed."""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from tests.helpers.common import REPO_ROOT
from tests.helpers.common import TEST_SEED
from tests.helpers.checkpoint_runs import assert_same_run, make_dataset, make_magrpo, run_summary, seed_everything

from comlrl.checkpoint.layout import latest_checkpoint, list_entries, read_checkpoint_metadata

TESTS = REPO_ROOT
OVERRIDES = {"num_train_epochs": 2}
SAVES = 10  # 8 step checkpoints + 2 epoch ends

# Kill points are deterministic: the child prints "paused" and sleeps at the named point (inside its
# n-th reward call, i.e. in the middle of a training step, or inside its n-th checkpoint save after
# training_state.pt is written), and the parent kills it there.
CHILD = textwrap.dedent(
    """
    import functools, json, os, sys, time
    sys.path.insert(0, {tests!r})
    import tests.helpers.common  # offline settings, one thread: exactly what the parent process uses
    import comlrl.checkpoint.folder as checkpoint
    from tests.helpers.checkpoint_runs import make_dataset, make_magrpo, seed_everything
    from tests.helpers.common import length_ratio
    from comlrl.checkpoint.layout import latest_checkpoint

    paths, directory, overrides, (where, count) = json.loads(sys.argv[1])

    def pause():
        print("paused", flush=True)
        time.sleep(600)

    calls = []

    @functools.wraps(length_ratio)  # the same reward with a kill point (a resume checks the reward function)
    def reward(c1, c2):
        calls.append(1)
        if where == "reward" and len(calls) == count:
            pause()
        return length_ratio(c1, c2)

    if where == "save":
        original, saves = checkpoint.save_torch, []

        def paused(path, value):
            original(path, value)
            if path.endswith("training_state.pt"):
                saves.append(path)
                if len(saves) == count:  # half of this checkpoint is on disk, in its staging folder
                    pause()

        checkpoint.save_torch = paused
    seed_everything(0)
    trainer = make_magrpo(paths, make_dataset(4), reward=reward, **overrides)
    resume = True if os.path.isdir(directory) and latest_checkpoint(directory) else None
    print("ready", flush=True)
    trainer.train(checkpoint_dir=directory, checkpoint_steps=1, resume_from_checkpoint=resume)
    print("done", flush=True)
    """
)
READ_TIMEOUT = 120  # seconds to wait for any line of the child


class Child:
    """A training subprocess whose stdout lines are read with a timeout (stderr goes to a file)."""

    def __init__(self, script, argument, stderr_path):
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(script), argument], stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)  # end of output

    def expect(self, text):
        try:
            line = self.lines.get(timeout=READ_TIMEOUT)
        except queue.Empty:
            line = f"<nothing within {READ_TIMEOUT} s>"
        if line != text:
            self.kill()
            with open(self.stderr_path) as handle:
                pytest.fail(f"the child said {line!r} instead of {text!r}; its stderr:\n{handle.read()[-3000:]}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._stderr.close()


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
    children = []

    def start(directory, kill_point):
        argument = json.dumps([tiny_paths, str(directory), OVERRIDES, list(kill_point)])
        started = Child(script, argument, tmp_path / f"child-{len(children)}.stderr")
        children.append(started)
        started.expect("ready")
        return started

    yield start
    for started in children:
        started.kill()


def sequences(directory):
    """The sequence numbers of the readable checkpoints in ``directory`` (the order they were saved)."""
    return sorted(e.sequence for e in list_entries(str(directory)) if e.sequence is not None)


def resume_in_process(tiny_paths, directory):
    seed_everything(99)  # anything: the checkpoint's RNG state replaces it
    trainer = make_magrpo(tiny_paths, make_dataset(4), **OVERRIDES)
    trainer.train(checkpoint_dir=str(directory), checkpoint_steps=1, resume_from_checkpoint=True)
    return trainer


def kill_points(seed):
    """Three kill points drawn with ``seed``: mid-step (inside a reward call) or mid-save. Each lies
    after the child's first completed checkpoint (a step and an evaluation take at most 5 reward
    calls; save n >= 2 follows a finished save), so every child makes progress, and before the
    run could end (it makes 32 reward calls; two children consume at most 18 of them)."""
    rng = random.Random(seed)
    return [("reward", rng.randint(6, 9)) if rng.random() < 0.5 else ("save", rng.randint(2, 3)) for _ in range(3)]


@pytest.mark.slow
def test_sigkill_at_seeded_kill_points_then_resume_is_bit_identical(tiny_paths, straight, child, tmp_path):
    seed = TEST_SEED
    points = kill_points(seed)
    print(f"kill points (seed {seed}, COMLRL_TEST_SEED replays another draw): {points}")
    directory = tmp_path / "ckpts"
    for point in points:
        started = child(directory, point)
        started.expect("paused")
        started.kill()
    assert sequences(directory), f"no checkpoint survived the kills at {points}"
    trainer = resume_in_process(tiny_paths, directory)
    assert_same_run(straight, run_summary(trainer))
    assert not [n for n in os.listdir(directory) if n.startswith(".")], "leftover staging folders were not removed"


@pytest.mark.slow
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_usable(tiny_paths, straight, child, tmp_path):
    directory = tmp_path / "ckpts"
    started = child(directory, ("save", 3))
    started.expect("paused")
    started.kill()
    hidden, *names = sorted(os.listdir(directory))
    assert names == ["checkpoint-step-1", "checkpoint-step-2", "run.json"]
    assert hidden.startswith(".checkpoint-3.") and hidden.endswith(".staging")  # the half-written one, out of sight
    assert latest_checkpoint(str(directory)) == str(directory / "checkpoint-step-2")
    assert read_checkpoint_metadata(str(directory))["progress"]["global_step"] == 2
    trainer = resume_in_process(tiny_paths, directory)
    assert_same_run(straight, run_summary(trainer))
    assert sequences(directory) == list(range(1, SAVES + 1)) and not [n for n in os.listdir(directory) if n.startswith(".")]
