"""The loop every trainer shares: epochs of steps over the training items, evaluation on schedule,
metrics, progress and model export. Algorithms fill in ``_items_per_step``, ``_train_step``,
``_flush_buffers`` and ``evaluate``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.loading import LoadOptions
from comlrl.models.lora import BaseReference, LoraBases, export_view
from comlrl.models.precision import Precision, resolve_precision
from comlrl.models.saving import all_or_nothing, check_folder_path, check_target_free, save_pretrained_dir
from comlrl.rollout.generation import GENERATION_KEY_FIELDS, RESERVED_GENERATION_KEYS, SamplingParams, refused_generation_keys
from comlrl.rollout.sampling import draw_seeds
from comlrl.rollout.tree import TreeRollout
from comlrl.checkpoint.interrupt import Interruptible
from comlrl.checkpoint.schedule import CheckpointSchedule
from comlrl.trainers.checkpoint_contents import TrainerCheckpoints
from comlrl.trainers.datasets import dataset_length, is_map_dataset  # noqa: F401  (also imported from here)
from comlrl.trainers.epochs import EpochLoop
from comlrl.trainers.services import RunServices, TrainingState  # noqa: F401  (TrainingState: also imported from here)
from comlrl.trainers.policy import PolicyAgent, build_references
from comlrl.trainers.backends import install_generation_backends, require_optional_packages
from comlrl.parallel.devices import resolve_devices
from comlrl.parallel.data_parallel import DataParallel
from comlrl.parallel.fsdp import Sharding, full_model_state, is_sharded, is_sharded_tensor
from comlrl.trainers.optim import AgentOptimizer
from comlrl.telemetry.progress import library_bars
from comlrl.telemetry.run_record import describe_data, describe_model, describe_reward
from comlrl.telemetry.signal import signal_metrics




def chunked(values: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class TrainerBase(RunServices, EpochLoop, TrainerCheckpoints):
    """Shared training loop (see module docstring). Subclasses set ``args``, ``agents``,
    ``tokenizers``, ``optimizers``, ``train_dataset`` and ``eval_dataset`` and call
    ``_init_services``; they extend ``_checkpoint_components`` with what else a checkpoint holds."""

    algorithm_name = "base"
    default_config_cls: Any = None
    _sharding: Optional[Sharding] = None  # fsdp=True under torchrun
    _lora: Optional[LoraBases] = None  # the shared frozen bases of LoRA-trained models (``_load_options``)
    precision: Optional[Precision] = None
    data_parallel = True  # runs under torchrun (trainers that do not refuse it before anything loads)

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

    def _join_data_parallel(self, args: Any) -> DataParallel:
        """Join torchrun's process group when this process was started by it (before anything loads)."""
        if args.fsdp and args.parallel_training == "mp":
            raise ValueError(
                "fsdp=True shards each agent over torchrun's processes, parallel_training='mp' puts agents on devices of "
                "one process; use one of them (see docs/distributed.md)."
            )
        self._dist = DataParallel.current()
        if self._dist.enabled and not self.data_parallel:
            raise ValueError(
                f"{type(self).__name__} does not run under torchrun yet (this process is rank {self._dist.rank} of "
                f"{self._dist.world_size}): its preference collection and pair updates are not split over processes. "
                f"Launch it as one process (`python script.py`), with parallel_training='mp' to use several devices."
            )
        if self._dist.enabled and args.parallel_training == "mp":
            raise ValueError(
                "parallel_training='mp' (agents on several devices of one process) cannot be combined with torchrun's "
                "data parallelism yet; use one of them (see docs/distributed.md)."
            )
        if args.fsdp and not self._dist.enabled:
            warnings.warn(
                "fsdp=True has no effect in a single process: there is nothing to shard over. Launch with "
                "`torchrun --nproc_per_node=N script.py` (N > 1) to shard the agents, or set fsdp=False.",
                stacklevel=3,
            )
        elif args.fsdp:
            self._sharding = Sharding(self._dist.device().type, self._dist.world_size)
        return self._dist

    def _model_devices(self, spec: Any, count: int, kind: str) -> List[torch.device]:
        """One device per model; under torchrun, devices left to comlrl are this rank's (cuda:LOCAL_RANK)."""
        dist = getattr(self, "_dist", None)
        if dist is not None and dist.enabled and (spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto")):
            return [dist.device()] * count
        return resolve_devices(spec, count, kind)

    @property
    def env_step(self) -> int:
        return self.state.env_step

    @env_step.setter
    def env_step(self, value: int) -> None:
        self.state.env_step = int(value)

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
        self._agent_sources = list(sources)
        sharding = self._sharding
        if sharding is not None:  # shards and references start from rank 0's weights
            self._dist.broadcast_parameters(trainable)
        # a trainer that loads its models without _load_options trains as before: float32, no autocast
        precision = self.precision or Precision("fp32", torch.float32)
        frozen = precision.frozen if precision.frozen != precision.weights and isinstance(precision.frozen, torch.dtype) else None
        self.reference_models = build_references(models, sources, reference_devices, frozen) if self._uses_reference_models() else []
        if sharding is not None:
            models = [sharding.shard(model) for model in models]
        self.policies = [
            PolicyAgent(i, model, tok, device, self.reference_models[i] if self.reference_models else None, precision)
            for i, (model, tok, device) in enumerate(zip(models, self.tokenizers, self.agent_devices))
        ]
        for policy, module in zip(self.policies, trainable):
            policy.optimizer = self._make_optimizer(module.parameters(), a.agent_learning_rate)
            if sharding is not None:
                policy.generator = sharding.generation(policy.generator, policy.model)
        install_generation_backends(self.policies, a)

    def _saved_references(self) -> List[Optional[nn.Module]]:
        """References a checkpoint writes: a LoRA agent's reference is its frozen base, not saved."""
        return [None if isinstance(m, BaseReference) else m for m in self.reference_models]

    def _load_options(self, model_config: Mapping[str, Any]) -> LoadOptions:
        """Resolve the GPU-path settings before anything loads: the precision (stored back into the
        config as the value used), the optional packages they need, and how models are loaded."""
        a = self.args
        explicit = a.precision is not None
        self._requested_precision = a.precision  # what the user asked for (a sub-engine resolves it the same way)
        self.precision = resolve_precision(a.precision, model_config, self.agent_devices)
        a.precision = self.precision.name
        require_optional_packages(a)
        mp_recompute = a.parallel_training == "mp" and a.gradient_checkpointing
        self._lora = LoraBases("parallel_training='mp' with gradient_checkpointing=True" if mp_recompute else None)
        return LoadOptions(self.precision, explicit, a.gradient_checkpointing)

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
        parameters = list(parameters)
        in_backward = a.optimizer_in_backward if a.optimizer_in_backward is not None else a.max_grad_norm is None
        if any(is_sharded_tensor(p) for p in parameters):
            in_backward = False  # see AgentOptimizer: sharded parameters step after backward
        dist = getattr(self, "_dist", None)
        return AgentOptimizer(
            parameters, lr=lr, betas=a.adam_betas, eps=a.adam_epsilon, weight_decay=a.weight_decay,
            fused=a.optimizer_fused, max_grad_norm=a.max_grad_norm, in_backward=in_backward, kind=a.optimizer,
            grad_sync=dist.average_ if dist is not None and dist.enabled else None,
        )

    def _unsharded(self, modules: Optional[Sequence[nn.Module]] = None) -> Any:
        """A block in which the sharded agents among ``modules`` (all when None) are unsharded, for
        forwards whose number can differ between ranks (collective: every rank enters it). Outside
        FSDP it does nothing."""
        return self._sharding.unsharded(modules) if self._sharding is not None else contextlib.nullcontext()

    def _per_rank(self, count: int, name: str) -> int:
        """This process's share of a whole-run count (all of it in a single process)."""
        return self._dist.per_rank(count, name)

    def _step_seed(self) -> int:
        """The seed of one training step's random streams: one draw from torch's global generator (on
        rank 0, shared with every rank), so a checkpoint's RNG state covers it."""
        return int(self._dist.broadcast_object(draw_seeds(1)[0] if self._dist.is_main else None))

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

        ``generation_kwargs`` are extra ``generate`` settings that leave the sampled distribution
        alone (``use_cache``, ``max_time``, ``stop_strings``, ...: ``DISTRIBUTION_FREE_GENERATION_KEYS``);
        the config's sampling settings and anything that reshapes the distribution are refused.
        """
        schedule = CheckpointSchedule.from_train_args(
            checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval, checkpoint_total_limit=checkpoint_total_limit,
            checkpoint_steps=checkpoint_steps, resume_from_checkpoint=resume_from_checkpoint,
        )
        self._set_generation_kwargs(generation_kwargs)
        if self.train_dataset is None:
            raise ValueError("train_dataset is required to train; pass train_dataset=... to the trainer.")
        self._check_data_parallel()
        self._checkpoint_begin(resume_from_checkpoint, schedule)
        self.metrics.claim()  # a resumed run has claimed its log in the restore; a new one must not mix
        if self._run_record is not None:
            self._run_record.start(
                trainer=type(self).__name__, config=self.args, wandb_config=self.wandb_config, seed=torch.initial_seed(),
                models=[{"role": role, "source": describe_model(role, model, source)["source"]} for role, model, source in self._run_models()],
                data={"train": describe_data(self.train_dataset), "eval": describe_data(self.eval_dataset)},
                reward=describe_reward(self.reward_func),
            )
        self._training_active = True
        error: Optional[BaseException] = None
        self._interrupt = Interruptible(defer_sigterm=schedule.directory is not None)
        try:
            with self._interrupt:
                self._run_epochs()
        except BaseException as exc:
            error = exc
            self._training_failure = f"epoch {self.state.epoch + 1}, item {self.state.position} (global step {self.state.global_step})"
            raise
        finally:
            self._training_active = False
            self._checkpoint_schedule = None
            self._interrupt = None
            self._finish_run_record(error)
        self._training_failure = None

    def _check_data_parallel(self) -> None:
        """Under torchrun, the whole-run counts must split evenly over the processes (checked before
        anything is generated, with the fix in the message)."""
        world = self._dist.world_size
        if world <= 1:
            return
        a = self.args
        self._per_rank(a.rollout_buffer_size, "rollout_buffer_size")
        self._per_rank(a.train_batch_size, "train_batch_size")
        per_step = self._items_per_step()
        if per_step % world:
            raise ValueError(
                f"a training step covers {per_step} items (from rollout_buffer_size={a.rollout_buffer_size}), which cannot "
                f"be split over {world} processes; choose rollout_buffer_size so that the items per step are a multiple of {world}."
            )
        length = dataset_length(self.train_dataset)
        if length is not None and length % world:
            raise ValueError(
                f"the training dataset has {length} items, which cannot be split evenly over {world} processes: uneven item "
                f"counts would leave ranks with different numbers of updates. Use a dataset length that is a multiple of {world}."
            )
        if a.num_turns > 1 and a.early_termination_threshold is not None:
            raise ValueError(
                "early_termination_threshold ends tree branches depending on each rank's rewards, so ranks would hold "
                "different numbers of samples; set early_termination_threshold=None for data-parallel multi-turn training."
            )

    def _set_generation_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        from transformers import GenerationConfig

        reserved = sorted(set(kwargs) & RESERVED_GENERATION_KEYS)
        if reserved:
            raise ValueError(f"train() cannot override {reserved}; set them in the config ({type(self.args).__name__}).")
        known = set(GenerationConfig().to_dict())
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"train() got unknown generation settings {unknown}; see transformers.GenerationConfig.")
        changing = refused_generation_keys(kwargs)
        if changing:
            fields = ", ".join(f"{key} -> {GENERATION_KEY_FIELDS[key]}" for key in changing if key in GENERATION_KEY_FIELDS)
            raise ValueError(
                f"train() got generation settings {changing} that change the distribution tokens are sampled from, while the "
                f"update scores them under softmax(logits / temperature): the recorded log-probs, importance ratios and KL "
                f"would be of another policy. Set the sampling in the config ({type(self.args).__name__}: temperature, top_p, "
                f"top_k, max_new_tokens{'; ' + fields if fields else ''}) and remove them."
            )
        if kwargs and self.args.generation_backend == "vllm":
            raise ValueError(
                f"generation_backend='vllm' does not forward train() generation settings {sorted(kwargs)}; remove them or "
                f"use generation_backend='hf'."
            )
        self._generation_kwargs = dict(kwargs)

    # hooks for subclasses (checkpoints are taken right after them)
    def _after_step(self) -> None:
        pass

    def _after_epoch(self) -> None:
        pass

    def _record_signal(self, reward_groups: Sequence[Sequence[float]], completion_groups: Sequence[Sequence[str]]) -> None:
        """Log the step's zero-signal fractions (``comlrl.telemetry.signal``); warn once when it had none."""
        metrics = signal_metrics(reward_groups, completion_groups)
        self.metrics.record(metrics)
        self._signal.check(metrics, self.env_step)

    # ------------------------------------------------------------------ algorithm interface
    def _items_per_step(self) -> int:
        raise NotImplementedError

    def _train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        """Roll out ``items`` (this process's share of the step; ``item_ids`` their indices in the
        whole step, the identity of their random streams) and update."""
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
            default = "" if args.is_explicit("num_turns") else f"; num_turns defaults to {args.num_turns}, as in CoMLRL 1.4.3"
            raise ValueError(
                f"Multi-turn {family} requires an external_transition (num_turns={args.num_turns}{default}): for single-turn "
                f"training set num_turns=1 in {type(args).__name__}(...), or give external_transition=f returning the next "
                f"turn's prompt of every agent."
            )

    def _sampling(self, *, greedy: bool = False) -> SamplingParams:
        a = self.args
        return SamplingParams(a.max_new_tokens, a.temperature, a.top_p, a.top_k, do_sample=not greedy, extra=dict(self._generation_kwargs))

    def _rollout_tree(
        self, *, reward: Any, num_generations: int, joint_mode: str, greedy: bool,
        early_termination_threshold: Optional[float], reference_kl: bool,
    ) -> TreeRollout:
        """A ``TreeRollout`` over ``self.policies``; with ``reference_kl`` every level's rows are also
        scored for their KL to the reference."""
        a = self.args
        scorer = None
        if reference_kl:
            def scorer(agent: int, completions: Any) -> Dict[str, Any]:
                return self.policies[agent].rollout_extras(completions, a.temperature, reference_kl=True)
        return TreeRollout(
            generators=[p.generator for p in self.policies], formatters=self.formatters, reward=reward,
            num_generations=num_generations, num_turns=a.num_turns, joint_mode=joint_mode, discount=a.discount,
            sampling=self._sampling(greedy=greedy), early_termination_threshold=early_termination_threshold,
            external_transition=self.external_transition, external_prompt_passthrough=a.external_prompt_passthrough,
            row_scorer=scorer, map_agents=self._workers.map,
        )

    def _user_callbacks(self) -> Dict[str, Any]:
        """The user's objects a checkpoint keeps the state of (when they offer one)."""
        callbacks = {
            "reward_func": self.reward_func, "reward_processor": self.reward_processor,
            "external_transition": self.external_transition,
        }
        callbacks.update({f"formatters.{i}": formatter.original for i, formatter in enumerate(self.formatters)})
        return callbacks

    # ------------------------------------------------------------------ export
    def _agent_export_dirs(self, output_dir: str) -> List[str]:
        return [os.path.join(output_dir, f"agent_{i}") for i in range(len(self.agents))]

    def save_model(self, output_dir: str, overwrite: bool = False, merge_adapters: bool = False) -> None:
        """Write ``output_dir/agent_i/`` (weights, config, tokenizer) for every agent.

        Each folder loads back with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and can be given to a
        new trainer as ``agents=[".../agent_0", ...]``. A LoRA-trained agent's folder holds its
        adapter in peft's layout (``PeftModel.from_pretrained(base, folder)``; given back as an agent
        it continues training), or with ``merge_adapters=True`` the merged full model. Existing
        non-empty folders are refused unless ``overwrite=True``. A W&B run stays open.
        """
        check_folder_path(output_dir, "save_model(output_dir)")
        exported = [self._export_model(model) for model in self.agents]
        states = [full_model_state(model) if is_sharded(model) else None for model in exported]  # collective
        models = [export_view(model, merge_adapters) for model in exported]
        if self._dist.is_main:  # under torchrun rank 0 writes (every rank holds the same weights)
            targets = self._agent_export_dirs(output_dir)
            for target in targets:
                check_target_free(target, overwrite)
            with library_bars(self.verbose), all_or_nothing(targets):
                for target, model, state, tokenizer in zip(targets, models, states, self.tokenizers):
                    save_pretrained_dir(target, model, tokenizer, overwrite, state_dict=state)
            if self._wandb is not None:
                self._wandb.write({"final_model_saved": 1.0}, self.env_step)
        self._dist.barrier()

    def _export_model(self, model: nn.Module) -> nn.Module:
        return model

    def close(self) -> None:
        """Close metric sinks (and finish a W&B run this trainer opened) and stop the agent workers."""
        self.metrics.close()
        self._workers.close()
