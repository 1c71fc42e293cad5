"""Configs of the preference trainers: MADPO (learning from preference pairs directly) and MARLHF
(a learned joint reward model, then online RL against it).

Every field of CoMLRL 1.4.3 keeps its name and default; every check runs in ``__post_init__``,
before any model loads, with errors that name the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, FrozenSet, Optional, Tuple

import torch

from comlrl.core.registry import advantage_names
from comlrl.core.preference import PAIR_SELECTIONS
from comlrl.trainers.actor_critic.config import CRITIC_TYPES, validate_q_groups
from comlrl.trainers.registry import rl_backends
from comlrl.trainers.reinforce.config import LearningVariantFields, MAGRPOConfig
from comlrl.config import (
    RESUMABLE_RUN_FIELDS,
    PolicyLossFields,
    RolloutFields,
    normalize_parallel_training,
    require_at_least,
    require_choice,
    require_in_range,
    require_int_at_least,
    require_optional_positive,
    validate_reference_kl,
)

COLLABORATION_MODES = ("decentralized", "centralized")
RL_ALGORITHM_ALIASES = {"mareforce": "mareinforce"}


def group_baseline(algorithm: str) -> Optional[str]:
    """The ``advantage_mode`` of a "group" RL backend (its record's default, else MAGRPO's); None for
    an actor-critic backend. The backends are the algorithm records with ``rl_backend`` set."""
    record = rl_backends()[algorithm]
    if record.rl_backend != "group":
        return None
    return record.defaults.get("advantage_mode", MAGRPOConfig.advantage_mode)

RESUMABLE_FIELDS = RESUMABLE_RUN_FIELDS


def _require_optional_int(config: Any, name: str, minimum: int) -> None:
    if getattr(config, name) is not None:
        require_int_at_least(config, name, minimum)


def _require_positive(config: Any, name: str) -> None:
    require_in_range(config, name, 0.0, float("inf"), low_open=True)


@dataclass
class MADPOConfig(RolloutFields):
    """Multi-Agent Direct Preference Optimization (reference-free).

    Each agent samples ``preference_num_candidates`` completions per item; the shared reward scores
    the aligned joint candidates; pairs (winner, loser) with a strict reward gap are kept; then every
    agent is trained on ``L = -log sigmoid(dpo_beta * sum_i [log pi_i(winner_i) - log pi_i(loser_i)])``.
    """

    resumable_fields: ClassVar[FrozenSet[str]] = RESUMABLE_FIELDS
    _pair_selections: ClassVar[Tuple[str, ...]] = PAIR_SELECTIONS

    # --- schedule
    num_train_epochs: int = 20
    """MADPO: epochs over the collected pairs. MARLHF: epochs of online RL over the training set."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every agent (one optimizer per agent)."""
    logging_steps: int = 50
    """Minimum env_step gap between two logged training rows (rows in between are averaged)."""
    # --- team
    collaboration_mode: str = "decentralized"
    """"decentralized": one model per agent. "centralized": one joint actor writes every role's
    output (``num_agents`` roles), split by the trainer's ``centralized_comparator_adapter``."""
    # --- sampling and episodes (plus the RolloutFields: devices, sampling, evaluation, reference KL)
    top_k: Optional[int] = 50
    """Top-k filter at sampling time; None or 0 disables it."""
    num_turns: int = 1
    """Turns per episode; the preference trainers support one turn only."""
    joint_mode: str = "aligned"
    """Joint responses are the aligned j-th candidates of every agent ("aligned"; alias "align")."""
    early_termination_threshold: Optional[float] = None
    """Passed to the online RL backend of MARLHF (None: episodes never end early)."""
    # --- RL-style buffers (MADPO: pairs per update; MARLHF: the RL backend's buffers)
    rollout_buffer_size: int = 2
    """MARLHF: prompt groups collected per agent before an RL update."""
    train_batch_size: Optional[int] = None
    """MADPO: preference pairs per update. MARLHF: the RL backend's minibatch. None: ``rollout_buffer_size``."""
    advantage_normalization: bool = True
    """MARLHF: standardise the RL advantages within each group."""
    advantage_mode: str = "mean"
    """MARLHF: the group baseline; follows ``rl_algorithm`` (magrpo "mean", mareinforce "raw",
    maremax "max", marloo "rloo")."""
    # --- preference collection and loss
    preference_num_candidates: int = 80
    """K: candidates each agent samples per item (K aligned joint candidates are scored)."""
    preference_pairs_per_sample: Optional[int] = 16
    """Most pairs kept per item (None: every strict pair; required for ``pair_selection="all"``)."""
    pair_selection: str = "reward_gap"
    """Which pairs are kept: "reward_gap" (largest reward gap first), "random", or "all"."""
    dpo_beta: float = 0.1
    """beta of the MADPO loss: the scale of the implicit reward ``beta * log pi``."""
    use_environment_step: bool = True
    """MADPO updates advance env_step (the x-axis of the logs) by ``environment_steps_per_pair`` per pair."""
    environment_steps_per_pair: int = 2
    """env_step increment per pair in a MADPO update (a pair holds two joint responses)."""
    # --- beyond CoMLRL 1.4.3
    collection_batch_size: Optional[int] = None
    """Items whose candidates are generated together: one generate call per agent for
    ``collection_batch_size x preference_num_candidates`` rows, one reward call per item. None:
    enough items for about 64 rows per call (``64 // preference_num_candidates``), at least
    ``rollout_buffer_size``."""

    def __post_init__(self) -> None:
        require_choice(self, "collaboration_mode", COLLABORATION_MODES)
        if self.collaboration_mode == "centralized":
            self._centralize_comparator()
        for name in ("num_train_epochs", "num_agents", "rollout_buffer_size"):
            require_int_at_least(self, name, 1)
        for name in ("eval_interval", "eval_num_samples"):
            require_int_at_least(self, name, 0)
        for name in ("eval_batch_size", "num_turns", "logging_steps"):
            require_int_at_least(self, name, 1)
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        require_int_at_least(self, "train_batch_size", 1)
        normalize_parallel_training(self, ["agent_devices"])
        validate_reference_kl(self)
        if self.reference_kl_enabled and not self._reads_reference_kl():
            raise ValueError(
                f"reference_kl_enabled=True is not used by {type(self).__name__.removesuffix('Config')}: its DPO loss has "
                f"no reference-KL penalty (dpo_beta sets how far the policy may move); remove it."
            )
        if self.num_turns != 1:
            raise ValueError(
                f"MADPO currently supports num_turns=1 only (got num_turns={self.num_turns}); the preference "
                f"trainers compare single-turn joint responses."
            )
        self._validate_preference()
        self._validate_common()
        self._validate_rollout()
        require_choice(self, "joint_mode", ("aligned",), {"align": "aligned"})
        require_choice(self, "advantage_mode", advantage_names())
        require_at_least(self, "agent_learning_rate", 0.0)
        _require_optional_int(self, "collection_batch_size", 1)

    def _centralize_comparator(self) -> None:
        """Hook of the iterative configs: a centralized team has one comparator generator (index 0)."""

    def _reads_reference_kl(self) -> bool:
        """Whether reference_kl_enabled means anything (MARLHF's RL phase; not MADPO's DPO loss)."""
        return False

    def _validate_preference(self) -> None:
        require_int_at_least(self, "preference_num_candidates", 2)
        _require_optional_int(self, "preference_pairs_per_sample", 1)
        _require_positive(self, "dpo_beta")
        require_int_at_least(self, "environment_steps_per_pair", 1)
        if not isinstance(self.use_environment_step, bool):
            raise ValueError(f"use_environment_step must be True or False. Got {self.use_environment_step!r}.")
        if self.pair_selection is None:
            self.pair_selection = "reward_gap"
        require_choice(self, "pair_selection", self._pair_selections)
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError(
                f"pair_selection='all' keeps every strict pair, so preference_pairs_per_sample must be None "
                f"(got {self.preference_pairs_per_sample}); or choose pair_selection='reward_gap'/'random' to cap them."
            )


# MARLHFConfig fields only one family of RL backends reads (advantage_mode: see ``_follow_rl_algorithm``).
GROUP_BACKEND_FIELDS = ("joint_mode", "buffers_per_generation")
ACTOR_CRITIC_BACKEND_FIELDS = ("critic_model_name", "critic_learning_rate", "critic_devices", "critic_type", "value_loss_coef",
                               "critic_value_head_hidden_dim", "update_epochs")
IAC_BACKEND_FIELDS = ("use_separate_critic", "value_clip_range", "value_head_hidden_dim")


@dataclass
class MARLHFConfig(MADPOConfig, LearningVariantFields):
    """Multi-Agent RL from Human(-style) Feedback: preference pairs -> a joint reward model
    (Bradley-Terry) -> online RL of the agents against the fixed learned reward.

    ``rl_algorithm`` picks the RL backend: the MAGRPO family ("magrpo", "mareinforce", "marloo",
    "maremax", with ``num_generations`` samples per prompt) or actor-critic ("iac", "maac", with
    the critic fields below).
    """

    resumable_fields: ClassVar[FrozenSet[str]] = RESUMABLE_FIELDS | {"reward_model_device", "critic_devices"}

    rl_algorithm: str = "magrpo"
    """Online RL backend: magrpo, mareinforce (alias mareforce), maremax, marloo, maac or iac."""
    num_generations: int = 4
    """Samples per prompt in online RL (the group of the MAGRPO baseline; >= 2 there, >= 1 for AC)."""
    # --- reward model
    reward_model_name: Optional[str] = None
    """Hub id or local causal-LM directory of the reward model's backbone (a directory written by
    ``save_model`` also restores its trained head). None: the first actor's identifier."""
    reward_model_device: Optional[str] = "cuda:0"
    """Device of the reward model (None: the trainer's device). A CUDA device this host lacks falls
    back to the trainer's device with a warning."""
    reward_learning_rate: float = 1e-5
    """AdamW learning rate of reward learning."""
    reward_num_train_epochs: int = 1
    """Epochs of Bradley-Terry training over the preference pairs."""
    reward_train_batch_size: int = 1
    """Pairs per reward-model update (winners and losers scored in one forward)."""
    reward_max_length: Optional[int] = None
    """Most tokens of a joint text the reward model reads; longer texts keep their end (the
    responses and the scored last token) and lose their beginning, with a warning. None: the
    backbone's ``max_position_embeddings`` when it has one, else no limit."""
    reward_freeze_backbone: bool = False
    """Train only the reward head (the backbone stays as loaded)."""
    # --- actor-critic backends (rl_algorithm "iac" / "maac")
    critic_model_name: Optional[str] = None
    """Critic source when the trainer gets no ``critic_model``/``critics`` (None: the first actor's identifier)."""
    critic_learning_rate: Optional[float] = None
    """AdamW learning rate of the critics (None: ``agent_learning_rate``)."""
    critic_devices: Any = None
    """Devices of the critics (None: the actors' devices; MAAC: the first actor's)."""
    use_separate_critic: bool = True
    """IAC: one critic LLM per actor (True) or a value head on each actor's backbone (False)."""
    critic_type: str = "v"
    """"v": V(prompt); "q": Q(prompt, completion)."""
    value_loss_coef: float = 0.6
    """Weight of the critics' value loss."""
    value_clip_range: Optional[float] = 0.2
    """IAC: PPO value clipping epsilon (None: plain squared error)."""
    critic_value_head_hidden_dim: Optional[int] = None
    """Hidden width of the critics' value heads (None or 0: one linear layer)."""
    value_head_hidden_dim: Optional[int] = None
    """IAC with ``use_separate_critic=False``: hidden width of the heads on the actors."""
    # --- beyond CoMLRL 1.4.3 (online RL)
    buffers_per_generation: int = 1
    """MAGRPO family: rollout buffers sampled per generate call (see MAGRPOConfig)."""
    importance_clip_range: Optional[float] = 0.2
    """PPO clip epsilon of off-policy updates (MAGRPO ``buffers_per_generation > 1``, AC ``update_epochs > 1``);
    loss_type="gspo": GSPO's 3e-4 unless set."""
    update_epochs: int = 1
    """Actor-critic: passes over each drained buffer (see IACConfig)."""

    def _reads_reference_kl(self) -> bool:
        return True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._validate_variants()
        every_family = {f.name for f in dataclasses.fields(PolicyLossFields)}  # the policy loss: every backend reads it
        changed = [f.name for f in dataclasses.fields(LearningVariantFields)
                   if f.name not in every_family and getattr(self, f.name) != f.default]
        if changed and self.uses_actor_critic:
            raise ValueError(f"{', '.join(changed)}: the MAGRPO-family learning variants need rl_algorithm magrpo, mareinforce, "
                             f"marloo or maremax, not {self.rl_algorithm!r}; leave them at their defaults for an actor-critic backend.")

    def _validate_preference(self) -> None:
        super()._validate_preference()
        canonical = require_choice(self, "rl_algorithm", tuple(rl_backends()), RL_ALGORITHM_ALIASES)
        minimum = 1 if self.uses_actor_critic else 2
        if isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int) or self.num_generations < minimum:
            why = "the group baseline needs at least two samples per prompt" if minimum == 2 else "at least one sample"
            raise ValueError(f"num_generations must be >= {minimum} for rl_algorithm={canonical!r} ({why}). Got {self.num_generations!r}.")
        _require_positive(self, "reward_learning_rate")
        require_int_at_least(self, "reward_num_train_epochs", 1)
        require_int_at_least(self, "reward_train_batch_size", 1)
        _require_optional_int(self, "reward_max_length", 1)
        self._validate_reward_device()
        if self.reward_model_name is not None and (not isinstance(self.reward_model_name, str) or not self.reward_model_name.strip()):
            raise ValueError(f"reward_model_name must be a hub id or a local directory (or None). Got {self.reward_model_name!r}.")
        if not isinstance(self.reward_freeze_backbone, bool):
            raise ValueError(f"reward_freeze_backbone must be True or False. Got {self.reward_freeze_backbone!r}.")
        self._validate_critic_fields()
        if self.uses_actor_critic:
            validate_q_groups(self)
        self._refuse_other_backends_fields(canonical)
        self._follow_rl_algorithm(canonical)

    def _refuse_other_backends_fields(self, algorithm: str) -> None:
        """A field set explicitly that the chosen RL backend never reads is an error, not ignored."""
        if self.uses_actor_critic:
            unused = set(GROUP_BACKEND_FIELDS) | (set(IAC_BACKEND_FIELDS) if algorithm == "maac" else set())
        else:
            unused = set(ACTOR_CRITIC_BACKEND_FIELDS) | set(IAC_BACKEND_FIELDS)
        for name in sorted(unused):
            if self.is_explicit(name):
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not used by rl_algorithm={algorithm!r}; remove it, or choose an "
                    f"rl_algorithm that reads it."
                )

    def _validate_reward_device(self) -> None:
        if self.reward_model_device is None:
            return
        self.reward_model_device = str(self.reward_model_device)
        try:
            torch.device(self.reward_model_device)
        except RuntimeError:
            raise ValueError(
                f"reward_model_device must be a device such as 'cpu' or 'cuda:0' (or None for the trainer's device). "
                f"Got {self.reward_model_device!r}."
            ) from None

    def _validate_critic_fields(self) -> None:
        require_optional_positive(self, "critic_learning_rate")
        require_choice(self, "critic_type", CRITIC_TYPES)
        _require_positive(self, "value_loss_coef")
        require_optional_positive(self, "value_clip_range")
        require_optional_positive(self, "importance_clip_range")
        for name in ("critic_value_head_hidden_dim", "value_head_hidden_dim"):
            _require_optional_int(self, name, 0)
        if not isinstance(self.use_separate_critic, bool):
            raise ValueError(f"use_separate_critic must be True or False. Got {self.use_separate_critic!r}.")
        require_int_at_least(self, "buffers_per_generation", 1)
        require_int_at_least(self, "update_epochs", 1)
        if self.critic_model_name is not None and (not isinstance(self.critic_model_name, str) or not self.critic_model_name.strip()):
            raise ValueError(f"critic_model_name must be a hub id or a local directory (or None). Got {self.critic_model_name!r}.")

    def _follow_rl_algorithm(self, algorithm: str) -> None:
        """The group baseline is the one ``rl_algorithm`` names; an explicit other one is an error."""
        mode = group_baseline(algorithm)
        if mode is None:
            if self.is_explicit("advantage_mode"):
                raise ValueError(
                    f"advantage_mode={self.advantage_mode!r} is not used by rl_algorithm={algorithm!r} (its advantages come "
                    f"from the critic); remove it."
                )
            return
        if self.is_explicit("advantage_mode") and self.advantage_mode != mode:
            raise ValueError(
                f"advantage_mode={self.advantage_mode!r} conflicts with rl_algorithm={algorithm!r}, whose baseline is "
                f"{mode!r}. Choose the algorithm instead (magrpo: mean, mareinforce: raw, maremax: max, marloo: rloo) "
                f"and leave advantage_mode unset."
            )
        self.advantage_mode = mode

    @property
    def uses_actor_critic(self) -> bool:
        """Whether ``rl_algorithm`` is an actor-critic backend (its record's ``rl_backend``)."""
        record = rl_backends().get(self.rl_algorithm)
        return record is not None and record.rl_backend == "actor_critic"
