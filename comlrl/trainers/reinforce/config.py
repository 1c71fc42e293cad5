"""Configs of the REINFORCE family: MAGRPO and its baselines MAREINFORCE, MARLOO, MAReMax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, FrozenSet, Optional

from comlrl.core.credit import SCALE_REWARDS
from comlrl.core.registry import advantage_names
from comlrl.trainers.registry import ALGORITHMS
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

JOINT_MODES = ("aligned", "cross")
JOINT_MODE_ALIASES = {"align": "aligned", "crossed": "cross"}
ADVANTAGE_GROUPINGS = ("node", "agent_turn")

# Fields that may differ between a checkpoint and the run that resumes it.
RESUMABLE_FIELDS = RESUMABLE_RUN_FIELDS


@dataclass
class LearningVariantFields(PolicyLossFields):
    """The learning variants of the MAGRPO family (docs/algorithms.md): shared by ``MAGRPOConfig`` and
    the configs whose RL phase runs MAGRPO (``MARLHFConfig``). The defaults are CoMLRL 1.4.3's maths.
    The policy loss (``loss_type``, ``epsilon_high``) is every family's (``PolicyLossFields``)."""

    scale_rewards: str = "group"
    """What advantages are divided by when ``advantage_normalization`` is on (population stds): "group"
    (1.4.3: each group standardised by its own std), "batch" (TRL: the baseline's advantages divided by
    the std of the raw rewards over every group of the agent's turn in the drained buffer, every
    data-parallel rank's included), "agent" (group-centred advantages divided by the std of the agent's
    centred advantages of the turn: the per-agent scale of Dr. MAS) or "none" (no division, Dr. GRPO)."""
    advantage_grouping: str = "node"
    """Which samples share a baseline: "node" (1.4.3: one agent's K completions at one node) or
    "agent_turn" (every sample of one agent at one turn in the drained buffer, AT-GRPO's grouping key)."""
    counterfactual_credit: bool = False
    """Credit each agent against its own alternatives with the other agents' completions held fixed
    (the baseline applied per context of the others, then averaged; C3). Needs joint_mode="cross"."""
    sequential_updates: bool = False
    """Update the agents one after another and weight a later agent's advantages by the clipped ratio
    ``pi_new / pi_old`` of the earlier agents' completions in the same joint response (HAPPO). Needs
    joint_mode="aligned" and parallel_training other than "mp"."""
    # --- DAPO (Yu et al. 2025), each off by default; loss_type="dapo" alone is only its token-mean loss
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group (one agent's K completions at a node) whose credited rewards are
    all equal never enters the rollout buffer, so the buffer fills from the following steps' items and
    every update holds ``rollout_buffer_size`` groups that carry signal (a partial buffer is still
    drained at an epoch's end); the dropped groups' tokens no longer count in any normaliser. Logged:
    ``dynamic_sampling/dropped_fraction``. Not with advantage_grouping="agent_turn", sequential_updates
    or torchrun."""
    overlong_filtering: bool = False
    """DAPO's overlong filtering: a completion that reached ``max_new_tokens`` without an end-of-sequence
    token is masked out of the loss (its tokens count nowhere, its siblings keep their weights); its
    reward still enters its group's baseline. Logged: ``agent_i/overlong_filtered_fraction``."""
    soft_overlong_cache: Optional[int] = None
    """L_cache of DAPO's soft overlong punishment (None: off): with ``L_max = max_new_tokens``, a
    completion of ``|y|`` tokens (EOS included) gets ``(L_max - L_cache - |y|) / L_cache`` added to its
    credited reward when ``|y| > L_max - L_cache``, 0 below (so -1 at ``|y| = L_max``). Must be below
    max_new_tokens."""

    def _validate_variants(self) -> None:
        """The learning variants, and the combinations with existing features that are refused."""
        self._validate_policy_loss()
        require_choice(self, "scale_rewards", SCALE_REWARDS)
        require_choice(self, "advantage_grouping", ADVANTAGE_GROUPINGS)
        self._validate_dapo()
        if self.scale_rewards != "group" and not self.advantage_normalization:
            raise ValueError(f"scale_rewards={self.scale_rewards!r} needs advantage_normalization=True "
                             "(with it off nothing is scaled); set advantage_normalization=True or leave scale_rewards='group'.")
        if self.counterfactual_credit and self.joint_mode != "cross":
            raise ValueError('counterfactual_credit needs joint_mode="cross": each completion of an agent must meet the '
                             "same completions of the other agents.")
        if self.counterfactual_credit and self.advantage_grouping != "node":
            raise ValueError('counterfactual_credit computes its baselines per node; use advantage_grouping="node".')
        if self.sequential_updates and self.joint_mode != "aligned":
            raise ValueError('sequential_updates needs joint_mode="aligned" (one earlier-agent completion per joint response).')
        if self.sequential_updates and self.parallel_training == "mp":
            raise ValueError('sequential_updates cannot run with parallel_training="mp" (the agents update one after '
                             'another); use parallel_training="none".')

    def _validate_dapo(self) -> None:
        cache = self.soft_overlong_cache
        if cache is not None and (isinstance(cache, bool) or not isinstance(cache, int) or not 1 <= cache < self.max_new_tokens):
            raise ValueError(f"soft_overlong_cache must be None or an integer in [1, max_new_tokens - 1] = [1, "
                             f"{self.max_new_tokens - 1}] (DAPO's L_cache, the tokens before max_new_tokens where the "
                             f"penalty ramps from 0 to -1). Got {cache!r}.")
        if self.dynamic_sampling and self.advantage_grouping != "node":
            raise ValueError('dynamic_sampling drops a node\'s group when its rewards tie, but with advantage_grouping='
                             '"agent_turn" a tied node still carries signal against the pooled baseline; use '
                             'advantage_grouping="node" or dynamic_sampling=False.')
        if self.dynamic_sampling and self.sequential_updates:
            raise ValueError("dynamic_sampling can keep one agent's group of a node and drop another's, so the agents' "
                             "buffers no longer hold the same joint responses that sequential_updates weights; set one "
                             "of them to False.")


@dataclass
class MAGRPOConfig(RolloutFields, LearningVariantFields):
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
    """Baseline: "mean" (MAGRPO), "max" (MAReMax), "rloo" (MARLOO), "raw" (MAREINFORCE), or any name
    registered with ``comlrl.core.register_advantage``."""
    # --- beyond CoMLRL 1.4.3 (plus the CommonTrainingFields: optimizer, memory, output)
    buffers_per_generation: int = 1
    """Generate the prompts of this many rollout buffers in one call per agent. Above 1, every buffer
    after the first is sampled by an older policy than the one it updates (importance-weighted, see
    ``importance_clip_range``)."""
    importance_clip_range: Optional[float] = 0.2
    """PPO clip epsilon of stale groups: a group consumed after its agent stepped since sampling it
    (leftovers of multi-turn trees, later minibatches when ``train_batch_size < rollout_buffer_size``,
    later turns of a buffer, later buffers of one generation) is weighted by ``pi / pi_sampling`` with
    the log-probs recorded while sampling, clipped to ``[1 - eps, 1 + (epsilon_high or eps)]`` (None:
    unclipped importance weights; loss_type="gspo": GSPO's 3e-4 unless set)."""

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
        require_choice(self, "advantage_mode", advantage_names())
        require_at_least(self, "agent_learning_rate", 0.0)
        require_optional_positive(self, "importance_clip_range")
        require_int_at_least(self, "buffers_per_generation", 1)
        self._validate_variants()


def _baseline_variant(algorithm: str, doc: str) -> type:
    """The 1.4.x config class of a MAGRPO-family record: MAGRPOConfig with the record's defaults."""
    record = ALGORITHMS[algorithm]
    return MAGRPOConfig.variant(f"{record.shown_name}Config", doc, __name__, record.defaults)


MAREINFORCEConfig = _baseline_variant("mareinforce", "MAGRPO without a baseline: advantages are the returns themselves.")
MARLOOConfig = _baseline_variant("marloo", "MAGRPO with the leave-one-out baseline.")
MAReMaxConfig = _baseline_variant("maremax", "MAGRPO with the group-max baseline.")
