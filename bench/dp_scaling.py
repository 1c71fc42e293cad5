"""Data-parallel scaling of a fixed MAGRPO workload: time per training step with 1, 2, ... processes
(torchrun, gloo on the CPU or NCCL on GPUs) and the bytes each process all-reduces per step.

    python bench/dp_scaling.py --model $BENCH_MODELS/tiny-llama --procs 1 2 [--json-out FILE]

The workload is the same global batch at every world size (the same items per step, the same rollout
buffer and train batch as whole-run counts), so the runs train the same team; only the work per
process shrinks. Each line of output is one JSON result: world size, train wall time, steps, seconds
per step, the bytes of gradients all-reduced per process and step (counted where comlrl averages them,
``DataParallel.average_``), and per agent. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from bench_common import emit


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset

    import comlrl.parallel.data_parallel as distributed
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    reduced = {"bytes": 0, "calls": 0}
    original = distributed.DataParallel.average_

    def counting(self, tensor):
        reduced["bytes"] += tensor.numel() * tensor.element_size()
        reduced["calls"] += 1
        return original(self, tensor)

    distributed.DataParallel.average_ = counting
    prompts = [f"Write about topic number {i}." for i in range(args.num_prompts)]

    def reward(c1, c2):
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]

    trainer = MAGRPOTrainer(
        agent_model=args.model, num_agents=2, reward_func=reward, train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=MAGRPOConfig(num_turns=1, num_generations=args.num_generations, max_new_tokens=args.max_new_tokens,
                          num_train_epochs=1, verbose=False, rollout_buffer_size=args.rollout_buffer_size,
                          agent_learning_rate=1e-5, logging_steps=10**9, eval_interval=0),
    )
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    steps = trainer.state.global_step
    params = [sum(p.numel() * p.element_size() for p in agent.parameters() if p.requires_grad) for agent in trainer.agents]
    if trainer.team.dist.is_main:
        result = {
            "bench": "dp_scaling", "world_size": trainer.team.dist.world_size, "model": args.model, "train_wall_s": round(wall, 3),
            "steps": steps, "s_per_step": round(wall / max(steps, 1), 3), "env_steps": trainer.env_step,
            "allreduced_bytes_per_step": reduced["bytes"] // max(steps, 1), "allreduce_calls_per_step": reduced["calls"] // max(steps, 1),
            "gradient_bytes_per_agent": params, "threads_per_process": args.threads,
        }
        print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rollout-buffer-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    here = os.path.abspath(__file__)
    flags = ["--model", args.model, "--num-prompts", str(args.num_prompts), "--num-generations", str(args.num_generations),
             "--max-new-tokens", str(args.max_new_tokens), "--rollout-buffer-size", str(args.rollout_buffer_size),
             "--threads", str(args.threads), "--seed", str(args.seed), "--worker"]
    for procs in args.procs:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", "--master_addr=127.0.0.1",
                   f"--master_port={_free_port()}", here, *flags]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if done.returncode != 0:
            sys.exit(f"dp_scaling: {procs} process(es) failed:\n{done.stderr[-3000:]}")
        line = [l for l in done.stdout.splitlines() if l.startswith("{")][-1]
        emit(json.loads(line), args.json_out)  # printed and appended, its paths made portable


if __name__ == "__main__":
    main()
