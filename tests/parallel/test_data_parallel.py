"""Data parallelism with torchrun on the CPU (gloo): 2 processes, each rolling out half of every step's
items, reach the same parameters as one process (same global batch, per-item random streams)."""

import json
import os
import socket
import subprocess
import sys

import pytest
from tests.helpers.common import REPO_ROOT
import torch
from tests.helpers.dp_scenarios import LR, SCENARIOS, magrpo, seed_everything
from tests.helpers.tolerances import adamw_gap

from comlrl.checkpoint.files import CheckpointError



def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(scenario, paths, out, nproc=2, module="tests.helpers.dp_scenarios"):
    settings = out / f"{scenario}.json"
    settings.write_text(json.dumps({"paths": paths, "scenario": scenario, "out": str(out), "module": module}))
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", os.path.join(REPO_ROOT, "tests", "helpers", "dp_worker.py"), str(settings)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 or aborted_after_the_run(done, nproc), done.stderr[-4000:]
    return torch.load(out / f"{scenario}.pt", weights_only=True)


def aborted_after_the_run(done, nproc):
    """Whether a failed launch failed only in a worker's teardown: every rank left the process group
    (its results written) and the one error is the C++ abort torch.distributed's threads can raise
    while a process exits."""
    left = all(f"rank {rank} left" in done.stdout for rank in range(nproc))
    return left and "terminate called without an active exception" in done.stderr


def one_process(scenario, paths, out):
    seed_everything(0)
    return SCENARIOS[scenario](paths, str(out))


def assert_close_runs(single, double):
    """Same samples (env steps, rewards), the same logged gradient norms and losses up to float noise, and
    parameters within tolerances.adamw_gap(lr, steps): 2 ranks sum the gradients in another order, and
    AdamW turns float noise in a near-zero gradient into a step of up to lr in either direction.

    The logged values (rewards, losses and norms of order 1) are compared at 1e-4, the normwise float32
    bound of one forward and backward of these models (tolerances.gradient_bound: 4 x chain ~ 200 x
    eps); that later steps start from weights up to the gap apart and still agree to it holds for these
    runs (no sampled token sits at a tie), not for every run."""
    assert double["env_step"] == single["env_step"]
    gap = adamw_gap(LR, max(single["steps"], double["steps"]))
    for a, b in zip(single["parameters"], double["parameters"]):
        torch.testing.assert_close(a, b, atol=gap, rtol=0)
    assert [sorted(r) for r in single["rows"]] == [sorted(r) for r in double["rows"]]
    for r1, r2 in zip(single["rows"], double["rows"]):
        for key in r1:
            assert r1[key] == pytest.approx(r2[key], abs=1e-4), key


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["magrpo", "iac"])
def test_two_ranks_train_the_same_team_as_one_process(tiny_paths, tmp_path, scenario):
    single = one_process(scenario, tiny_paths, tmp_path / "single")
    (tmp_path / "double").mkdir()
    double = torchrun(scenario, tiny_paths, tmp_path / "double")
    assert any(not torch.equal(a, b) for a, b in zip(single["parameters"], one_untrained(tiny_paths, scenario)))
    assert_close_runs(single, double)
    if scenario == "magrpo":  # only rank 0 logs: one metrics file with each row once
        lines = (tmp_path / "double" / "magrpo-run" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == len(double["rows"])


def one_untrained(paths, scenario):
    seed_everything(0)
    from transformers import AutoModelForCausalLM

    names = [paths["llama"], paths["gpt2"]] if scenario == "magrpo" else [paths["llama"]] * 2
    return [p.detach().clone() for n in names for p in AutoModelForCausalLM.from_pretrained(n).parameters()]


@pytest.mark.slow
def test_a_distributed_checkpoint_resumes_exactly_and_refuses_another_world_size(tiny_paths, tmp_path):
    result = torchrun("checkpointed", tiny_paths, tmp_path)
    straight, resumed = result["straight"], result["resumed"]
    for a, b in zip(straight["parameters"], resumed["parameters"]):
        assert torch.equal(a, b)
    assert straight["env_step"] == resumed["env_step"]
    assert "checkpoint-step-1" in result["names"] and "checkpoint-2" in result["names"]
    # one process cannot continue a 2-process run: each rank's buffers and random streams are in it
    seed_everything(0)
    single = magrpo(tiny_paths, str(tmp_path / "single"), output_dir=None)
    with pytest.raises(CheckpointError, match="2 data-parallel process"):
        single.train(resume_from_checkpoint=str(tmp_path / "ckpts" / "checkpoint-step-1"))


def pretend_two_ranks(trainer):
    from comlrl.parallel.data_parallel import DataParallel

    trainer.team.dist = DataParallel(rank=0, world_size=2, local_rank=0)
    return trainer


def test_uneven_splits_are_refused_before_any_rollout(tiny_paths, tmp_path):
    from datasets import Dataset

    trainer = magrpo(tiny_paths, str(tmp_path), output_dir=None)
    trainer.train_dataset = Dataset.from_dict({"prompt": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="uneven item counts"):
        pretend_two_ranks(trainer).train()
    trainer = magrpo(tiny_paths, str(tmp_path), output_dir=None, rollout_buffer_size=3)
    with pytest.raises(ValueError, match="rollout_buffer_size=3 .* 2 processes"):
        pretend_two_ranks(trainer).train()
    trainer = magrpo(tiny_paths, str(tmp_path), output_dir=None, early_termination_threshold=0.5)
    with pytest.raises(ValueError, match="early_termination_threshold=None"):
        pretend_two_ranks(trainer).train()
    assert trainer.env_step == 0


def test_a_device_list_of_the_wrong_length_is_refused(tiny_paths):
    with pytest.raises(ValueError, match=r"agent_devices length \(3\) must be 1 or 2"):
        magrpo(tiny_paths, "unused", output_dir=None, agent_devices=["cpu", "cpu", "cpu"])


@pytest.mark.parametrize("wait", [True, False])
def test_leave_process_group_destroys_the_group_this_process_joined(tmp_path, wait):
    import torch.distributed as dist

    from comlrl.parallel.data_parallel import leave_process_group

    leave_process_group()  # without a group: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    leave_process_group(wait=wait)
    assert not dist.is_initialized()


def test_exit_worker_rank_flushes_its_output_and_skips_interpreter_teardown(tmp_path):
    """A finished rank > 0 ends through os._exit: what it printed (buffered, not yet flushed) still
    arrives, its exit code is the one given, and no atexit handler (interpreter teardown) runs."""
    script = (
        "import atexit, sys\n"
        "from comlrl.parallel.data_parallel import exit_worker_rank\n"
        "atexit.register(lambda: print('teardown ran'))\n"
        "sys.stdout.write('trained'); sys.stderr.write('warned')\n"
        "exit_worker_rank(3)\n"
        "print('after exit')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert done.returncode == 3
    assert done.stdout == "trained" and done.stderr == "warned"
