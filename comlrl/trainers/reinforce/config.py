"""Configs of the REINFORCE family: MAGRPO and its baselines MAREINFORCE, MARLOO, MAReMax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, FrozenSet, Optional

from comlrl.core.advantages import ADVANTAGE_MODES
from comlrl.trainers.config_base import (
    RESUMABLE_RUN_FIELDS,
    RolloutFields,
    normalize_parallel_training,
    require_at_least,
    require_choice,
    require_int_at_least,
    require_optional_positive,
    validate_reference_kl,
)

JOINT_MODES = ("aligned", "cross")
JOINT_MODE_ALIASES = {"align": "aligned", "crossed": "cross"}

# Fields that may differ between a checkpoint and the run that resumes it.
RESUMABLE_FIELDS = RESUMABLE_RUN_FIELDS


@dataclass
class MAGRPOConfig(RolloutFields):
    """Multi-Agent Group-Relative Policy Optimization.

    Per dataset item every agent samples ``num_generations`` completions; joint responses are scored
    by one shared reward; each agent's completions are credited with advantages against the group
    of its siblings, and every agent takes policy-gradient steps on its own parameters.
    """

    resumable_fields: ClassVar[FrozenSet[str]] = RESUMABLE_FIELDS

    # --- schedule
    num_train_epochs: int = 20
    """Epochs of the whole run (when resuming, epochs already done count)."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every agent (one optimizer per agent)."""
    logging_steps: int = 50
    """Minimum env_step gap between two logged training rows (1 = log every update)."""
    # --- sampling and episodes (plus the RolloutFields: devices, sampling, turns, evaluation, reference KL)
    num_generations: int = 4
    """K: completions each agent samples per prompt (the group of the baseline)."""
    top_k: Optional[int] = 50
    """Top-k filter at sampling time; None or 0 disables it."""
    joint_mode: str = "aligned"
    """How joint responses are formed per node: "aligned" (the j-th samples of every agent, K joint
    responses) or "cross" (the Cartesian product, K^N joint responses). Aliases: "align", "crossed"."""
    # --- updates
    rollout_buffer_size: int = 2
    """Prompt groups (nodes) collected per agent before an update."""
    train_batch_size: Optional[int] = None
    """Groups per optimizer step (None: ``rollout_buffer_size``, one step per buffer)."""
    advantage_normalization: bool = True
    """Standardise advantages within each group. With it on, every baseline gives the same advantages."""
    advantage_mode: str = "mean"
    """Baseline: "mean" (MAGRPO), "max" (MAReMax), "rloo" (MARLOO) or "raw" (MAREINFORCE)."""
    # --- beyond CoMLRL 1.4.3 (plus the CommonTrainingFields: optimizer, memory, output)
    buffers_per_generation: int = 1
    """Generate the prompts of this many rollout buffers in one call per agent. Above 1, every buffer
    after the first is sampled by an older policy than the one it updates (importance-weighted, see
    ``importance_clip_range``)."""
    importance_clip_range: Optional[float] = 0.2
    """PPO clip epsilon of stale groups: a group consumed after its agent stepped since sampling it
    (leftovers of multi-turn trees, later minibatches when ``train_batch_size < rollout_buffer_size``,
    later turns of a buffer, later buffers of one generation) is weighted by ``pi / pi_sampling`` with
    the log-probs recorded while sampling (None: unclipped importance weights)."""

    def __post_init__(self) -> None:
        require_int_at_least(self, "num_train_epochs", 1)
        require_int_at_least(self, "num_agents", 1)
        require_int_at_least(self, "num_generations", 2, "the group baseline needs at least two samples per prompt")
        require_int_at_least(self, "rollout_buffer_size", 1)
        require_int_at_least(self, "eval_interval", 0)
        require_int_at_least(self, "eval_num_samples", 0)
        require_int_at_least(self, "eval_batch_size", 1)
        require_int_at_least(self, "num_turns", 1)
        require_int_at_least(self, "logging_steps", 1)
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        require_int_at_least(self, "train_batch_size", 1)
        normalize_parallel_training(self, ["agent_devices"])
        validate_reference_kl(self)
        self._validate_extensions()

    def _validate_extensions(self) -> None:
        self._validate_common()
        self._validate_rollout()
        require_choice(self, "joint_mode", JOINT_MODES, JOINT_MODE_ALIASES)
        require_choice(self, "advantage_mode", ADVANTAGE_MODES)
        require_at_least(self, "agent_learning_rate", 0.0)
        require_optional_positive(self, "importance_clip_range")
        require_int_at_least(self, "buffers_per_generation", 1)


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """MAGRPO without a baseline: advantages are the returns themselves."""

    advantage_mode: str = "raw"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """MAGRPO with the leave-one-out baseline."""

    advantage_mode: str = "rloo"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """MAGRPO with the group-max baseline."""

    advantage_mode: str = "max"
