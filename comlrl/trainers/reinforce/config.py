"""Configs of the REINFORCE family: MAGRPO and its baselines MAREINFORCE, MARLOO, MAReMax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, FrozenSet, Optional

from comlrl.core.advantages import ADVANTAGE_MODES
from comlrl.trainers.config_base import (
    CommonTrainingFields,
    normalize_parallel_training,
    require_at_least,
    require_choice,
    require_in_range,
    require_int_at_least,
    require_optional_positive,
    validate_reference_kl,
)

JOINT_MODES = ("aligned", "cross")
JOINT_MODE_ALIASES = {"align": "aligned", "crossed": "cross"}

# Fields that may differ between a checkpoint and the run that resumes it.
RESUMABLE_FIELDS = frozenset(
    {
        "num_train_epochs",
        "agent_devices",
        "reference_devices",
        "parallel_training",
        "logging_steps",
        "output_dir",
        "verbose",
    }
)


@dataclass
class MAGRPOConfig(CommonTrainingFields):
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
    num_agents: int = 2
    """Number of agents. When ``agents`` is given to the trainer and this field is left at its
    default, it follows ``len(agents)``; set explicitly, it must agree."""
    # --- devices
    parallel_training: Optional[str] = "none"
    """"none": all agents on the first of ``agent_devices``; "mp": one device per agent."""
    agent_devices: Any = None
    """Device spec: None/"auto" (cuda:i when there are enough GPUs, else cuda:0, else cpu), one device
    string for all agents, or a list with one device per agent."""
    # --- sampling
    num_generations: int = 4
    """K: completions each agent samples per prompt (the group of the baseline)."""
    max_new_tokens: int = 256
    temperature: float = 0.6
    """Sampling temperature; log-probs are scored under the same tempered distribution."""
    top_p: float = 0.6
    top_k: Optional[int] = 50
    """Top-k filter at sampling time; None or 0 disables it."""
    # --- episodes
    num_turns: int = 2
    """Turns per episode; more than one needs an ``external_transition``."""
    discount: float = 1.0
    """Gamma of the tree returns ``G = r + gamma * mean(child returns)``."""
    joint_mode: str = "aligned"
    """How joint responses are formed per node: "aligned" (the j-th samples of every agent, K joint
    responses) or "cross" (the Cartesian product, K^N joint responses). Aliases: "align", "crossed"."""
    early_termination_threshold: Optional[float] = -0.2
    """A branch stops expanding when the mean reward of its node is above this value (None: never)."""
    external_prompt_passthrough: bool = False
    """Use the prompts returned by ``external_transition`` verbatim instead of passing them through
    the formatters."""
    # --- evaluation
    eval_interval: int = 16
    """Evaluate before every ``eval_interval``-th training item of an epoch (0: only when called)."""
    eval_num_samples: int = 4
    """Evaluation items per evaluation (0 evaluates nothing)."""
    eval_batch_size: int = 1
    """Evaluation items generated together per agent."""
    # --- updates
    rollout_buffer_size: int = 2
    """Prompt groups (nodes) collected per agent before an update."""
    train_batch_size: Optional[int] = None
    """Groups per optimizer step (None: ``rollout_buffer_size``, one step per buffer)."""
    advantage_normalization: bool = True
    """Standardise advantages within each group. With it on, every baseline gives the same advantages."""
    advantage_mode: str = "mean"
    """Baseline: "mean" (MAGRPO), "max" (MAReMax), "rloo" (MARLOO) or "raw" (MAREINFORCE)."""
    # --- reference KL
    reference_kl_enabled: bool = False
    """Penalise ``reference_kl_coef * KL(agent || frozen initial agent)`` in every return."""
    reference_kl_coef: float = 0.1
    reference_devices: Any = None
    """Devices of the frozen references (default: the agents' devices)."""
    # --- beyond CoMLRL 1.4.3 (plus the CommonTrainingFields: optimizer, memory, output)
    buffers_per_generation: int = 1
    """Generate the prompts of this many rollout buffers in one call per agent. Above 1, every buffer
    after the first is sampled by an older policy than the one it updates; those updates are
    importance-weighted with the sampling log-probs and clipped at ``importance_clip_range``."""
    importance_clip_range: Optional[float] = 0.2
    """PPO clip epsilon of off-policy updates (None: unclipped importance weights)."""

    def __post_init__(self) -> None:
        require_int_at_least(self, "num_train_epochs", 1)
        require_int_at_least(self, "num_agents", 1)
        if isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int) or self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2: the group baseline needs at least two samples per prompt. "
                f"Got {self.num_generations!r}."
            )
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
        require_int_at_least(self, "max_new_tokens", 1)
        require_in_range(self, "temperature", 0.0, float("inf"), low_open=True)
        require_in_range(self, "top_p", 0.0, 1.0, low_open=True)
        if self.top_k is not None:
            require_int_at_least(self, "top_k", 0)
        require_in_range(self, "discount", 0.0, 1.0)
        require_choice(self, "joint_mode", JOINT_MODES, JOINT_MODE_ALIASES)
        require_choice(self, "advantage_mode", ADVANTAGE_MODES)
        require_at_least(self, "agent_learning_rate", 0.0)
        require_optional_positive(self, "importance_clip_range")
        require_int_at_least(self, "buffers_per_generation", 1)
        if self.early_termination_threshold is not None and (
            isinstance(self.early_termination_threshold, bool) or not isinstance(self.early_termination_threshold, (int, float))
        ):
            raise ValueError(
                f"early_termination_threshold must be a number or None. Got {self.early_termination_threshold!r}."
            )


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
