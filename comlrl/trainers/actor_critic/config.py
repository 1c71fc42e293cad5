"""Configs of the actor-critic family: IAC (independent critics) and MAAC (one centralized critic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, FrozenSet, Optional

from comlrl.config import (
    RESUMABLE_RUN_FIELDS,
    PolicyLossFields,
    RolloutFields,
    normalize_parallel_training,
    require_at_least,
    require_choice,
    require_int_at_least,
    require_optional_positive,
    validate_reference_kl,
)

CRITIC_TYPES = ("v", "q")

# Fields that may differ between a checkpoint and the run that resumes it.
RESUMABLE_FIELDS = RESUMABLE_RUN_FIELDS | {"critic_devices"}


@dataclass
class ActorCriticFields(RolloutFields, PolicyLossFields):
    """Fields IAC and MAAC share (see ``IACConfig`` and ``MAACConfig``); the actors' policy loss
    (``loss_type``, ``epsilon_high``) is the one every family takes (``PolicyLossFields``)."""

    resumable_fields: ClassVar[FrozenSet[str]] = RESUMABLE_FIELDS

    # --- schedule and learning rates
    num_train_epochs: int = 40
    """Epochs of the whole run."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every actor (one optimizer per actor)."""
    critic_learning_rate: Optional[float] = 5e-6
    """AdamW learning rate of the critics (None: ``agent_learning_rate``)."""
    logging_steps: int = 1
    """Minimum env_step gap between two logged training rows."""
    critic_devices: Any = None
    """Device spec of the critics (default: the actors' devices; MAAC: the first actor's)."""
    num_generations: int = 1
    """K: completions each actor samples per history. With ``num_turns > 1`` every joint response
    branches into its own next turn (a tree of K^t histories at turn t); 1 gives one episode per item."""
    # (plus the RolloutFields: devices, sampling, turns, early termination, evaluation, reference KL)
    # --- critic
    critic_type: str = "v"
    """"v": the critic estimates V(h) from the prompt (history); "q": Q(h, a) from prompt and
    completion."""
    value_loss_coef: float = 0.6
    """Weight of the critic's squared error in its loss."""
    critic_value_head_hidden_dim: Optional[int] = None
    """Hidden width of the critics' value heads (None or 0: one linear layer). MAAC also reads
    ``model_config["critic_value_head_hidden_dim"]`` as CoMLRL 1.4.3 did."""
    # --- updates
    rollout_buffer_size: int = 8
    """Samples (one per actor, joint response and history) collected per actor before an update."""
    train_batch_size: Optional[int] = None
    """Samples per optimizer step (None: ``rollout_buffer_size``)."""
    advantage_normalization: bool = True
    """Standardise the TD-error advantages of each (actor, turn) group of an update."""
    # --- beyond CoMLRL 1.4.3
    update_epochs: int = 1
    """Passes over each drained buffer (1: the CoMLRL 1.4.3 schedule). Every sample an actor consumes
    after its own latest optimizer step (a later minibatch or pass) is importance-weighted."""
    importance_clip_range: Optional[float] = 0.2
    """PPO epsilon of the ratio clip of stale samples: those drawn before their actor's latest
    optimizer step are weighted by ``pi / pi_sampling`` with the log-probs recorded while sampling and
    clipped to ``[1 - eps, 1 + (epsilon_high or eps)]`` (None: unclipped ratios; loss_type="gspo":
    GSPO's 3e-4 unless set)."""

    def _separate_critic_devices_required(self) -> bool:
        return True

    def __post_init__(self) -> None:
        require_int_at_least(self, "rollout_buffer_size", 1)
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        require_int_at_least(self, "train_batch_size", 1)
        require_int_at_least(self, "num_agents", 1)
        require_int_at_least(self, "num_turns", 1)
        require_choice(self, "critic_type", CRITIC_TYPES)
        if self.critic_learning_rate is None:
            self.critic_learning_rate = self.agent_learning_rate
        require_int_at_least(self, "num_generations", 1)
        require_int_at_least(self, "eval_interval", 0)
        require_int_at_least(self, "eval_num_samples", 0)
        require_int_at_least(self, "eval_batch_size", 1)
        require_int_at_least(self, "logging_steps", 1)
        critic_fields = ["critic_devices"] if self._separate_critic_devices_required() else []
        normalize_parallel_training(self, ["agent_devices", *critic_fields])
        validate_reference_kl(self)
        self._validate_extensions()
        validate_q_groups(self)

    def _validate_extensions(self) -> None:
        self._validate_common()
        self._validate_rollout()
        require_int_at_least(self, "num_train_epochs", 1)
        require_at_least(self, "agent_learning_rate", 0.0)
        require_at_least(self, "critic_learning_rate", 0.0)
        require_at_least(self, "value_loss_coef", 0.0)
        if self.critic_value_head_hidden_dim is not None:
            require_int_at_least(self, "critic_value_head_hidden_dim", 0)
        require_int_at_least(self, "update_epochs", 1)
        require_optional_positive(self, "importance_clip_range")
        self._validate_policy_loss()
        if not isinstance(self.advantage_normalization, bool):
            raise ValueError(f"advantage_normalization must be True or False. Got {self.advantage_normalization!r}.")


@dataclass
class IACConfig(ActorCriticFields):
    """Independent Actor-Critic.

    Every actor has its own critic: a separate LLM with a value head (``use_separate_critic=True``)
    or a value head on the actor's own backbone (``use_separate_critic=False``). Each critic reads
    only its actor's prompt (and, for "q", its completion); each actor follows the TD-error
    advantages of its own critic.
    """

    use_separate_critic: bool = True
    """True: one critic LLM per actor (``critic_model`` / ``critics``). False: a value head on each
    actor's backbone, trained with the actor's loss ``policy + value_loss_coef * value`` in one
    forward and one optimizer."""
    value_clip_range: Optional[float] = 0.2
    """PPO value clipping ``max((T-V)^2, (T-V_clip)^2)`` with ``V_clip = V_old + clip(V - V_old, +-eps)``
    (None: plain squared error). Applies to every IAC critic (CoMLRL 1.4.3: shared heads only)."""
    value_head_hidden_dim: Optional[int] = None
    """Hidden width of the value heads on the actors (``use_separate_critic=False``)."""

    def _separate_critic_devices_required(self) -> bool:
        return bool(self.use_separate_critic)

    def _validate_extensions(self) -> None:
        super()._validate_extensions()
        if not isinstance(self.use_separate_critic, bool):
            raise ValueError(f"use_separate_critic must be True or False. Got {self.use_separate_critic!r}.")
        require_optional_positive(self, "value_clip_range")
        if self.value_head_hidden_dim is not None:
            require_int_at_least(self, "value_head_hidden_dim", 0)


@dataclass
class MAACConfig(ActorCriticFields):
    """Multi-Agent Actor-Critic with one centralized critic.

    One critic LLM reads every actor's prompt (and, for "q", every completion) and estimates the
    value of the joint history; each actor follows the TD-error advantages of that shared critic.
    """


def validate_q_groups(config: Any) -> None:
    """A Q critic with one sample per history centres each Q on the other samples of its (actor, turn)
    group; a buffer that leaves a turn one sample gives it advantage exactly 0, so it is refused."""
    if config.critic_type != "q" or config.num_generations != 1:
        return
    needed = 2 * config.num_turns
    if config.rollout_buffer_size < needed:
        raise ValueError(
            f"critic_type='q' with num_generations=1 and rollout_buffer_size={config.rollout_buffer_size} (num_turns="
            f"{config.num_turns}) leaves (actor, turn) groups of one sample, whose advantage Q - mean(other Q) is "
            f"exactly 0: the actors would learn nothing. Set num_generations >= 2 or rollout_buffer_size >= {needed}."
        )
