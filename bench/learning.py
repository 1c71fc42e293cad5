#!/usr/bin/env python
"""Learning benchmark: N seeds x a list of MAGRPO variants on two tasks, with the embedded SmolLM2.

  python bench/learning.py --tasks length_ratio,tldr --variants default,dr_grpo,dapo,counterfactual,cross \
      --seeds 1,2,3,4,5 --env-prompts 48
  python bench/learning.py --report-only          # summarise what has finished
  python bench/learning.py --report-only --markdown   # ... as the table of docs/benchmarks.md

Tasks:
  length_ratio  the project lead's workload, ``magrpo_bench.py --num-agents 2 --num-generations 4
                --max-new-tokens 32 --num-prompts 16 --epochs 3 --threads 2 --seed S`` (``--bench-script``),
                a variant's fields passed as ``--config-set FIELD=VALUE``
  tldr, strbuild, housebuild, ...
                a ready ``comlrl.envs`` environment on its bundled rows (no hub), single turn, the same
                sampling settings (K = 4, temperature 0.6, top-p 0.6, top-k 50, lr 5e-5),
                ``--env-prompts`` rows x ``--env-epochs``, ``--env-buffer`` prompts per update and
                ``--env-max-new-tokens``. The sweep's second task is TLDR: its gated reward (structure,
                length ratio, vocabulary, style) tells SmolLM2-135M's answers apart, while on StrBuild
                every answer of the 135M model scored -0.5 (no valid /setblock command, even with the
                target grid shown and 96 tokens), so every group ties and nothing can be learned.

Every finished run appends one JSON line to ``OUT/runs.jsonl`` and leaves ``OUT/TASK/VARIANT/seedS/``
(``result.json`` and the run's ``metrics.jsonl``); a rerun skips finished runs, so an interrupted sweep
resumes where it stopped. ``OUT/summary.json`` and ``OUT/curves.png`` are rewritten after every run.
OUT defaults to ``bench/learning_out`` (git-ignored: never commit a run's outputs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> MAGRPOConfig fields; "default" is CoMLRL 1.4.3's maths. "cross" is the control of
# "counterfactual" (the same cross-mode pairing without counterfactual credit). "dapo" is DAPO complete:
# its token-mean loss, clip-higher, dynamic sampling, overlong filtering and the soft overlong
# punishment with L_cache = 8 (about a fifth of the 32 and 48 new tokens of the two tasks, DAPO's
# 4096 of 20480); "dapo_loss" is loss_type="dapo" alone.
VARIANTS: Dict[str, Dict[str, Any]] = {
    "default": {},
    "counterfactual": {"joint_mode": "cross", "counterfactual_credit": True},
    "cross": {"joint_mode": "cross"},
    "scale_batch": {"scale_rewards": "batch"},
    "scale_agent": {"scale_rewards": "agent"},
    "scale_none": {"scale_rewards": "none"},
    "agent_turn": {"advantage_grouping": "agent_turn"},
    "sequential": {"sequential_updates": True},
    "grpo": {"loss_type": "grpo"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28, "dynamic_sampling": True, "overlong_filtering": True,
             "soft_overlong_cache": 8},
    "dapo_loss": {"loss_type": "dapo"},
    "bnpo": {"loss_type": "bnpo"},
    "gspo": {"loss_type": "gspo"},
}
WORKLOAD = ["--num-agents", "2", "--num-generations", "4", "--max-new-tokens", "32", "--num-prompts", "16", "--epochs", "3", "--threads", "2"]
# Student t quantiles t_{0.975, df} for the 95 % interval of a mean over df + 1 seeds.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def default_model() -> str:
    """``$BENCH_MODELS/smollm2-135m-instruct`` when it exists, else the embedded default model."""
    models = os.environ.get("BENCH_MODELS")
    if models and os.path.isdir(os.path.join(models, "smollm2-135m-instruct")):
        return os.path.join(models, "smollm2-135m-instruct")
    sys.path.insert(0, ROOT)
    from comlrl.models.default_model import default_model_dir

    return str(default_model_dir())


def default_bench_script() -> str:
    """``$BENCH_SCRIPT``, else this repository's ``bench/magrpo_bench.py`` (the shared harness's workload)."""
    return os.environ.get("BENCH_SCRIPT") or os.path.join(HERE, "magrpo_bench.py")


# ------------------------------------------------------------------ one run
def length_ratio_command(args, variant: str, seed: int, run_dir: str) -> List[str]:
    cmd = [sys.executable, args.bench_script, "--model", args.model, *WORKLOAD, "--seed", str(seed),
           "--json-out", os.path.join(run_dir, "result.json"),
           "--config-set", f"output_dir={os.path.join(run_dir, 'run')}", "--config-set", "logging_steps=1"]
    for field, value in VARIANTS[variant].items():
        cmd += ["--config-set", f"{field}={json.dumps(value)}"]
    return cmd


ENV_FLAGS = ("env_prompts", "env_epochs", "env_max_new_tokens", "env_buffer")


def env_command(args, task: str, variant: str, seed: int, run_dir: str) -> List[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "_env-run", "--task", task, "--variant", variant, "--seed", str(seed),
           "--model", args.model, "--run-dir", run_dir]
    for name in ENV_FLAGS:
        cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return cmd


def add_env_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env-prompts", type=int, default=8, help="dataset rows of a ready environment (at most its train split)")
    p.add_argument("--env-epochs", type=int, default=4)
    p.add_argument("--env-max-new-tokens", type=int, default=48)
    p.add_argument("--env-buffer", type=int, default=1, help="rollout_buffer_size: prompts per update")


def env_run(argv: Sequence[str]) -> None:
    """Train one variant on a ready environment in this process; write ``result.json`` in the bench's fields.

    An environment that renders its prompts with a chat template (StrBuild, HouseBuild) gets the
    model's tokenizer, as ``comlrl train`` gives it; the writing tasks send their prompts as they are."""
    p = argparse.ArgumentParser()
    for flag in ("--task", "--variant", "--model", "--run-dir"):
        p.add_argument(flag, required=True)
    p.add_argument("--seed", type=int, required=True)
    add_env_flags(p)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    import random

    import torch

    sys.path.insert(0, ROOT)
    from transformers import AutoTokenizer

    from comlrl.envs import get_environment
    from comlrl.envs.base import environment_spec
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    torch.set_num_threads(a.threads)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    options: Dict[str, Any] = {"num_turns": 1}
    if "tokenizer" in {f.name for f in dataclasses.fields(environment_spec(a.task).options_cls)}:
        options["tokenizer"] = AutoTokenizer.from_pretrained(a.model)
    env = get_environment(a.task, **options)
    rewards: List[float] = []

    def reward_func(*completions, batch_items=None):
        values = [float(v) for v in env.reward_func(*completions, batch_items=batch_items)]
        rewards.extend(values)
        return values

    config = MAGRPOConfig(num_agents=env.num_agents, num_turns=1, num_train_epochs=a.env_epochs, agent_learning_rate=5e-5,
                          logging_steps=1, num_generations=4, max_new_tokens=a.env_max_new_tokens, temperature=0.6, top_p=0.6,
                          top_k=50, rollout_buffer_size=a.env_buffer, advantage_normalization=True, eval_interval=0, verbose=False,
                          output_dir=os.path.join(a.run_dir, "run"), **VARIANTS[a.variant])
    dataset = env.load_dataset("train", offline=True)
    dataset = dataset.select(range(min(a.env_prompts, len(dataset))))
    trainer = MAGRPOTrainer(agent_model=a.model, num_agents=env.num_agents, reward_func=reward_func,
                            formatters=env.formatters, train_dataset=dataset, args=config)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    quarter = max(1, len(rewards) // 4)
    result = {"bench": f"learning_{a.task}", "train_wall_s": round(wall, 3), "peak_rss_mib": peak_rss_mib(),
              "reward_mean_all": mean(rewards), "reward_mean_first_quarter": mean(rewards[:quarter]),
              "reward_mean_last_quarter": mean(rewards[-quarter:]), "joint_responses": len(rewards)}
    with open(os.path.join(a.run_dir, "result.json"), "w") as f:
        json.dump(result, f)


def peak_rss_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def mean(xs: Sequence[float]) -> Optional[float]:
    return float(sum(xs) / len(xs)) if xs else None


# ------------------------------------------------------------------ the sweep
def run_dir_of(out: str, task: str, variant: str, seed: int) -> str:
    return os.path.join(out, task, variant, f"seed{seed}")


def load_runs(out: str) -> Dict[tuple, Dict[str, Any]]:
    """Finished runs by (task, variant, seed): the lines of runs.jsonl."""
    runs = {}
    path = os.path.join(out, "runs.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    runs[(row["task"], row["variant"], row["seed"])] = row
    return runs


def record_run(out: str, task: str, variant: str, seed: int, wall_s: Optional[float]) -> Dict[str, Any]:
    """Append the finished run's line (from its result.json and metrics.jsonl) to runs.jsonl."""
    run_dir = run_dir_of(out, task, variant, seed)
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    row = {"task": task, "variant": variant, "seed": seed, "fields": VARIANTS.get(variant),
           "first_quarter": result["reward_mean_first_quarter"], "final_quarter": result["reward_mean_last_quarter"],
           "train_wall_s": result.get("train_wall_s"), "run_wall_s": wall_s, "peak_rss_mib": result.get("peak_rss_mib"),
           "curve": reward_curve(os.path.join(run_dir, "run", "metrics.jsonl"))}
    with open(os.path.join(out, "runs.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def reward_curve(metrics_path: str) -> List[float]:
    """The mean reward of every training step (``turn_1/reward_mean`` of each logged row)."""
    curve = []
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            for line in f:
                row = json.loads(line)
                if "turn_1/reward_mean" in row and not any(k.startswith("eval/") for k in row):
                    curve.append(float(row["turn_1/reward_mean"]))
    return curve


def run_one(args, task: str, variant: str, seed: int) -> None:
    run_dir = run_dir_of(args.out, task, variant, seed)
    os.makedirs(run_dir, exist_ok=True)
    if not os.path.exists(os.path.join(run_dir, "result.json")):  # a result.json without a line: finished, adopt it
        run_path = os.path.join(run_dir, "run")
        if os.path.isdir(run_path):  # a half-written run of an interrupted sweep starts afresh
            for name in os.listdir(run_path):
                if os.path.isfile(os.path.join(run_path, name)):
                    os.remove(os.path.join(run_path, name))
        cmd = length_ratio_command(args, variant, seed, run_dir) if task == "length_ratio" else env_command(args, task, variant, seed, run_dir)
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        start = time.perf_counter()
        with open(os.path.join(run_dir, "stdout.log"), "w") as out, open(os.path.join(run_dir, "stderr.log"), "w") as err:
            code = subprocess.call(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        if code != 0 or not os.path.exists(os.path.join(run_dir, "result.json")):
            raise SystemExit(f"{task}/{variant}/seed{seed} failed (exit {code}); see {run_dir}/stderr.log")
        record_run(args.out, task, variant, seed, round(time.perf_counter() - start, 1))
    else:
        record_run(args.out, task, variant, seed, None)


# ------------------------------------------------------------------ the report
def interval(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean and the 95 % t-interval of the mean (None for fewer than two values)."""
    n = len(values)
    m = mean(values)
    if n < 2:
        return {"n": n, "mean": m, "ci95_low": None, "ci95_high": None}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = T975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "ci95_low": m - half, "ci95_high": m + half}


def summarise(runs: Dict[tuple, Dict[str, Any]]) -> Dict[str, Any]:
    """Per task and variant: first- and final-quarter means with intervals, wall time, peak RSS, and
    the paired (same seeds) final-quarter difference against "default"."""
    summary: Dict[str, Any] = {}
    for task, variant in sorted({(t, v) for t, v, _ in runs}):
        rows = [r for (t, v, _), r in sorted(runs.items()) if t == task and v == variant]
        entry = {"seeds": [r["seed"] for r in rows], "first_quarter": interval([r["first_quarter"] for r in rows]),
                 "final_quarter": interval([r["final_quarter"] for r in rows]),
                 "train_wall_s_mean": mean([r["train_wall_s"] for r in rows if r.get("train_wall_s") is not None]),
                 "peak_rss_mib_max": max((r["peak_rss_mib"] for r in rows if r.get("peak_rss_mib") is not None), default=None)}
        base = {r["seed"]: r["final_quarter"] for (t, v, _), r in runs.items() if t == task and v == "default"}
        paired = [r["final_quarter"] - base[r["seed"]] for r in rows if r["seed"] in base]
        if variant != "default" and paired:
            entry["paired_final_minus_default"] = interval(paired)
        summary.setdefault(task, {})[variant] = entry
    return summary


def plot(runs: Dict[tuple, Dict[str, Any]], path: str) -> None:
    """Mean reward curve per variant (x: fraction of training), a 95 % band where there are 2+ seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({t for t, _, _ in runs})
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(6 * max(1, len(tasks)), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for variant in sorted({v for t, v, _ in runs if t == task}):
            curves = [r["curve"] for (t, v, _), r in runs.items() if t == task and v == variant and r["curve"]]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            x = [(i + 1) / length for i in range(length)]
            stats = [interval([c[i] for c in curves]) for i in range(length)]
            ax.plot(x, [s["mean"] for s in stats], label=f"{variant} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(x, [s["ci95_low"] for s in stats], [s["ci95_high"] for s in stats], alpha=0.2)
        ax.set_title(task)
        ax.set_xlabel("fraction of training")
        ax.set_ylabel("mean reward per step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def in_progress(out: str, runs: Dict[tuple, Dict[str, Any]]) -> Dict[str, Any]:
    """Runs started but not finished (no runs.jsonl line): the steps they logged and their per-step
    reward curve, and, against the same seed's default run, the mean reward over the steps both have."""
    partial: Dict[str, Any] = {}
    for task in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        for variant in sorted(os.listdir(os.path.join(out, task))) if os.path.isdir(os.path.join(out, task)) else []:
            for seed_dir in sorted(os.listdir(os.path.join(out, task, variant))):
                seed = int(seed_dir[4:]) if seed_dir.startswith("seed") and seed_dir[4:].isdigit() else None
                if seed is None or (task, variant, seed) in runs:
                    continue
                curve = reward_curve(os.path.join(out, task, variant, seed_dir, "run", "metrics.jsonl"))
                partial[f"{task}/{variant}/seed{seed}"] = {"steps_logged": len(curve), "curve": curve}
    for key, entry in partial.items():
        task, variant, seed = key.split("/")
        base = partial.get(f"{task}/default/{seed}", {}).get("curve") or runs.get((task, "default", int(seed[4:])), {}).get("curve")
        if variant != "default" and base:
            n = min(len(base), len(entry["curve"]))
            entry["common_steps"] = n
            entry["mean_reward_common_steps"] = mean(entry["curve"][:n])
            entry["default_mean_reward_common_steps"] = mean(base[:n])
    return partial


def report(out: str) -> Dict[str, Any]:
    runs = load_runs(out)
    summary = summarise(runs)
    partial = in_progress(out, runs)
    if partial:
        summary["_in_progress"] = partial
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if runs:
        plot(runs, os.path.join(out, "curves.png"))
    return summary


def markdown_table(summary: Dict[str, Any]) -> str:
    """The summary as the table of docs/benchmarks.md: per task and variant, the seeds, first- and
    final-quarter means with their 95 % intervals, the paired final-quarter difference against
    "default" (same seeds), mean training wall time and the largest peak RSS."""
    def fmt(stat: Optional[Dict[str, Any]]) -> str:
        if not stat or stat.get("mean") is None:
            return "-"
        if stat.get("ci95_low") is None:
            return f"{stat['mean']:.3f}"
        return f"{stat['mean']:.3f} [{stat['ci95_low']:.3f}, {stat['ci95_high']:.3f}]"

    lines = ["| task | variant | seeds | first quarter | final quarter | final - default (paired) | train wall s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for task, variants in summary.items():
        if task.startswith("_"):
            continue
        for variant, entry in sorted(variants.items(), key=lambda kv: (kv[0] != "default", kv[0])):
            wall, rss = entry.get("train_wall_s_mean"), entry.get("peak_rss_mib_max")
            lines.append(f"| {task} | {variant} | {','.join(str(s) for s in entry['seeds'])} | {fmt(entry['first_quarter'])} | "
                         f"{fmt(entry['final_quarter'])} | {fmt(entry.get('paired_final_minus_default'))} | "
                         f"{'-' if wall is None else f'{wall:.0f}'} | {'-' if rss is None else f'{rss:.0f}'} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_env-run":
        return env_run(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="length_ratio,tldr")
    p.add_argument("--variants", default="default,dr_grpo,dapo,counterfactual,cross")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--model", default=None, help="SmolLM2 folder (default: $BENCH_MODELS/smollm2-135m-instruct or the embedded one)")
    p.add_argument("--bench-script", default=default_bench_script())
    p.add_argument("--out", default=os.path.join(HERE, "learning_out"))
    add_env_flags(p)
    p.add_argument("--order", choices=["seed", "variant"], default="seed", help="seed: every variant of seed 1 first (paired results early)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print the summary as a markdown table instead of JSON")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if not args.report_only:
        args.model = args.model or default_model()
        seeds = [int(s) for s in args.seeds.split(",")]
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        plan = [(t, v, s) for s in seeds for t in tasks for v in variants] if args.order == "seed" else \
               [(t, v, s) for t in tasks for v in variants for s in seeds]
        for task, variant, seed in plan:
            if (task, variant, seed) not in load_runs(args.out):
                run_one(args, task, variant, seed)
                report(args.out)
    summary = report(args.out)
    print(markdown_table(summary) if args.markdown else json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
