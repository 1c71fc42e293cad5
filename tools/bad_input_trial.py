"""The bad-input trial: the mistakes a new user makes, through `comlrl train` and the Python API,
each run with tiny models, and each message classified.

    python tools/bad_input_trial.py [--markdown OUT.md] [--only ID ...]

A case is one mistake and the words its message must contain (the argument, and where useful the
value or the fix). Classes:

- good: a clean error (the CLI: exit status 2 and one line on stderr, no traceback; Python: a
  ValueError, TypeError, FileNotFoundError, FileExistsError or an OSError class of comlrl's own,
  such as ``StorageError``, raised by comlrl's own code) that contains every expected word and,
  for a case marked ``early``, came before any model was loaded. A case marked ``accept`` is a
  mistake comlrl handles (a pandas DataFrame is converted, ``estimate`` assumes a critic and says
  so): good when it runs through and its output (stdout and stderr) contains every expected word;
- fair: a clean error that misses an expected word or came after a model loaded;
- poor: nothing raised (the mistake was accepted), a traceback out of the CLI, or a raw error of
  Python or a library (KeyError, AttributeError, an OSError without our message, ...).

Prints one line per case and the counts; ``--markdown`` writes the table (docs/testing.md holds it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools"), os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "helpers"),
                os.path.join(ROOT, "tests", "envs")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Case:
    id: str
    surface: str  # "cli" or "python"
    mistake: str
    words: Sequence[str]
    run: Callable[["Context"], Any]
    early: bool = True
    accept: bool = False


@dataclass
class Outcome:
    case: Case
    verdict: str
    message: str
    loads: int
    why: str = ""


@dataclass
class Context:
    tmp: str
    models: Dict[str, str]
    chat: Dict[str, str]
    counter: Dict[str, int] = field(default_factory=lambda: {"loads": 0})

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def new_dir(self, name: str) -> str:
        path = tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmp)
        return path


# ----------------------------------------------------------------------------- running one case


CLEAN = (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyboardInterrupt)


def count_model_loads(context: Context) -> None:
    """Count every ``from_pretrained`` of a model (a "before any model loads" case must see none)."""
    from transformers import modeling_utils

    original = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        context.counter["loads"] += 1
        return original(cls, *args, **kwargs)

    modeling_utils.PreTrainedModel.from_pretrained = classmethod(counted)


def run_case(case: Case, context: Context) -> Outcome:
    context.counter["loads"] = 0
    err, out = io.StringIO(), io.StringIO()
    raised: Optional[BaseException] = None
    result: Any = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            result = case.run(context)
        except SystemExit as exit_:  # argparse
            result = exit_.code
        except BaseException as error:  # noqa: BLE001 - what reaches the user is being judged
            raised = error
    loads = context.counter["loads"]
    if case.accept:
        return accepted_outcome(case, raised, result, out.getvalue() + err.getvalue(), loads)
    if case.surface == "cli":
        if raised is not None:
            return Outcome(case, "poor", f"{type(raised).__name__}: {raised}", loads, "traceback out of the CLI")
        lines = [line for line in err.getvalue().strip().splitlines() if line.strip() and "Warning" not in line
                 and not line.startswith("  ")]
        message = lines[-1] if lines else ""
        if result in (0, None):
            return Outcome(case, "poor", message, loads, "accepted (exit 0)")
        if "Traceback" in err.getvalue():
            return Outcome(case, "poor", message, loads, "traceback")
    else:
        if raised is None:
            return Outcome(case, "poor", repr(result)[:120], loads, "accepted (nothing raised)")
        message = f"{type(raised).__name__}: {raised}"
        frames = traceback.extract_tb(raised.__traceback__)
        ours = bool(frames) and os.path.abspath(frames[-1].filename).startswith(os.path.join(ROOT, "comlrl") + os.sep)
        clean = isinstance(raised, CLEAN) or (isinstance(raised, OSError) and type(raised).__module__.startswith("comlrl."))
        if not clean or not ours:
            where = os.path.relpath(frames[-1].filename, ROOT) if frames else "?"
            return Outcome(case, "poor", message, loads, f"raw exception from {where}")
    missing = [word for word in case.words if word.lower() not in message.lower()]
    if missing:
        return Outcome(case, "fair", message, loads, f"does not mention {missing}")
    if case.early and loads:
        return Outcome(case, "fair", message, loads, f"after {loads} model load(s)")
    return Outcome(case, "good", message, loads)


def accepted_outcome(case: Case, raised: Optional[BaseException], result: Any, output: str, loads: int) -> Outcome:
    """A mistake comlrl is meant to handle: it must run through and say what it did."""
    if raised is not None or (case.surface == "cli" and result not in (0, None)):
        what = f"{type(raised).__name__}: {raised}" if raised is not None else f"exit {result}"
        return Outcome(case, "poor", what, loads, "refused, but comlrl should handle it")
    missing = [word for word in case.words if word.lower() not in output.lower()]
    message = " ".join(output.split())[-300:]
    return Outcome(case, "fair" if missing else "good", message, loads, f"does not mention {missing}" if missing else "")


# ----------------------------------------------------------------------------- the cases


def cli(*argv: str, config: str = "magrpo_tldr_config.yaml", offline: bool = True, out: Optional[str] = None,
        overrides: Sequence[str] = ()) -> Callable[[Context], Any]:
    def go(context: Context) -> Any:
        from comlrl.cli.main import main

        run_dir = out(context) if callable(out) else (out or context.new_dir("run"))
        base = ["agent_model.name=" + context.chat["llama"], "dataset.num_train_items=1", "dataset.num_eval_items=1",
                "output.verbose=false"]
        given = {text.split("=", 1)[0] for text in overrides}
        base = [text for text in base if text.split("=", 1)[0] not in given]  # the case's own value, once
        args = ["train", "--config", config, "--output-dir", run_dir, *(["--offline"] if offline else []), *argv,
                "--override", *base, *overrides]
        return main(args)

    return go


def no_network(function: Callable[[Context], Any]) -> Callable[[Context], Any]:
    def go(context: Context) -> Any:
        import comlrl.envs.sources as sources

        original = sources.load_real

        def unreachable(name, split_expression):
            raise ConnectionError(f"Couldn't reach '{name}' on the Hub")

        sources.load_real = unreachable
        try:
            return function(context)
        finally:
            sources.load_real = original

    return go


def file_at(context: Context, name: str) -> str:
    path = context.path(name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("a user's file\n")
    return path


def run_dir_with_a_run(context: Context) -> str:
    path = context.new_dir("earlier")
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as handle:
        handle.write('{"env_step": 1}\n')
    return path


def cli_cases() -> List[Case]:
    c = Case
    return [
        c("cli-01", "cli", "--config names no file or bundled config", ["--config", "comlrl configs"],
          cli(config="no_such_config.yaml")),
        c("cli-02", "cli", "misspelt bundled config name", ["magrpo_tldr_config.yaml"], cli(config="magrpo_tldr_confg.yaml")),
        c("cli-03", "cli", "misspelt trainer field", ["num_generation", "num_generations"], cli(overrides=["magrpo.num_generation=4"])),
        c("cli-04", "cli", "override without '='", ["magrpo.num_generations"], cli(overrides=["magrpo.num_generations"])),
        c("cli-05", "cli", "text for an integer", ["num_generations", "four"], cli(overrides=["magrpo.num_generations=four"])),
        c("cli-06", "cli", "fractional count", ["num_generations", "4.5"], cli(overrides=["magrpo.num_generations=4.5"])),
        c("cli-07", "cli", "one generation (no group)", ["num_generations"], cli(overrides=["magrpo.num_generations=1"])),
        c("cli-08", "cli", "zero epochs", ["num_train_epochs"], cli(overrides=["magrpo.num_train_epochs=0"])),
        c("cli-09", "cli", "negative learning rate", ["agent_learning_rate"], cli(overrides=["magrpo.agent_learning_rate=-1"])),
        c("cli-10", "cli", "top_p above 1", ["top_p"], cli(overrides=["magrpo.top_p=1.5"])),
        c("cli-11", "cli", "misspelt --algorithm", ["magrop", "magrpo"], cli("--algorithm", "magrop")),
        c("cli-12", "cli", "misspelt environment", ["tldrr", "tldr"], cli(overrides=["environment=tldrr"])),
        c("cli-13", "cli", "no model at all", ["agent_model.name", "agents"], cli(overrides=["agent_model.name=None"])),
        c("cli-14", "cli", "agents given as one string", ["agents", "list"], cli(overrides=["agent_model.name=None", "agents=Qwen/A"])),
        c("cli-15", "cli", "three agents for a two-agent task", ["agents", "3"],
          cli(overrides=["agent_model.name=None", 'agents=["a","b","c"]'])),
        c("cli-16", "cli", "agent_model and agents conflict", ["agent_model.name", "agents"], cli(overrides=['agents=["x/a","x/b"]'])),
        c("cli-17", "cli", "a critic for MAGRPO", ["critic_model.name", "null"], cli(overrides=["critic_model.name=x/critic"])),
        c("cli-18", "cli", "IAC without a critic", ["critic"], cli(config="iac_tldr_config.yaml", overrides=["critic_model.name=None"])),
        c("cli-19", "cli", "unknown dtype", ["torch_dtype", "float33"], cli(overrides=["agent_model.torch_dtype=float33"])),
        c("cli-20", "cli", "right padding", ["padding_side", "left"], cli(overrides=["tokenizer.padding_side=right"])),
        c("cli-21", "cli", "zero training items", ["num_train_items", "0"], cli(overrides=["dataset.num_train_items=0"])),
        c("cli-22", "cli", "--json without --dry-run", ["--json", "--dry-run"], cli("--json")),
        c("cli-23", "cli", "negative --checkpoint-steps", ["--checkpoint-steps", "-3"],
          lambda ctx: cli("--checkpoint-dir", ctx.path("trial-ck"), "--checkpoint-steps", "-3")(ctx)),
        c("cli-24", "cli", "--checkpoint-interval 0", ["--checkpoint-interval", "0"], cli("--checkpoint-interval", "0")),
        c("cli-25", "cli", "--checkpoint-total-limit 0", ["--checkpoint-total-limit", "0"], cli("--checkpoint-total-limit", "0")),
        c("cli-26", "cli", "--checkpoint-dir is a file", ["--checkpoint-dir", "is a file"],
          lambda ctx: cli("--checkpoint-dir", file_at(ctx, "ck-file"))(ctx)),
        c("cli-27", "cli", "--resume a path that does not exist", ["--resume", "does not exist"], cli("--resume", "/nonexistent/ck")),
        c("cli-28", "cli", "--resume without a checkpoint dir", ["checkpoint_dir", "resume"], cli("--resume")),
        c("cli-29", "cli", "--resume an empty folder", ["--resume", "not a comlrl checkpoint"],
          lambda ctx: cli("--resume", ctx.new_dir("empty"))(ctx)),
        c("cli-30", "cli", "--output-dir is a file", ["is a file", "--output-dir"], cli(out=lambda ctx: file_at(ctx, "run-file"))),
        c("cli-31", "cli", "--output-dir holds an earlier run", ["--overwrite", "already holds a run"], cli(out=run_dir_with_a_run)),
        c("cli-32", "cli", "output.save_path is a file", ["output.save_path", "is a file"],
          lambda ctx: cli(overrides=[f"output.save_path={file_at(ctx, 'save-file')}"])(ctx)),
        c("cli-33", "cli", "W&B online without a login", ["wandb login", "wandb.mode=offline"], no_login(cli(overrides=["wandb.project=mine"]))),
        c("cli-34", "cli", "unknown W&B mode", ["wandb.mode", "sometimes"], cli(overrides=["wandb.project=mine", "wandb.mode=sometimes"])),
        c("cli-35", "cli", "an empty offline split", ["training data is empty", "[:0]"], cli(overrides=["dataset.train_split=[:0]"])),
        c("cli-36", "cli", "a percentage split offline", ["dataset.train_split", "10%"], cli(overrides=["dataset.train_split=train[10%:]"])),
        c("cli-37", "cli", "no network and no --offline", ["--offline", "allow_sample_fallback"], no_network(cli(offline=False))),
        c("cli-38", "cli", "a model folder that does not exist", ["/nonexistent/model"], cli(overrides=["agent_model.name=/nonexistent/model"])),
        c("cli-39", "cli", "a seed that is not a number", ["seed", "abc"], cli(overrides=["seed=abc"])),
        c("cli-40", "cli", "zero turns", ["num_turns"], cli(overrides=["magrpo.num_turns=0"])),
        c("cli-41", "cli", "unknown external mode", ["external.mode", "bogus"], cli(config="magrpo_he_config.yaml", overrides=["external.mode=bogus"])),
        c("cli-42", "cli", "unknown joint mode", ["joint_mode", "bogus"], cli(overrides=["magrpo.joint_mode=bogus"])),
        c("cli-43", "cli", "text for a reward scale", ["scale_factor", "abc"], cli(overrides=["reward_processor.scale_factor=abc"])),
        c("cli-44", "cli", "a misspelt section", ["magrpoo"], cli(overrides=["magrpoo.num_turns=1"])),
        c("cli-45", "cli", "checkpoint.resume as a number", ["checkpoint.resume", "5"], cli(overrides=["checkpoint.resume=5"])),
        c("cli-46", "cli", "1.4.x's 'model' section", ["model", "agent_model"], cli(overrides=["model.name=x/y"])),
        c("cli-47", "cli", "an unknown sandbox option", ["sandbox.", "bogus"], cli(config="magrpo_he_config.yaml", overrides=["sandbox.bogus=1"])),
        c("cli-48", "cli", "three agents by count", ["num_agents", "3"], cli(overrides=["magrpo.num_agents=3"])),
        c("cli-49", "cli", "a single-agent baseline with two agents", ["num_agents", "grpo"],
          cli(config="grpo_tldr_config.yaml", overrides=["grpo.num_agents=2"])),
        c("cli-50", "cli", "a flag of another command", ["--epochs"], cli("--epochs", "3")),
    ]


def no_login(function: Callable[[Context], Any]) -> Callable[[Context], Any]:
    def go(context: Context) -> Any:
        saved = {key: os.environ.pop(key, None) for key in ("WANDB_API_KEY", "WANDB_MODE", "NETRC")}
        os.environ["NETRC"] = context.path("no-netrc")
        try:
            return function(context)
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None)
                if value is not None:
                    os.environ[key] = value

    return go


def one_turn(**fields: Any):
    from comlrl.trainers.reinforce import MAGRPOConfig

    base = dict(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, eval_interval=0)
    return MAGRPOConfig(**{**base, **fields})


def dataset(count: int = 2, column: str = "prompt"):
    from datasets import Dataset

    return Dataset.from_dict({column: [f"Say something about {i}." for i in range(count)]})


def ratio(c1, c2):
    return [float(len(b)) / max(len(a), 1) for a, b in zip(c1, c2)]


def trainer(context: Context, **kwargs: Any):
    from comlrl.trainers.reinforce import MAGRPOTrainer

    settings = dict(agents=[context.models["llama"], context.models["gpt2"]], reward_func=ratio, train_dataset=dataset(),
                    args=one_turn())
    settings.update(kwargs)
    return MAGRPOTrainer(**settings)


def trained(context: Context, **kwargs: Any):
    t = trainer(context, **kwargs)
    t.train()
    return t


def python_cases() -> List[Case]:
    c = Case
    from comlrl.envs import get_environment
    from comlrl.trainers.reinforce import MAGRPOConfig

    return [
        c("py-01", "python", "misspelt config field", ["num_generation", "num_generations"], lambda ctx: MAGRPOConfig(num_generation=4)),
        c("py-02", "python", "fractional count", ["num_generations", "4.5"], lambda ctx: one_turn(num_generations=4.5)),
        c("py-03", "python", "one generation", ["num_generations"], lambda ctx: one_turn(num_generations=1)),
        c("py-04", "python", "negative learning rate", ["agent_learning_rate"], lambda ctx: one_turn(agent_learning_rate=-1e-5)),
        c("py-05", "python", "negative epochs", ["num_train_epochs"], lambda ctx: one_turn(num_train_epochs=-1)),
        c("py-06", "python", "output_dir is a file", ["output_dir", "is a file"], lambda ctx: one_turn(output_dir=file_at(ctx, "out-file"))),
        c("py-07", "python", "unknown joint_mode", ["joint_mode", "bogus"], lambda ctx: one_turn(joint_mode="bogus")),
        c("py-08", "python", "tensorboard without output_dir", ["tensorboard", "output_dir"], lambda ctx: one_turn(tensorboard=True)),
        c("py-09", "python", "unknown precision", ["precision", "fp8"], lambda ctx: one_turn(precision="fp8")),
        c("py-10", "python", "no agents", ["agent_model", "agents"], lambda ctx: trainer(ctx, agents=None)),
        c("py-11", "python", "an agent folder that does not exist", ["/nonexistent/agent"],
          lambda ctx: trainer(ctx, agents=["/nonexistent/agent", ctx.models["gpt2"]])),
        c("py-12", "python", "no reward function", ["reward_func"], lambda ctx: trainer(ctx, reward_func=None)),
        c("py-13", "python", "one-list reward for two agents", ["reward_func", "f(completions_0, completions_1"],
          lambda ctx: trainer(ctx, reward_func=lambda completions: [0.0] * len(completions))),
        c("py-14", "python", "reward returns too many values", ["3 values", "joint response"],
          lambda ctx: trained(ctx, reward_func=lambda a, b: [0.0] * (len(a) + 1)), early=False),
        c("py-15", "python", "reward returns NaN", ["reward_func", "nan"],
          lambda ctx: trained(ctx, reward_func=lambda a, b: [float("nan")] * len(a)), early=False),
        c("py-16", "python", "reward returns text", ["reward_func", "real number"],
          lambda ctx: trained(ctx, reward_func=lambda a, b: ["good"] * len(a)), early=False),
        c("py-17", "python", "three formatters for two agents", ["formatters", "3"],
          lambda ctx: trainer(ctx, formatters=[lambda r: r["prompt"]] * 3)),
        c("py-18", "python", "dataset without a prompt column", ["prompt", "formatters"],
          lambda ctx: trainer(ctx, train_dataset=dataset(column="question"))),
        c("py-19", "python", "an empty dataset", ["train_dataset", "no rows"], lambda ctx: trainer(ctx, train_dataset=dataset(0))),
        c("py-20", "python", "two turns (the default) without a transition", ["num_turns=1", "external_transition"],
          lambda ctx: trainer(ctx, args=MAGRPOConfig(num_generations=2))),
        c("py-21", "python", "a transition that is not callable", ["external_transition", "callable"],
          lambda ctx: trainer(ctx, args=one_turn(num_turns=2), external_transition="next")),
        c("py-22", "python", "args as a dict", ["args", "MAGRPOConfig"], lambda ctx: trainer(ctx, args={"num_turns": 1})),
        c("py-23", "python", "unknown dtype in model_config", ["float33"], lambda ctx: trainer(ctx, model_config={"torch_dtype": "float33"})),
        c("py-24", "python", "three tokenizers for two agents", ["tokenizer", "3"],
          lambda ctx: trainer(ctx, tokenizer=[ctx.models["llama"]] * 3)),
        c("py-25", "python", "save_model onto a file", ["save_model", "is a file"],
          lambda ctx: trainer(ctx).save_model(file_at(ctx, "save-target")), early=False),
        c("py-26", "python", "save_model into a used folder", ["overwrite"], lambda ctx: save_twice(ctx), early=False),
        c("py-27", "python", "resume from a path that does not exist", ["/nonexistent/ck"],
          lambda ctx: trainer(ctx).train(resume_from_checkpoint="/nonexistent/ck"), early=False),
        c("py-28", "python", "negative checkpoint_steps", ["checkpoint_steps", "-3"],
          lambda ctx: trainer(ctx).train(checkpoint_dir=ctx.new_dir("ck"), checkpoint_steps=-3), early=False),
        c("py-29", "python", "unknown generation setting in train()", ["bogus_setting"],
          lambda ctx: trainer(ctx).train(bogus_setting=1), early=False),
        c("py-30", "python", "output_dir holds another run", ["overwrite_output_dir"],
          lambda ctx: trainer(ctx, args=one_turn(output_dir=run_dir_with_a_run(ctx))).train(), early=False),
        c("py-31", "python", "misspelt environment", ["tldrr", "tldr"], lambda ctx: get_environment("tldrr")),
        c("py-32", "python", "unknown environment option", ["external_mod", "external_mode"],
          lambda ctx: get_environment("humaneval", external_mod="x")),
        c("py-33", "python", "unknown external mode", ["external_mode", "bogus"], lambda ctx: get_environment("humaneval", external_mode="bogus")),
        c("py-34", "python", "load_dataset('test')", ["split", "train", "eval"], lambda ctx: get_environment("tldr").load_dataset("test")),
        c("py-35", "python", "load_dataset without network", ["offline=True", "allow_sample_fallback"],
          no_network(lambda ctx: get_environment("tldr").load_dataset("train"))),
        c("py-36", "python", "an offline split that is not a slice", ["train_split", "10%"],
          lambda ctx: get_environment("tldr").load_dataset("train", True, hf_split="train[10%:]")),
        c("py-37", "python", "IAC with a critic for value heads", ["use_separate_critic", "critic"], lambda ctx: iac_heads_with_critic(ctx)),
        c("py-38", "python", "IAC without any critic", ["critic"], lambda ctx: iac_without_critic(ctx)),
        c("py-39", "python", "the reward for a three-agent team", ["3 agent"],
          lambda ctx: trainer(ctx, agents=[ctx.models["llama"]] * 3, args=one_turn(num_agents=3))),
        c("py-40", "python", "a reward processor that is not callable", ["reward_processor"],
          lambda ctx: trainer(ctx, reward_processor=2.0)),
    ]


def save_twice(context: Context) -> None:
    t = trainer(context)
    target = context.new_dir("saved")
    t.save_model(target)
    t.save_model(target)


def iac_heads_with_critic(context: Context):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    return IACTrainer(agents=[context.models["llama"], context.models["gpt2"]], critics=[context.models["llama"]] * 2,
                      reward_func=ratio, train_dataset=dataset(), args=IACConfig(num_turns=1, use_separate_critic=False))


def iac_without_critic(context: Context):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    return IACTrainer(agents=[context.models["llama"], context.models["gpt2"]], tokenizer=[context.models["llama"], context.models["gpt2"]],
                      reward_func=ratio, train_dataset=dataset(), args=IACConfig(num_turns=1, use_separate_critic=True))


# ----------------------------------------------------------------------------- report


def markdown(outcomes: Sequence[Outcome], tmp: Optional[str] = None) -> str:
    """The table of docs/testing.md (the trial's temporary folder written as ``<tmp>``)."""
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("good", "fair", "poor")}
    lines = [f"{len(outcomes)} cases: **{counts['good']} good, {counts['fair']} fair, {counts['poor']} poor**.", "",
             "| case | mistake | verdict | message (first 110 characters) |", "|---|---|---|---|"]
    for o in outcomes:
        text = (o.message.replace(tmp, "<tmp>") if tmp else o.message).replace("|", "\\|").replace("\n", " ")[:110]
        verdict = o.verdict + (f" ({o.why})" if o.why else "")
        lines.append(f"| {o.case.id} | {o.case.mistake} | {verdict} | {text} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument("--json", default=None, help="write every outcome here")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from tiny_chat_models import build_chat_models
    from tiny_models import build_tiny_models

    with tempfile.TemporaryDirectory(prefix="comlrl-trial-") as tmp:
        context = Context(tmp, build_tiny_models(os.path.join(tmp, "models")), build_chat_models(os.path.join(tmp, "chat")))
        count_model_loads(context)
        from bad_input_cases import newcomer_cases

        cases = cli_cases() + python_cases() + newcomer_cases(sys.modules[__name__])
        if args.only:
            cases = [case for case in cases if case.id in args.only]
        outcomes = []
        for case in cases:
            outcome = run_case(case, context)
            outcomes.append(outcome)
            print(f"{case.id:7s} {outcome.verdict:5s} {case.mistake[:44]:44s} {outcome.why[:40]:40s} {outcome.message[:90]}", flush=True)
    table = markdown(outcomes, tmp)
    print(table.splitlines()[0])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([{"id": o.case.id, "verdict": o.verdict, "why": o.why, "message": o.message, "loads": o.loads} for o in outcomes],
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
