"""The contract every trainer config follows.

A config is a dataclass with a docstring per field, validated in ``__post_init__`` with errors that
name the field, the value and the fix. Configs remember which fields the caller set explicitly
(``explicit_fields``), so a trainer can tell "left at its default" from "asked for", and they load
from plain dicts (YAML sections) with unknown keys rejected.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

from comlrl.training.devices import normalize_parallel_training as parallel_mode



class ConfigBase:
    """Mixin for trainer config dataclasses (see module docstring)."""

    # Fields that may change when a run resumes from a checkpoint (documented in docs/checkpoints.md).
    resumable_fields: ClassVar[FrozenSet[str]] = frozenset()
    # Credentials: never written to checkpoints, logs or configs on disk (``to_dict`` leaves them out).
    secret_fields: ClassVar[FrozenSet[str]] = frozenset()

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.init][: len(args)]
        object.__setattr__(obj, "_explicit_fields", frozenset(names) | frozenset(kwargs))
        return obj

    @property
    def explicit_fields(self) -> FrozenSet[str]:
        """Names of the fields given to the constructor (as opposed to left at their defaults)."""
        return getattr(self, "_explicit_fields", frozenset())

    def is_explicit(self, name: str) -> bool:
        return name in self.explicit_fields

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, section: Optional[str] = None):
        """Build a config from a mapping; unknown keys raise a ValueError with close matches."""
        known = set(cls.field_names())
        unknown = [key for key in values if key not in known]
        if unknown:
            where = f" in section '{section}'" if section else ""
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"Unknown {cls.__name__} field(s){where}: {', '.join(hints)}. "
                f"Valid fields: {', '.join(sorted(known))}."
            )
        return cls(**dict(values))

    def to_dict(self) -> Dict[str, Any]:
        """Every field except the ``secret_fields`` (credentials)."""
        return {name: getattr(self, name) for name in self.field_names() if name not in self.secret_fields}


# ----------------------------------------------------------------------------- validation helpers


def require_at_least(config: Any, name: str, minimum: float) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}. Got {value!r}.")


def require_int_at_least(config: Any, name: str, minimum: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}. Got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}. Got {value!r}.")


def require_in_range(config: Any, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    value = getattr(config, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}]. Got {value!r}.")


def require_optional_positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number or None. Got {value!r}.")


def require_choice(config: Any, name: str, choices: Iterable[str], aliases: Optional[Mapping[str, str]] = None) -> str:
    """Normalise a string option (case and surrounding spaces ignored) and store the canonical value."""
    value = getattr(config, name)
    canonical = value.strip().lower() if isinstance(value, str) else value
    if aliases and canonical in aliases:
        canonical = aliases[canonical]
    choices = tuple(choices)
    if canonical not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}. Got {value!r}.")
    setattr(config, name, canonical)
    return canonical


def normalize_parallel_training(config: Any, device_fields: Iterable[str]) -> None:
    """Normalise ``config.parallel_training``; "mp" needs explicit devices in ``device_fields``."""
    config.parallel_training = parallel_mode(config.parallel_training)
    if config.parallel_training == "mp":
        for field in device_fields:
            if getattr(config, field) is None:
                raise ValueError(
                    f"parallel_training='mp' needs {field}: give one device per model, "
                    f"e.g. {field}=['cuda:0', 'cuda:1']."
                )


def validate_reference_kl(config: Any) -> None:
    coef = config.reference_kl_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0. Got {coef!r}.")
    if not isinstance(config.reference_kl_enabled, bool):
        raise ValueError(f"reference_kl_enabled must be True or False. Got {config.reference_kl_enabled!r}.")


@dataclass
class CommonTrainingFields(ConfigBase):
    """Fields every comlrl RL config has beyond CoMLRL 1.4.3 (optimizer, memory, output)."""

    max_grad_norm: Optional[float] = None
    """Clip each model's gradient to this global norm before its optimizer step (None: no clipping;
    the norm is logged either way)."""
    weight_decay: float = 0.01
    """AdamW weight decay (torch's default)."""
    adam_betas: Tuple[float, float] = (0.9, 0.999)
    adam_epsilon: float = 1e-8
    optimizer_fused: Optional[bool] = None
    """Use torch's fused AdamW kernel (None: wherever the parameters' device supports it)."""
    optimizer_in_backward: Optional[bool] = None
    """Update each parameter inside backward as soon as its gradient is complete and free the
    gradient at once (same arithmetic, no full set of gradients in memory). None: on unless
    ``max_grad_norm`` is set (global-norm clipping needs every gradient first)."""
    update_micro_batch_size: Optional[int] = None
    """Rows (completions) per forward/backward inside one optimizer step; None puts a whole
    minibatch in one forward. Lower it to bound activation memory."""
    output_dir: Optional[str] = None
    """Where the run writes its metrics log (``metrics.jsonl``, appended to, never truncated except
    when a resumed run drops the rows written after its checkpoint); None keeps logs in memory only."""
    tensorboard: bool = False
    """Also write every logged row to TensorBoard under ``output_dir/tensorboard`` (needs the
    ``tensorboard`` package and ``output_dir``)."""
    verbose: Optional[bool] = None
    """Console output and progress bars (None: from ``wandb_config.config_sections.output.verbose``,
    default True)."""

    def _validate_common(self) -> None:
        require_optional_positive(self, "max_grad_norm")
        if self.optimizer_in_backward and self.max_grad_norm is not None:
            raise ValueError(
                "optimizer_in_backward=True cannot be combined with max_grad_norm (clipping needs every gradient "
                "before the first update); set one of them to None."
            )
        require_at_least(self, "weight_decay", 0.0)
        betas = tuple(self.adam_betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1). Got {self.adam_betas!r}.")
        self.adam_betas = (float(betas[0]), float(betas[1]))
        require_in_range(self, "adam_epsilon", 0.0, float("inf"), low_open=True)
        if self.update_micro_batch_size is not None:
            require_int_at_least(self, "update_micro_batch_size", 1)
        if self.output_dir is not None and not isinstance(self.output_dir, str):
            raise ValueError(f"output_dir must be a path string or None. Got {self.output_dir!r}.")
        if self.tensorboard and not self.output_dir:
            raise ValueError("tensorboard=True writes under output_dir; set output_dir as well.")


# Fields of every RL config that may differ between a checkpoint and the run that resumes it.
RESUMABLE_RUN_FIELDS = frozenset(
    {"num_train_epochs", "agent_devices", "reference_devices", "parallel_training", "logging_steps", "output_dir", "verbose"}
)


@dataclass
class RolloutFields(CommonTrainingFields):
    """CoMLRL 1.4.3 fields with the same meaning and default in every RL config (sampling, episodes,
    evaluation, reference KL); ``_validate_rollout`` checks them."""

    num_agents: int = 2
    """Number of agents. When ``agents`` is given to the trainer and this field is left at its
    default, it follows ``len(agents)``; set explicitly, it must agree."""
    parallel_training: Optional[str] = "none"
    """"none" or "mp" (one device per model, from the ``*_devices`` fields)."""
    agent_devices: Any = None
    """Device spec: None/"auto" (cuda:i when there are enough GPUs, else cuda:0, else cpu), one device
    string for all agents, or a list with one device per agent."""
    # --- sampling
    max_new_tokens: int = 256
    temperature: float = 0.6
    """Sampling temperature; log-probs are scored under the same tempered distribution."""
    top_p: float = 0.6
    top_k: Optional[int] = None
    """Top-k filter at sampling time; None or 0 disables it."""
    # --- episodes
    num_turns: int = 2
    """Turns per episode; more than one needs an ``external_transition``."""
    discount: float = 1.0
    """Gamma: weight of the next turn's return (MAGRPO tree returns, IAC/MAAC TD targets)."""
    early_termination_threshold: Optional[float] = -0.2
    """An episode (in MAGRPO: a tree branch) stops after a turn whose mean reward is above this value
    (None: never early)."""
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
    # --- reference KL
    reference_kl_enabled: bool = False
    """Penalise ``reference_kl_coef * KL(agent || frozen initial agent)`` in every reward/return."""
    reference_kl_coef: float = 0.1
    reference_devices: Any = None
    """Devices of the frozen references (default: the agents' devices)."""

    def _validate_rollout(self) -> None:
        require_int_at_least(self, "max_new_tokens", 1)
        require_in_range(self, "temperature", 0.0, float("inf"), low_open=True)
        require_in_range(self, "top_p", 0.0, 1.0, low_open=True)
        if self.top_k is not None:
            require_int_at_least(self, "top_k", 0)
        require_in_range(self, "discount", 0.0, 1.0)
        threshold = self.early_termination_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
            raise ValueError(f"early_termination_threshold must be a number or None. Got {threshold!r}.")
