#!/usr/bin/env python
"""IAC benchmark: the fixed length-ratio workload through the public comlrl API.

  python bench/iac_bench.py --model $BENCH_MODELS/tiny-llama --critic-mode separate --threads 2
  python bench/iac_bench.py --model $BENCH_MODELS/tiny-llama --critic-mode shared --threads 2

--critic-mode separate: use_separate_critic=True with one critic per agent, a fresh copy of that
agent's model (so it reads the agent's tokenizer). --critic-mode shared: a value head on each actor.
The last stdout line is the JSON result (see bench_common.run_and_report).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ac_common  # noqa: E402
import bench_common as bc  # noqa: E402


def main(argv=None) -> None:
    parser = ac_common.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--critic-mode", choices=["separate", "shared"], default="separate")
    args = parser.parse_args(argv)
    paths = bc.resolve_models(args)
    bc.setup_runtime(args)

    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    separate = args.critic_mode == "separate"
    models, tokenizers = bc.load_models_and_tokenizers(paths)
    critics = bc.load_models_and_tokenizers(paths)[0] if separate and not args.pass_paths else None
    counters = critic_counts = None
    if not (args.pass_paths or args.no_instrument):
        counters = ac_common.agent_counters(models, tokenizers)
        critic_counts = ac_common.critic_counters(critics) if critics is not None else None
    reward = bc.CountingReward(args.num_agents)
    config = IACConfig(use_separate_critic=separate, **ac_common.config_fields(args))

    def build():
        critic_kwargs = {"critics": list(paths) if args.pass_paths else critics} if separate else {}
        return IACTrainer(
            agents=list(paths) if args.pass_paths else models, tokenizer=tokenizers, reward_func=reward.func,
            formatters=bc.make_formatters(args.num_agents, tokenizers, args.chat_template), args=config,
            train_dataset=bc.make_dataset(args.num_prompts), **critic_kwargs,
        )

    extra = {"critic_mode": args.critic_mode, **ac_common.report_fields(args)}
    bc.run_and_report("iac", args, paths, tokenizers, build, reward, counters, extra=extra, critic_counters=critic_counts)


if __name__ == "__main__":
    main()
