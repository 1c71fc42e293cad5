"""Activation memory of one scoring forward/backward with and without gradient checkpointing (CPU).

Counts the bytes of every tensor autograd saves for backward (``saved_tensors_hooks``; parameters
excluded) during comlrl's scoring forward of a batch of completions, and checks the gradients
agree. Usage: ``python bench/gpu/activation_memory.py [MODEL_DIR] [--rows 8] [--prompt 64] [--completion 128]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from transformers import AutoModelForCausalLM

from comlrl.models.gradient_checkpointing import enable_gradient_checkpointing, scoring_mode
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import score_completions


def measure(model, batch):
    params = {p.data_ptr() for p in model.parameters()}
    seen, total = set(), [0]

    def pack(tensor):
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if tensor.data_ptr() not in params and key not in seen:
            seen.add(key)
            total[0] += tensor.numel() * tensor.element_size()
        return tensor

    scoring_mode(model)
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = score_completions(model, batch, 1.0).logprobs.mul(batch.mask).sum()
    loss.backward()
    seconds = time.perf_counter() - start
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return total[0], seconds, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="a model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.model is None:
        from comlrl.models.default_model import default_model_dir

        args.model = default_model_dir()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (args.prompt,)) for _ in range(args.rows)]
    completions = [torch.randint(3, vocab, (args.completion,)) for _ in range(args.rows)]
    batch = build_sequence_batch(prompts, completions, 2, torch.device("cpu"))
    plain, plain_s, grads = measure(model, batch)
    checkpointed = copy.deepcopy(model)
    enable_gradient_checkpointing(checkpointed, "model")
    ckpt, ckpt_s, ckpt_grads = measure(checkpointed, batch)
    worst = max(float((a - b).abs().max()) for a, b in zip(grads, ckpt_grads))
    print(json.dumps({
        "model": args.model, "rows": args.rows, "tokens_per_row": args.prompt + args.completion,
        "saved_mib": plain / 2**20, "saved_mib_checkpointed": ckpt / 2**20, "ratio": ckpt / plain,
        "forward_backward_s": plain_s, "forward_backward_s_checkpointed": ckpt_s, "max_abs_grad_difference": worst,
    }, indent=2))


if __name__ == "__main__":
    main()
