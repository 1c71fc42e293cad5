"""The bad-input trial's cases from a newcomer's first hour (issue 31), added to ``tools/bad_input_trial.py``.

Each case is a mistake and the words its message must hold: the argument or file, the value, the
cause, the fix. Storage faults are real where the machine allows (a read-only bind mount as root, a
0555 folder otherwise) and injected at the lowest write call for a full disk. Two cases are
``accept`` cases: comlrl handles the mistake (a pandas DataFrame is converted; ``estimate`` assumes
a critic) and must say what it did.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
from typing import Any, Callable, Iterator, List


@contextlib.contextmanager
def read_only_folder(path: str) -> Iterator[str]:
    """``path`` made read-only for real: a read-only bind mount as root (chmod does not stop root), a 0555
    folder otherwise; as root without the right to mount, ``os.access`` answers as on a read-only mount."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield path
        finally:
            os.chmod(path, 0o755)
        return
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", path, path], capture_output=True).returncode == 0
    if mounted and os.access(path, os.W_OK):
        subprocess.run(["mount", "-o", "remount,ro,bind", path], capture_output=True)
    real = os.access
    if not mounted:
        os.access = lambda p, mode, **kw: False if os.path.abspath(p).startswith(path) else real(p, mode, **kw)
    try:
        yield path
    finally:
        os.access = real
        if mounted:
            subprocess.run(["umount", path], check=False)


@contextlib.contextmanager
def full_disk(module: Any, name: str, after: int = 0) -> Iterator[None]:
    """``module.name`` (a write function) raises OSError(ENOSPC) from its ``after + 1``-th call on."""
    original = getattr(module, name)
    calls = []

    def write(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(*args, **kwargs)

    setattr(module, name, write)
    try:
        yield
    finally:
        setattr(module, name, original)


def truncated_copy(source: str, target: str) -> str:
    if not os.path.exists(target):
        shutil.copytree(source, target)
        weights = os.path.join(target, "model.safetensors")
        with open(weights, "r+b") as handle:
            handle.truncate(os.path.getsize(weights) // 2)
    return target


def short_context_copy(source: str, target: str, positions: int) -> str:
    """A copy of a RoPE model whose config says it takes ``positions`` positions (weights unchanged)."""
    if not os.path.exists(target):
        shutil.copytree(source, target)
        path = os.path.join(target, "config.json")
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        config["max_position_embeddings"] = positions
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
    return target


def metrics_dir(context: Any) -> str:
    path = context.new_dir("plotted")
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as handle:
        for step in (4, 8, 12):
            handle.write(json.dumps({"env_step": step, "turn_1/reward_mean": 0.1 * step}) + "\n")
    return path


def command(*argv: str) -> Callable[[Any], Any]:
    def go(context: Any) -> Any:
        from comlrl.cli.main import main

        return main(list(argv))

    return go


def newcomer_cases(trial: Any) -> List[Any]:
    return cli_cases(trial) + python_cases(trial)


def cli_cases(t: Any) -> List[Any]:
    c, cli = t.Case, t.cli

    def read_only_run(ctx):
        with read_only_folder(ctx.path("ro-cli")) as folder:
            return cli(out=os.path.join(folder, "run"))(ctx)

    def checkpoint_disk_full(ctx):
        import torch

        with full_disk(torch, "save"):
            return cli("--checkpoint-dir", ctx.new_dir("ck-full"), "--checkpoint-steps", "1")(ctx)

    return [
        c("cli-51", "cli", "--output-dir on a read-only mount", ["--output-dir", "cannot be written", "ro-cli"], read_only_run),
        c("cli-52", "cli", "estimate --num-agents 0", ["--num-agents", "0", ">= 1"],
          lambda ctx: command("estimate", "--num-agents", "0", "--model", ctx.models["llama"])(ctx)),
        c("cli-53", "cli", "a truncated model.safetensors", ["agents", "model.safetensors", "truncated"],
          lambda ctx: cli(overrides=["agent_model.name=" + truncated_copy(ctx.chat["llama"], ctx.path("trunc-chat"))])(ctx)),
        c("cli-54", "cli", "TLDR prompts longer than a 512-position model", ["agents[0]", "train_dataset row", "512", "max_new_tokens"],
          lambda ctx: cli(overrides=["agent_model.name=" + short_context_copy(ctx.chat["llama"], ctx.path("short-chat"), 512)])(ctx)),
        c("cli-55", "cli", "the same override key twice", ["magrpo.num_turns", "twice", "Keep one"],
          cli(overrides=["magrpo.num_turns=1", "magrpo.num_turns=2"])),
        c("cli-56", "cli", "--offline with dataset.offline=false", ["--offline", "dataset.offline=false", "drop one"],
          cli(overrides=["dataset.offline=false"])),
        c("cli-57", "cli", "plot --out x.txt", ["--out", ".txt", ".png"],
          lambda ctx: command("plot", metrics_dir(ctx), "--out", ctx.path("curve.txt"))(ctx)),
        c("cli-58", "cli", "estimate --algorithm maac without a critic", ["assumed", "critic", "--critic-model"],
          lambda ctx: command("estimate", "--algorithm", "maac", "--model", ctx.models["llama"], "--device", "cpu")(ctx), accept=True),
        c("cli-59", "cli", "which files does the demo write", ["run_config.json", "demo_summary.json"],
          command("demo", "--help"), accept=True),
        c("cli-60", "cli", "an unknown model id", ["no-such-org/no-such-model", "default"],
          cli(overrides=["agent_model.name=no-such-org/no-such-model"])),
        c("cli-61", "cli", "a full disk at a checkpoint", ["checkpoint", "the disk is full", "free some space"],
          checkpoint_disk_full, early=False),
        c("cli-62", "cli", "output.verbose=no", ["output.verbose", "'no'"], cli(overrides=["output.verbose=no"])),
    ]


def python_cases(t: Any) -> List[Any]:
    c, trainer, trained, one_turn, dataset = t.Case, t.trainer, t.trained, t.one_turn, t.dataset

    def rows(*prompts: Any):
        from datasets import Dataset

        return Dataset.from_dict({"prompt": list(prompts)})

    def keyed(row):
        return row["question"]

    def divide(c1, c2, batch_items=None):
        return [len(a) / 0 for a in c1]

    def dataframe(ctx):
        import pandas

        frame = pandas.DataFrame({"prompt": ["Say a thing.", "Say another thing."]})
        done = trained(ctx, train_dataset=frame)
        print(f"trained on a DataFrame converted to {type(done.train_dataset).__name__}")

    def save_none(ctx):
        return trainer(ctx).save_model(None)

    def save_full(ctx):
        from transformers import modeling_utils

        with full_disk(modeling_utils, "safe_save_file", after=1):
            return trainer(ctx).save_model(ctx.path("save-full", "agents"))

    def checkpoint_full(ctx):
        import torch

        with full_disk(torch, "save", after=4):
            return trainer(ctx, args=one_turn(rollout_buffer_size=1)).train(checkpoint_dir=ctx.new_dir("ck-py"), checkpoint_steps=1)

    def other_reward(ctx):
        folder = ctx.new_dir("ck-reward")
        trained(ctx).save_checkpoint(os.path.join(folder, "ck"))
        return trainer(ctx, reward_func=divide).train(resume_from_checkpoint=os.path.join(folder, "ck"))

    def read_only_output(ctx):
        with read_only_folder(ctx.path("ro-py")) as folder:
            return one_turn(output_dir=os.path.join(folder, "run"))

    def iac_saved(ctx):
        from comlrl.trainers.actor_critic import IACConfig, IACTrainer

        agents = [ctx.models["llama"], ctx.models["gpt2"]]
        return IACTrainer(agents=agents, critics=agents, reward_func=t.ratio, train_dataset=dataset(),
                          args=IACConfig(num_turns=1, use_separate_critic=True))

    return [
        c("py-41", "python", "verbose='no'", ["verbose", "'no'", "verbose=False"], lambda ctx: one_turn(verbose="no")),
        c("py-42", "python", "tensorboard=1", ["tensorboard", "True or False", "1"], lambda ctx: one_turn(tensorboard=1)),
        c("py-43", "python", "a learning rate as text", ["agent_learning_rate", "'1e-5'", "without quotes"],
          lambda ctx: one_turn(agent_learning_rate="1e-5")),
        c("py-44", "python", "a truncated model.safetensors", ["agents[1]", "model.safetensors", "truncated", "download"],
          lambda ctx: trainer(ctx, agents=[ctx.models["llama"], truncated_copy(ctx.models["gpt2"], ctx.path("trunc-gpt2"))])),
        c("py-45", "python", "a pandas DataFrame as train_dataset", ["trained on a DataFrame converted to Dataset"], dataframe,
          early=False, accept=True),
        c("py-46", "python", "a prompt longer than the context", ["agents[0]", "train_dataset row 1", "1024", "max_new_tokens"],
          lambda ctx: trainer(ctx, train_dataset=rows("Say a thing.", "word " * 1100))),
        c("py-47", "python", "a full disk during save_model", ["save-full", "agent_1", "the disk is full"], save_full, early=False),
        c("py-48", "python", "a full disk at a checkpoint", ["checkpoint", "the disk is full", "untouched"], checkpoint_full, early=False),
        c("py-49", "python", "a None prompt", ["train_dataset row 1", "None", "formatters[0]"],
          lambda ctx: trainer(ctx, train_dataset=rows("Say a thing.", None))),
        c("py-50", "python", "the reward function raises", ["reward_func", "divide", "ZeroDivisionError", "train_dataset row 0", "2 agent"],
          lambda ctx: trained(ctx, reward_func=divide), early=False),
        c("py-51", "python", "a formatter's KeyError", ["formatters[1]", "keyed", "KeyError", "agent 1", "train_dataset row 0"],
          lambda ctx: trainer(ctx, formatters=[lambda row: row["prompt"], keyed])),
        c("py-52", "python", "save_model(None)", ["save_model(output_dir)", "None"], save_none, early=False),
        c("py-53", "python", "resume with another reward function", ["reward function", "ratio", "divide", "COMLRL_ALLOW_REWARD_CHANGE"],
          other_reward, early=False),
        c("py-54", "python", "IAC from saved folders without tokenizer", ["tokenizer=[", "each folder or id holds its tokenizer"], iac_saved),
        c("py-55", "python", "output_dir on a read-only mount", ["output_dir", "ro-py", "cannot be written"], read_only_output),
        c("py-56", "python", "an unknown model id", ["no-such-org/no-such-model", "'default'", "default_model_dir()"],
          lambda ctx: trainer(ctx, agents=["no-such-org/no-such-model", ctx.models["gpt2"]])),
    ]
