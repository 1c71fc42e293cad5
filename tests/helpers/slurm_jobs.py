"""Running examples/slurm's job scripts here: bash with stand-ins for Slurm's commands.

- ``srun`` runs its command once per node of the job (``SLURM_NNODES``), each with ``SLURM_NODEID`` and a
  node-local ``TMPDIR`` of its own (``<root>/node<i>``), and exits with the highest exit code, as
  ``srun --ntasks-per-node=1`` does;
- ``scontrol show hostnames LIST`` prints the comma-separated LIST one per line; ``scontrol requeue ID``
  appends ``requeue ID`` to ``<root>/scontrol.log``.

``handshake`` drives the FIFO handshake of ``tests.helpers.preemption_probe``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from typing import Dict, List, Optional

from tests.helpers.common import REPO_ROOT

SLURM_DIR = os.path.join(REPO_ROOT, "examples", "slurm")
SRUN = """#!/usr/bin/env bash
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
pids=()
for i in $(seq 0 $(( ${SLURM_NNODES:-1} - 1 ))); do
    mkdir -p "$SHIM_ROOT/node$i"
    SLURM_NODEID=$i SLURM_PROCID=$i TMPDIR="$SHIM_ROOT/node$i" "$@" &
    pids+=($!)
done
code=0
for pid in "${pids[@]}"; do
    wait "$pid"; status=$?
    if [ "$status" -gt "$code" ]; then code=$status; fi
done
exit "$code"
"""
SCONTROL = """#!/usr/bin/env bash
case "$1 $2" in
    "show hostnames") echo "$3" | tr ',' '\\n' ;;
    requeue*) echo "requeue $2" >> "$SHIM_ROOT/scontrol.log" ;;
    *) echo "scontrol stand-in: unsupported: $*" >&2; exit 1 ;;
esac
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_env(root: str, *, nodes: int = 1, restart: int = 0, **extra: str) -> Dict[str, str]:
    """The environment of a job script run with the stand-ins installed under ``root``."""
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "COMLRL_TEST_"))}
    env.update(
        PATH=os.pathsep.join([bin_dir, os.environ["PATH"]]), SHIM_ROOT=root, SLURM_JOB_ID="4242", SLURM_JOB_NAME="comlrl-test",
        SLURM_NNODES=str(nodes), SLURM_JOB_NODELIST=",".join(["127.0.0.1"] * nodes), SLURM_RESTART_COUNT=str(restart),
        COMLRL_SLURM_DIR=SLURM_DIR, COMLRL_PYTHON=sys.executable, OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    env.update(extra)
    return env


def start(script: str, args: List[str], env: Dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", os.path.join(SLURM_DIR, script), *args], env=env, cwd=env["SHIM_ROOT"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def prepare_handshake(folder: str, ranks: int = 1) -> None:
    for rank in range(ranks):
        os.makedirs(os.path.join(folder, f"rank{rank}"))
        for name in ("ready", "go"):
            os.mkfifo(os.path.join(folder, f"rank{rank}", name))


def wait_ready(folder: str, rank: int, job: subprocess.Popen, timeout: float = 240) -> int:
    """The pid a training process wrote into its ``ready`` FIFO once its step is under way; fails
    (killing ``job``) when none comes within ``timeout`` seconds."""
    fifo = os.path.join(folder, f"rank{rank}", "ready")
    got: List[str] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        job.kill()
        with open(fifo, "w"):  # release the reader
            pass
        out, err = job.communicate()
        raise AssertionError(f"no training step reached the handshake of rank {rank}:\n{out[-3000:]}\n{err[-3000:]}")
    return int(got[0])


def release(folder: str, rank: int) -> None:
    with open(os.path.join(folder, f"rank{rank}", "go"), "w") as go:
        go.write("go")


def finish(job: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
        raise AssertionError(f"the job script did not end:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def requeues(root: str) -> List[str]:
    path = os.path.join(root, "scontrol.log")
    return open(path).read().splitlines() if os.path.exists(path) else []


def saved_tensors(folder: str) -> Dict[str, "object"]:
    """Every tensor of a saved agent folder (safetensors), by name."""
    from safetensors.torch import load_file

    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def probe_records(folder: str, ranks: int) -> List[Optional[dict]]:
    import json

    return [json.load(open(os.path.join(folder, f"rank{rank}.json"))) for rank in range(ranks)]
