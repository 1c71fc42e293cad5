"""MARLHF: learn a joint reward model from the team's ranked samples, then train the agents with
online RL against it.

A run is one round of phases (MARLHFIter repeats them):

  1. collect   as MADPO: K candidates per agent and item, task reward, strict-gap pairs
  2. reward    Bradley-Terry training of the joint reward model on the pairs' joint texts
               (winners and losers of a batch in one forward); its optimizer moments are then
               released, the model stays fixed
  3. policy    ``num_train_epochs`` of online RL over the training set, scored by the learned
               reward (``evaluate()`` always uses the task reward):
               - magrpo / mareinforce / maremax / marloo: the MAGRPO step of this trainer itself;
               - iac / maac: an IAC / MAAC engine built once at construction, sharing the agents,
                 this trainer's step counter and metrics, and keeping its critics and optimizers
                 across rounds.
               The reference of the KL penalty (when enabled) is the initial policy in every backend.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from comlrl.models.loading import check_model_config
from comlrl.models.reward_model import (
    REWARD_MODEL_DIR,
    joint_text,
    load_reward_model,
    load_reward_tokenizer,
    loadable_name,
    resolve_reward_model_source,
    save_reward_model,
)
from comlrl.models.saving import check_folder_path, check_target_free
from comlrl.models.sources import describe_source
from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.actor_critic.iac import IACTrainer
from comlrl.trainers.actor_critic.maac import MAACTrainer
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.base import TrainerBase, dataset_length
from comlrl.trainers.preference.collaboration import RoleSplittingMetrics
from comlrl.trainers.preference.config import MARLHFConfig
from comlrl.trainers.preference.madpo import MADPOTrainer
from comlrl.trainers.preference.reward_learning import LearnedJointReward, RewardScorer, resolve_reward_device, train_bradley_terry
from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists, tokenizer_fingerprint
from comlrl.telemetry.progress import library_bars

__all__ = ["MARLHFConfig", "MARLHFTrainer"]

# The actor-critic engine takes every field its config shares with MARLHFConfig, by name and value,
# except these, which it is given by the trainer (the count it resolved, the critics' learning-rate
# default) or which belong to the trainer's own output (the engine writes no logs or files itself).
ENGINE_SET_FIELDS = frozenset({"num_agents", "critic_learning_rate", "verbose", "output_dir", "overwrite_output_dir", "tensorboard"})
# Fields of MARLHFConfig that no actor-critic config has: collection, reward learning, the group backends.
PREFERENCE_ONLY_FIELDS = frozenset({
    "advantage_mode", "buffers_per_generation", "collaboration_mode", "collection_batch_size", "critic_model_name", "dpo_beta",
    "environment_steps_per_pair", "joint_mode", "pair_selection", "preference_num_candidates", "preference_pairs_per_sample",
    "reward_freeze_backbone", "reward_learning_rate", "reward_max_length", "reward_model_device", "reward_model_name",
    "reward_num_train_epochs", "reward_train_batch_size", "rl_algorithm", "use_environment_step",
    # the MAGRPO-family learning variants (LearningVariantFields): refused at their non-defaults with an
    # actor-critic backend (MARLHFConfig.__post_init__)
    "advantage_grouping", "counterfactual_credit", "epsilon_high", "loss_type", "scale_rewards", "sequential_updates",
})


def engine_fields(engine_config_cls: type) -> List[str]:
    """The MARLHFConfig fields an actor-critic engine of ``engine_config_cls`` takes over unchanged."""
    shared = set(MARLHFConfig.field_names()) & set(engine_config_cls.field_names())
    return sorted(shared - ENGINE_SET_FIELDS)


class GroupRL:
    """Online RL with the MAGRPO family: the MAGRPO step of the trainer itself (learned reward)."""

    def __init__(self, trainer: "MARLHFTrainer"):
        self.trainer = trainer

    def items_per_step(self) -> int:
        return MAGRPOTrainer._items_per_step(self.trainer)

    def train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        MAGRPOTrainer._train_step(self.trainer, items, item_ids)

    def flush(self) -> None:
        MAGRPOTrainer._flush_buffers(self.trainer)

    def evaluate(self, num_eval_samples: Optional[int]) -> Dict[str, float]:
        return MAGRPOTrainer.evaluate(self.trainer, num_eval_samples)


class ActorCriticRL:
    """Online RL with an IAC / MAAC engine that shares the trainer's agents, state and metrics."""

    def __init__(self, trainer: "MARLHFTrainer", engine: Any):
        self.trainer = trainer
        self.engine = engine
        self.task_reward = engine.reward
        engine.reward = trainer.learned_reward
        engine.state = trainer.state
        engine.metrics = trainer.metrics

    def items_per_step(self) -> int:
        return self.engine._items_per_step()

    def train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        self.engine._generation_kwargs = self.trainer._generation_kwargs
        self.engine._train_step(items, item_ids)

    def flush(self) -> None:
        self.engine._flush_buffers()

    def evaluate(self, num_eval_samples: Optional[int]) -> Dict[str, float]:
        engine = self.engine
        engine.eval_dataset = self.trainer.eval_dataset
        engine._generation_kwargs = self.trainer._generation_kwargs
        engine.reward = self.task_reward
        try:
            return engine.evaluate(num_eval_samples)
        finally:
            engine.reward = self.trainer.learned_reward

    def add_components(self, components: CheckpointComponents) -> None:
        engine = self.engine
        components.add_models("rl.critics", engine.critics)
        components.add_models("rl.value_heads", [a.value_head for a in engine.agents if a.value_head is not None])
        for name, optimizer in engine.named_optimizers().items():
            if not name.startswith("agent_optimizers."):  # those are the trainer's ``optimizers``
                components.add_optimizers(f"rl.{name}", optimizer)
        buffers = AttributeState(engine, "rollout_buffers")
        components.add_state("rl.rollout_buffers", buffers, records=(RolloutSample,), check=per_agent_lists(engine.num_agents, "rl.rollout_buffers"))


class MARLHFTrainer(MADPOTrainer):
    """MARLHF trainer (see the module docstring and ``MARLHFConfig``).

    Arguments as ``MADPOTrainer``, plus for the actor-critic backends ``critic_model`` / ``critics``
    (default ``args.critic_model_name``, else the first actor's identifier) and ``metrics_callback``.
    Public: ``reward_model`` (a ``JointRewardModel``), ``reward_tokenizer``, ``reward_optimizer``,
    ``reward_device``.
    """

    default_config_cls = MARLHFConfig
    config_family = MARLHFConfig
    algorithm_name = "MARLHF"

    def __init__(self, *args: Any, metrics_callback: Any = None, critic_model: Any = None, critics: Optional[List[Any]] = None, **kwargs: Any):
        given = self._madpo_arguments(args, kwargs)
        config = self._resolve_args(given["args"])
        agents, agent_model = given["agents"], given["agent_model"]
        first_sources = list(agents) if agents is not None and not isinstance(agents, (str, bytes)) else [agent_model]
        self.reward_model_source = resolve_reward_model_source(config.reward_model_name, first_sources)
        self._critic_sources = self._plan_critic_sources(config, critic_model, critics, first_sources)
        if metrics_callback is not None and not callable(metrics_callback):
            raise ValueError(f"metrics_callback must be callable (rollouts -> dict), got {type(metrics_callback).__name__}.")
        super().__init__(*args, **kwargs)
        self._model_config = check_model_config(given["model_config"])
        self.metrics_callback = metrics_callback
        self._load_reward_model()
        if self.args.uses_actor_critic:
            self._rl: Any = self._build_actor_critic(metrics_callback)
        else:
            self._rl = GroupRL(self)

    # ------------------------------------------------------------------ entities
    @staticmethod
    def _plan_critic_sources(args: MARLHFConfig, critic_model: Any, critics: Any, first_sources: List[Any]) -> Dict[str, Any]:
        """Critic arguments of the actor-critic backends, resolved before anything loads."""
        if not args.uses_actor_critic:
            given = "critic_model" if critic_model is not None else "critics" if critics is not None else None
            if given:
                raise ValueError(f"{given} is only used by rl_algorithm 'iac' or 'maac' (got {args.rl_algorithm!r}); drop it.")
            return {}
        if args.rl_algorithm == "iac" and not args.use_separate_critic:
            if critic_model is not None or critics is not None:
                raise ValueError("use_separate_critic=False puts value heads on the actors; drop critic_model/critics.")
            return {}
        if critic_model is None and critics is None:
            if args.critic_model_name is not None:
                return {"critic_model": args.critic_model_name}
            # default: an actor's own identifier (IAC: each critic reads its actor's tokens; MAAC: the first actor's)
            actors = first_sources if args.rl_algorithm == "iac" and len(first_sources) > 1 else first_sources[:1]
            names = [loadable_name(source) for source in actors]
            for source, name in zip(actors, names):
                if name is None:
                    raise ValueError(
                        f"critic_model_name must be provided when agent models are objects: {describe_source(source)} has "
                        f"no loadable name. Pass critic_model=..., critics=[...] or set critic_model_name."
                    )
            return {"critics": names} if len(names) > 1 else {"critic_model": names[0]}
        return {"critic_model": critic_model, "critics": critics}

    def _uses_reference_models(self) -> bool:
        # the MAGRPO step penalises KL to references built here; an actor-critic engine builds its own
        return bool(self.args.reference_kl_enabled) and not self.args.uses_actor_critic

    def _load_reward_model(self) -> None:
        a = self.args
        self.reward_device = resolve_reward_device(a.reward_model_device, self.agent_devices[0])
        self.reward_tokenizer = load_reward_tokenizer(self.reward_model_source)
        with library_bars(self.verbose):
            self.reward_model = load_reward_model(self.reward_model_source, model_config=self._model_config, device=self.reward_device,
                                                  freeze_backbone=a.reward_freeze_backbone)
        trainable = [p for p in self.reward_model.parameters() if p.requires_grad]
        self._reward_optimizer = self._make_optimizer(trainable, a.reward_learning_rate)
        self.reward_optimizer = self._reward_optimizer.optimizer
        self._reward_scorer = RewardScorer(self.reward_model, self.reward_tokenizer, self.reward_device, a.reward_max_length)
        self.learned_reward = RewardFunction(LearnedJointReward(self._reward_scorer, a.update_micro_batch_size), self.num_agents)

    def _actor_critic_args(self) -> Any:
        a = self.args
        cls = IACTrainer if a.rl_algorithm == "iac" else MAACTrainer
        fields = {name: getattr(a, name) for name in engine_fields(cls.default_config_cls)}
        # the precision as asked for, not as resolved into the config: the engine resolves it again from
        # the same model_config and devices (an explicit "fp32" would contradict a torch_dtype="auto")
        fields["precision"] = getattr(self, "_requested_precision", a.precision)
        fields.update(num_agents=self.num_agents, critic_learning_rate=a.critic_learning_rate or a.agent_learning_rate,
                      verbose=False, output_dir=None, overwrite_output_dir=False, tensorboard=False)
        return cls, cls.default_config_cls(**fields)

    def _build_actor_critic(self, metrics_callback: Any) -> ActorCriticRL:
        """The IAC / MAAC engine, built once: critics loaded, references = the initial actors."""
        cls, ac_args = self._actor_critic_args()
        model_config = {k: v for k, v in self._model_config.items() if k != "special_tokens"}  # already applied
        callback = metrics_callback
        if callback is not None and self.collaboration is not None:
            callback = RoleSplittingMetrics(callback, self.collaboration)
        engine = cls(
            agents=list(self.agents), tokenizer=list(self.tokenizers), reward_func=self.reward.func,
            reward_processor=self.reward.processor, formatters=[f.original for f in self.formatters], args=ac_args,
            eval_dataset=self.eval_dataset, model_config=model_config, metrics_callback=callback, **self._critic_sources,
        )
        for policy in self.policies:  # the engine's optimizers train the agents from now on
            policy.optimizer.remove_hooks()
        self.policies = engine.policies
        self.optimizers = engine.agent_optimizers
        self.reference_models = engine.reference_models
        self.critics = engine.critics
        return ActorCriticRL(self, engine)

    # ------------------------------------------------------------------ reward learning
    def _rollout_reward(self, training: bool) -> RewardFunction:
        return self.learned_reward if training else self.reward

    def _reward_phase(self) -> bool:
        """Bradley-Terry training on this round's training pairs; the model is fixed afterwards."""
        pairs = self.preference_pairs
        if not pairs:
            return False
        a = self.args
        self._restart_reward_learning()
        winners = [joint_text(p.prompts, p.winner_completions) for p in pairs]
        losers = [joint_text(p.prompts, p.loser_completions) for p in pairs]
        train_bradley_terry(
            self._reward_scorer, self._reward_optimizer, winners, losers, epochs=a.reward_num_train_epochs,
            batch_size=a.reward_train_batch_size, micro_batch_size=a.update_micro_batch_size, record=self.metrics.record,
        )
        self.reward_optimizer.state.clear()  # the reward model is fixed from here on: release its AdamW moments
        self.reward_model.eval()
        self.metrics.flush(self.env_step, force=True)
        return True

    def _restart_reward_learning(self) -> None:
        """Before reward learning: nothing (MARLHFIter restores the initial reward model)."""

    # ------------------------------------------------------------------ online RL (the epoch loop's hooks)
    def _epoch_length(self) -> Optional[int]:
        return dataset_length(self.train_dataset)

    def _checkpoint_epoch_length(self, states: Mapping[str, Any]) -> Optional[int]:
        return dataset_length(self.train_dataset)

    def _items_per_step(self) -> int:
        return self._rl.items_per_step()

    def _epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        return self._dataset_steps(self.train_dataset, start, self._items_per_step())

    def _maybe_evaluate(self, start: int, count: int) -> None:
        TrainerBase._maybe_evaluate(self, start, count)

    def _train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        self._rl.train_step(items, item_ids)

    def _flush_buffers(self) -> None:
        self._rl.flush()

    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """Greedy evaluation with the task reward (never the learned one); see ``MAGRPOTrainer.evaluate``."""
        return self._rl.evaluate(num_eval_samples)

    # ------------------------------------------------------------------ checkpoints and export
    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        components.add_models("reward_model", self.reward_model)
        components.add_optimizers("reward_optimizer", self.reward_optimizer)
        if isinstance(self._rl, ActorCriticRL):
            self._rl.add_components(components)
        return components

    def _checkpoint_identity(self) -> Dict[str, Any]:
        identity = super()._checkpoint_identity()
        identity["tokenizers"]["reward_model"] = tokenizer_fingerprint(self.reward_tokenizer)
        return identity

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        config = super()._wandb_run_config()
        config.update(rl_algorithm=a.rl_algorithm, num_generations=a.num_generations, advantage_mode=a.advantage_mode,
                      reward_learning_rate=a.reward_learning_rate, reward_num_train_epochs=a.reward_num_train_epochs,
                      reward_freeze_backbone=a.reward_freeze_backbone)
        return config

    def save_model(self, output_dir: str, overwrite: bool = False) -> None:
        """``agent_i/`` for every agent (see ``TrainerBase.save_model``) and ``reward_model/``: the
        reward backbone (an ordinary causal-LM folder), ``reward_head.pt`` and the reward tokenizer;
        ``reward_model_name=".../reward_model"`` loads it back with its head."""
        check_folder_path(output_dir, "save_model(output_dir)")
        target = os.path.join(output_dir, REWARD_MODEL_DIR)
        check_target_free(target, overwrite)
        super().save_model(output_dir, overwrite)
        with library_bars(self.verbose):
            save_reward_model(target, self.reward_model, self.reward_tokenizer, overwrite)
