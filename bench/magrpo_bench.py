#!/usr/bin/env python
"""MAGRPO benchmark: the fixed length-ratio workload through the public comlrl API.

  python bench/magrpo_bench.py --model $BENCH_MODELS/tiny-llama --num-agents 2 \\
      --num-generations 4 --max-new-tokens 32 --num-prompts 4 --epochs 1 --threads 2

Whatever ``comlrl`` the interpreter imports is measured (run it with comlrl 1.4.3's venv for the
baseline). The last stdout line is the JSON result (see bench_common.run_and_report).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def main(argv=None) -> None:
    parser = bc.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--rollout-buffer-size", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--joint-mode", default="aligned", choices=["aligned", "cross"])
    parser.add_argument("--config-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="set one more MAGRPOConfig field (value parsed as YAML), e.g. a loss variant")
    args = parser.parse_args(argv)
    extra_fields = bc.parse_config_sets(parser, args.config_set)
    paths = bc.resolve_models(args)
    bc.setup_runtime(args)

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    models, tokenizers, counters = bc.load_instrumented(args, paths)
    reward = bc.CountingReward(args.num_agents)
    config = MAGRPOConfig(**{**dict(  # --config-set wins over the workload's values
        num_agents=args.num_agents,
        num_turns=1,
        num_train_epochs=args.epochs,
        agent_learning_rate=args.lr,
        logging_steps=10**9,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        joint_mode=args.joint_mode,
        rollout_buffer_size=args.rollout_buffer_size,
        advantage_normalization=True,
        eval_interval=0,
    ), **extra_fields})

    def build():
        return MAGRPOTrainer(
            agents=list(paths) if args.pass_paths else models,
            tokenizer=tokenizers,
            reward_func=reward.func,
            formatters=bc.make_formatters(args.num_agents, tokenizers, args.chat_template),
            args=config,
            train_dataset=bc.make_dataset(args.num_prompts),
        )

    extra = {"rollout_buffer_size": args.rollout_buffer_size, "joint_mode": args.joint_mode, "lr": args.lr,
             "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "config_set": extra_fields}
    bc.run_and_report("magrpo", args, paths, tokenizers, build, reward, counters, extra=extra)


if __name__ == "__main__":
    main()
