#!/usr/bin/env python
"""MAAC benchmark: the fixed length-ratio workload through the public comlrl API.

  python bench/maac_bench.py --model $BENCH_MODELS/tiny-llama --threads 2
  python bench/maac_bench.py --model $BENCH_MODELS/tiny-llama --model $BENCH_MODELS/tiny-hetero --threads 2

The centralized critic is a fresh copy of the first agent's model (it reads the first agent's
tokenizer). The last stdout line is the JSON result (see bench_common.run_and_report).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ac_common  # noqa: E402
import bench_common as bc  # noqa: E402


def main(argv=None) -> None:
    args = ac_common.build_arg_parser(__doc__.splitlines()[0]).parse_args(argv)
    paths = bc.resolve_models(args)
    bc.setup_runtime(args)

    from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer

    models, tokenizers = bc.load_models_and_tokenizers(paths)
    critic = None if args.pass_paths else bc.load_models_and_tokenizers(paths[:1])[0][0]
    counters = critic_counts = None
    if not (args.pass_paths or args.no_instrument):
        counters = ac_common.agent_counters(models, tokenizers)
        critic_counts = ac_common.critic_counters([critic])
    reward = bc.CountingReward(args.num_agents)
    config = MAACConfig(**ac_common.config_fields(args))

    def build():
        return MAACTrainer(
            agents=list(paths) if args.pass_paths else models, critic_model=paths[0] if args.pass_paths else critic,
            tokenizer=tokenizers, reward_func=reward.func,
            formatters=bc.make_formatters(args.num_agents, tokenizers, args.chat_template), args=config,
            train_dataset=bc.make_dataset(args.num_prompts),
        )

    bc.run_and_report("maac", args, paths, tokenizers, build, reward, counters, extra=ac_common.report_fields(args),
                      critic_counters=critic_counts)


if __name__ == "__main__":
    main()
