"""``comlrl eval``: evaluate a saved team on a ready environment's split or a user dataset.

    comlrl eval --agents runs/magrpo_he/agent_0 runs/magrpo_he/agent_1 --sample 8 --pass-k 1,5 --offline
    comlrl eval --checkpoint runs/ckpts --env humaneval --split eval --greedy
    comlrl eval --agents saved/ --env tldr --dataset my_posts.jsonl --output-dir runs/eval_tldr

The command assembles, like ``comlrl train``: a run config (``--config``; or ``--env`` with the team's
own run config for the team's algorithm and sampling; or the ``config.yaml`` ``comlrl train`` wrote
beside the agents) -> a ``RunPlan`` with the evaluated agents and the flags -> every check that needs
no model (``eval_team``: team size, order, tokenizers, the checkpoint's trainer family; the split
or dataset rows; pass@k's test results; the output directory) -> the trainer of the plan's algorithm,
built on the agents (a checkpoint's agent weights copied in) -> its evaluation's ``report`` (the code
``trainer.evaluate()`` runs, ``comlrl.trainers.evaluation``) with the decoding asked for -> the files
of ``eval_output``.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

NO_HOOKS = SimpleNamespace(eval_logger=None, eval_aggregator=None, metrics_callback=None)
SUMMARY = ("reward_mean", "expected_return")  # what the console shows; every metric is in the files
SAMPLING_FLAGS = (("num_turns", "num_turns"), ("max_new_tokens", "max_new_tokens"), ("temperature", "temperature"),
                  ("top_p", "top_p"), ("top_k", "top_k"), ("batch_size", "eval_batch_size"))


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "eval", help="evaluate saved agents or a training checkpoint on an environment",
        description="Evaluate a team (the agent_i folders save_model wrote, or a training checkpoint) on a ready environment's "
        "split or a JSON-lines dataset of its rows, greedily or with K samples per item (pass@k for the code environments), "
        "over as many turns as the environment has. Writes eval.json, eval.md (a table per metric) and eval_rows.jsonl.",
    )
    team = parser.add_mutually_exclusive_group(required=True)
    team.add_argument("--agents", nargs="+", metavar="DIR", help="agent folders in team order (agent_0 first), or the folder holding them")
    team.add_argument("--checkpoint", metavar="DIR", help="a training checkpoint folder, or a checkpoint directory (its latest)")
    task = parser.add_mutually_exclusive_group()
    task.add_argument("--env", metavar="NAME", help="a ready environment (see comlrl.envs.list_environments())")
    task.add_argument("--config", metavar="FILE_OR_NAME", help="a comlrl train config (file or bundled name) naming the environment")
    parser.add_argument("--env-option", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="an environment option by name, e.g. external_mode=plain (YAML values)")
    parser.add_argument("--algorithm", default=None, help="whose evaluation to run (default: the config's; with --env alone magrpo)")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--split", choices=("eval", "train"), default="eval", help="the environment's split (default: eval)")
    data.add_argument("--dataset", metavar="FILE.jsonl", help="a JSON-lines file of rows with the environment's columns")
    parser.add_argument("--num-samples", type=int, default=None, metavar="N", help="evaluate the first N items (default: all)")
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument("--greedy", action="store_true", help="one greedy episode per item (the default)")
    decoding.add_argument("--sample", type=int, default=None, metavar="K", help="K sampled episodes per item")
    parser.add_argument("--pass-k", default=None, metavar="K1,K2", help="report pass@k for these k (code environments; k <= K)")
    parser.add_argument("--num-turns", type=int, default=None, help="turns per episode (default: the config's, or the environment's)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per response (default: the config's)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the config's)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the config's)")
    parser.add_argument("--top-k", type=int, default=None, help="top-k sampling (default: the config's)")
    parser.add_argument("--batch-size", type=int, default=None, help="items per generation batch (default: the config's eval_batch_size)")
    parser.add_argument("--output-dir", default=None, help="where the files go (default: runs/eval_<environment>_<split>)")
    parser.add_argument("--offline", action="store_true", help="the environment's bundled sample instead of the real dataset")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled episodes (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation's files in --output-dir")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE",
                        help="import a module (or .py file) first, e.g. one that registers an environment; repeatable")
    return parser


def eval_settings(args: argparse.Namespace):
    """The decoding flags as ``EvalSettings`` (every flag checked, naming it)."""
    from comlrl.trainers.evaluation import EvalSettings

    for flag, value, low in (("--sample", args.sample, 1), ("--num-samples", args.num_samples, 1), ("--num-turns", args.num_turns, 1),
                             ("--max-new-tokens", args.max_new_tokens, 1), ("--batch-size", args.batch_size, 1)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be at least {low}, got {value}.")
    samples = args.sample or 1
    pass_k: Tuple[int, ...] = ()
    if args.pass_k is not None:
        try:
            pass_k = tuple(sorted({int(part) for part in args.pass_k.split(",") if part.strip()}))
        except ValueError:
            raise ValueError(f"--pass-k {args.pass_k!r}: give whole numbers separated by commas, e.g. --pass-k 1,5.") from None
        too_large = [k for k in pass_k if not 1 <= k <= samples]
        if not pass_k or too_large:
            fix = f"--sample {max(pass_k)}" if pass_k and max(pass_k) > samples else "k >= 1"
            raise ValueError(f"--pass-k {args.pass_k!r}: pass@k needs 1 <= k <= the samples per item ({samples}); use {fix}.")
    return EvalSettings(samples=samples, greedy=args.sample is None, pass_k=pass_k, per_agent=True, seed=args.seed,
                        progress=not args.quiet)


def run_eval(args: argparse.Namespace) -> int:
    from comlrl.cli.eval_output import check_output_dir, write_outputs
    from comlrl.cli.train import import_user_modules

    settings = eval_settings(args)
    import_user_modules(args.imports)
    team = team_source(args)
    data, source, asked = base_config(args, team)
    plan = eval_plan(args, team, data, source, asked)
    output_dir = args.output_dir or os.path.join("runs", f"eval_{plan.environment}_{split_label(args)}")
    check_output_dir(output_dir, args.overwrite)
    check_team(team, plan)
    env, items, data_record = evaluation_items(args, plan, settings)
    sources, tokenizers, names = team_tokenizers(team, plan)  # "default" is built here on first use, after every data check
    env = with_chat_templates(env, plan, tokenizers, items)
    started = time.perf_counter()
    trainer = build_trainer(plan, env, tokenizers, names, args.seed)  # the models load here
    try:
        if team.checkpoint is not None:
            from comlrl.cli.eval_team import load_checkpoint_agents

            load_checkpoint_agents(team.manifest, trainer.agents)
        report = trainer.evaluation.report(items, settings, details=env.reward_details)
    finally:
        trainer.close()
    record = eval_record(args, plan, trainer, team, sources, settings, report.metrics, data_record, len(items), source,
                         time.perf_counter() - started)
    paths = write_outputs(output_dir, record, report.episodes, sampled=not settings.greedy)
    for key, value in report.metrics.items():
        if key.rsplit("/", 1)[-1] in SUMMARY or "pass@" in key:
            print(f"{key} = {value:.4f}")
    print(f"comlrl eval: {len(report.metrics)} metrics of {len(items)} items; wrote {', '.join(paths)}")
    return 0


def split_label(args: argparse.Namespace) -> str:
    return os.path.splitext(os.path.basename(args.dataset))[0] if args.dataset else args.split


# ----------------------------------------------------------------------------- the run config


def team_source(args: argparse.Namespace):
    from comlrl.cli.eval_team import TeamSource, check_order, checkpoint_run_config, expand_agents, read_checkpoint, saved_config_of

    if args.agents:
        folders = expand_agents(args.agents)
        saved = saved_config_of(folders)
        check_order(folders, saved)
        return TeamSource(folders=folders, saved_config=saved)
    manifest = read_checkpoint(args.checkpoint)
    return TeamSource(checkpoint=manifest["path"], manifest=manifest, saved_config=checkpoint_run_config(manifest))


def base_config(args: argparse.Namespace, team) -> Tuple[Dict[str, Any], str, str]:
    """(config data, where it came from, what asked for its algorithm): ``--config``, else ``--env``
    (with the team's run config for the team and its settings), else the team's run config."""
    from comlrl.runplan.plan import load_config

    asked = "--algorithm" if args.algorithm else None
    if args.config:
        data, _, source = load_config(args.config)
        return data, source, asked or f"--config {args.config}"
    saved = load_config(team.saved_config)[0] if team.saved_config else None
    if args.env:
        return env_config(args, saved), f"--env {args.env}", asked or (f"the run config {team.saved_config}" if saved else "--env (magrpo)")
    if saved is not None:
        return saved, team.saved_config, asked or f"the run config {team.saved_config}"
    given = "--checkpoint" if team.checkpoint else "--agents"
    raise ValueError(f"{given}: no run config (config.yaml, written by comlrl train) was found beside the team; give --env NAME "
                     f"(the environment to evaluate on) or --config FILE (the run config that trained it).")


def env_config(args: argparse.Namespace, saved: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A run config for ``--env``: the team, algorithm and trainer settings of the team's run config
    when there is one (its turns aside), else MAGRPO with the environment's turns."""
    import dataclasses

    from comlrl.envs.base import canonical_name, environment_spec
    from comlrl.runplan.plan import choose_algorithm

    environment = canonical_name(args.env)
    turns = next(f.default for f in dataclasses.fields(environment_spec(environment).options_cls) if f.name == "num_turns")
    data: Dict[str, Any] = {"environment": environment}
    if saved is not None:
        algorithm, section = choose_algorithm(saved, args.algorithm)
        data.update({key: copy.deepcopy(saved[key]) for key in ("agent_model", "agents", "critic_model", "critics", "seed") if key in saved})
        values = {k: v for k, v in (saved.get(section) or {}).items() if k != "num_turns"}
    else:
        algorithm, section = choose_algorithm({"algorithm": args.algorithm or "magrpo"}, None)
        if algorithm.name == "maac" or algorithm.family == "preference" and algorithm.name.startswith("marlhf"):
            raise ValueError(f"--algorithm {algorithm.name} builds a trainer with a critic or reward model, which needs the run config that "
                             f"names it: give --config FILE (or the agents' own run directory), or --algorithm iac / magrpo for the "
                             f"same evaluation without one.")
        # evaluation runs no critic: IAC's value heads on the actors spare loading one (MAAC needs --config with its critic)
        values = {"use_separate_critic": False} if algorithm.family == "actor_critic" and algorithm.name != "maac" else {}
    data["algorithm"] = algorithm.name
    data[section] = {**values, "num_turns": turns}
    return data


def eval_plan(args: argparse.Namespace, team, data: Dict[str, Any], source: str, asked: str):
    """The ``RunPlan`` of the evaluation: ``data`` with the evaluated agents and the flags."""
    from comlrl.cli.eval_team import check_checkpoint_family
    from comlrl.envs.base import build_options, environment_spec
    from comlrl.runplan.plan import choose_algorithm, choose_environment, resolve

    data = {key: copy.deepcopy(value) for key, value in data.items() if key not in ("wandb", "checkpoint")}
    algorithm, section = choose_algorithm(data, args.algorithm)
    if team.checkpoint is not None:
        check_checkpoint_family(team.manifest, algorithm, asked)
    environment = choose_environment(data)
    check_team_size(team, environment_spec(environment).agent_counts, environment)
    if args.num_turns is not None:
        try:
            build_options(environment, {"num_turns": args.num_turns})
        except ValueError as error:
            raise ValueError(f"--num-turns {args.num_turns}: {error}") from None
    values = dict(data.get(section) or {})
    values.pop("output_dir", None)
    if team.folders is not None:
        data["agents"] = list(team.folders)
        data["agent_model"] = {**(data.get("agent_model") or {}), "name": None}
        if algorithm.agents is None:
            values["num_agents"] = len(team.folders)
    for flag, key in SAMPLING_FLAGS:
        if getattr(args, flag) is not None:
            values[key] = getattr(args, flag)
    data[section] = values
    data["output"] = {"base_dir": args.output_dir or "runs", "save_final_model": False, "verbose": False}
    if args.offline:
        data["dataset"] = {**(data.get("dataset") or {}), "offline": True}
    plan = resolve(data, source=source, algorithm=args.algorithm)
    plan.environment_options.update(env_options(args.env_option))
    build_options(plan.environment, plan.environment_options)  # the environment's own checks, with --env-option
    plan.config.output_dir, plan.config.tensorboard = None, False  # the evaluation writes its own files
    return plan


def env_options(pairs: List[str]) -> Dict[str, Any]:
    import yaml

    options: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--env-option {pair!r}: use KEY=VALUE, e.g. --env-option external_mode=plain.")
        if key in ("num_turns", "num_agents", "tokenizer"):
            fix = {"num_turns": "--num-turns", "num_agents": "the number of agents given", "tokenizer": "the agents' own tokenizers"}[key]
            raise ValueError(f"--env-option {pair!r}: {key} comes from {fix}; remove it.")
        options[key] = yaml.safe_load(value)
    return options


def check_team_size(team, counts: Tuple[int, ...], environment: str) -> None:
    size = team.size
    if size not in counts:
        given = f"--agents gives {size} agent folders" if team.folders is not None else f"--checkpoint holds {size} agents"
        sizes = " or ".join(map(str, counts))
        raise ValueError(f"{given}, but the {environment} environment takes {sizes} agents; give a team of {sizes} (agent_0 first), "
                         f"or evaluate on an environment for {size}.")


def check_team(team, plan) -> None:
    """Refusals that need the plan: the team size the folders' run trained, the checkpoint's agent count."""
    from comlrl.cli.eval_team import trained_team_size
    from comlrl.runplan.plan import load_config

    if team.folders is not None and team.saved_config:
        trained = trained_team_size(load_config(team.saved_config)[0])
        if trained is not None and trained != len(team.folders):
            raise ValueError(f"--agents gives {len(team.folders)} agents, but their run ({team.saved_config}) trained a team of {trained}; "
                             f"give the whole team (agent_0 .. agent_{trained - 1}) in order.")
    if team.checkpoint is not None and team.size != plan.entities.num_agents:
        raise ValueError(f"--checkpoint {team.checkpoint!r} holds {team.size} agents but the run config builds {plan.entities.num_agents}; "
                         f"give the config of the run that wrote it (--config).")


def team_tokenizers(team, plan) -> Tuple[List[str], List[Any], Dict[str, Any]]:
    """The agents' sources, their tokenizers (checked against the models and, for a checkpoint, its
    fingerprints) and the resolved model names the trainer is built with."""
    from comlrl.cli.eval_team import check_checkpoint_tokenizers, check_tokenizers
    from comlrl.cli.train import resolve_model_names
    from comlrl.models.tokenizers import add_special_tokens, load_tokenizers

    names = resolve_model_names(plan.entities, log=lambda message: print(message, file=sys.stderr))
    sources = list(names["agents"]) if names["agents"] else [names["agent_model"]] * plan.entities.num_agents
    tokenizers = [copy.deepcopy(t) for t in load_tokenizers(sources)]
    check_tokenizers(sources, tokenizers, "--agents" if team.folders is not None else "--checkpoint")
    if team.checkpoint is not None:
        trained = [copy.deepcopy(t) for t in tokenizers]
        for tokenizer in trained:
            add_special_tokens(tokenizer, plan.model_config.get("special_tokens"))
        check_checkpoint_tokenizers(team.manifest, trained, sources)
    return sources, tokenizers, names


# ----------------------------------------------------------------------------- rows, trainer, record


def evaluation_items(args: argparse.Namespace, plan, settings) -> Tuple[Any, List[Any], Dict[str, Any]]:
    """The environment and the rows to evaluate, checked before any model loads."""
    from comlrl.cli.eval_data import check_rows, load_split, read_dataset
    from comlrl.envs import get_environment

    env = get_environment(plan.environment, **{key: value for key, value in plan.environment_options.items() if key != "tokenizer"})
    if args.dataset:
        items, record = read_dataset(args.dataset)
    else:
        items, record = load_split(env, plan, args.split)
    env.rows.add(items)
    if args.num_samples is not None:
        items = items[: args.num_samples]
    check_rows(env, items, args, plan, settings)
    return env, items, {**record, "rows": len(items)}


def with_chat_templates(env, plan, tokenizers: List[Any], items: List[Any]):
    """The environment again with the agents' tokenizers when its prompts use their chat templates
    (Minecraft's ``use_chat_template``, on by default), else ``env``."""
    from comlrl.envs import get_environment

    if not getattr(env.options, "use_chat_template", False):
        return env
    options = {key: value for key, value in plan.environment_options.items() if key != "tokenizer"}
    templated = get_environment(plan.environment, **options, tokenizer=list(tokenizers))
    templated.rows.add(items)  # the transitions find a prompt's row here
    templated.data_sources = dict(env.data_sources)
    return templated


def build_trainer(plan, env, tokenizers: List[Any], names: Dict[str, Any], seed: int):
    """The plan's trainer on the evaluated agents (no training data, no metric files, no W&B)."""
    from comlrl.rollout.reward_processors import RewardProcessors
    from comlrl.rollout.seeding import seed_everything
    from comlrl.trainers.registry import TrainerParts

    seed_everything(seed)
    processor = None
    if plan.reward_processor is not None:
        processor = RewardProcessors.compose([RewardProcessors.scale(plan.reward_processor["scale_factor"]),
                                              RewardProcessors.shift(plan.reward_processor["shift"])])
    tokenizer = list(tokenizers) if getattr(env.options, "use_chat_template", False) else None  # the ones the prompts were rendered with
    parts = TrainerParts(env, names, tokenizer, None, None, processor, None, NO_HOOKS)
    with warnings.catch_warnings():  # nothing is trained here: the half-precision training warning does not apply
        warnings.filterwarnings("ignore", message=r".* will train with .* weights and optimizer state", category=UserWarning)
        return plan.algorithm.trainer_class()(**plan.algorithm.trainer_kwargs(plan, parts))


def eval_record(args, plan, trainer, team, sources, settings, metrics, data_record, items, source, wall) -> Dict[str, Any]:
    from comlrl.checkpoint.state import jsonable
    from comlrl.cli.eval_team import describe_team
    from comlrl.telemetry.redaction import redact_secrets
    from comlrl.telemetry.run_record import library_versions

    c = plan.config
    described = {
        "environment": plan.environment, "environment_options": {k: v for k, v in plan.environment_options.items() if k != "tokenizer"},
        "config": source, "algorithm": plan.algorithm.name, "evaluation": type(trainer.evaluation).__name__,
        "data": args.dataset or f"{args.split} split", "items": items, "decoding": "greedy" if settings.greedy else "sampled",
        "samples_per_item": settings.samples, "pass_k": list(settings.pass_k), "num_turns": c.num_turns, "max_new_tokens": c.max_new_tokens,
        "temperature": None if settings.greedy else c.temperature, "top_p": None if settings.greedy else c.top_p,
        "top_k": None if settings.greedy else c.top_k, "seed": args.seed, "eval_batch_size": c.eval_batch_size,
    }
    record = {"format": "comlrl-eval", "version": 1, "metrics": metrics, "settings": described, "models": describe_team(team, sources),
              "data": data_record, "versions": library_versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "wall_time_s": round(wall, 3)}
    return redact_secrets(jsonable(record))
