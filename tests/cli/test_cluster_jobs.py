"""Runs that last days on a shared cluster, from the command line and through the job scripts of
examples/slurm (run by bash with stand-ins for srun and scontrol: tests/helpers/slurm_jobs.py).

The preemption test sends a real SIGUSR1 with os.kill to a real `comlrl train` process in the middle of a
training step (a FIFO handshake in the reward makes the moment certain, tests/helpers/preemption_probe.py):
the step finishes, a checkpoint is written, the process exits with 85, run_summary.json says
"preempted", the script requeues the job; the requeued attempt (the same script, `--resume auto`)
finishes with the same parameters, bit for bit, as a run that was never stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest
import torch
from tests.helpers import slurm_jobs as jobs
from tests.helpers.cli_runs import read_jsonl

from comlrl.cli.main import build_parser, main

SCRIPTS = ["node.sh", "requeue.sh", "train_single_node.sbatch", "train_multi_node.sbatch"]


def tiny_run(model, *, epochs=2, items=4):
    return ["--import", "tests.helpers.preemption_probe", "--override", "environment=tldr_probe", f"agent_model.name={model}",
            "seed=7", "dataset.offline=true", f"dataset.num_train_items={items}", "dataset.num_eval_items=1",
            f"magrpo.num_train_epochs={epochs}", "magrpo.max_new_tokens=6", "magrpo.eval_interval=0", "magrpo.logging_steps=1",
            "magrpo.num_generations=2", "magrpo.agent_learning_rate=1e-3",
            "magrpo.weight_decay=0", "output.verbose=false"]  # no weight decay: a weight that changed was trained


# ----------------------------------------------------------------------------- the scripts themselves


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_job_scripts_are_valid_bash(script):
    done = subprocess.run(["bash", "-n", os.path.join(jobs.SLURM_DIR, script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def script_train_options(script):
    """The `comlrl train` options a script passes (the line after node.sh up to "$@"), with the script's
    own variables filled in with sample values."""
    text = open(os.path.join(jobs.SLURM_DIR, script)).read().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if '/node.sh"' in line)
    options = line.split('/node.sh"', 1)[1].replace('"$@"', "").split()
    values = {"$CONFIG": "magrpo_tldr_config.yaml", "$RUN_DIR": "runs/x", "$RUN_DIR/checkpoints": "runs/x/checkpoints",
              "$CHECKPOINT_EVERY_S": "3600", "$SOFT_LIMIT": "47:30:00", "$REQUEUE_EXIT_CODE": "85"}
    return [values.get(option.strip('"'), option.strip('"')) for option in options]


@pytest.mark.parametrize("script", ["train_single_node.sbatch", "train_multi_node.sbatch"])
def test_the_scripts_train_options_parse_and_plan_a_run(script, tmp_path, capsys):
    options = script_train_options(script)
    assert {"--resume", "--checkpoint-dir", "--checkpoint-every-s", "--time-limit", "--requeue-exit-code"} <= set(options)
    build_parser().parse_args(["train", *options])  # every flag exists
    plan_options = [o.replace("runs/x", str(tmp_path / "x")) for o in options]
    assert main(["train", *plan_options, "--dry-run", "--json", "--override", "agent_model.name=default"]) == 0
    checkpoint = json.loads(capsys.readouterr().out)["checkpoint"]
    assert checkpoint == {"dir": str(tmp_path / "x" / "checkpoints"), "interval": 1, "steps": None, "total_limit": None,
                          "resume": "auto", "every_s": 3600.0, "time_limit": 171000.0, "requeue_exit_code": 85}


def test_the_scripts_ask_slurm_for_the_signal_and_the_requeue():
    for script in ("train_single_node.sbatch", "train_multi_node.sbatch"):
        text = open(os.path.join(jobs.SLURM_DIR, script)).read()
        directives = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, flags=re.M))
        assert directives["signal"] == "USR1@300" and "requeue" in directives and directives["open-mode"] == "append"
        assert 'requeue_if_preempted "$code"' in text
    multi = open(os.path.join(jobs.SLURM_DIR, "train_multi_node.sbatch")).read()
    assert "--kill-on-bad-exit=0" in multi and 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in multi
    node = open(os.path.join(jobs.SLURM_DIR, "node.sh")).read()
    assert "--rdzv_backend=c10d" in node and "trap '' USR1" in node


# ----------------------------------------------------------------------------- flags


def test_time_limit_and_requeue_flags(chat_models, tmp_path, capsys):
    """--time-limit counts from the command's start: 1 ms is spent before training begins, so the run
    stops after its first step with its checkpoint and the requeue code it was given."""
    run_dir, ck = tmp_path / "run", tmp_path / "run" / "ck"
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(run_dir), "--checkpoint-dir", str(ck),
                 "--time-limit", "0.001s", "--requeue-exit-code", "86", *tiny_run(chat_models["llama"])])
    assert code == 86
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["exit_code"]) == ("preempted", "time limit", 86)
    assert summary["progress"]["global_step"] == 1 and summary["final_checkpoint"] == str(ck / "checkpoint-step-1")
    assert "spent before training started" in capsys.readouterr().out
    for bad, message in ((["--time-limit", "90"], "ambiguous"), (["--time-limit", "soon"], "not a duration"),
                         (["--requeue-exit-code", "0"], "--requeue-exit-code .* must be an integer from 3 to 125"),
                         (["--checkpoint-every-s", "-5"], "--checkpoint-every-s .* must be a positive number")):
        assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(tmp_path / "other"), "--checkpoint-dir",
                     str(tmp_path / "other-ck"), *bad, "--dry-run"]) == 2
        assert re.search(message, capsys.readouterr().err), bad


def test_resume_auto_sets_aside_an_earlier_start_that_never_checkpointed(chat_models, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(run_dir), "--checkpoint-dir", str(tmp_path / "ck"),
            "--resume", "auto", *tiny_run(chat_models["llama"], epochs=1, items=2)]
    # a start without checkpoints that did not get to save its agents (as a job killed mid-run)
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(run_dir),
                 *tiny_run(chat_models["llama"], epochs=1, items=2), "output.save_final_model=false"]) == 0
    first = (run_dir / "metrics.jsonl").read_text()
    assert main(args) == 0
    aside = [p for p in run_dir.iterdir() if p.name.startswith("earlier-start-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_text() == first
    assert "found no checkpoint to resume; the files of an earlier start" in capsys.readouterr().out
    assert json.loads((run_dir / "run_summary.json").read_text())["status"] == "completed"


# ----------------------------------------------------------------------------- a real signal, a real requeue


@pytest.mark.slow
def test_sigusr1_checkpoints_exits_85_and_the_requeued_job_finishes_bit_identically(chat_models, tmp_path):
    model = chat_models["llama"]
    run_dir, handshake = tmp_path / "run", tmp_path / "handshake"
    jobs.prepare_handshake(str(handshake))
    options = tiny_run(model)
    env = jobs.slurm_env(str(tmp_path), RUN_DIR=str(run_dir), CONFIG="magrpo_tldr_config.yaml",
                         COMLRL_TEST_HANDSHAKE=f"{handshake}:3")  # in step 3 of 8 (one reward call per step)
    job = jobs.start("train_single_node.sbatch", options, env)
    pid = jobs.wait_ready(str(handshake), 0, job)
    os.kill(pid, signal.SIGUSR1)  # what `sbatch --signal=USR1@300` sends, mid-step
    jobs.release(str(handshake), 0)
    first = jobs.finish(job)
    log = first.stdout + first.stderr
    assert "comlrl: SIGUSR1 received: finishing this step" in log
    assert "preempted (exit code 85, run status: preempted); requeueing (restart 1)" in log
    assert jobs.requeues(str(tmp_path)) == ["requeue 4242"]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    checkpoint = str(run_dir / "checkpoints" / "checkpoint-step-3")
    stopped = (summary["status"], summary["signal"], summary["exit_code"], summary["final_checkpoint"])
    assert stopped == ("preempted", "SIGUSR1", 85, checkpoint)
    assert summary["progress"]["global_step"] == 3 and summary["scheduler"]["job_id"] == "4242"
    assert f"stopped the run after global step 3 (epoch 1, item 3); checkpoint {checkpoint}; exiting with code 85" in log

    env = jobs.slurm_env(str(tmp_path), restart=1, RUN_DIR=str(run_dir), CONFIG="magrpo_tldr_config.yaml")
    second = jobs.finish(jobs.start("train_single_node.sbatch", options, env))
    log = second.stdout + second.stderr
    assert second.returncode == 0 and jobs.requeues(str(tmp_path)) == ["requeue 4242"], log[-3000:]
    assert f"comlrl: resuming from {checkpoint}" in log and "(Slurm job 4242, restart 1)" in log
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert (summary["status"], summary["attempt"], summary["resumed_from"]) == ("completed", 2, checkpoint)
    assert [row["env_step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == sorted({row["env_step"] for row in
                                                                                       read_jsonl(run_dir / "metrics.jsonl")})

    reference = tmp_path / "reference"
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(reference), *options]) == 0
    for agent in ("agent_0", "agent_1"):
        resumed, straight = jobs.saved_tensors(str(run_dir / agent)), jobs.saved_tensors(str(reference / agent))
        initial = jobs.saved_tensors(model)
        assert resumed.keys() == straight.keys()
        assert all(torch.equal(resumed[name], straight[name]) for name in straight), agent
        assert any(not torch.equal(straight[name], initial[name]) for name in straight if name in initial), "nothing trained"
