"""The fixed MAGRPO benchmark workload and its measurement, shared by magrpo_bench.py and limit_bench.py.

The workload is the team's benchmark definition (the same prompts, formatters, length-ratio reward,
flags and JSON fields as the shared harness), so numbers from either harness compare directly:

- dataset: the first N of 16 fixed prompts (ten from the CoMLRL length-ratio tutorial, six more),
  with ``target_min`` 2.0 and ``target_max`` 3.0 columns;
- formatters: agent 0 gets "Write a short response to this task:\\n{prompt}", every other agent
  "...detailed response...", as plain text unless ``--chat-template``;
- reward: 1.0 when len(agent i+1) / len(agent i) is in [2, 3], exp(-distance) otherwise, 0 when
  agent i is empty, averaged over consecutive agent pairs, with an explicit N-positional signature;
- agents: preloaded float32 models, one instance per agent, with a per-agent tokenizer list
  (``--pass-paths`` passes the folder strings instead).

Only the public API of whatever ``comlrl`` the interpreter imports is used, so the same script
measures comlrl 1.4.3 in its own venv and this project in ours. The last stdout line is one JSON
object; progress bars and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import inspect
import json
import math
import os
import platform
import random
import resource
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
                     ("WANDB_MODE", "disabled"), ("WANDB_SILENT", "true"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_key, _value)

PROMPTS: List[str] = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Explain how teleportation might work:",
    "Tell a joke about dinosaurs:",
    "Describe a world without electricity:",
    "Create a superhero with a unique power:",
    "Write a scene where the moon talks:",
    "Invent a new type of fruit:",
    "Design a playground on Mars:",
    "Describe a library under the sea:",
    "Explain why the sky changes color at sunset:",
    "Write a letter from a cat to its owner:",
    "Invent a sport played on ice and sand:",
    "Describe a robot that learns to paint:",
    "Tell a story about a lost umbrella:",
]


# ----------------------------------------------------------------------------- flags and set-up


def build_arg_parser(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark takes (each script adds its algorithm flags)."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--model", action="append", default=None,
        help="model folder or id; repeat it to give each agent its own model (one value: used for every agent)")
    add("--num-agents", type=int, default=None, help="number of agents (default: number of --model values, or 2)")
    add("--num-generations", type=int, default=4)
    add("--max-new-tokens", type=int, default=32)
    add("--num-prompts", type=int, default=4)
    add("--epochs", type=int, default=1)
    add("--seed", type=int, default=0)
    add("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    add("--lr", type=float, default=5e-5, help="agent learning rate")
    add("--temperature", type=float, default=0.6)
    add("--top-p", type=float, default=0.6)
    add("--chat-template", action="store_true", help="wrap each prompt in the agent tokenizer's chat template")
    add("--pass-paths", action="store_true",
        help="give the trainer model folder strings instead of preloaded models (disables the model counters)")
    add("--no-instrument", action="store_true", help="do not count generate()/forward() calls")
    add("--label", default="", help="free text copied into the JSON line")
    add("--json-out", default=None, help="also append the JSON line to this file")
    add("--profile", default=None, help="run trainer.train() under cProfile and dump the stats here")
    return parser


def resolve_models(args: argparse.Namespace) -> List[str]:
    """One model path per agent; sets ``args.num_agents``."""
    models = list(args.model or [])
    if not models:
        from bench_models import models_dir

        root = models_dir()
        if not os.path.isdir(os.path.join(root, "tiny-llama")):
            raise SystemExit(f"give --model PATH, or build the bench models first: python bench/bench_models.py "
                             f"(then {root}/tiny-llama is the default)")
        models = [os.path.join(root, "tiny-llama")]
    count = args.num_agents if args.num_agents is not None else max(len(models), 2)
    if len(models) == 1:
        models = models * count
    if len(models) != count:
        raise SystemExit(f"{len(models)} --model values for {count} agents; give one, or one per agent")
    if count < 2:
        raise SystemExit("the length-ratio workload needs at least 2 agents")
    args.num_agents = count
    return models


def seed_everything(seed: int) -> None:
    import numpy
    import torch
    from transformers import set_seed

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    set_seed(seed)


def setup_runtime(args: argparse.Namespace) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set by an earlier parallel region
            pass
    seed_everything(args.seed)


def load_models_and_tokenizers(paths: Sequence[str]):
    """An independent float32 model and a tokenizer (pad = eos when missing) per agent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models, tokenizers = [], []
    for path in paths:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        models.append(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
        tokenizers.append(tokenizer)
    return models, tokenizers


# ----------------------------------------------------------------------------- the workload


def load_instrumented(args: argparse.Namespace, paths: Sequence[str]):
    """``(models, tokenizers, counters)``: the models loaded once, with call counters attached unless
    the trainer gets paths (``--pass-paths``) or ``--no-instrument`` (counters None)."""
    models, tokenizers = load_models_and_tokenizers(paths)
    counters = None
    if not (args.pass_paths or args.no_instrument):
        counters = ModelCounters()
        for model, tokenizer in zip(models, tokenizers):
            counters.attach(model, tokenizer.pad_token_id)
    return models, tokenizers, counters


def make_dataset(num_prompts: int):
    from datasets import Dataset

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(num_prompts)]
    return Dataset.from_dict({"prompt": prompts, "target_min": [2.0] * num_prompts, "target_max": [3.0] * num_prompts})


def make_formatters(num_agents: int, tokenizers: Optional[Sequence[Any]] = None, chat_template: bool = False) -> List[Callable]:
    """Agent 0 is asked for a short response, the others for a detailed one."""
    tokenizers = list(tokenizers) if tokenizers is not None else [None] * num_agents

    def formatter(kind: str, tokenizer: Any) -> Callable:
        def format_prompt(item):
            text = f"Write a {kind} response to this task:\n{item['prompt']}"
            if chat_template and tokenizer is not None:
                return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
            return text

        format_prompt.__name__ = f"{kind}_formatter"
        return format_prompt

    return [formatter("short" if i == 0 else "detailed", tokenizers[i]) for i in range(num_agents)]


def length_ratio_reward(first: str, second: str, target_min: float = 2.0, target_max: float = 3.0) -> float:
    """Reward of one pair: 1.0 when len(second)/len(first) is in the target, exp(-distance) outside."""
    if not first:
        return 0.0
    ratio = len(second) / len(first)
    distance = max(target_min - ratio, ratio - target_max, 0.0)
    return 1.0 if distance == 0.0 else math.exp(-distance)


def joint_reward(texts: Sequence[str]) -> float:
    """Mean pair reward over consecutive agents of one joint response."""
    pairs = [length_ratio_reward(texts[i], texts[i + 1]) for i in range(len(texts) - 1)]
    return sum(pairs) / len(pairs)


class CountingReward:
    """The workload's reward function, counting calls, joint responses, rewards and completions.

    ``func(completions1, ..., completionsN)`` takes one list (or one string) per agent and returns one
    reward per joint response; its signature names exactly N positional parameters.
    """

    def __init__(self, num_agents: int):
        self.num_agents = num_agents
        self.calls = 0
        self.joint = 0
        self.seconds = 0.0
        self.rewards: List[float] = []
        self.completions: List[List[str]] = [[] for _ in range(num_agents)]
        # (perf_counter at the end of each call, joint responses so far): where preference collection ends
        self._call_ends: List[Tuple[float, int]] = []

        def length_ratio_reward(*completions):
            return self.score(completions)

        length_ratio_reward.__signature__ = inspect.Signature([
            inspect.Parameter(f"completions{i + 1}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(num_agents)
        ])
        self.func = length_ratio_reward

    def score(self, completions: Sequence[Any]) -> List[float]:
        start = time.perf_counter()
        if len(completions) != self.num_agents:
            raise TypeError(f"expected {self.num_agents} completion lists, got {len(completions)}")
        per_agent = [list(c) if isinstance(c, (list, tuple)) else [c] for c in completions]
        rewards = []
        for joint in zip(*per_agent):
            rewards.append(float(joint_reward(joint)))
            for agent, text in enumerate(joint):
                self.completions[agent].append(text)
        self.calls += 1
        self.joint += len(rewards)
        self.rewards.extend(rewards)
        end = time.perf_counter()
        self.seconds += end - start
        self._call_ends.append((end, self.joint))
        return rewards


# ----------------------------------------------------------------------------- instrumentation


class ModelCounters:
    """Calls, rows, tokens and seconds of ``generate()`` and of forward passes on our model objects."""

    COUNTS = ("generate_calls", "generate_rows", "generate_new_tokens_padded", "generate_new_tokens_nonpad",
              "fwd_calls_grad", "fwd_calls_nograd", "fwd_rows_grad", "fwd_rows_nograd", "fwd_tokens_grad", "fwd_tokens_nograd")
    SECONDS = ("generate_s", "fwd_s_grad", "fwd_s_nograd")

    def __init__(self):
        self.values: Dict[str, Any] = {**{name: 0 for name in self.COUNTS}, **{name: 0.0 for name in self.SECONDS}}
        self._generating = 0
        self._started: List[float] = []
        self._generate_starts: List[float] = []  # perf_counter at each generate() call

    def attach(self, model: Any, pad_token_id: Optional[int]) -> None:
        self._wrap_generate(model, pad_token_id)
        model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        model.register_forward_hook(self._after_forward, with_kwargs=True)

    def _wrap_generate(self, model: Any, pad_token_id: Optional[int]) -> None:
        import torch

        original = model.generate

        def generate(*args, **kwargs):
            start = time.perf_counter()
            self._generate_starts.append(start)
            self._generating += 1
            try:
                output = original(*args, **kwargs)
            finally:
                self._generating -= 1
            self.values["generate_s"] += time.perf_counter() - start
            self.values["generate_calls"] += 1
            sequences = getattr(output, "sequences", output)
            prompt = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(sequences, torch.Tensor) and isinstance(prompt, torch.Tensor):
                new = sequences[:, prompt.shape[-1]:]
                self.values["generate_rows"] += int(new.shape[0])
                self.values["generate_new_tokens_padded"] += int(new.numel())
                real = int((new != pad_token_id).sum()) if pad_token_id is not None else int(new.numel())
                self.values["generate_new_tokens_nonpad"] += real
            return output

        model.generate = generate

    def _before_forward(self, module, args, kwargs):
        if not self._generating:
            self._started.append(time.perf_counter())

    def _after_forward(self, module, args, kwargs, output):
        import torch

        if self._generating or not self._started:
            return
        seconds = time.perf_counter() - self._started.pop()
        ids = kwargs.get("input_ids", args[0] if args else None)
        is_tensor = isinstance(ids, torch.Tensor)
        rows = int(ids.shape[0]) if is_tensor and ids.dim() == 2 else 1
        mode = "grad" if torch.is_grad_enabled() else "nograd"
        self.values[f"fwd_calls_{mode}"] += 1
        self.values[f"fwd_rows_{mode}"] += rows
        self.values[f"fwd_tokens_{mode}"] += int(ids.numel()) if is_tensor else 0
        self.values[f"fwd_s_{mode}"] += seconds

    def as_dict(self) -> Dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.values.items()}


# ----------------------------------------------------------------------------- the report


def implementation_info() -> Dict[str, Any]:
    """Distribution name, version and module file of the ``comlrl`` under test."""
    import comlrl

    names = importlib.metadata.packages_distributions().get("comlrl") or ["comlrl"]
    version = getattr(comlrl, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(names[0])
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return {"name": names[0], "version": str(version), "module_file": getattr(comlrl, "__file__", None)}


def peak_rss_mib() -> float:
    """Peak resident set size of this process (``ru_maxrss`` is in KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def mean(values: Sequence[float]) -> Optional[float]:
    return round(float(sum(values) / len(values)), 6) if values else None


def versions() -> Dict[str, str]:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable_paths(value: Any) -> Any:
    """``value`` with every absolute path made machine-neutral, so that a results file can be committed
    without naming this machine's folders: under this checkout, relative to it (``bench/models/x``);
    in an installed package, from ``site-packages/`` on; elsewhere, ``.../`` and its last two parts."""
    if isinstance(value, dict):
        return {key: portable_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_paths(item) for item in value]
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    path = os.path.normpath(value)
    if os.path.commonpath([path, _CHECKOUT]) == _CHECKOUT:
        return os.path.relpath(path, _CHECKOUT)
    parts = path.split(os.sep)
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages"):])
    return ".../" + "/".join(parts[-2:])


def emit(result: Dict[str, Any], json_out: Optional[str]) -> None:
    """Print the JSON line last on stdout (and append it to ``json_out``), its paths made portable."""
    line = json.dumps(portable_paths(result))
    sys.stdout.flush()
    print(line, flush=True)
    if json_out:
        with open(json_out, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def timed_train(trainer: Any, seed: int, profile: Optional[str]) -> Dict[str, float]:
    """``train_start``/``train_end`` (perf_counter) and ``train_s`` of ``trainer.train()`` (reseeded
    first; optionally under cProfile)."""
    seed_everything(seed)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    trainer.train()
    if profiler is not None:
        profiler.disable()
    end = time.perf_counter()
    if profiler is not None:
        profiler.dump_stats(profile)
    return {"train_start": start, "train_end": end, "train_s": end - start}


def retokenized(reward: CountingReward, tokenizers: Optional[Sequence[Any]]) -> int:
    """Completion tokens re-counted from the texts the reward saw (independent of the implementation)."""
    if tokenizers is None:
        return 0
    return sum(len(tokenizers[agent](text, add_special_tokens=False).input_ids)
               for agent, texts in enumerate(reward.completions) for text in texts)


def run_and_report(algo: str, args: argparse.Namespace, model_paths: Sequence[str], tokenizers: Any,
                   build_trainer: Callable[[], Any], reward: CountingReward, counters: Optional[ModelCounters],
                   extra: Optional[Dict[str, Any]] = None, critic_counters: Optional[ModelCounters] = None,
                   after_train: Optional[Callable[[Any, Dict[str, float]], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Build the trainer (timed as setup), time ``train()``, print and return the JSON result.

    ``after_train(trainer, timing)`` (untimed; ``timing`` from ``timed_train``) returns fields added
    just before ``model_counters`` (an existing key is replaced in place).
    """
    import torch

    start = time.perf_counter()
    trainer = build_trainer()
    setup_s = time.perf_counter() - start
    timing = timed_train(trainer, args.seed, args.profile)
    train_s = timing["train_s"]

    retok = retokenized(reward, tokenizers)
    gen_tokens, gen_source = None, None
    if counters is not None and counters.values["generate_calls"]:
        gen_tokens, gen_source = counters.values["generate_new_tokens_nonpad"], "generate_hook_nonpad"
    elif retok:
        gen_tokens, gen_source = retok, "retokenized_completions"
    rewards = reward.rewards
    quarter = max(1, len(rewards) // 4)
    config = {
        "models": list(model_paths), "num_agents": args.num_agents, "num_generations": args.num_generations,
        "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts, "epochs": args.epochs,
        "seed": args.seed, "threads": torch.get_num_threads(), "chat_template": bool(args.chat_template),
        "pass_paths": bool(args.pass_paths), **(extra or {}),
    }
    result = {
        "bench": f"{algo}_bench",
        "implementation": implementation_info(),
        "label": args.label,
        "config": config,
        "setup_s": round(setup_s, 3),
        "train_wall_s": round(train_s, 3),
        "reward_calls": reward.calls,
        "joint_responses": reward.joint,
        "joint_samples_per_s": round(reward.joint / train_s, 4) if train_s > 0 else None,
        "generated_tokens": gen_tokens,
        "generated_tokens_source": gen_source,
        "generated_tokens_per_s": round(gen_tokens / train_s, 2) if gen_tokens and train_s > 0 else None,
        "completion_tokens_retokenized": retok,
        "completion_chars": sum(len(text) for texts in reward.completions for text in texts),
        "reward_s": round(reward.seconds, 4),
        "peak_rss_mib": peak_rss_mib(),
        "reward_mean_all": mean(rewards),
        "reward_mean_first_quarter": mean(rewards[:quarter]),
        "reward_mean_last_quarter": mean(rewards[-quarter:]),
        "model_counters": counters.as_dict() if counters is not None else None,
        "critic_counters": critic_counters.as_dict() if critic_counters is not None else None,
        "versions": versions(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if after_train is not None:
        added = after_train(trainer, timing) or {}
        merged: Dict[str, Any] = {}
        for key, value in result.items():
            if key == "model_counters":
                merged.update({k: v for k, v in added.items() if k not in result})
            merged[key] = added.get(key, value)
        result = merged
    emit(result, args.json_out)
    return result


# ---------------------------------------------------------------------------
# Preference benchmarks (madpo_bench.py, marlhf_bench.py). Additions only: the
# scripts above do not use anything below.
# ---------------------------------------------------------------------------

def _int_or_none(text: str) -> Optional[int]:
    return None if str(text).strip().lower() in {"none", "null", ""} else int(text)


def add_preference_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by the MADPO and MARLHF benchmarks (preference collection)."""
    p.add_argument("--num-candidates", type=int, default=8,
                   help="preference_num_candidates: completions per agent and prompt")
    p.add_argument("--pairs-per-sample", type=_int_or_none, default=4,
                   help="preference_pairs_per_sample ('none' = unlimited; required with --pair-selection all)")
    p.add_argument("--pair-selection", default="reward_gap", choices=["reward_gap", "random", "all"])
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--rollout-buffer-size", type=int, default=2)
    p.add_argument("--train-batch-size", type=_int_or_none, default=None,
                   help="train_batch_size (default: the config's, i.e. the rollout buffer size)")


def preference_config_fields(args: argparse.Namespace) -> Dict[str, Any]:
    """The config fields MADPO and MARLHF benchmarks share (the workload's sampling, batching and pairs)."""
    return dict(
        num_agents=args.num_agents, num_turns=1, num_train_epochs=args.epochs, agent_learning_rate=args.lr, logging_steps=10**9,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        rollout_buffer_size=args.rollout_buffer_size, train_batch_size=args.train_batch_size, eval_interval=0,
        preference_num_candidates=args.num_candidates, preference_pairs_per_sample=args.pairs_per_sample,
        pair_selection=args.pair_selection,
    )


def preference_trainer(trainer_cls: Any, args: argparse.Namespace, paths: Sequence[str], models: Sequence[Any], tokenizers: Any,
                       reward: "CountingReward", formatters: Any, config: Any, dataset: Any, probe: "PreferenceProbe") -> Any:
    """A MADPO / MARLHF trainer of the benchmark workload (paths or the loaded models), with the probe attached."""
    trainer = trainer_cls(
        agents=list(paths) if args.pass_paths else models, num_agents=args.num_agents, tokenizer=tokenizers,
        reward_func=reward.func, formatters=formatters, args=config, train_dataset=dataset,
    )
    return probe.attach(trainer)


def preference_pairs_from_rewards(rewards: Sequence[float], group_size: int,
                                  limit: Optional[int], mode: str) -> List[int]:
    """Pairs per prompt implied by the documented selection rule, from the candidate rewards.

    rewards holds the K = group_size candidate scores of each prompt, prompt after prompt.
    Every ordered (i, j), i != j, with r_i - r_j > 0 strictly is a candidate pair (ties and
    NaN dropped); all modes but "all" keep at most `limit` of them.
    """
    out: List[int] = []
    for start in range(0, len(rewards) - group_size + 1, group_size):
        group = [float(x) for x in rewards[start:start + group_size]]
        n = sum(1 for i, a in enumerate(group) for j, b in enumerate(group) if i != j and a - b > 0)
        if mode != "all" and limit is not None:
            n = min(n, int(limit))
        out.append(n)
    return out


def merge_counters(counters: Sequence[ModelCounters]) -> Optional[Dict[str, Any]]:
    """Field-wise sum of several ModelCounters.as_dict() (None if there are none)."""
    if not counters:
        return None
    total: Dict[str, Any] = {}
    for c in counters:
        for k, v in c.as_dict().items():
            total[k] = round(total.get(k, 0) + v, 4) if isinstance(v, float) else total.get(k, 0) + v
    return total


class ModelLoadWatcher:
    """Records from_pretrained() loads of models and tokenizers while active.

    Instrumentation only. While active, the from_pretrained classmethods of transformers'
    PreTrainedModel and PreTrainedTokenizerBase are wrapped (and restored on exit); every
    load is recorded (kind, class, source, start time, seconds) and every loaded model gets
    its own ModelCounters. The scripts load their agent models before entering, so what
    is recorded is what the trainer loads itself: the MARLHF reward backbone in train(),
    any reference model, or the agents with --pass-paths.
    """

    def __init__(self):
        self.loads: List[Dict[str, Any]] = []
        self._restore: List[Tuple[Any, Any]] = []
        self._depth = 0

    def __enter__(self) -> "ModelLoadWatcher":
        from transformers import PreTrainedModel
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        for kind, base in (("model", PreTrainedModel), ("tokenizer", PreTrainedTokenizerBase)):
            orig = base.__dict__.get("from_pretrained")
            if not isinstance(orig, classmethod):
                continue
            base.from_pretrained = classmethod(self._wrap(kind, orig.__func__))
            self._restore.append((base, orig))
        return self

    def __exit__(self, *exc) -> None:
        for base, orig in reversed(self._restore):
            base.from_pretrained = orig
        self._restore = []

    def _wrap(self, kind: str, func):
        import functools
        watcher = self

        @functools.wraps(func)
        def from_pretrained(cls, *a, **kw):
            if watcher._depth:
                return func(cls, *a, **kw)
            watcher._depth += 1
            t0 = time.perf_counter()
            try:
                obj = func(cls, *a, **kw)
            finally:
                watcher._depth -= 1
            rec: Dict[str, Any] = {
                "kind": kind, "class": type(obj).__name__,
                "source": str(a[0] if a else kw.get("pretrained_model_name_or_path")),
                "start": t0, "seconds": time.perf_counter() - t0, "counters": None,
            }
            if kind == "model" and hasattr(obj, "register_forward_hook") and hasattr(obj, "generate"):
                c = ModelCounters()
                c.attach(obj, getattr(getattr(obj, "config", None), "pad_token_id", None))
                rec["counters"] = c
            watcher.loads.append(rec)
            return obj

        return from_pretrained

    def summary(self, since: float, until: Optional[float] = None) -> List[Dict[str, Any]]:
        return [{"kind": r["kind"], "class": r["class"], "source": r["source"],
                 "seconds": round(r["seconds"], 3)}
                for r in self.loads if r["start"] >= since and (until is None or r["start"] < until)]

    def counters_since(self, since: float) -> List[ModelCounters]:
        return [r["counters"] for r in self.loads if r["start"] >= since and r["counters"] is not None]


class PreferenceProbe:
    """What a MADPO/MARLHF run did, observed from outside the trainer.

    - Pairs collected: counted on the list returned by the trainer's
      ``_build_preference_dataset`` when it has one (a private method of comlrl 1.4.3,
      wrapped on the instance, source "collect_hook"); also derived from the candidate
      rewards the reward function returned, with the documented selection rule
      ("from_rewards"). The scripts add further cross-checks.
    - Collection end: the end of the reward call that completes num_prompts x K
      candidate evaluations (collection comes first in every documented flow).
    """

    def __init__(self, args, reward: CountingReward, counters: Optional[ModelCounters],
                 watcher: Optional[ModelLoadWatcher] = None):
        self.args = args
        self.reward = reward
        self.counters = counters
        self.watcher = watcher
        self.hook_pairs: Optional[int] = None
        self.hook_calls = 0

    def attach(self, trainer):
        fn = getattr(trainer, "_build_preference_dataset", None)
        if callable(fn):
            probe = self

            def _build_preference_dataset(*a, **kw):
                pairs = fn(*a, **kw)
                probe.hook_calls += 1
                try:
                    probe.hook_pairs = (probe.hook_pairs or 0) + len(pairs)
                except TypeError:
                    pass
                return pairs

            try:
                trainer._build_preference_dataset = _build_preference_dataset
            except Exception:
                pass
        return trainer

    @property
    def expected_candidates(self) -> int:
        return int(self.args.num_prompts) * int(self.args.num_candidates)

    def collect_end(self, timing: Dict[str, float]) -> Optional[float]:
        ends = self.reward._call_ends
        for t, joint in ends:
            if joint >= self.expected_candidates:
                return t
        return ends[-1][0] if ends else None

    def first_generate_after(self, t: Optional[float]) -> Optional[float]:
        if t is None or self.counters is None:
            return None
        later = [s for s in self.counters._generate_starts if s > t]
        return min(later) if later else None

    def report(self, trainer, timing: Dict[str, float]) -> Dict[str, Any]:
        t0, t1, train_s = timing["train_start"], timing["train_end"], timing["train_s"]
        k = int(self.args.num_candidates)
        collected = self.reward.rewards[:self.expected_candidates]
        per_item = None
        if len(collected) == self.expected_candidates:
            per_item = preference_pairs_from_rewards(collected, k, self.args.pairs_per_sample,
                                                     self.args.pair_selection)
        from_rewards = sum(per_item) if per_item is not None else None
        if self.hook_pairs is not None:
            pairs, source = self.hook_pairs, "collect_hook"
        else:
            pairs, source = from_rewards, "from_rewards"
        ce = self.collect_end(timing)
        collect_s = round(ce - t0, 3) if ce is not None else None
        out: Dict[str, Any] = {
            "preference_pairs": pairs,
            "preference_pairs_source": source,
            "preference_pairs_checks": {"collect_hook": self.hook_pairs,
                                        "from_rewards": from_rewards,
                                        "from_rewards_per_prompt": per_item},
            "collection_candidates": len(collected),
            "collect_s": collect_s,
            "collect_candidates_per_s": (round(len(collected) / collect_s, 4)
                                         if collect_s else None),
            "trainer_env_step": _jsonable_int(getattr(trainer, "env_step", None)),
        }
        if self.watcher is not None:
            out["loads_in_setup"] = self.watcher.summary(since=-math.inf, until=t0)
            out["loads_in_train"] = self.watcher.summary(since=t0, until=t1)
        return out


def _jsonable_int(x) -> Optional[int]:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def parse_config_sets(parser, items):
    """``--config-set FIELD=VALUE`` items -> ``{field: value}`` (values parsed as YAML)."""
    import yaml

    fields = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--config-set wants FIELD=VALUE, got {item!r}")
        fields[field.strip()] = yaml.safe_load(value)
    return fields
