"""What the IAC and MAAC benchmarks share on top of bench_common: their flags, the config fields
they set, and counting the critics' forwards."""

from __future__ import annotations

import argparse
from typing import Any, Dict

import bench_common as bc


def build_arg_parser(description: str) -> argparse.ArgumentParser:
    parser = bc.build_arg_parser(description)
    parser.add_argument("--critic-type", choices=["v", "q"], default="v")
    parser.add_argument("--rollout-buffer-size", type=int, default=8)
    parser.add_argument("--critic-lr", type=float, default=5e-5)
    parser.add_argument("--top-k", type=int, default=None,
                        help="set top_k in the config (default: leave the config's default, None)")
    return parser


def config_fields(args: argparse.Namespace) -> Dict[str, Any]:
    """The config fields both benchmarks set explicitly (the shared harness's workload)."""
    return dict(
        num_agents=args.num_agents, num_turns=1, num_train_epochs=args.epochs, agent_learning_rate=args.lr,
        critic_learning_rate=args.critic_lr, num_generations=args.num_generations, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, critic_type=args.critic_type,
        rollout_buffer_size=args.rollout_buffer_size, advantage_normalization=True, eval_interval=0, logging_steps=10**9,
        **({"top_k": args.top_k} if args.top_k is not None else {}),
    )


def report_fields(args: argparse.Namespace) -> Dict[str, Any]:
    return {"critic_type": args.critic_type, "rollout_buffer_size": args.rollout_buffer_size, "lr": args.lr,
            "critic_lr": args.critic_lr, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}


def critic_counters(critics) -> "bc.ModelCounters":
    """Counters on each critic's transformer body: every implementation runs it (a critic never generates)."""
    counters = bc.ModelCounters()
    for critic in critics:
        critic.base_model.register_forward_pre_hook(counters._before_forward, with_kwargs=True)
        critic.base_model.register_forward_hook(counters._after_forward, with_kwargs=True)
    return counters


def agent_counters(models, tokenizers) -> "bc.ModelCounters":
    counters = bc.ModelCounters()
    for model, tokenizer in zip(models, tokenizers):
        counters.attach(model, tokenizer.pad_token_id)
    return counters
