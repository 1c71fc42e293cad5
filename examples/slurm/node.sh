#!/usr/bin/env bash
# One node of a comlrl training job; the sbatch scripts run it with `srun`, one task per node.
#
#   node.sh [comlrl train options...]
#
# It points every cache a job writes while it runs at the node's own disk, then starts the training:
# `python -m comlrl train ...` for one process, or torchrun (c10d rendezvous at COMLRL_RDZV_ENDPOINT,
# the first node) when the job has several nodes or several processes per node. torchrun gives each
# node its rank in the rendezvous.
#
# Settings (environment; the sbatch scripts set them):
#   COMLRL_NNODES          nodes of the job                [SLURM_NNODES, else 1]
#   COMLRL_NPROC_PER_NODE  training processes per node     [1]
#   COMLRL_RDZV_ENDPOINT   host:port of the rendezvous     (needed with torchrun)
#   COMLRL_NODE_LOCAL      the node-local disk             [TMPDIR, else /tmp]
#   COMLRL_HUB_CACHE       a shared Hugging Face hub cache with the models already downloaded (optional:
#                          without it each job downloads the models onto the node's disk)
#   COMLRL_PYTHON          the Python of the comlrl environment  [python]
set -euo pipefail

node="${SLURM_NODEID:-0}"
local_root="${COMLRL_NODE_LOCAL:-${TMPDIR:-/tmp}}/comlrl-job${SLURM_JOB_ID:-local}-node${node}"

# Node-local caches. Compiled kernels (Triton, the CUDA JIT, TorchInductor), Hugging Face's datasets
# and lock files, vLLM's compile cache and comlrl's converted default model are written while jobs run;
# on a shared filesystem the jobs of a cluster contend for them (and NFS locks are slow or broken).
# The Hugging Face login (token) is kept where it was.
export HF_TOKEN_PATH="${HF_TOKEN_PATH:-${HF_HOME:-$HOME/.cache/huggingface}/token}"
export HF_HOME="$local_root/huggingface"
if [ -n "${COMLRL_HUB_CACHE:-}" ]; then
    export HF_HUB_CACHE="$COMLRL_HUB_CACHE"
fi
export TRITON_CACHE_DIR="$local_root/triton"
export CUDA_CACHE_PATH="$local_root/cuda-jit"
export TORCHINDUCTOR_CACHE_DIR="$local_root/inductor"
export VLLM_CACHE_ROOT="$local_root/vllm"
export COMLRL_CACHE="$local_root/comlrl"
mkdir -p "$HF_HOME" "$TRITON_CACHE_DIR" "$CUDA_CACHE_PATH" "$TORCHINDUCTOR_CACHE_DIR" "$VLLM_CACHE_ROOT" "$COMLRL_CACHE"

python="${COMLRL_PYTHON:-python}"
nnodes="${COMLRL_NNODES:-${SLURM_NNODES:-1}}"
nproc="${COMLRL_NPROC_PER_NODE:-1}"
echo "comlrl node ${node} ($(hostname)): caches under ${local_root}"

# Slurm's --signal=USR1@T reaches every process of the job step: the launcher (this shell, torchrun)
# must survive it, and comlrl's training processes, which handle it themselves once training runs,
# finish their step, checkpoint and exit with the requeue code. An ignored signal stays ignored
# across exec and in the children until comlrl installs its handler.
trap '' USR1

if [ "$nnodes" -eq 1 ] && [ "$nproc" -eq 1 ]; then
    exec "$python" -m comlrl train "$@"
fi
if [ -z "${COMLRL_RDZV_ENDPOINT:-}" ]; then
    echo "node.sh: COMLRL_RDZV_ENDPOINT (host:port of the first node) is needed for ${nnodes} node(s) x ${nproc} process(es)" >&2
    exit 2
fi
# torchrun forwards SIGTERM to the training processes and waits this long before SIGKILL (torch releases
# whose torchrun has --shutdown-timeout; older ones wait 30 s)
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-120}"
exec "$python" -m torch.distributed.run --nnodes="$nnodes" --nproc_per_node="$nproc" \
    --rdzv_id="comlrl-${SLURM_JOB_ID:-local}-${SLURM_RESTART_COUNT:-0}" --rdzv_backend=c10d \
    --rdzv_endpoint="$COMLRL_RDZV_ENDPOINT" --max_restarts=0 \
    -m comlrl train "$@"
