"""Checks ``comlrl.cli.memory.estimate_memory`` against measured peak memory on the CPU.

Each case trains one step of a real trainer in a fresh subprocess and measures its peak resident
memory above the process's memory before the first model loads (``VmHWM`` minus ``VmRSS`` then,
from /proc/self/status, with the tokenizer loaded and the runtime warmed up by the same trainer on a
micro model, then the peak reset: the interpreter, lazily imported modules, kernels' scratch and
the tokenizer are not the run's memory, as CUDA's context is not in
``torch.cuda.max_memory_allocated``). glibc
is told to serve large blocks from mmap (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the
resident set at once and the peak follows live tensors as CUDA's allocator statistics do. Completions are held at ``max_new_tokens`` with
``min_new_tokens`` so the workload is the one the estimate assumes, and every run takes two steps:
AdamW's state is allocated during the first update, so the steady-state peak comes from the second. The estimate is computed from
the model's config.json and the trainer config alone.

    python bench/gpu/estimator_check.py [--models-dir DIR] [--only NAME ...] [--json OUT]   (DIR: $BENCH_MODELS or bench/models)

Prints one table row per case and the relative error; exits 1 when a case is off by more than 15 %.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday and explain it:", "Write a bedtime story for a dragon:",
           "Explain how teleportation might work:"]

# name -> (model folder, algorithm, config fields, LoRA rank)
CASES: Dict[str, Any] = {
    "tiny MAGRPO fp32": ("tiny-llama", "magrpo", {}, 0),
    "smol MAGRPO fp32": ("smollm2-135m-instruct", "magrpo", {}, 0),
    "smol MAGRPO fp32 + GC": ("smollm2-135m-instruct", "magrpo", {"gradient_checkpointing": True}, 0),
    "smol MAGRPO bf16-mixed": ("smollm2-135m-instruct", "magrpo", {"precision": "bf16-mixed"}, 0),
    "smol MAGRPO LoRA r=16": ("smollm2-135m-instruct", "magrpo", {}, 16),
    "smol MAGRPO KL, no in-backward": ("smollm2-135m-instruct", "magrpo", {"reference_kl_enabled": True, "optimizer_in_backward": False}, 0),
    "smol IAC separate critics": ("smollm2-135m-instruct", "iac", {}, 0),
    "smol MAAC": ("smollm2-135m-instruct", "maac", {}, 0),
}

CHILD = r"""
import json, os, sys
sys.path.insert(0, {root!r})
for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"), ("WANDB_MODE", "disabled")):
    os.environ.setdefault(k, v)
import torch
torch.set_num_threads(2)
torch.manual_seed(0)
from datasets import Dataset
from transformers import AutoTokenizer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.cli.memory import estimate_memory, run_shape, shapes_from_sources

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

model, algorithm, fields, rank, prompts, new_tokens = {model!r}, {algorithm!r}, {fields!r}, {rank!r}, {prompts!r}, {new_tokens!r}
tok = AutoTokenizer.from_pretrained(model)
prompt_tokens = max(len(tok(p).input_ids) for p in prompts)
common = dict(num_turns=1, max_new_tokens=new_tokens, num_train_epochs=1, verbose=False, eval_interval=0, **fields)
reward2 = lambda a, b: [min(len(y) / max(len(x), 1), 3.0) for x, y in zip(a, b)]
peft = None
if rank:
    from peft import LoraConfig
    peft = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0)
if algorithm == "magrpo":
    args = MAGRPOConfig(num_generations=4, rollout_buffer_size=2, **common)
    dataset = Dataset.from_dict({{"prompt": prompts[:4]}})  # two steps: the second has every AdamW state allocated
    make = lambda: MAGRPOTrainer(agent_model=model, num_agents=2, tokenizer=tok, reward_func=reward2, train_dataset=dataset, args=args,
                                 peft_config=peft)
    critics = []
else:
    cls, config = (IACTrainer, IACConfig) if algorithm == "iac" else (MAACTrainer, MAACConfig)
    args = config(num_agents=2, num_generations=4, rollout_buffer_size=4, **common)
    dataset = Dataset.from_dict({{"prompt": prompts[:2]}})
    make = lambda: cls(agent_model=model, critic_model=model, tokenizer=tok, reward_func=reward2, train_dataset=dataset, args=args,
                       peft_config=peft, critic_peft_config=peft)
    critics = [model] * (2 if algorithm == "iac" else 1)
# warm the runtime up with the same trainer on a micro model (imports, lazily built kernels and thread pools
# are the interpreter's memory, not the run's), then reset the peak
import gc, tempfile
from tests.helpers.tiny_models import make_llama, make_tokenizer, save
micro_tok = make_tokenizer(300, "<eos>", "<pad>")
micro = save(make_llama(micro_tok), micro_tok, os.path.join(tempfile.mkdtemp(), "micro"))
real_model, real_tok = model, tok
model, tok = micro, micro_tok
def hold_length(trainer):
    # memory only, not maths: train() refuses min_new_tokens (it changes the sampled distribution),
    # so the workload's fixed completion length is installed past that check
    trainer._set_generation_kwargs = lambda kwargs: setattr(trainer, "_generation_kwargs", {{"min_new_tokens": new_tokens}})
    return trainer
warm = hold_length(make())
warm.train()
del warm
model, tok = real_model, real_tok
gc.collect()
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # resets VmHWM to the current resident set
baseline = status("VmRSS:")
trainer = hold_length(make())
trainer.train()
peak = status("VmHWM:") - baseline
shapes = shapes_from_sources([model, model])
shape = run_shape(algorithm, shapes, trainer.args, agent_sources=[model, model], critic_shapes=shapes_from_sources(critics),
                  critic_sources=[model if rank else f"critic{{i}}" for i in range(len(critics))], prompt_tokens=prompt_tokens,
                  lora_rank=rank, device="cpu")
estimate = estimate_memory(shape)
print(json.dumps({{"measured": peak, "predicted": estimate.peak, "parts": estimate.table(1 << 20)}}))
"""


def run_case(name: str, models_dir: str, new_tokens: int) -> Dict[str, Any]:
    folder, algorithm, fields, rank = CASES[name]
    code = CHILD.format(root=ROOT, model=os.path.join(models_dir, folder), algorithm=algorithm, fields=fields, rank=rank,
                        prompts=PROMPTS, new_tokens=new_tokens)
    # large allocations straight from mmap, so a freed tensor leaves the resident set at once and the peak
    # follows live tensors (glibc would otherwise keep freed blocks of up to 32 MiB in its heap)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=2400, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["name"] = name
    result["error"] = result["predicted"] / result["measured"] - 1.0
    return result


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", default=os.environ.get("BENCH_MODELS") or os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "models"), help="default: $BENCH_MODELS or bench/models (python bench/bench_models.py)")
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--verbose", action="store_true", help="print each estimate's parts")
    args = parser.parse_args(argv)
    results = []
    print("| case | measured MiB | predicted MiB | error |\n|---|---|---|---|")
    for name in args.only or list(CASES):
        result = run_case(name, args.models_dir, args.new_tokens)
        results.append(result)
        print(f"| {name} | {result['measured'] / 2**20:.0f} | {result['predicted'] / 2**20:.0f} | {result['error']:+.1%} |", flush=True)
        if args.verbose:
            print(result["parts"], flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 1 if any(abs(r["error"]) > 0.15 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
