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
from tests.helpers.common import REPO_ROOT
from tests.helpers.checkpoint_runs import assert_same_run, make_dataset, seed_everything
from tests.helpers.preference_runs import make_preference, preference_summary

from comlrl.checkpoint.layout import read_checkpoint_metadata

KINDS = ["madpo", "marlhf-magrpo", "marlhf-iac", "marlhf-maac", pytest.param("madpo-iter", marks=pytest.mark.slow),
         pytest.param("marlhf-iter", marks=pytest.mark.slow)]


def checkpoints(directory):
    """The run's checkpoints in the order they were written (their manifests' sequence)."""
    paths = [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith("checkpoint-")]
    return sorted(paths, key=lambda path: read_checkpoint_metadata(path)["sequence"])


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
    names = {os.path.basename(path) for path in found}
    assert not any(".v" in name for name in names)  # every commit point has a name of its own
    if kind.endswith("iter"):
        assert {"checkpoint-round-1-collected", "checkpoint-round-1", "checkpoint-round-2"} <= names
    else:
        assert {"checkpoint-collected", "checkpoint-1"} <= names
    if kind.startswith("marlhf"):
        assert any(name.endswith("reward-model") for name in names)

    for index, path in enumerate(found):
        seed_everything(99)  # anything: the checkpoint's RNG state replaces it
        # each resume is a run of its own: its own folders (a shared one would hold the previous
        # resume's replay, and the next would write beside it, saying so)
        resumed = make_preference(kind, tiny_paths, dataset, str(tmp_path / f"c{index}"))
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
    import tests.helpers.common  # offline settings, one thread: exactly what the parent process uses
    from tests.helpers.checkpoint_runs import make_dataset, seed_everything
    from tests.helpers.preference_runs import make_preference
    from comlrl.checkpoint.layout import latest_checkpoint

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
# The resume continues in the killed run's folders: when the kill came after a round's replay was
# written, the resumed run writes its replay into a resume-<id> subfolder and says so (the no-overwrite
# rule of trainers/preference/output_paths.py); whether it does depends on the drawn kill points.
@pytest.mark.filterwarnings("ignore:.*already holds files; this run writes its preference_replay:UserWarning")
def test_sigkill_at_random_moments_then_resume_is_bit_identical(kind, tiny_paths, tmp_path):
    dataset = make_dataset(4)
    straight, expected = straight_run(kind, tiny_paths, dataset, str(tmp_path / "a"))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=REPO_ROOT))
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


@pytest.mark.parametrize("kind", ["madpo", "marlhf-iac", pytest.param("madpo-iter", marks=pytest.mark.slow)])
def test_parallel_training_mp_is_bit_identical_to_sequential(kind, tiny_paths, tmp_path):
    """parallel_training="mp": the agents' collection (and MARLHF's RL steps) run on worker threads,
    each row on its own random stream, so the run equals the sequential one."""
    dataset = make_dataset(4)
    _, expected = straight_run(kind, tiny_paths, dataset, str(tmp_path / "a"))
    seed_everything(0)
    extra = dict(parallel_training="mp", agent_devices=["cpu", "cpu"])
    if kind == "marlhf-iac":
        extra["critic_devices"] = ["cpu", "cpu"]
    parallel = make_preference(kind, tiny_paths, dataset, str(tmp_path / "b"), **extra)
    assert parallel.team.workers.parallel
    parallel.train()
    assert_same_run(expected, preference_summary(parallel))
