#!/usr/bin/env python
"""MAAC benchmark: the fixed length-ratio workload through the public comlrl API.

  python bench/maac_bench.py --model $BENCH_MODELS/tiny-llama --threads 2
  python bench/maac_bench.py --model $BENCH_MODELS/tiny-llama --model $BENCH_MODELS/tiny-hetero --threads 2

The centralized critic is a fresh copy of the first agent's model (it reads the first agent's
tokenizer). Critic forwards are counted on the critic's transformer body, which every
implementation runs. The last stdout line is the JSON result (see bench_common.run_and_report).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def count_critic_forwards(counters: "bc.ModelCounters", critic) -> None:
    """Count forwards of the critic's transformer body (a critic never generates)."""
    critic.base_model.register_forward_pre_hook(counters._before_forward, with_kwargs=True)
    critic.base_model.register_forward_hook(counters._after_forward, with_kwargs=True)


def main(argv=None) -> None:
    parser = bc.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--critic-type", choices=["v", "q"], default="v")
    parser.add_argument("--rollout-buffer-size", type=int, default=8)
    parser.add_argument("--critic-lr", type=float, default=5e-5)
    args = parser.parse_args(argv)
    paths = bc.resolve_models(args)
    bc.setup_runtime(args)

    from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer

    models, tokenizers = bc.load_models_and_tokenizers(paths)
    critic = None if args.pass_paths else bc.load_models_and_tokenizers(paths[:1])[0][0]
    counters = critic_counters = None
    if not (args.pass_paths or args.no_instrument):
        counters = bc.ModelCounters()
        for model, tokenizer in zip(models, tokenizers):
            counters.attach(model, tokenizer.pad_token_id)
        critic_counters = bc.ModelCounters()
        count_critic_forwards(critic_counters, critic)
    reward = bc.CountingReward(args.num_agents)
    config = MAACConfig(
        num_agents=args.num_agents,
        num_turns=1,
        num_train_epochs=args.epochs,
        agent_learning_rate=args.lr,
        critic_learning_rate=args.critic_lr,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        critic_type=args.critic_type,
        rollout_buffer_size=args.rollout_buffer_size,
        advantage_normalization=True,
        eval_interval=0,
        logging_steps=10**9,
    )

    def build():
        return MAACTrainer(
            agents=list(paths) if args.pass_paths else models,
            critic_model=paths[0] if args.pass_paths else critic,
            tokenizer=tokenizers,
            reward_func=reward.func,
            formatters=bc.make_formatters(args.num_agents, tokenizers, args.chat_template),
            args=config,
            train_dataset=bc.make_dataset(args.num_prompts),
        )

    extra = {"critic_type": args.critic_type, "rollout_buffer_size": args.rollout_buffer_size, "lr": args.lr,
             "critic_lr": args.critic_lr, "temperature": args.temperature, "top_p": args.top_p}
    bc.run_and_report("maac", args, paths, tokenizers, build, reward, counters, extra=extra, critic_counters=critic_counters)


if __name__ == "__main__":
    main()
