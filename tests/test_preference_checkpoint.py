"""Exact resume of the preference trainers: a run resumed from ANY of its checkpoints (after a collection
step, after collection, after reward learning, after a learning step or epoch, after a round) ends
bit-identical to the run that was never interrupted."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from checkpoint_helpers import assert_same_run, make_dataset, seed_everything
from preference_helpers import make_preference, preference_summary

from comlrl.utils import read_checkpoint_metadata

KINDS = ["madpo", "marlhf-magrpo", "marlhf-iac", "marlhf-maac", pytest.param("madpo-iter", marks=pytest.mark.slow),
         pytest.param("marlhf-iter", marks=pytest.mark.slow)]


def checkpoints(directory):
    names = [n for n in os.listdir(directory) if n.startswith("checkpoint-")]
    return [os.path.join(directory, n) for n in sorted(names, key=lambda n: int(n.split("-")[1]))]


def straight_run(kind, paths, dataset, root):
    """The uninterrupted run (seed 0, no checkpoints) and its summary."""
    seed_everything(0)
    trainer = make_preference(kind, paths, dataset, root)
    trainer.train()
    return trainer, preference_summary(trainer)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_every_checkpoint_is_bit_identical(kind, tiny_paths, tmp_path):
    dataset = make_dataset(4)
    straight, expected = straight_run(kind, tiny_paths, dataset, str(tmp_path / "a"))
    assert expected["pairs"], "the run must collect pairs for the test to mean something"

    seed_everything(0)
    saved = make_preference(kind, tiny_paths, dataset, str(tmp_path / "b"))
    directory = str(tmp_path / "ckpts")
    saved.train(checkpoint_dir=directory, checkpoint_steps=1)
    assert_same_run(expected, preference_summary(saved))  # checkpoints change nothing the run computes
    found = checkpoints(directory)
    phases = [read_checkpoint_metadata(path)["progress"] for path in found]
    assert len(found) >= 5 and all("global_step" in p for p in phases)

    for path in found:
        seed_everything(99)  # anything: the checkpoint's RNG state replaces it
        resumed = make_preference(kind, tiny_paths, dataset, str(tmp_path / "c"))
        resumed.train(resume_from_checkpoint=path)
        assert_same_run(expected, preference_summary(resumed))


def test_a_finished_run_returns_at_once_and_grows_with_more_epochs(tiny_paths, tmp_path):
    dataset = make_dataset(4)
    seed_everything(0)
    longer = make_preference("madpo", tiny_paths, dataset, num_train_epochs=3)
    longer.train()
    seed_everything(0)
    short = make_preference("madpo", tiny_paths, dataset)
    directory = str(tmp_path / "ckpts")
    short.train(checkpoint_dir=directory)
    final = checkpoints(directory)[-1]
    again = make_preference("madpo", tiny_paths, dataset)
    again.train(resume_from_checkpoint=final)
    assert again.progress.updates == short.progress.updates  # nothing left to do
    grown = make_preference("madpo", tiny_paths, dataset, num_train_epochs=3)
    grown.train(resume_from_checkpoint=final)
    assert_same_run(preference_summary(longer), preference_summary(grown))


CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import conftest  # offline settings, one thread: exactly what the parent process uses
    from checkpoint_helpers import make_dataset, seed_everything
    from preference_helpers import make_preference
    from comlrl.utils.checkpoint import latest_checkpoint

    kind, paths, root, directory = json.loads(sys.argv[1])
    seed_everything(0)
    trainer = make_preference(kind, paths, make_dataset(4), root)
    resume = True if os.path.isdir(directory) and latest_checkpoint(directory) else None
    print("ready", flush=True)
    trainer.train(checkpoint_dir=directory, checkpoint_steps=1, resume_from_checkpoint=resume)
    print("done", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["madpo", "marlhf-iter"])
def test_sigkill_at_random_moments_then_resume_is_bit_identical(kind, tiny_paths, tmp_path):
    dataset = make_dataset(4)
    straight, expected = straight_run(kind, tiny_paths, dataset, str(tmp_path / "a"))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=os.path.dirname(os.path.abspath(__file__))))
    directory = tmp_path / "ckpts"
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    for target in sorted(rng.sample(range(2, 6 if kind == "madpo" else 12), 2)):
        argument = json.dumps([kind, tiny_paths, str(tmp_path / "child"), str(directory)])
        proc = subprocess.Popen([sys.executable, str(script), argument], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            deadline = time.monotonic() + 180
            while proc.poll() is None and len(checkpoints(directory) if directory.exists() else []) < target:
                assert time.monotonic() < deadline, "the training process made no progress"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.1))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    seed_everything(99)
    resumed = make_preference(kind, tiny_paths, dataset, str(tmp_path / "child"))
    resumed.train(checkpoint_dir=str(directory), checkpoint_steps=1, resume_from_checkpoint=True)
    assert_same_run(expected, preference_summary(resumed))
    if "iter" not in kind:
        return
    # the resumed run wrote its own copy of every round's pairs, equal to the uninterrupted run's
    for r in (1, 2):
        name = f"iteration_{r:04d}.json"
        with open(os.path.join(straight.outputs.path("preference_replay"), name)) as a, open(os.path.join(resumed.outputs.path("preference_replay"), name)) as b:
            assert json.load(a) == json.load(b)


def test_a_finished_iterative_run_grows_with_more_rounds(tiny_paths, tmp_path):
    dataset = make_dataset(4)
    _, expected = straight_run("madpo-iter", tiny_paths, dataset, str(tmp_path / "a"))  # 2 rounds
    seed_everything(0)
    longer = make_preference("madpo-iter", tiny_paths, dataset, str(tmp_path / "b"), num_iterations=3)
    longer.train()
    seed_everything(0)
    short = make_preference("madpo-iter", tiny_paths, dataset, str(tmp_path / "c"), num_iterations=1)
    directory = str(tmp_path / "ckpts")
    short.train(checkpoint_dir=directory)
    final = checkpoints(directory)[-1]
    grown = make_preference("madpo-iter", tiny_paths, dataset, str(tmp_path / "d"), num_iterations=3)
    grown.train(resume_from_checkpoint=final)
    assert_same_run(preference_summary(longer), preference_summary(grown))
    assert grown.progress.round == 3 and expected["progress"]["round"] == 2
