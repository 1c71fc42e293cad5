"""The several-node job of examples/slurm, run here: train_multi_node.sbatch under bash with stand-ins for
srun and scontrol (tests/helpers/slurm_jobs.py) starts node.sh on two "nodes", each with a node-local
directory of its own; node.sh points the caches at it and starts a torchrun launcher with --nnodes=2
--nproc_per_node=1 and a c10d rendezvous on 127.0.0.1, which gives each node its rank. The two
processes train the same team as one process does (parameters within float noise, as in
test_data_parallel.py), and each saw its own node's caches. A SIGUSR1 that reaches one training process
(and both launchers, which ignore it) stops both processes after the same step; the script reads
run_summary.json (torchrun exits 1) and requeues; the requeued job finishes the run."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from tests.helpers import slurm_jobs as jobs
from tests.helpers.cli_runs import read_jsonl

from comlrl.cli.main import main

CACHES = ("HF_HOME", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "COMLRL_CACHE")


def workload(model, epochs=1):
    """4 items, 2 per step (one per process); a small learning rate so that Adam does not turn float
    noise into differences of the order of the learning rate (test_data_parallel.py)."""
    return ["--import", "tests.helpers.preemption_probe", "--override", "environment=tldr_probe", f"agent_model.name={model}",
            "seed=11", "dataset.offline=true", "dataset.num_train_items=4", "dataset.num_eval_items=1", f"magrpo.num_train_epochs={epochs}",
            "magrpo.max_new_tokens=6", "magrpo.eval_interval=0", "magrpo.logging_steps=1", "magrpo.num_generations=2",
            "magrpo.rollout_buffer_size=2", "magrpo.train_batch_size=2", "magrpo.early_termination_threshold=null",
            "magrpo.agent_learning_rate=2e-5",
            "magrpo.weight_decay=0", "output.verbose=false"]  # no weight decay: a weight that changed was trained


@pytest.mark.slow
def test_two_nodes_with_torchrun_train_the_same_team_as_one_process(chat_models, tmp_path):
    model = chat_models["llama"]
    run_dir, probes = tmp_path / "run", tmp_path / "probes"
    probes.mkdir()
    env = jobs.slurm_env(str(tmp_path), nodes=2, RUN_DIR=str(run_dir), GPUS_PER_NODE="1", RDZV_PORT=str(jobs.free_port()),
                         COMLRL_TEST_PROBE_OUT=str(probes), COMLRL_DIST_BACKEND="gloo")
    done = jobs.finish(jobs.start("train_multi_node.sbatch", workload(model), env))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "training ended with exit code 0 (run status: completed); not requeued" in log and jobs.requeues(str(tmp_path)) == []
    assert "rendezvous 127.0.0.1:" in log

    # node ranks came from the rendezvous; each process wrote its caches under its own node's disk
    seen = jobs.probe_records(str(probes), 2)
    assert sorted(r["GROUP_RANK"] for r in seen) == ["0", "1"] and all(r["WORLD_SIZE"] == "2" for r in seen)
    roots = set()
    for record in seen:
        local = {os.path.dirname(record[name]) for name in CACHES}
        assert len(local) == 1, record  # every cache in one node-local folder
        root = local.pop()
        assert os.path.basename(root).startswith("comlrl-job4242-node") and os.path.isdir(record["TRITON_CACHE_DIR"])
        assert root.startswith(record["TMPDIR"] + os.sep) and record["TMPDIR"].startswith(os.path.join(str(tmp_path), "node"))
        roots.add(root)
    assert len(roots) == 2  # two nodes, two node-local cache folders

    single_dir = tmp_path / "single"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(single_dir), *workload(model)]) == 0
    rows, single_rows = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(single_dir / "metrics.jsonl")
    assert [r["env_step"] for r in rows] == [r["env_step"] for r in single_rows]  # rank 0 alone logged, once per step
    assert_same_team(run_dir, single_dir)
    for agent in ("agent_0", "agent_1"):
        single, initial = jobs.saved_tensors(str(single_dir / agent)), jobs.saved_tensors(model)
        assert any(not torch.equal(single[name], initial[name]) for name in single if name in initial), "nothing trained"
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["status"] == "completed" and summary["progress"]["global_step"] == 2


def assert_same_team(run_dir, single_dir):
    for agent in ("agent_0", "agent_1"):
        double, single = jobs.saved_tensors(str(run_dir / agent)), jobs.saved_tensors(str(single_dir / agent))
        assert double.keys() == single.keys()
        for name in single:
            torch.testing.assert_close(double[name], single[name], atol=1e-5, rtol=0)


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
def test_a_signal_on_one_node_stops_both_at_the_same_step_and_the_requeued_job_finishes(chat_models, tmp_path):
    model = chat_models["llama"]
    run_dir, handshake = tmp_path / "run", tmp_path / "handshake"
    jobs.prepare_handshake(str(handshake), ranks=2)
    settings = dict(RUN_DIR=str(run_dir), GPUS_PER_NODE="1", COMLRL_DIST_BACKEND="gloo")
    env = jobs.slurm_env(str(tmp_path), nodes=2, RDZV_PORT=str(jobs.free_port()), COMLRL_TEST_HANDSHAKE=f"{handshake}:2", **settings)
    job = jobs.start("train_multi_node.sbatch", workload(model, epochs=2), env)  # 4 steps; the handshake is in step 2
    pids = [jobs.wait_ready(str(handshake), rank, job) for rank in (0, 1)]
    for pid in (pids[1], parent_of(pids[0]), parent_of(pids[1])):  # rank 1 (not the writer) and both torchrun launchers
        os.kill(pid, signal.SIGUSR1)
    for rank in (0, 1):
        jobs.release(str(handshake), rank)
    first = jobs.finish(job)
    log = first.stdout + first.stderr
    checkpoint = str(run_dir / "checkpoints" / "checkpoint-step-2")
    assert "run status: preempted); requeueing (restart 1)" in log and jobs.requeues(str(tmp_path)) == ["requeue 4242"], log[-4000:]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert (summary["status"], summary["signal"], summary["final_checkpoint"]) == ("preempted", "SIGUSR1", checkpoint)
    assert summary["progress"]["global_step"] == 2 and os.path.isdir(checkpoint)

    env = jobs.slurm_env(str(tmp_path), nodes=2, restart=1, RDZV_PORT=str(jobs.free_port()), **settings)
    second = jobs.finish(jobs.start("train_multi_node.sbatch", workload(model, epochs=2), env))
    log = second.stdout + second.stderr
    assert second.returncode == 0 and "run status: completed); not requeued" in log, log[-4000:]
    assert json.loads((run_dir / "run_summary.json").read_text())["attempt"] == 2
    single_dir = tmp_path / "single"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(single_dir), *workload(model, epochs=2)]) == 0
    assert_same_team(run_dir, single_dir)
