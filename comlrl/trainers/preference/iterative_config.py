"""Configs of the iterative preference trainers (MADPOIter, MARLHFIter): rounds of collection
against a comparator, replay of earlier rounds' pairs, and learning.

Round r (1-based) compares candidates of the current policy with candidates of a comparator:
``current`` (the live policy, sampled on its own RNG stream), ``current_copy`` (a frozen copy of the
round-start policy on ``comparator_devices``), ``model`` (a fixed external model), ``history`` (the
policy as it was ``comparator_history_k`` rounds before this round started) or ``api`` (an HTTP
completion endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, FrozenSet, Optional, Tuple

from comlrl.core.preference import COMPARISON_SELECTIONS, REPLAY_MODES
from comlrl.config import require_choice, require_in_range, require_int_at_least
from comlrl.trainers.preference.config import MADPOConfig, MARLHFConfig

COMPARATOR_POLICIES = ("current", "current_copy", "model", "history", "api")
COMPARATOR_POLICY_ALIASES = {
    "self": "current", "online": "current",
    "copy": "current_copy", "online_copy": "current_copy", "current-offload": "current_copy", "current_offload": "current_copy",
    "external": "model", "comparator": "model", "reference": "model", "ref": "model",
    "checkpoint": "history", "previous": "history", "previous_iteration": "history",
    "http": "api", "endpoint": "api",
}
GENERATION_MODES = ("decentralized", "centralized")
GENERATION_MODE_ALIASES = {
    "decentralised": "decentralized", "multi_agent": "decentralized", "multi-agent": "decentralized",
    "centralised": "centralized", "single_agent": "centralized", "single-agent": "centralized",
}
REPLAY_MODE_ALIASES = {
    "latest": "current", "new": "current",
    "recent_k": "nearest_k", "last_k": "nearest_k", "k": "nearest_k",
    "lambda": "lambda_decay", "td_lambda": "lambda_decay", "td-lambda": "lambda_decay",
}
API_FORMATS = ("generic", "openai", "anthropic", "openai_responses")
API_FORMAT_ALIASES = {
    "openai_chat": "openai", "chat": "openai",
    "anthropic_messages": "anthropic", "messages": "anthropic",
    "responses": "openai_responses", "codex": "openai_responses",
}
SCORING_REWARDS = ("task", "reward_model")
SCORING_ALIASES = {"oracle": "task", "environment": "task", "env": "task", "model": "reward_model", "learned": "reward_model"}

ITERATIVE_RESUMABLE = frozenset(
    {"num_iterations", "comparator_devices", "preference_replay_dir", "policy_checkpoint_dir", "comparator_api_url",
     "comparator_api_timeout", "comparator_api_headers", "comparator_api_key_env", "comparator_api_key_header",
     "comparator_api_key_prefix"}
)


@dataclass
class _IterativePreferenceConfig:
    """Settings shared by MADPOIterConfig and MARLHFIterConfig (a mixin; see the module docstring)."""

    secret_fields: ClassVar[FrozenSet[str]] = frozenset({"comparator_api_key"})
    _pair_selections: ClassVar[Tuple[str, ...]] = COMPARISON_SELECTIONS

    # --- rounds and replay
    num_iterations: int = 6
    """Rounds of collection + learning (may be raised when resuming a finished run)."""
    preference_replay_mode: str = "current"
    """Which rounds' pairs a round trains on: "current" (this round's), "nearest_k" (the newest
    ``preference_replay_k`` rounds), "all_history", or "lambda_decay" (round of age a weighted lambda^a)."""
    preference_replay_k: Optional[int] = None
    """Rounds kept by ``nearest_k`` (required there; None or 1 for ``current``)."""
    preference_replay_lambda: Optional[float] = None
    """lambda in [0, 1] of ``lambda_decay`` (required there)."""
    preference_replay_sample_size: Optional[int] = None
    """Pairs drawn from the replay rounds (None: this round's pair count, else the newest round's)."""
    preference_replay_dir: Optional[str] = None
    """Where each round's pairs are written (``iteration_NNNN.json``); None: see docs (W&B/output dirs, then cwd)."""
    log_reward_distribution: bool = False
    """Write a reward histogram (JSON + PNG, and W&B histograms) per round under ``reward_distributions/``."""
    policy_checkpoint_dir: Optional[str] = None
    """Export the agents as ``initial/`` and ``iteration_NNNN/`` (after round N) folders here (None: no export)."""
    # --- comparator
    comparator_policy: str = "current"
    """current, current_copy, model, history or api (aliases: see the module's table)."""
    comparator_generation_mode: str = "decentralized"
    """"decentralized": the comparator answers each agent's prompt; "centralized": one generator
    writes every agent's part from a joint prompt (split by the centralized adapter)."""
    comparator_centralized_agent_index: int = 0
    """Which agent (or ``comparator_agents`` entry) is the centralized comparator's generator."""
    comparator_model_name: Optional[str] = None
    """``model`` policy: one source (id or directory) for every agent's comparator."""
    comparator_agents: Optional[Any] = None
    """``model`` policy: one source or model object per agent (centralized: 1 or num_agents entries)."""
    comparator_devices: Any = None
    """Devices of comparator models (None: the agents' devices)."""
    comparator_num_candidates: Optional[int] = None
    """Candidates the comparator samples per item and agent (None: ``preference_num_candidates``)."""
    comparator_history_k: Optional[int] = None
    """``history`` policy: the comparator of round r is the policy at the start of round r - k
    (the initial policy when r - k < 1). Default 1: the previous round's policy."""
    # --- api comparator (the key is never written to checkpoints, logs or configs on disk)
    comparator_api_url: Optional[str] = None
    """``api`` policy: the endpoint URL."""
    comparator_api_format: str = "generic"
    """generic, openai (chat completions), anthropic (messages) or openai_responses."""
    comparator_api_model: Optional[str] = None
    """Model name sent to the endpoint."""
    comparator_api_max_n_per_request: Optional[int] = None
    """Most completions asked for in one request (None: the API's own limit)."""
    comparator_api_timeout: float = 120.0
    """Seconds per HTTP request."""
    comparator_api_headers: Optional[Dict[str, str]] = None
    """Extra HTTP headers."""
    comparator_api_key: Optional[str] = field(default=None, repr=False)
    """API key (prefer ``comparator_api_key_env``); never stored."""
    comparator_api_key_env: Optional[str] = None
    """Environment variable holding the API key."""
    comparator_api_key_header: str = "Authorization"
    """Header that carries the key."""
    comparator_api_key_prefix: Optional[str] = "Bearer"
    """Prefix before the key in that header (None or "": the bare key)."""
    comparator_api_response_field: str = "completions"
    """``generic`` format: dotted path of the completion list in the JSON response."""
    comparator_api_extra_body: Optional[Dict[str, Any]] = None
    """Extra JSON fields of every request body."""

    def _centralize_comparator(self) -> None:
        if self.comparator_centralized_agent_index != 0:
            raise ValueError(
                f"collaboration_mode='centralized' has one actor, so the comparator generator must be actor index 0 "
                f"(got comparator_centralized_agent_index={self.comparator_centralized_agent_index})."
            )
        self.comparator_generation_mode = "centralized"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]  (the MADPO/MARLHF validation first)
        require_int_at_least(self, "num_iterations", 1)
        self._validate_replay()
        self._validate_comparator()

    def _validate_replay(self) -> None:
        mode = require_choice(self, "preference_replay_mode", REPLAY_MODES, REPLAY_MODE_ALIASES)
        k, lam, size = self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        if size is not None:
            require_int_at_least(self, "preference_replay_sample_size", 1)
        if mode == "current":
            _only_when(k is None or k == 1, "preference_replay_k", k, "preference_replay_mode='nearest_k'")
            _only_when(lam is None, "preference_replay_lambda", lam, "preference_replay_mode='lambda_decay'")
            _only_when(size is None, "preference_replay_sample_size", size, "a historical replay mode")
        elif mode == "nearest_k":
            if k is None:
                raise ValueError("preference_replay_k is required when preference_replay_mode='nearest_k' (the rounds to keep).")
            require_int_at_least(self, "preference_replay_k", 1)
            _only_when(lam is None, "preference_replay_lambda", lam, "preference_replay_mode='lambda_decay'")
        elif mode == "all_history":
            _only_when(k is None, "preference_replay_k", k, "preference_replay_mode='nearest_k'")
            _only_when(lam is None, "preference_replay_lambda", lam, "preference_replay_mode='lambda_decay'")
        else:
            _only_when(k is None, "preference_replay_k", k, "preference_replay_mode='nearest_k'")
            if lam is None:
                raise ValueError("preference_replay_lambda is required when preference_replay_mode='lambda_decay' (a value in [0, 1]).")
            require_in_range(self, "preference_replay_lambda", 0.0, 1.0)

    def _validate_comparator(self) -> None:
        policy = require_choice(self, "comparator_policy", COMPARATOR_POLICIES, COMPARATOR_POLICY_ALIASES)
        require_choice(self, "comparator_generation_mode", GENERATION_MODES, GENERATION_MODE_ALIASES)
        require_choice(self, "comparator_api_format", API_FORMATS, API_FORMAT_ALIASES)
        require_int_at_least(self, "comparator_centralized_agent_index", 0)
        if self.comparator_generation_mode == "centralized" and self.comparator_centralized_agent_index >= self.num_agents:  # type: ignore[attr-defined]
            raise ValueError(
                f"comparator_centralized_agent_index must be in [0, num_agents) = [0, {self.num_agents}); "  # type: ignore[attr-defined]
                f"got {self.comparator_centralized_agent_index}."
            )
        for name in ("comparator_num_candidates", "comparator_api_max_n_per_request"):
            if getattr(self, name) is not None:
                require_int_at_least(self, name, 1)
        require_in_range(self, "comparator_api_timeout", 0.0, float("inf"), low_open=True)
        named = self.comparator_model_name is not None or self.comparator_agents is not None
        if policy == "model":
            if not named:
                raise ValueError("comparator_policy='model' needs comparator_model_name (one source for all agents) or comparator_agents.")
        elif named:
            given = "comparator_model_name" if self.comparator_model_name is not None else "comparator_agents"
            raise ValueError(f"{given} is only used by comparator_policy='model' (got comparator_policy={policy!r}); drop it.")
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            require_int_at_least(self, "comparator_history_k", 1)
        else:
            _only_when(self.comparator_history_k is None, "comparator_history_k", self.comparator_history_k, "comparator_policy='history'")
        if policy == "api" and not self.comparator_api_url:
            raise ValueError("comparator_policy='api' needs comparator_api_url (the completion endpoint).")
        if self.comparator_agents is not None and (isinstance(self.comparator_agents, (str, bytes)) or not hasattr(self.comparator_agents, "__len__")):
            raise ValueError(f"comparator_agents must be a list (one source per agent); for one source use comparator_model_name. Got {self.comparator_agents!r}.")
        for name in ("comparator_api_headers", "comparator_api_extra_body"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{name} must be a dict or None. Got {type(value).__name__}.")
        if not isinstance(self.log_reward_distribution, bool):
            raise ValueError(f"log_reward_distribution must be True or False. Got {self.log_reward_distribution!r}.")


def _only_when(ok: bool, name: str, value: Any, mode: str) -> None:
    if not ok:
        raise ValueError(f"{name} is only valid when {mode} (got {name}={value!r}); drop it or change the mode.")


@dataclass
class MADPOIterConfig(_IterativePreferenceConfig, MADPOConfig):
    """Iterative MADPO: every round collects comparisons against the comparator and takes
    ``num_train_epochs`` MADPO epochs over the round's (replayed) pairs."""

    resumable_fields: ClassVar[FrozenSet[str]] = MADPOConfig.resumable_fields | ITERATIVE_RESUMABLE

    num_train_epochs: int = 1
    """MADPO epochs per round."""
    preference_num_candidates: int = 20
    """K: candidates the current policy samples per item and agent each round."""
    preference_pairs_per_sample: Optional[int] = 4
    """Most comparisons kept per item (None: all)."""
    pair_selection: str = "comparator_reward"
    """comparator_reward (best comparator answers first, then the largest gap), reward_gap, random or all."""


@dataclass
class MARLHFIterConfig(_IterativePreferenceConfig, MARLHFConfig):
    """Iterative MARLHF: every round collects comparisons, restarts reward learning from the initial
    reward model on the round's (replayed) pairs, then runs ``num_train_epochs`` of online RL."""

    resumable_fields: ClassVar[FrozenSet[str]] = MARLHFConfig.resumable_fields | ITERATIVE_RESUMABLE

    num_train_epochs: int = 2
    """Online-RL epochs per round."""
    preference_num_candidates: int = 20
    """K: candidates the current policy samples per item and agent each round."""
    preference_pairs_per_sample: Optional[int] = 4
    """Most comparisons kept per item (None: all)."""
    pair_selection: str = "comparator_reward"
    """comparator_reward, reward_gap, random or all."""
    reward_num_train_epochs: int = 2
    """Bradley-Terry epochs per round."""
    preference_scoring_reward: str = "task"
    """What scores the comparisons: "task" (reward_func) or "reward_model" (the previous round's
    learned reward model; round 1 uses the task reward)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice(self, "preference_scoring_reward", SCORING_REWARDS, SCORING_ALIASES)
