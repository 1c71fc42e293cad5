#!/usr/bin/env python
"""Bare-compute floor of the MAGRPO workload, in raw PyTorch.

The models, prompts, formatters, sampling settings, reward and on-policy schedule of
magrpo_bench.py, with none of a library's bookkeeping. For every rollout buffer of
``--rollout-buffer-size`` prompts and for every agent: ONE batched ``generate`` over the buffer's
prompts x K (left padded, KV cache), then ONE batched forward + backward of the policy-gradient loss
over the completion tokens (EOS included) and one AdamW step. Advantages are the group-normalised
rewards. A library running the same algorithm on the same hardware can approach this time, not beat
it by much.

Same flags as magrpo_bench.py plus ``--fused-adamw``. Prints one JSON line (train_wall_s,
joint_samples_per_s, peak_rss_mib and the split generate_s / forward_backward_s / optimizer_s).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def sample(model, tokenizer, prompts: List[str], k: int, args):
    """(sequences, prompt attention mask, completion mask, non-pad new tokens): K samples of every
    prompt in one call."""
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer([p for p in prompts for _ in range(k)], return_tensors="pt", padding=True)
    with torch.inference_mode():
        sequences = model.generate(
            **batch, do_sample=True, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, pad_token_id=tokenizer.pad_token_id,
        )
    new = sequences[:, batch["input_ids"].shape[1]:]
    eos = new == tokenizer.eos_token_id
    before_eos = eos.int().cumsum(dim=1) - eos.int() == 0  # every token up to and including the first EOS
    return sequences.clone(), batch["attention_mask"], before_eos.long(), int((new != tokenizer.pad_token_id).sum())


def normalised_advantages(rewards, groups: int, k: int):
    """(groups * k,) rewards -> advantages standardised within each prompt's K samples."""
    grid = rewards.view(groups, k)
    centred = grid - grid.mean(dim=1, keepdim=True)
    return (centred / (grid.std(dim=1, unbiased=False, keepdim=True) + 1e-6)).view(-1)


def policy_gradient_step(model, optimizer, rollout, advantages) -> Tuple[float, float]:
    """One forward/backward of -A * mean log pi(completion) over all rows, one AdamW step."""
    import torch

    sequences, prompt_mask, completion_mask, _ = rollout
    prompt_len = prompt_mask.shape[1]
    start = time.perf_counter()
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    logits = model(input_ids=sequences, attention_mask=attention).logits[:, prompt_len - 1:-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    token_logprobs = logprobs.gather(-1, sequences[:, prompt_len:].unsqueeze(-1)).squeeze(-1)
    mask = completion_mask.float()
    per_row = (token_logprobs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    loss = -(per_row * advantages).mean()
    loss.backward()
    middle = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return middle - start, time.perf_counter() - middle


def main(argv=None) -> None:
    parser = bc.build_arg_parser("bare-compute floor of the MAGRPO workload")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--rollout-buffer-size", type=int, default=2)
    parser.add_argument("--fused-adamw", action="store_true", help="torch's fused AdamW kernel")
    args = parser.parse_args(argv)
    paths = bc.resolve_models(args)
    bc.setup_runtime(args)
    import torch

    models, tokenizers = bc.load_models_and_tokenizers(paths)
    formatters = bc.make_formatters(args.num_agents, tokenizers, args.chat_template)
    items = [bc.make_dataset(args.num_prompts)[i] for i in range(args.num_prompts)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=args.lr, fused=True if args.fused_adamw else None) for m in models]
    k, size = args.num_generations, args.rollout_buffer_size
    seconds = {"generate_s": 0.0, "forward_backward_s": 0.0, "optimizer_s": 0.0}
    rewards_seen: List[float] = []
    generated = 0

    bc.seed_everything(args.seed)
    start = time.perf_counter()
    for _epoch in range(args.epochs):
        for first in range(0, len(items), size):
            group = items[first:first + size]
            rollouts = []
            for model, tokenizer, formatter in zip(models, tokenizers, formatters):
                began = time.perf_counter()
                rollouts.append(sample(model, tokenizer, [formatter(item) for item in group], k, args))
                seconds["generate_s"] += time.perf_counter() - began
            texts = [tok.batch_decode(seqs[:, mask.shape[1]:], skip_special_tokens=True)
                     for tok, (seqs, mask, _, _) in zip(tokenizers, rollouts)]
            generated += sum(rollout[3] for rollout in rollouts)
            rewards = [bc.joint_reward(joint) for joint in zip(*texts)]
            rewards_seen.extend(rewards)
            advantages = normalised_advantages(torch.tensor(rewards), len(group), k)
            for model, optimizer, rollout in zip(models, optimizers, rollouts):
                forward_backward, step = policy_gradient_step(model, optimizer, rollout, advantages)
                seconds["forward_backward_s"] += forward_backward
                seconds["optimizer_s"] += step
    wall = time.perf_counter() - start

    joint = len(rewards_seen)
    quarter = max(1, joint // 4)
    bc.emit({
        "bench": "limit_bench",
        "implementation": {"name": "floor (raw PyTorch)", "version": torch.__version__, "module_file": None},
        "label": args.label or "limit",
        "train_wall_s": round(wall, 3),
        "joint_responses": joint,
        "joint_samples_per_s": round(joint / wall, 4),
        "generated_tokens": generated,
        "generated_tokens_per_s": round(generated / wall, 2),
        "peak_rss_mib": bc.peak_rss_mib(),
        **{name: round(value, 3) for name, value in seconds.items()},
        "reward_mean_all": bc.mean(rewards_seen),
        "reward_mean_first_quarter": bc.mean(rewards_seen[:quarter]),
        "reward_mean_last_quarter": bc.mean(rewards_seen[-quarter:]),
        "config": {"models": paths, "num_agents": args.num_agents, "num_generations": k,
                   "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts, "epochs": args.epochs,
                   "seed": args.seed, "rollout_buffer_size": size, "threads": torch.get_num_threads(),
                   "fused_adamw": bool(args.fused_adamw), "lr": args.lr, "temperature": args.temperature,
                   "top_p": args.top_p, "top_k": args.top_k},
        "versions": bc.versions(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }, args.json_out)


if __name__ == "__main__":
    main()
