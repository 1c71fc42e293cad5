"""GPU benchmark of the published CoMLRL configurations (issue 12): peak memory, step time and
generation speed of comlrl per precision / checkpointing / LoRA setting, beside CoMLRL 1.4.3.

Nothing is downloaded: every model is built from its published shape (``comlrl.cli.published``)
with random weights, the tokenizer is a word-level vocabulary over the model's whole id range built
in code, prompts are synthetic token strings of the assumed published prompt length, and the reward
is a cheap length ratio. Random models almost never emit EOS, so every completion runs to
``max_new_tokens`` (the worst case, which is also what the memory estimate assumes).

Each job runs in its own subprocess (clean CUDA statistics, an out-of-memory error stays in its
job): build the models, one warm-up step (AdamW state, kernels, allocator), then ``--steps`` timed
steps with fresh peak statistics. Jobs run in priority order while the ``--budget-s`` allows; the
JSON file is rewritten after every job, so a global timeout still leaves every finished result.

    python bench/gpu/gpu_bench.py --out results.json [--budget-s 450] [--steps 2] [--only JOB ...]
    python bench/gpu/gpu_bench.py --list
    python bench/gpu/gpu_bench.py --scale tiny --device cpu --only tldr-magrpo/bf16-mixed+gc --out x.json   (CPU smoke)

``--comlrl143 DIR``: a directory where CoMLRL 1.4.3 is installed (``run.sh`` installs the wheel in
``wheels/``); jobs of library "1.4.3" run with it first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if __name__ == "__main__" and "--child" not in sys.argv and ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the driver reads this project's published data; a child imports its library's comlrl


@dataclass(frozen=True)
class Job:
    """One measured configuration: a published run under one library and setting."""

    name: str
    run: str  # index into PUBLISHED_RUNS by short key
    library: str = "comlrl"  # or "1.4.3"
    precision: str = "bf16-mixed"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    num_turns: Optional[int] = None  # override of the published turns (time budget), recorded in the result
    expected_s: float = 60.0  # rough wall time on an H200, for the budget


RUNS = {"tldr-magrpo": 0, "tldr-maac": 1, "tldr-iac": 2, "che-iac": 3, "housebuild-maac": 4}

JOBS: List[Job] = [
    Job("tldr-magrpo/1.4.3", "tldr-magrpo", library="1.4.3", precision="bf16", expected_s=70),
    Job("tldr-magrpo/bf16-mixed+gc", "tldr-magrpo", gradient_checkpointing=True, expected_s=45),
    Job("tldr-magrpo/bf16-mixed+gc+lora", "tldr-magrpo", gradient_checkpointing=True, lora_rank=16, expected_s=45),
    Job("tldr-magrpo/bf16-mixed", "tldr-magrpo", expected_s=45),
    Job("tldr-maac/bf16-mixed+gc", "tldr-maac", gradient_checkpointing=True, expected_s=50),
    Job("tldr-maac/bf16-mixed+gc+lora", "tldr-maac", gradient_checkpointing=True, lora_rank=16, expected_s=50),
    Job("tldr-iac/bf16-mixed+gc+lora", "tldr-iac", gradient_checkpointing=True, lora_rank=16, expected_s=55),
    Job("tldr-iac-shared/bf16-mixed+gc", "tldr-iac", gradient_checkpointing=True, expected_s=45),
    Job("che-iac/bf16-mixed+gc+lora", "che-iac", gradient_checkpointing=True, lora_rank=16, num_turns=1, expected_s=70),
    Job("housebuild-maac/bf16-mixed+gc+lora", "housebuild-maac", gradient_checkpointing=True, lora_rank=16, num_turns=1, expected_s=70),
    Job("tldr-maac/1.4.3", "tldr-maac", library="1.4.3", precision="bf16", expected_s=80),
]


# ----------------------------------------------------------------------------- building blocks (also used on CPU)
def build_tokenizer(vocab_size: int):
    """A word-level tokenizer whose ids cover ``vocab_size``: "<eos>" is id 0, "w<i>" is id i."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>")


def scaled_shape(shape, scale: str):
    """The published shape, or (``tiny``) the same architecture at a few thousand parameters."""
    from dataclasses import replace

    if scale == "full":
        return shape
    return replace(shape, vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                   num_kv_heads=1 if shape.num_kv_heads < shape.num_heads else 2, head_dim=16)


def build_model(shape, dtype, device: str, seed: int = 0):
    """A random-weight causal LM in ``shape`` (Qwen3 with q/k norms, Qwen2 with q/k/v biases, else Llama)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    cls = Qwen3Config if shape.qk_norm else Qwen2Config if shape.attention_bias else LlamaConfig
    config = cls(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                 num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                 head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings, eos_token_id=0, pad_token_id=0,
                 bos_token_id=None, max_position_embeddings=4096)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._name_or_path = shape.name
    return model


def synthetic_prompts(count: int, tokens: int, vocab_size: int) -> List[str]:
    """``count`` prompts of exactly ``tokens`` word-level tokens (ids away from EOS)."""
    return [" ".join(f"w{1 + (17 * i + 31 * j) % (vocab_size - 1)}" for j in range(tokens)) for i in range(count)]


def length_ratio(*completions, **_):
    """Reward: how much longer each agent's completion is than the first agent's, capped at 3."""
    first = completions[0]
    return [min(sum(len(c[k]) for c in completions[1:]) / max(len(first[k]), 1) / max(len(completions) - 1, 1), 3.0)
            for k in range(len(first))]


# ----------------------------------------------------------------------------- one job (child process)
class GenerationMeter:
    """Counts new tokens and time of every Hugging Face ``generate`` call (both libraries use it)."""

    def __init__(self, synchronize):
        from transformers.generation.utils import GenerationMixin

        self.tokens = 0
        self.seconds = 0.0
        self.calls = 0
        original = GenerationMixin.generate
        meter = self

        def generate(model, *args, **kwargs):
            synchronize()
            start = time.perf_counter()
            out = original(model, *args, **kwargs)
            synchronize()
            meter.seconds += time.perf_counter() - start
            sequences = out.sequences if hasattr(out, "sequences") else out
            prompt = kwargs.get("input_ids", args[0] if args else None)
            meter.tokens += int(sequences.shape[0] * (sequences.shape[1] - prompt.shape[1]))
            meter.calls += 1
            return out

        GenerationMixin.generate = generate

    def reset(self) -> None:
        self.tokens, self.seconds, self.calls = 0, 0.0, 0


def _trainer(job: Job, run, models, tokenizers, dataset, transition):
    """The trainer of ``job`` through the public API both libraries share (new fields only for comlrl)."""
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    fields = dict(run.settings, num_train_epochs=1, eval_interval=0, temperature=0.7, top_p=0.9)
    ours = job.library == "comlrl"
    if ours:
        fields.update(verbose=False, precision=job.precision, gradient_checkpointing=job.gradient_checkpointing)
    extra: Dict[str, Any] = {}
    if ours and job.lora_rank:
        from peft import LoraConfig

        lora = LoraConfig(r=job.lora_rank, lora_alpha=2 * job.lora_rank, target_modules="all-linear", lora_dropout=0.0)
        extra["peft_config"] = lora
    agents, critics = models
    if isinstance(agents, str):  # one saved model for every agent (and critic): LoRA adapters share its base
        agents, critics = [agents] * len(run.agents), [critics] * len(run.critics) if critics else []
    if fields["num_turns"] > 1:
        extra["external_transition"] = transition
    if run.algorithm == "magrpo":
        return MAGRPOTrainer(agents=agents, tokenizer=tokenizers, reward_func=length_ratio, train_dataset=dataset,
                             args=MAGRPOConfig(**fields), **extra)
    if ours and job.lora_rank and critics:
        extra["critic_peft_config"] = extra["peft_config"]
    shared = job.name.startswith("tldr-iac-shared")
    if run.algorithm == "iac":
        config = IACConfig(num_agents=len(agents), use_separate_critic=not shared, **fields)
        return IACTrainer(agents=agents, critics=None if shared else critics, tokenizer=tokenizers, reward_func=length_ratio,
                          train_dataset=dataset, args=config, **extra)
    return MAACTrainer(agents=agents, critics=critics, tokenizer=tokenizers, reward_func=length_ratio, train_dataset=dataset,
                       args=MAACConfig(num_agents=len(agents), **fields), **extra)


def job_spec(job: Job, scale: str) -> Dict[str, Any]:
    """Everything a job's child needs from comlrl's published data, as JSON (a 1.4.3 child cannot
    import this project's modules: its ``comlrl`` is 1.4.3)."""
    from dataclasses import asdict

    from comlrl.cli.published import PUBLISHED_MODELS, PUBLISHED_RUNS, published_estimate

    run = PUBLISHED_RUNS[RUNS[job.run]]
    settings = dict(run.settings)
    if job.num_turns is not None:  # fewer turns than published, to fit the time budget (recorded in the result)
        settings["num_turns"] = job.num_turns
    if scale == "tiny":  # the CPU smoke run: toy sizes all the way
        settings["max_new_tokens"] = 8
    shared = job.name.startswith("tldr-iac-shared")
    spec = {
        "name": run.name, "algorithm": run.algorithm, "settings": settings, "published_num_turns": run.settings["num_turns"],
        "prompt_tokens": run.prompt_tokens if scale == "full" else 16, "reported_gb": run.reported_gb, "shared_heads": shared,
        "agents": [asdict(scaled_shape(PUBLISHED_MODELS[a], scale)) for a in run.agents],
        "critics": [] if shared else [asdict(scaled_shape(PUBLISHED_MODELS[c], scale)) for c in run.critics],
        "homogeneous": len(set(run.agents) | set(run.critics)) == 1 and not shared,
    }
    if job.library == "comlrl" and scale == "full":
        from dataclasses import replace

        estimate = published_estimate(replace(run, settings=settings), job.precision, job.gradient_checkpointing, job.lora_rank)
        spec["estimated_peak_gib"] = estimate.peak / 2**30
    return spec


def run_job(job: Job, spec: Dict[str, Any], device: str, steps: int) -> Dict[str, Any]:
    import gc
    from types import SimpleNamespace

    import torch

    run = SimpleNamespace(**{k: spec[k] for k in ("name", "algorithm", "settings")}, agents=spec["agents"], critics=spec["critics"])
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    meter = GenerationMeter(sync)
    # 1.4.3 trains in the models' dtype; comlrl loads bfloat16 bases for LoRA and float32 masters otherwise
    dtype = torch.bfloat16 if (job.library == "1.4.3" or job.lora_rank or job.precision == "bf16") else torch.float32
    agent_shapes = [SimpleNamespace(**shape) for shape in spec["agents"]]
    critic_shapes = [SimpleNamespace(**shape) for shape in spec["critics"]]
    tokenizers = [build_tokenizer(s.vocab_size) for s in agent_shapes]
    built = time.perf_counter()
    agents = [build_model(s, dtype, device, seed=i) for i, s in enumerate(agent_shapes)]
    critics = [build_model(s, dtype, device, seed=10 + i) for i, s in enumerate(critic_shapes)]
    if job.lora_rank and spec["homogeneous"]:  # one saved base, given by path, so every adapter shares it
        import tempfile

        folder = os.path.join(tempfile.mkdtemp(prefix="gpu-bench-"), "base")
        agents[0].save_pretrained(folder)
        tokenizers[0].save_pretrained(folder)
        del agents, critics
        agents, critics = folder, folder
        tokenizers = tokenizers[0]
    build_s = time.perf_counter() - built
    vocab = min(s.vocab_size for s in agent_shapes)
    prompt_tokens = spec["prompt_tokens"]
    transition = lambda agent_completions, **_: synthetic_prompts(len(agent_completions), prompt_tokens, vocab)  # noqa: E731

    def dataset(count):
        rows = [{"prompt": p} for p in synthetic_prompts(count, prompt_tokens, vocab)]
        try:
            from datasets import Dataset
        except ImportError:  # comlrl takes any indexable dataset; 1.4.3 needs datasets (run.sh carries it)
            return rows
        return Dataset.from_list(rows)

    warm = _trainer(job, run, (agents, critics), tokenizers, dataset(1), transition)
    warm.train()
    del warm
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    meter.reset()
    trainer = _trainer(job, run, (agents, critics), tokenizers, dataset(steps), transition)
    start = time.perf_counter()
    trainer.train()
    sync()
    wall = time.perf_counter() - start
    result: Dict[str, Any] = {
        "job": job.name, "library": job.library, "run": run.name, "precision": job.precision,
        "gradient_checkpointing": job.gradient_checkpointing, "lora_rank": job.lora_rank, "device": device,
        "num_turns": run.settings["num_turns"], "published_num_turns": spec["published_num_turns"],
        "steps": steps, "step_s": wall / steps, "build_s": build_s, "generation_tokens": meter.tokens,
        "generation_tokens_per_s": meter.tokens / meter.seconds if meter.seconds else None, "generate_calls": meter.calls,
        "generation_share": meter.seconds / wall if wall else None,
    }
    if cuda:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        result["gpu"] = torch.cuda.get_device_name()
    if "estimated_peak_gib" in spec:
        result["estimated_peak_gib"] = spec["estimated_peak_gib"]
    result["reported_gb"] = spec["reported_gb"]
    return result


# ----------------------------------------------------------------------------- the driver
def _child_command(job: Job, args: argparse.Namespace) -> List[str]:
    spec = dict(job_spec(job, args.scale), scale=args.scale)
    return [sys.executable, os.path.abspath(__file__), "--child", job.name, "--spec", json.dumps(spec), "--device", args.device,
            "--steps", str(args.steps)]


def _child_env(job: Job, args: argparse.Namespace) -> Dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")
    path = [ROOT] if job.library == "comlrl" else [args.comlrl143, os.path.join(HERE, "stubs")]
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    return env


def drive(args: argparse.Namespace) -> int:
    jobs = [j for j in JOBS if not args.only or j.name in args.only]
    unknown = sorted(set(args.only or []) - {j.name for j in JOBS})
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}; --list shows them")
    if any(j.library == "1.4.3" for j in jobs) and not args.comlrl143:
        jobs = [j for j in jobs if j.library != "1.4.3"]
        print("no --comlrl143 directory: the 1.4.3 rows are skipped", file=sys.stderr)
    started = time.perf_counter()
    report: Dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": args.budget_s, "results": [], "skipped": []}
    for job in jobs:
        left = args.budget_s - (time.perf_counter() - started)
        if left < min(job.expected_s, 30):
            report["skipped"].append({"job": job.name, "reason": f"budget: {left:.0f} s left, about {job.expected_s:.0f} s needed"})
            print(json.dumps(report["skipped"][-1]), flush=True)
            continue
        try:
            done = subprocess.run(_child_command(job, args), capture_output=True, text=True, timeout=left, env=_child_env(job, args))
            if done.returncode == 0:
                report["results"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            else:
                tail = done.stderr.strip().splitlines()[-3:]
                report["skipped"].append({"job": job.name, "reason": "failed: " + " | ".join(tail)})
        except subprocess.TimeoutExpired:
            report["skipped"].append({"job": job.name, "reason": f"stopped at the budget ({left:.0f} s)"})
        report["elapsed_s"] = time.perf_counter() - started
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(json.dumps(report["results"][-1] if report["results"] and report["results"][-1]["job"] == job.name else report["skipped"][-1]),
              flush=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    return 0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_bench.json", help="JSON report (rewritten after every job)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget for all jobs (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per job after one warm-up step (default: %(default)s)")
    parser.add_argument("--only", nargs="*", default=None, metavar="JOB", help="job names (default: all, in priority order)")
    parser.add_argument("--scale", choices=["full", "tiny"], default="full", help="tiny: the same architectures at toy sizes")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--comlrl143", default=None, help="directory where CoMLRL 1.4.3 is installed (run.sh makes it)")
    parser.add_argument("--list", action="store_true", help="print the jobs and exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.list:
        for job in JOBS:
            print(f"{job.name:45s} {job.library:7s} ~{job.expected_s:.0f} s")
        return 0
    if args.child:
        job = next(j for j in JOBS if j.name == args.child)
        spec = json.loads(args.spec)
        print(json.dumps(dict(run_job(job, spec, args.device, args.steps), scale=spec["scale"])))
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
