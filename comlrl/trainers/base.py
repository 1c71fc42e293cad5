"""The loop every trainer shares: epochs of steps over the training items, evaluation on schedule,
metrics, progress and model export. Algorithms fill in ``_items_per_step``, ``_train_step``,
``_flush_buffers`` and ``evaluate``.
"""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.saving import check_target_free, save_pretrained_dir
from comlrl.rollout.generation import RESERVED_GENERATION_KEYS, SamplingParams
from comlrl.rollout.tree import TreeRollout
from comlrl.training.checkpoint import CheckpointSchedule, TrainingCheckpointMixin, build_identity
from comlrl.training.checkpoint_files import CheckpointError
from comlrl.training.checkpoint_state import AttributeState, CheckpointComponents, DataclassState
from comlrl.trainers.policy import PolicyAgent, build_references
from comlrl.training.devices import resolve_devices
from comlrl.training.optim import AgentOptimizer
from comlrl.training.metrics import JsonlSink, MemorySink, MetricsLogger
from comlrl.training.progress import ProgressBar
from comlrl.training.tensorboard_sink import TensorBoardSink
from comlrl.training.wandb_sink import WandbSink, verbose_from_wandb_config


@dataclass
class TrainingState:
    """Where a run is: the cursor a checkpoint needs to continue from the exact same step."""

    epoch: int = 0  # epochs completed
    position: int = 0  # training items consumed in the current epoch
    env_step: int = 0  # joint rewards computed so far (the x-axis of every log)
    global_step: int = 0  # training steps (one rollout + its updates) so far


def is_map_dataset(dataset: Any) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def dataset_length(dataset: Any) -> Optional[int]:
    try:
        return len(dataset)
    except TypeError:
        return None


def chunked(values: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class TrainerBase(TrainingCheckpointMixin):
    """Shared training loop (see module docstring). Subclasses set ``args``, ``agents``,
    ``tokenizers``, ``optimizers``, ``train_dataset`` and ``eval_dataset`` and call
    ``_init_services``; they extend ``_checkpoint_components`` with what else a checkpoint holds."""

    algorithm_name = "base"
    default_config_cls: Any = None

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def _resolve_args(cls, args: Any) -> Any:
        """The config to use: a private copy of ``args`` (or the trainer's default config)."""
        if args is None:
            return cls.default_config_cls()
        family = getattr(cls, "config_family", None) or cls.default_config_cls
        if not isinstance(args, family):
            raise TypeError(f"args must be a {family.__name__} (or a subclass), got {type(args).__name__}.")
        return copy.copy(args)

    def _init_services(self, wandb_config: Optional[Mapping[str, Any]], run_config: Dict[str, Any]) -> None:
        self.state = TrainingState()
        self.wandb_config = dict(wandb_config) if wandb_config is not None else None
        verbose = self.args.verbose
        self.verbose = verbose_from_wandb_config(self.wandb_config) if verbose is None else bool(verbose)
        self._memory = MemorySink()
        self._wandb: Optional[WandbSink] = None
        self._run_config = run_config
        sinks: List[Any] = [self._memory]
        if self.args.output_dir:
            sinks.append(JsonlSink(os.path.join(self.args.output_dir, "metrics.jsonl")))
        if self.args.tensorboard:
            sinks.append(TensorBoardSink(os.path.join(self.args.output_dir, "tensorboard")))
        self.metrics = MetricsLogger(sinks, self.args.logging_steps)
        self._generation_kwargs: Dict[str, Any] = {}
        if self.wandb_config is not None:
            self._start_wandb()

    def _start_wandb(self) -> None:
        if self._wandb is None:
            self._wandb = WandbSink(self.wandb_config, dict(self._run_config))
            self.metrics.sinks.append(self._wandb)

    @property
    def wandb_initialized(self) -> bool:
        return self._wandb is not None

    @property
    def env_step(self) -> int:
        return self.state.env_step

    @env_step.setter
    def env_step(self, value: int) -> None:
        self.state.env_step = int(value)

    @property
    def log_history(self) -> List[Dict[str, Any]]:
        """Every logged row (training and evaluation), oldest first."""
        return self._memory.rows

    # ------------------------------------------------------------------ shared construction steps
    def _reference_devices(self, devices: Sequence[torch.device]) -> List[torch.device]:
        """Devices of the frozen references: ``reference_devices``, else the agents' own."""
        spec = self.args.reference_devices
        return resolve_devices(spec, len(devices), "reference_devices") if spec is not None else list(devices)

    def _build_policies(
        self,
        models: Sequence[nn.Module],
        trainable: Sequence[nn.Module],
        sources: Sequence[Any],
        reference_devices: Sequence[torch.device],
    ) -> None:
        """Frozen references (with reference KL), then one ``PolicyAgent`` per language model and one
        optimizer over each ``trainable`` module (the model itself, or a wrapper adding a value head)."""
        a = self.args
        self.reference_models = build_references(models, sources, reference_devices) if self._uses_reference_models() else []
        self.policies = [
            PolicyAgent(i, model, tok, device, self.reference_models[i] if self.reference_models else None)
            for i, (model, tok, device) in enumerate(zip(models, self.tokenizers, self.agent_devices))
        ]
        for policy, module in zip(self.policies, trainable):
            policy.optimizer = self._make_optimizer(module.parameters(), a.agent_learning_rate)

    def _uses_reference_models(self) -> bool:
        """Whether frozen references are built (the reference-KL penalty needs them)."""
        return bool(self.args.reference_kl_enabled)

    def _store_task(self, *, train_dataset: Any, eval_dataset: Any, reward_func: Any, reward_processor: Any, external_transition: Any) -> None:
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.external_transition = external_transition

    # ------------------------------------------------------------------ optimisation helpers
    def _make_optimizer(self, parameters, lr: float) -> AgentOptimizer:
        a = self.args
        in_backward = a.optimizer_in_backward if a.optimizer_in_backward is not None else a.max_grad_norm is None
        return AgentOptimizer(
            parameters, lr=lr, betas=a.adam_betas, eps=a.adam_epsilon, weight_decay=a.weight_decay,
            fused=a.optimizer_fused, max_grad_norm=a.max_grad_norm, in_backward=in_backward,
        )

    # ------------------------------------------------------------------ the loop
    def train(
        self,
        resume_from_checkpoint: Optional[str] = None,
        checkpoint_dir: Optional[str] = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: Optional[int] = None,
        checkpoint_steps: Optional[int] = None,
        **generation_kwargs: Any,
    ) -> None:
        """Train until ``args.num_train_epochs`` epochs are complete (resumed epochs count).

        Checkpoints (off by default; see docs/checkpoints.md): ``checkpoint_dir`` receives
        ``checkpoint-<sequence>`` folders every ``checkpoint_interval`` epochs, after the last epoch,
        and every ``checkpoint_steps`` training steps when set; ``checkpoint_total_limit`` keeps only
        the newest of this run's checkpoints. ``resume_from_checkpoint`` (a checkpoint folder, a
        checkpoint_dir for its latest, or True for the latest in ``checkpoint_dir``) continues a run
        from the exact step it was saved at.

        ``generation_kwargs`` are extra ``generate`` settings (e.g. ``repetition_penalty``); the
        sampling settings of the config cannot be overridden here.
        """
        schedule = CheckpointSchedule.from_train_args(
            checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval, checkpoint_total_limit=checkpoint_total_limit,
            checkpoint_steps=checkpoint_steps, resume_from_checkpoint=resume_from_checkpoint,
        )
        self._set_generation_kwargs(generation_kwargs)
        if self.train_dataset is None:
            raise ValueError("train_dataset is required to train; pass train_dataset=... to the trainer.")
        self._checkpoint_begin(resume_from_checkpoint, schedule)
        self._training_active = True
        try:
            self._run_epochs()
        except BaseException:
            self._training_failure = f"epoch {self.state.epoch + 1}, item {self.state.position} (global step {self.state.global_step})"
            raise
        finally:
            self._training_active = False
            self._checkpoint_schedule = None
        self._training_failure = None

    def _set_generation_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        from transformers import GenerationConfig

        reserved = sorted(set(kwargs) & RESERVED_GENERATION_KEYS)
        if reserved:
            raise ValueError(f"train() cannot override {reserved}; set them in the config ({type(self.args).__name__}).")
        known = set(GenerationConfig().to_dict())
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"train() got unknown generation settings {unknown}; see transformers.GenerationConfig.")
        self._generation_kwargs = dict(kwargs)

    def _run_epochs(self) -> None:
        total = self.args.num_train_epochs
        length = self._epoch_length()
        while self.state.epoch < total:
            bar = ProgressBar(
                total=length, initial=self.state.position, enabled=self.verbose,
                desc=f"{self.algorithm_name} epoch {self.state.epoch + 1}/{total}",
            )
            try:
                for start, items in self._epoch_steps(self.state.position):
                    self._maybe_evaluate(start, len(items))
                    self._train_step(items)
                    self.state.position = start + len(items)
                    self.state.global_step += 1
                    row = self.metrics.flush(self.env_step)
                    bar.update(len(items), row)
                    self._after_step()
                    self._checkpoint_after_step(self.state.global_step)
                self._flush_buffers()
                self.metrics.flush(self.env_step, force=True)
            finally:
                bar.close()
            self.state.epoch += 1
            self.state.position = 0
            self._after_epoch()
            self._checkpoint_after_epoch(self.state.epoch, final=self.state.epoch >= total)

    def _epoch_length(self) -> Optional[int]:
        """Items one epoch visits (the training dataset's length; None when it has none)."""
        return dataset_length(self.train_dataset)

    def _epoch_steps(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        return self._dataset_steps(self.train_dataset, start, self._items_per_step())

    @staticmethod
    def _dataset_steps(dataset: Any, start: int, size: int) -> Iterator[Tuple[int, List[Any]]]:
        """``(position, items)`` of consecutive steps of ``size`` items, from item ``start`` on."""
        if is_map_dataset(dataset):
            length = len(dataset)
            for first in range(start, length, size):
                yield first, [dataset[i] for i in range(first, min(first + size, length))]
            return
        iterator = iter(dataset)
        for _ in range(start):
            next(iterator, None)
        position, items = start, []
        for item in iterator:
            items.append(item)
            if len(items) == size:
                yield position, items
                position, items = position + size, []
        if items:
            yield position, items

    def _maybe_evaluate(self, start: int, count: int) -> None:
        interval = self.args.eval_interval
        if self.eval_dataset is None or interval <= 0:
            return
        if any((start + offset) % interval == 0 for offset in range(count)):
            self.evaluate()

    # hooks for subclasses (checkpoints are taken right after them)
    def _after_step(self) -> None:
        pass

    def _after_epoch(self) -> None:
        pass

    # ------------------------------------------------------------------ checkpoint contents
    def _checkpoint_components(self) -> CheckpointComponents:
        """What every trainer's checkpoint holds; subclasses add their models, optimizers, buffers
        and callbacks (``super()._checkpoint_components().add_models(...)...``)."""
        components = CheckpointComponents()
        components.add_models("agents", self.agents)
        progress = DataclassState(self.state)
        components.add_state("progress", progress, check=progress.check)
        components.add_state("metrics", self.metrics)
        components.add_state("log_history", AttributeState(self._memory, "rows"))
        # An iterable dataset is re-iterated and the consumed items skipped; restoring its own iteration
        # state as well would skip them twice, so only indexable datasets' states are kept.
        datasets = {"train_dataset": self.train_dataset, "eval_dataset": self.eval_dataset}
        return components.add_callbacks({name: d for name, d in datasets.items() if is_map_dataset(d)})

    def _checkpoint_identity(self) -> Dict[str, Any]:
        return build_identity(
            config=self.args,
            dataset=self.train_dataset,
            tokenizers={f"agents.{i}": tok for i, tok in enumerate(self.tokenizers)},
            wandb=self._wandb.identity if self._wandb is not None else None,
            progress=asdict(self.state),
            generation=self._generation_kwargs,
        )

    def _checkpoint_check(self, manifest: Mapping[str, Any], states: Mapping[str, Any]) -> None:
        progress, total = states["progress"], self.args.num_train_epochs
        for name, value in progress.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"The checkpoint's progress {name}={value!r} is not a non-negative integer.")
        epoch, position = progress["epoch"], progress["position"]
        if epoch > total or (epoch == total and position > 0):
            needed = epoch + (1 if position else 0)
            raise CheckpointError(
                f"The checkpoint is past epoch {needed - 1} ({epoch} complete, {position} items into the next) but "
                f"num_train_epochs is {total}; set num_train_epochs >= {needed} to resume it."
            )
        length = self._checkpoint_epoch_length(states)
        if length is not None and position > length:
            raise CheckpointError(f"The checkpoint's position ({position} items) is beyond the training dataset ({length} items).")
        identity = manifest.get("wandb")
        run = self._wandb
        if identity and run is not None and not run.owned and run.run.id != identity["id"] and "id" not in (self.wandb_config or {}):
            raise CheckpointError(
                f"Cannot replace an external W&B run ({run.run.id}) with the checkpoint's run {identity['id']}: finish "
                f"the active run first, or pass wandb_config with the id you want."
            )

    def _checkpoint_epoch_length(self, states: Mapping[str, Any]) -> Optional[int]:
        """The epoch length a checkpoint's position is checked against (before it is restored)."""
        return dataset_length(self.train_dataset)

    def _checkpoint_restored(self, manifest: Mapping[str, Any]) -> None:
        """Drop log rows of the abandoned continuation; continue the checkpoint's W&B run unless
        ``wandb_config`` names a run (id or resume)."""
        self.metrics.rewind(self.log_history, self.env_step)
        identity = manifest.get("wandb")
        config = self.wandb_config
        if not identity or config is None or "id" in config or "resume" in config:
            return
        if self._wandb is not None:
            if self._wandb.run.id == identity["id"]:
                return
            self.metrics.sinks.remove(self._wandb)
            self._wandb.close()
            self._wandb = None
        config.update(id=identity["id"], resume="allow")
        for key in ("project", "entity"):
            if identity.get(key) and not config.get(key):
                config[key] = identity[key]
        self._start_wandb()

    # ------------------------------------------------------------------ algorithm interface
    def _items_per_step(self) -> int:
        raise NotImplementedError

    def _train_step(self, items: List[Any]) -> None:
        raise NotImplementedError

    def _flush_buffers(self) -> None:
        raise NotImplementedError

    def evaluate(self, *args: Any, **kwargs: Any) -> Dict[str, float]:
        raise NotImplementedError

    # ------------------------------------------------------------------ rollout (subclasses set policies, formatters)
    @staticmethod
    def _check_transition(args: Any, transition: Any, family: str) -> None:
        if transition is not None and not callable(transition):
            raise ValueError(f"external_transition must be callable, got {type(transition).__name__}.")
        if args.num_turns > 1 and transition is None:
            raise ValueError(
                f"Multi-turn {family} requires an external_transition (num_turns={args.num_turns}): give a function "
                f"that returns the next turn's prompts, or set num_turns=1."
            )

    def _sampling(self, *, greedy: bool = False) -> SamplingParams:
        a = self.args
        return SamplingParams(a.max_new_tokens, a.temperature, a.top_p, a.top_k, do_sample=not greedy, extra=dict(self._generation_kwargs))

    def _rollout_tree(
        self, *, reward: Any, num_generations: int, joint_mode: str, greedy: bool,
        early_termination_threshold: Optional[float], old_logprobs: bool, reference_kl: bool,
    ) -> TreeRollout:
        """A ``TreeRollout`` over ``self.policies``; with ``old_logprobs`` / ``reference_kl`` every
        level's rows are also scored for their sampling log-probs / KL to the reference."""
        a = self.args
        scorer = None
        if old_logprobs or reference_kl:
            def scorer(agent: int, completions: Any) -> Dict[str, Any]:
                return self.policies[agent].rollout_extras(completions, a.temperature, old_logprobs=old_logprobs, reference_kl=reference_kl)
        return TreeRollout(
            generators=[p.generator for p in self.policies], formatters=self.formatters, reward=reward,
            num_generations=num_generations, num_turns=a.num_turns, joint_mode=joint_mode, discount=a.discount,
            sampling=self._sampling(greedy=greedy), early_termination_threshold=early_termination_threshold,
            external_transition=self.external_transition, external_prompt_passthrough=a.external_prompt_passthrough,
            row_scorer=scorer,
        )

    def _user_callbacks(self) -> Dict[str, Any]:
        """The user's objects a checkpoint keeps the state of (when they offer one)."""
        callbacks = {
            "reward_func": self.reward_func, "reward_processor": self.reward_processor,
            "external_transition": self.external_transition,
        }
        callbacks.update({f"formatters.{i}": formatter.original for i, formatter in enumerate(self.formatters)})
        return callbacks

    # ------------------------------------------------------------------ evaluation items
    def _evaluation_items(self, num_eval_samples: Optional[int]) -> List[Any]:
        """Up to ``num_eval_samples`` (default ``args.eval_num_samples``) eval items; none without an
        eval dataset or for a count of 0."""
        if self.eval_dataset is None:
            return []
        count = self.args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
        return self._eval_items(count) if count > 0 else []

    def _eval_items(self, count: int) -> List[Any]:
        dataset = self.eval_dataset
        if is_map_dataset(dataset):
            return [dataset[i] for i in range(min(count, len(dataset)))]
        items = []
        for item in dataset:
            if len(items) >= count:
                break
            items.append(item)
        return items

    # ------------------------------------------------------------------ export
    def _agent_export_dirs(self, output_dir: str) -> List[str]:
        return [os.path.join(output_dir, f"agent_{i}") for i in range(len(self.agents))]

    def save_model(self, output_dir: str, overwrite: bool = False) -> None:
        """Write ``output_dir/agent_i/`` (weights, config, tokenizer) for every agent.

        Each folder loads back with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and can be given to a
        new trainer as ``agents=[".../agent_0", ...]``. Existing non-empty folders are refused unless
        ``overwrite=True``. A W&B run stays open.
        """
        targets = self._agent_export_dirs(output_dir)
        for target in targets:
            check_target_free(target, overwrite)
        for target, model, tokenizer in zip(targets, self.agents, self.tokenizers):
            save_pretrained_dir(target, self._export_model(model), tokenizer, overwrite)
        if self._wandb is not None:
            self._wandb.write({"final_model_saved": 1.0}, self.env_step)

    def _export_model(self, model: nn.Module) -> nn.Module:
        return model

    def close(self) -> None:
        """Close metric sinks (and finish a W&B run this trainer opened)."""
        self.metrics.close()
