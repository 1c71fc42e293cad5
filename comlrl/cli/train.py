"""``comlrl train`` and ``comlrl configs``: run a task repository's experiment from its YAML config.

    comlrl train --config magrpo_tldr_config.yaml --override agent_model.name=default magrpo.num_train_epochs=1
    comlrl train --config configs/iac_tldr_config.yaml --override agents='["A","B"]' agent_model.name=None ... --dry-run --json

The command only assembles: config + overrides -> ``RunPlan`` (``comlrl.runplan.plan``, every check,
no model) -> environment (``comlrl.envs``) -> trainer (``comlrl.trainers.registry``) -> ``train()`` ->
``save_model`` -> reward curve. The run directory (``output.base_dir`` or ``--output-dir``) receives
``config.yaml`` (the config after the overrides, seed filled in: ``--config`` of a repeat),
``resolved_config.yaml`` (what ``--dry-run`` prints), ``metrics.jsonl``, ``eval_rows.jsonl``, the
agents and ``reward_curve.png``;
a directory that already holds a run is refused unless ``--overwrite`` or a resume is asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import yaml

from comlrl.cli.long_runs import AUTO, RUN_FILES, TENSORBOARD_DIR, auto_candidate, resuming, set_aside_earlier_start, stop_after

SAVED_DIRS = ("agent_0", "agent_1", "critic", "reward_model")
SAVED_FILES = ("model.safetensors", "value_head.pt")  # an agent saved into the folder itself (IAC with one agent)
MODEL_NAME_KEYS = ("agent_model", "agents", "critic_model", "critics")


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="run an experiment from a YAML config (writing, code, Minecraft tasks)",
        description="Train with a CoMLRL task repository's YAML config (a file, or a bundled name: see `comlrl configs`) and "
        "dotted --override key=value pairs. Model names may be hub ids, local folders, or 'default' (the embedded "
        "SmolLM2-135M-Instruct).",
    )
    parser.add_argument("--config", required=True, metavar="FILE_OR_NAME", help="YAML config file or bundled config name")
    parser.add_argument("--override", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="dotted overrides, e.g. magrpo.num_turns=1 agents='[\"A\",\"B\"]' wandb.project=None")
    parser.add_argument("--algorithm", default=None, help="the algorithm to run (default: the config's section)")
    parser.add_argument("--output-dir", default=None, help="run directory (default: output.base_dir)")
    parser.add_argument("--offline", action="store_true", help="use the bundled dataset samples (dataset.offline=true)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config as YAML and exit (no model is loaded)")
    parser.add_argument("--json", action="store_true", help="with --dry-run: print one JSON object instead")
    parser.add_argument("--overwrite", action="store_true", help="replace the files of an earlier run in the run directory")
    parser.add_argument("--checkpoint-dir", default=None, help="save training checkpoints here (checkpoint.dir)")
    parser.add_argument("--checkpoint-interval", type=int, default=None, help="epochs between checkpoints (checkpoint.interval)")
    parser.add_argument("--checkpoint-steps", type=int, default=None, help="also every N training steps (checkpoint.steps)")
    parser.add_argument("--checkpoint-total-limit", type=int, default=None, help="keep only the newest N (checkpoint.total_limit)")
    parser.add_argument("--checkpoint-every-s", type=float, default=None, metavar="SECONDS",
                        help="also at the first step boundary SECONDS after the last save (checkpoint.every_s)")
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                        help="resume from a checkpoint folder, a checkpoint dir's latest, (no value) checkpoint.dir's latest, or "
                        "'auto': this run's newest usable checkpoint in checkpoint.dir, or a fresh start when it has none")
    parser.add_argument("--time-limit", default=None, metavar="DURATION",
                        help="soft deadline from the command's start (47:30:00, 2-00:00:00, 90m): checkpoint and exit with the "
                        "requeue code at the last step boundary before it (checkpoint.time_limit)")
    parser.add_argument("--requeue-exit-code", type=int, default=None, metavar="CODE",
                        help="exit code of a run stopped by SIGUSR1, SIGTERM or --time-limit after its checkpoint (default 85; "
                        "checkpoint.requeue_exit_code)")
    parser.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE",
                        help="import a Python module (or .py file) first, e.g. one that calls register_environment or "
                        "register_algorithm; repeatable")
    return parser


def import_user_modules(targets) -> None:
    """Import each ``--import`` target (a module name, or a path to a ``.py`` file) so that the
    environments and algorithms it registers are known before the config is read."""
    import importlib
    import importlib.util
    import sys

    for target in targets:
        if not target.endswith(".py"):
            try:
                importlib.import_module(target)
            except ModuleNotFoundError as error:
                if error.name is None or not target.startswith(error.name):
                    raise  # a module that the target itself imports is missing
                raise ModuleNotFoundError(f"--import {target!r}: no module named {error.name!r}; give a module on the Python "
                                          f"path (PYTHONPATH) or the path of a .py file.", name=error.name) from None
            continue
        if not os.path.isfile(target):
            raise FileNotFoundError(f"--import {target!r}: no such file; give a .py file or an importable module name.")
        name = os.path.splitext(os.path.basename(target))[0]
        spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def plan_for(args: argparse.Namespace):
    from comlrl.runplan.plan import plan_from_args

    from comlrl.checkpoint.schedule import parse_duration
    from comlrl.runplan.overrides import parse_overrides

    import_user_modules(args.imports)
    given = {override.key: override for override in parse_overrides(list(args.override))}
    offline = given.get("dataset.offline")
    if args.offline and offline is not None and offline.value is not True:
        raise ValueError(f"--offline (the bundled dataset samples) conflicts with --override dataset.offline={offline.raw} (the "
                         f"real data): drop one of them.")
    overrides = list(args.override) + (["dataset.offline=true"] if args.offline and offline is None else [])
    plan = plan_from_args(args.config, overrides, algorithm=args.algorithm, output_dir=args.output_dir)
    time_limit = parse_duration(args.time_limit) if args.time_limit is not None else None
    for key, value in (("dir", args.checkpoint_dir), ("interval", args.checkpoint_interval), ("steps", args.checkpoint_steps),
                       ("total_limit", args.checkpoint_total_limit), ("resume", args.resume), ("every_s", args.checkpoint_every_s),
                       ("time_limit", time_limit), ("requeue_exit_code", args.requeue_exit_code)):
        if value is not None:
            plan.checkpoint[key] = value
    check_schedule(plan)
    return plan


def run_train(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --time-limit counts from here
    plan = plan_for(args)
    if args.json and not args.dry_run:
        raise ValueError("--json goes with --dry-run (it prints the resolved config as one JSON object).")
    if args.dry_run:
        resolved = plan.to_dict()
        if args.json:
            print(json.dumps(resolved, indent=2))
        else:
            print(yaml.safe_dump(resolved, sort_keys=False, width=120), end="")
        return 0
    main_process = is_main_process()  # under torchrun, rank 0 owns the run directory
    if main_process:
        preflight(plan, overwrite=args.overwrite)
    if needs_hub(plan):  # no network: offline at once, instead of half a minute of retries per request
        from comlrl.adapters.hub import go_offline_if_unreachable

        go_offline_if_unreachable(log=lambda message: print(f"comlrl train: {message}", file=sys.stderr))
    data = load_data(plan)  # before any model loads: a missing or empty dataset is refused here
    if main_process:
        if plan.checkpoint["resume"] == AUTO and not resuming(plan):
            set_aside_earlier_start(plan.run_dir)
        check_run_dir(plan.run_dir, overwrite=args.overwrite, resuming=resuming(plan))
    from comlrl.checkpoint.interrupt import TrainingPreempted
    from comlrl.parallel.data_parallel import exit_worker_rank, leave_process_group

    finished, code = False, 0
    try:
        run(plan, overwrite=args.overwrite, data=data, started=started)
        finished = True
    except TrainingPreempted as stop:  # every rank stopped at the same checkpointed step
        finished, code = True, stop.exit_code
    finally:
        leave_process_group(wait=finished)
    if not main_process:  # a finished torchrun rank > 0: nothing of its own to write, skip the teardown
        exit_worker_rank(code)
    return code


def needs_hub(plan) -> bool:
    """Whether the run may ask the Hugging Face hub for something: the real dataset, or a model or
    tokenizer named by a hub id (not a local folder, not the embedded ``default``)."""
    from comlrl.runplan.plan import DEFAULT_MODEL
    from comlrl.models.sources import looks_like_path

    if plan.dataset["offline"] is not True:
        return True
    names = [getattr(plan.entities, key) for key in MODEL_NAME_KEYS]
    flat = [name for value in names for name in (value if isinstance(value, list) else [value]) if isinstance(name, str)]
    return any(name != DEFAULT_MODEL and not looks_like_path(name) and not os.path.isdir(name) for name in flat)


def preflight(plan, *, overwrite: bool) -> None:
    """Every check of a run that needs no model, before anything is written or loaded: the run, save and
    checkpoint paths (folders, not files; earlier runs and saved agents refused without ``--overwrite``),
    the checkpoint settings and the checkpoint to resume (it exists, and was written by this algorithm),
    and W&B's login or mode."""
    from comlrl.models.saving import check_folder_path

    check_folder_path(plan.run_dir, "The run directory (--output-dir / output.base_dir)")
    if not overwrite and plan.checkpoint["resume"] != AUTO:  # with --overwrite the earlier run's files are removed once
        check_run_dir(plan.run_dir, overwrite=False, resuming=resuming(plan))  # the data has loaded too; auto: see run_train
    if plan.output["save_final_model"]:
        check_folder_path(plan.output["save_path"], "output.save_path")
        check_save_path(plan.output["save_path"], overwrite=overwrite)
    check_checkpoint_settings(plan)
    check_wandb_login(plan.wandb)


CHECKPOINT_FLAGS = {"checkpoint_interval": "--checkpoint-interval (checkpoint.interval)",
                    "checkpoint_steps": "--checkpoint-steps (checkpoint.steps)",
                    "checkpoint_every_s": "--checkpoint-every-s (checkpoint.every_s)",
                    "stop_after_s": "--time-limit (checkpoint.time_limit)",
                    "requeue_exit_code": "--requeue-exit-code (checkpoint.requeue_exit_code)",
                    "checkpoint_total_limit": "--checkpoint-total-limit (checkpoint.total_limit)",
                    "checkpoint_dir": "--checkpoint-dir (checkpoint.dir)", "resume_from_checkpoint": "--resume (checkpoint.resume)"}


def check_schedule(plan) -> None:
    """``train()``'s checkpoint arguments (``CheckpointSchedule``), their errors named as the flags."""
    from comlrl.checkpoint.schedule import CheckpointSchedule

    ck = plan.checkpoint
    try:
        CheckpointSchedule.from_train_args(checkpoint_dir=ck["dir"], checkpoint_interval=ck["interval"], checkpoint_steps=ck["steps"],
                                           checkpoint_total_limit=ck["total_limit"], resume_from_checkpoint=ck["resume"],
                                           checkpoint_every_s=ck["every_s"], stop_after_s=ck["time_limit"],
                                           requeue_exit_code=ck["requeue_exit_code"])
    except ValueError as error:
        message = str(error)
        for name, flag in CHECKPOINT_FLAGS.items():
            message = message.replace(f"{name}=", f"{flag}=").replace(f"{name} ", f"{flag} ")
        raise ValueError(message) from None


def check_checkpoint_settings(plan) -> None:
    """The checkpoint folder's path; the checkpoint to resume read (its manifest only) and matched to
    this run's algorithm (``check_schedule`` checked the other arguments when the plan was made)."""
    from comlrl.checkpoint import layout
    from comlrl.checkpoint.files import CheckpointError
    from comlrl.models.saving import check_folder_path

    ck = plan.checkpoint
    if ck["dir"] is not None:
        check_folder_path(ck["dir"], "--checkpoint-dir (checkpoint.dir)")
    resume = ck["resume"]
    if resume == AUTO:
        resume = auto_candidate(ck["dir"], plan.algorithm.trainer.split(":")[1])
    if resume is None:
        return
    source = resume
    if resume is True:
        source = layout.latest_checkpoint(ck["dir"]) if os.path.isdir(ck["dir"]) else None
        if source is None:
            raise ValueError(f"--resume without a path resumes the latest checkpoint of --checkpoint-dir {ck['dir']!r}, but it holds "
                             f"none yet; give --resume CHECKPOINT, or start the run without --resume.")
    try:
        saved = layout.read_checkpoint_metadata(source)["trainer_class"]
    except (OSError, CheckpointError) as error:
        raise ValueError(f"--resume {source!r}: {error}") from None
    trainer = plan.algorithm.trainer.split(":")[1]
    if saved.rsplit(".", 1)[-1] != trainer:
        from comlrl.trainers.registry import ALGORITHMS

        names = [a.name for a in ALGORITHMS.values() if a.trainer.split(":")[1] == saved.rsplit(".", 1)[-1]]
        hint = f" (--algorithm {names[0]})" if names else ""
        raise ValueError(f"--resume {source!r} is a checkpoint of {saved.rsplit('.', 1)[-1]}, but this run trains {trainer} "
                         f"({plan.algorithm.name}); resume it with the config that wrote it{hint}, or give a checkpoint of this run.")


def check_wandb_login(settings) -> None:
    """W&B online needs a login (``comlrl.telemetry.wandb_sink.check_wandb_ready``), named as the YAML keys."""
    from comlrl.telemetry.wandb_sink import check_wandb_ready

    check_wandb_ready(settings, project_key="wandb.project", mode_setting="wandb.mode={}")


def is_main_process() -> bool:
    """False on torchrun's ranks other than 0 (they train, but write and print nothing)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def check_run_dir(path: str, *, overwrite: bool, resuming: bool) -> None:
    """Refuse a directory holding an earlier run's files unless overwriting (they are removed) or resuming."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"The run directory {path!r} is a file; choose another --output-dir (or output.base_dir).")
    found = [name for name in (*RUN_FILES, TENSORBOARD_DIR) if os.path.exists(os.path.join(path, name))]
    if not found or resuming:
        return
    if not overwrite:
        raise FileExistsError(
            f"The run directory {path!r} already holds a run ({', '.join(found)}); refusing to overwrite it. Choose another "
            f"--output-dir, pass --overwrite to replace that run's files, or --resume to continue it from a checkpoint."
        )
    for name in found:
        target = os.path.join(path, name)
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)


def check_save_path(path: str, *, overwrite: bool) -> None:
    """Refuse, before training, agents saved earlier where this run will save its own (unless overwriting)."""
    taken = [name for name in SAVED_DIRS if os.path.isdir(os.path.join(path, name)) and os.listdir(os.path.join(path, name))]
    taken += [name for name in SAVED_FILES if os.path.isfile(os.path.join(path, name))]
    if taken and not overwrite:
        raise FileExistsError(
            f"{path!r} already holds saved models ({', '.join(taken)}) where this run saves its agents; pass --overwrite to "
            f"replace them at the end, set output.save_path elsewhere, or output.save_final_model=false."
        )


# ----------------------------------------------------------------------------- assembly


def resolve_model_names(entities: Any, log: Callable[[str], None]) -> Dict[str, Any]:
    """The entities with every "default" replaced by the embedded model's folder (built on first use)."""
    from comlrl.runplan.plan import DEFAULT_MODEL

    def one(name: Optional[str]) -> Optional[str]:
        if name != DEFAULT_MODEL:
            return name
        from comlrl.models.default_model import default_model_dir

        return default_model_dir(log=log)

    out = {key: getattr(entities, key) for key in MODEL_NAME_KEYS}
    out["agent_model"], out["critic_model"] = one(out["agent_model"]), one(out["critic_model"])
    for key in ("agents", "critics"):
        if out[key]:
            out[key] = [one(name) for name in out[key]]
    return out


def wandb_config_for(plan, log: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    logs = os.path.join(plan.run_dir, "metrics.jsonl")
    if plan.wandb is None:
        log(f"comlrl train: W&B is off (wandb.project is not set); logging to {logs}")
        return None
    try:
        import wandb  # noqa: F401
    except ImportError:
        log(f"comlrl train: wandb.project is set but the wandb package is not installed (pip install 'comlrl[wandb]'); logging to {logs} only")
        return None
    return dict(plan.wandb)


@dataclass
class RunData:
    """The environment a run's rows were loaded with, and those rows (``load_data``)."""

    env: Any
    train: Any
    eval: Any

    def record(self) -> Dict[str, Any]:
        """Where each split's rows came from and how many there are (``resolved_config.yaml``'s ``data``)."""
        record = {split: self.env.data_sources.get(split) for split in ("train", "eval")}
        if getattr(self.env, "sandbox_isolation", None) is not None:  # code tasks: the isolation actually used
            record["sandbox"] = self.env.sandbox_isolation
        return record


def load_data(plan, log: Callable[[str], None] = print) -> RunData:
    """The run's training and evaluation rows, loaded before any model: ``dataset.offline=true`` the
    bundled sample (its split slice honoured), else the real data or an error, with the sample in its
    place only under ``dataset.allow_sample_fallback=true``; an empty training split is refused."""
    from comlrl.envs import get_environment

    options = {key: value for key, value in plan.environment_options.items() if key != "tokenizer"}
    env = get_environment(plan.environment, **options)
    d = plan.dataset
    train, evaluation = (
        env.load_dataset(split, d["offline"], hf_split=d[f"{split}_split"], source=d["name"], limit=d[f"num_{split}_items"],
                         allow_sample_fallback=d["allow_sample_fallback"])
        for split in ("train", "eval")
    )
    return RunData(env, train, evaluation)


def build(plan, log: Callable[[str], None] = print, data: Optional[RunData] = None):
    """Environment, datasets and trainer of ``plan`` (this loads the models; ``data``: already loaded rows)."""
    from comlrl.envs import get_environment
    from comlrl.telemetry.eval_rows import ROWS_FILE, EvalRows
    from comlrl.rollout.reward_processors import RewardProcessors
    from comlrl.rollout.seeding import seed_everything
    from comlrl.trainers.registry import TrainerParts

    seed_everything(plan.seed)
    data = data if data is not None else load_data(plan, log)
    entities = resolve_model_names(plan.entities, log)
    options = dict(plan.environment_options)
    tokenizer = None
    env = data.env
    if options.get("use_chat_template"):
        from transformers import AutoTokenizer

        sources = entities["agents"] or [entities["agent_model"]] * plan.entities.num_agents
        tokenizer = [AutoTokenizer.from_pretrained(source) for source in sources]
        options["tokenizer"] = tokenizer
        env = get_environment(plan.environment, **options)
        for rows in (data.train, data.eval):  # the transitions find a prompt's row here
            env.rows.add(rows)
        env.data_sources = dict(data.env.data_sources)
    processor = None
    if plan.reward_processor is not None:
        processor = RewardProcessors.compose([RewardProcessors.scale(plan.reward_processor["scale_factor"]),
                                              RewardProcessors.shift(plan.reward_processor["shift"])])
    rows = EvalRows(os.path.join(plan.run_dir, ROWS_FILE), env.reward_details)
    parts = TrainerParts(env, entities, tokenizer, data.train, data.eval if len(data.eval) else None, processor,
                         wandb_config_for(plan, log), rows)
    trainer = plan.algorithm.trainer_class()(**plan.algorithm.trainer_kwargs(plan, parts))
    rows.bind(trainer)
    return trainer, env


def run(plan, *, overwrite: bool = False, log: Callable[[str], None] = print, data: Optional[RunData] = None,
        started: Optional[float] = None):
    """Build, train, save the agents and draw the reward curve; returns the trainer. A run that fails
    before its first logged step removes the files it wrote, so that the corrected command is not
    refused as "already holds a run"."""
    from comlrl.cli.plot import plot_reward_curve

    from comlrl.runplan.plan import without_secrets

    main_process = is_main_process()
    data = data if data is not None else load_data(plan, log)
    written = []
    if not main_process:
        log = _silent
    else:
        os.makedirs(plan.run_dir, exist_ok=True)
        written = [name for name in (*RUN_FILES, TENSORBOARD_DIR) if not os.path.exists(os.path.join(plan.run_dir, name))]
        resolved = {**plan.to_dict(), "data": data.record()}
        for name, content in (("config.yaml", without_secrets(plan.merged)), ("resolved_config.yaml", resolved)):
            with open(os.path.join(plan.run_dir, name), "w", encoding="utf-8") as handle:
                yaml.safe_dump(content, handle, sort_keys=False, width=120)
    c = plan.config
    log(f"comlrl train: {plan.algorithm.name} on {plan.environment}, {plan.entities.num_agents} agents, "
        f"{c.num_train_epochs} epoch(s), {c.num_turns} turn(s); run directory {plan.run_dir}")
    metrics_path = os.path.join(plan.run_dir, "metrics.jsonl")
    try:
        trainer, _env = build(plan, log, data)
        ck = plan.checkpoint
        try:
            trainer.train(resume_from_checkpoint=ck["resume"], checkpoint_dir=ck["dir"], checkpoint_interval=ck["interval"],
                          checkpoint_total_limit=ck["total_limit"], checkpoint_steps=ck["steps"], checkpoint_every_s=ck["every_s"],
                          stop_after_s=stop_after(ck["time_limit"], started, log), requeue_exit_code=ck["requeue_exit_code"])
            if plan.output["save_final_model"]:
                trainer.save_model(plan.output["save_path"], overwrite=overwrite)
                log(f"comlrl train: agents saved in {plan.output['save_path']}")
        finally:
            trainer.close()
    except BaseException as error:
        from comlrl.checkpoint.interrupt import TrainingPreempted

        preempted = isinstance(error, TrainingPreempted)  # checkpointed, to be continued: its files stay
        if main_process and not preempted and not (os.path.exists(metrics_path) and os.path.getsize(metrics_path) > 0):
            remove_new_run_files(plan.run_dir, written)
        raise
    if main_process and os.path.exists(metrics_path):
        from comlrl.cli.plot import curve_series, read_metrics

        if curve_series(read_metrics(metrics_path)):
            log(f"comlrl train: reward curve {plot_reward_curve(plan.run_dir, overwrite=True)}")
        else:  # e.g. a preference run whose candidates all tied: no update logged a reward
            log(f"comlrl train: no reward curve drawn: {metrics_path} holds no turn_k/reward_mean or eval rewards.")
    return trainer


def remove_new_run_files(run_dir: str, names) -> None:
    """Remove the run files ``names`` this run created (nothing was trained into them)."""
    for name in names:
        target = os.path.join(run_dir, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)


def _silent(_message: str) -> None:
    pass


# ----------------------------------------------------------------------------- comlrl configs


def add_configs_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("configs", help="list the bundled experiment configs (or print one)",
                                   description="List the configs bundled with comlrl, or print one of them.")
    parser.add_argument("name", nargs="?", default=None, help="a bundled config to print")
    return parser


def run_configs(args: argparse.Namespace) -> int:
    from comlrl.runplan.plan import bundled_configs, find_config

    if args.name:
        print(find_config(args.name)[0], end="")
        return 0
    for name in bundled_configs():
        text = find_config(name)[0]
        title = text.splitlines()[0].lstrip("# ").strip() if text.startswith("#") else ""
        print(f"{name:34s} {title}")
    return 0

