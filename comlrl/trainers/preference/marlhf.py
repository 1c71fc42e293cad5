"""MARLHF: learn a joint reward model from the team's ranked samples, then train the agents with
online RL against it.

A run is one round of phases (``rounds.PreferenceRounds``; MARLHFIter repeats them):

  1. collect   as MADPO: K candidates per agent and item, task reward, strict-gap pairs
  2. reward    Bradley-Terry training of the joint reward model on the pairs' joint texts
               (``RewardLearning``); its optimizer moments are then released, the model stays fixed
  3. policy    ``num_train_epochs`` of online RL over the training set, scored by the learned
               reward (evaluation always uses the task reward). The backend is the algorithm record
               ``rl_algorithm`` names (``comlrl.trainers.registry``): a "group" record runs the
               MAGRPO-family step with the record's defaults; an "actor_critic" record runs the
               actor-critic step with critics of its arrangement, built once on the same agents.
               The reference of the KL penalty (when enabled) is the initial policy in every backend.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists
from comlrl.models.loading import check_model_config
from comlrl.models.lora import normalize_peft_configs
from comlrl.models.reward_model import REWARD_MODEL_DIR, loadable_name, resolve_reward_model_source
from comlrl.models.saving import check_folder_path, check_target_free
from comlrl.models.sources import describe_source
from comlrl.trainers.actor_critic.ac_base import check_actor_critic_arguments
from comlrl.trainers.actor_critic.entities import CriticSet, head_dim, load_actor_critic_team
from comlrl.trainers.actor_critic.evaluation import ActorCriticEvaluation
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.actor_critic.step import ActorCriticStep
from comlrl.trainers.construction import plan_team
from comlrl.trainers.preference.collaboration import RoleSplittingMetrics
from comlrl.trainers.preference.config import MARLHFConfig
from comlrl.trainers.preference.madpo import assemble_preference_team, attach_rounds, madpo_arguments
from comlrl.trainers.preference.reward_learning import RewardLearning
from comlrl.trainers.preference.rounds import PREFERENCE_PAIRS, PROGRESS, PreferenceRounds
from comlrl.trainers.registry import ALGORITHMS, Algorithm
from comlrl.trainers.reinforce.step import GroupStep
from comlrl.trainers.run import owner_view
from comlrl.trainers.trainer import Trainer

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
    # the MAGRPO-family learning variants (LearningVariantFields but the policy loss, which every backend
    # takes): refused at their non-defaults with an actor-critic backend (MARLHFConfig.__post_init__)
    "advantage_grouping", "counterfactual_credit", "dynamic_sampling", "overlong_filtering", "scale_rewards",
    "sequential_updates", "soft_overlong_cache",
})


def engine_fields(engine_config_cls: type) -> List[str]:
    """The MARLHFConfig fields an actor-critic engine of ``engine_config_cls`` takes over unchanged."""
    shared = set(MARLHFConfig.field_names()) & set(engine_config_cls.field_names())
    return sorted(shared - ENGINE_SET_FIELDS)


def actor_critic_config(args: MARLHFConfig, num_agents: int, requested_precision: Optional[str]) -> Tuple[Algorithm, Any]:
    """The record of ``args.rl_algorithm`` (an actor-critic one) and its engine's config: every shared
    field by name (``engine_fields``), the precision as asked for (not as resolved into ``args``: the
    engine resolves it again from the same model_config and devices), and the trainer's own settings."""
    record = ALGORITHMS[args.rl_algorithm]
    cls = record.config_class()
    fields = {name: getattr(args, name) for name in engine_fields(cls)}
    fields["precision"] = requested_precision
    fields.update(num_agents=num_agents, critic_learning_rate=args.critic_learning_rate or args.agent_learning_rate,
                  verbose=False, output_dir=None, overwrite_output_dir=False, tensorboard=False)
    return record, cls(**fields)


def plan_critic_sources(args: MARLHFConfig, critic_model: Any, critics: Any, first_sources: List[Any]) -> Dict[str, Any]:
    """Critic arguments of the actor-critic backends, resolved before anything loads."""
    if not args.uses_actor_critic:
        given = "critic_model" if critic_model is not None else "critics" if critics is not None else None
        if given:
            raise ValueError(f"{given} is only used by rl_algorithm 'iac' or 'maac' (got {args.rl_algorithm!r}); drop it.")
        return {"critic_model": None, "critics": None}
    if args.rl_algorithm == "iac" and not args.use_separate_critic:
        if critic_model is not None or critics is not None:
            raise ValueError("use_separate_critic=False puts value heads on the actors; drop critic_model/critics.")
        return {"critic_model": None, "critics": None}
    if critic_model is None and critics is None:
        if args.critic_model_name is not None:
            return {"critic_model": args.critic_model_name, "critics": None}
        # default: an actor's own identifier (IAC: each critic reads its actor's tokens; MAAC: the first actor's)
        actors = first_sources if args.rl_algorithm == "iac" and len(first_sources) > 1 else first_sources[:1]
        names = [loadable_name(source) for source in actors]
        for source, name in zip(actors, names):
            if name is None:
                raise ValueError(
                    f"critic_model_name must be provided when agent models are objects: {describe_source(source)} has "
                    f"no loadable name. Pass critic_model=..., critics=[...] or set critic_model_name."
                )
        return {"critic_model": None, "critics": names} if len(names) > 1 else {"critic_model": names[0], "critics": None}
    return {"critic_model": critic_model, "critics": critics}


class ActorCriticBackend:
    """MARLHF's actor-critic step as checkpoint state: the critics, the actors' value heads, the critic
    optimizers and the buffers, under "rl." names (the agents and their optimizers are the trainer's)."""

    def __init__(self, step: ActorCriticStep, critic_set: CriticSet):
        self.step = step
        self.critic_set = critic_set
        self.rank_records = step.rank_records

    @property
    def buffers(self) -> List[List[RolloutSample]]:
        return self.step.buffers

    @buffers.setter
    def buffers(self, value: List[List[RolloutSample]]) -> None:
        self.step.buffers = value

    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        step = self.step
        components.add_models("reference_models", step.run.team.saved_references())
        components.add_optimizers("optimizers", step.run.team.optimizers)
        components.add_models("rl.critics", self.critic_set.models)
        components.add_models("rl.value_heads", [a.value_head for a in step.team.agents if a.value_head is not None])
        for name, optimizer in step.named_optimizers().items():
            if not name.startswith("agent_optimizers."):  # those are the trainer's ``optimizers``
                components.add_optimizers(f"rl.{name}", optimizer)
        components.add_state("rl.rollout_buffers", AttributeState(step, "buffers"), records=(RolloutSample,),
                             check=per_agent_lists(step.team.num_agents, "rl.rollout_buffers"))


class MARLHFTrainer(Trainer):
    """MARLHF trainer (see the module docstring and ``MARLHFConfig``).

    Arguments as ``MADPOTrainer``, plus for the actor-critic backends ``critic_model`` / ``critics``
    (default ``args.critic_model_name``, else the first actor's identifier) and ``metrics_callback``.
    Public: ``reward_model`` (a ``JointRewardModel``), ``reward_tokenizer``, ``reward_optimizer``,
    ``reward_device``.
    """

    algorithm = "marlhf"
    algorithm_name = "MARLHF"
    default_config_cls = MARLHFConfig
    config_family = MARLHFConfig

    def __init__(self, *args: Any, metrics_callback: Any = None, critic_model: Any = None, critics: Optional[List[Any]] = None, **kwargs: Any):
        given = madpo_arguments(args, kwargs)
        config = given["args"] if given["args"] is not None else self.default_config_cls()
        if not isinstance(config, self.config_family):
            raise TypeError(f"args must be a {self.config_family.__name__} (or a subclass), got {type(config).__name__}.")
        agents, agent_model = given["agents"], given["agent_model"]
        first_sources = list(agents) if agents is not None and not isinstance(agents, (str, bytes)) else [agent_model]
        self.reward_model_source = resolve_reward_model_source(config.reward_model_name, first_sources)
        critic_sources = plan_critic_sources(config, critic_model, critics, first_sources)
        if metrics_callback is not None and not callable(metrics_callback):
            raise ValueError(f"metrics_callback must be callable (rollouts -> dict), got {type(metrics_callback).__name__}.")
        model_config = given["model_config"]
        assemble_preference_team(self, given, references=lambda a: bool(a.reference_kl_enabled) and not a.uses_actor_critic)
        self._model_config = check_model_config(model_config)
        self.metrics_callback = metrics_callback
        self.critic_set: Optional[CriticSet] = None  # the actor-critic backend's
        self.reward_learning = RewardLearning.load(self.args, self.reward_model_source, self._model_config, self.team, self.num_agents,
                                                  self.verbose)
        self.reward_learning.run = owner_view(self.run)
        backend = self._build_actor_critic(critic_sources) if self.args.uses_actor_critic else self._build_group()
        attach_rounds(self, self._rounds(), backend)
        contents = self.run.contents
        contents.contributors.append(self.reward_learning)
        weak = self._weak
        contents.tokenizers = lambda: {**{f"agents.{i}": t for i, t in enumerate(weak.tokenizers)},
                                       "reward_model": weak.reward_learning.tokenizer}
        self.run.step = backend.step if isinstance(backend, ActorCriticBackend) else backend

    def _rounds(self) -> PreferenceRounds:
        return PreferenceRounds(self.run, self.algorithm_name, self.reward_learning.learn)

    # ------------------------------------------------------------------ the online-RL backends
    def _build_group(self) -> GroupStep:
        """The MAGRPO-family step of ``rl_algorithm`` on this trainer's team, trained on the learned reward."""
        return GroupStep(self.args, self.run, self.reward_learning.learned_reward, self.algorithm_name)

    def _build_actor_critic(self, critic_sources: Dict[str, Any]) -> ActorCriticBackend:
        """The IAC / MAAC step of ``rl_algorithm``, built once: critics loaded, references = the initial
        actors; its policies and optimizers train the agents from now on."""
        record, ac_args = actor_critic_config(self.args, self.num_agents, self.team.requested_precision)
        arrangement = record.trainer_class().arrangement_cls(ac_args)
        callback = self.metrics_callback
        if callback is not None and self.collaboration is not None:
            callback = RoleSplittingMetrics(callback, self.collaboration)
        agents, tokenizers = list(self.agents), list(self.tokenizers)
        check_actor_critic_arguments(arrangement, None, agents, tokenizers, self.task.reward.func, None, callback, **critic_sources)
        count, plan = plan_team(ac_args, None, agents, None, tokenizers)
        critic_plan = arrangement.plan(critic_sources["critic_model"], critic_sources["critics"], count)
        model_config = {k: v for k, v in self._model_config.items() if k != "special_tokens"}  # already applied
        head_dims = (arrangement.actor_head_dim(model_config), head_dim(ac_args, model_config, "critic_value_head_hidden_dim"))
        peft = (normalize_peft_configs(None, count), normalize_peft_configs(None, len(critic_plan.sources) if critic_plan else 0, "critic_peft_config"))
        ac_team, critic_set = load_actor_critic_team(arrangement, plan, critic_plan, model_config, peft, head_dims, None,
                                                     references=bool(ac_args.reference_kl_enabled))
        ac_team.start_workers(critic_set.models)
        self.team.adopt(ac_team)
        self.critic_set = critic_set
        step = ActorCriticStep(ac_args, self.run, critic_set, arrangement, self.reward_learning.learned_reward, callback,
                               self.algorithm_name, team=ac_team)
        self.evaluation = ActorCriticEvaluation(step, self.task.reward)
        return ActorCriticBackend(step, critic_set)

    # ------------------------------------------------------------------ the 1.4.x attributes
    @property
    def critics(self) -> List[Any]:
        """The actor-critic backend's critics (empty for the group backends)."""
        return self.critic_set.models if self.critic_set is not None else []

    @property
    def reward_model(self) -> Any:
        return self.reward_learning.model

    @property
    def reward_tokenizer(self) -> Any:
        return self.reward_learning.tokenizer

    @property
    def reward_optimizer(self) -> Any:
        return self.reward_learning.optimizer.optimizer

    @property
    def reward_device(self) -> Any:
        return self.reward_learning.device

    @property
    def learned_reward(self) -> Any:
        return self.reward_learning.learned_reward

    progress = PROGRESS
    preference_pairs = PREFERENCE_PAIRS

    def save_model(self, output_dir: str, overwrite: bool = False, merge_adapters: bool = False) -> None:
        """``agent_i/`` for every agent (see ``Trainer.save_model``) and ``reward_model/``: the reward
        backbone (an ordinary causal-LM folder), ``reward_head.pt`` and the reward tokenizer;
        ``reward_model_name=".../reward_model"`` loads it back with its head."""
        check_folder_path(output_dir, "save_model(output_dir)")
        target = os.path.join(output_dir, REWARD_MODEL_DIR)
        check_target_free(target, overwrite)
        super().save_model(output_dir, overwrite, merge_adapters)
        self.reward_learning.save(target, overwrite, self.verbose)
