"""The algorithm registry: the one place that knows an algorithm.

One ``Algorithm`` record per algorithm holds its trainer and config classes, its config defaults
(MAREINFORCE, MARLOO and MAReMax are MAGRPO with another ``advantage_mode``: records, and their
1.4.x classes are made from them), the YAML section(s) its config is read from, its trainer family
(whose keyword builder turns an assembled run into the trainer's constructor arguments), which
model of the memory estimator (``comlrl estimate``) covers it and whether MARLHF can use it as its
online-RL backend (``rl_backend``). ``comlrl train``, ``comlrl estimate``, the run plan
(``comlrl.runplan.plan``) and MARLHF read these records and nothing else. Adding an algorithm is one
call::

    from comlrl.trainers.registry import register_algorithm

    register_algorithm("my_grpo", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce",
                       sections=("my_grpo", "magrpo"))

A trainer with a constructor of its own (not MAGRPO's, IAC's or MADPO's keywords) first registers
its family's keyword builder with ``register_family``. Classes may be given as ``"module:Class"``
strings, imported only when a run needs them (the built-in records do this).

``grpo`` and ``ac`` are the task repositories' single-agent baselines (their ``train_grpo.py`` /
``train_ac.py``): MAGRPO and IAC with one agent, on an environment built with ``num_agents=1``.
The preference trainers read the ``madpo``, ``marlhf``, ``madpo_iter`` and ``marlhf_iter``
sections (the iterative ones fall back to their base's section).

This module imports nothing of ``comlrl.config`` or ``comlrl.cli``: a keyword builder receives
the run plan and the assembled parts as arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

@dataclass
class TrainerParts:
    """What ``comlrl train`` assembles before a trainer is built (the keyword builders' input)."""

    env: Any
    entities: Dict[str, Any]  # model names resolved ("default" -> the embedded model's folder)
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    reward_processor: Optional[Callable[[float], float]]
    wandb_config: Optional[Dict[str, Any]]
    rows: Any


KwargsBuilder = Callable[[Any, TrainerParts], Dict[str, Any]]
"""``build(plan, parts) -> trainer keyword arguments``; ``plan`` is the run plan
(``comlrl.runplan.plan.RunPlan``: ``config``, ``model_config``, ``algorithm``, ...)."""


@dataclass(frozen=True)
class Algorithm:
    name: str
    trainer: Union[str, type]
    """The trainer class, or ``"module:Class"`` imported on first use."""
    config: Union[str, type]
    """Its config dataclass, or ``"module:Class"``."""
    sections: Tuple[str, ...]
    """YAML sections read for the config, first found wins (the MAGRPO variants also read ``magrpo``)."""
    family: str
    """Constructor family, a key of ``FAMILIES``: "reinforce" (MAGRPO-like), "actor_critic" (IAC/MAAC-like)
    or "preference" (MADPO-like; MARLHF's actor-critic backends also take critics)."""
    agents: Optional[int] = None
    """A fixed team size (1: a single-agent baseline); None: the section's ``num_agents``."""
    estimator: Optional[str] = None
    """The memory estimator's model of this algorithm (a key of ``comlrl.cli.memory.MEMORY_MODELS``:
    "magrpo", "iac", "maac", "madpo", "marlhf"); None: not modelled (``comlrl estimate`` refuses the run)."""
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Config defaults of this algorithm over its config class's own (a plain ``MAGRPOConfig`` given to
    ``MARLOOTrainer`` takes ``advantage_mode="rloo"`` unless the field was set)."""
    display_name: str = ""
    """The name shown in logs and messages ("MAReMax"); default: the name in upper case."""
    rl_backend: Optional[str] = None
    """As MARLHF's online-RL backend (``rl_algorithm=name``): "group" (the MAGRPO-family step with
    these ``defaults``) or "actor_critic" (an engine of ``config``); None: not a backend."""

    def trainer_class(self) -> type:
        return _load(self.trainer)

    def config_class(self) -> type:
        return _load(self.config)

    @property
    def shown_name(self) -> str:
        return self.display_name or self.name.upper()

    @property
    def trainer_name(self) -> str:
        """The trainer class's name, without importing it."""
        return self.trainer.split(":")[1] if isinstance(self.trainer, str) else self.trainer.__name__

    def trainer_kwargs(self, plan: Any, parts: TrainerParts) -> Dict[str, Any]:
        """The trainer's constructor arguments, from its family's keyword builder."""
        return FAMILIES[self.family](plan, parts)


def _load(target: Union[str, type]) -> type:
    if isinstance(target, type):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


# ----------------------------------------------------------------------------- keyword builders per family


def reinforce_kwargs(plan: Any, parts: TrainerParts) -> Dict[str, Any]:
    e, env = parts.entities, parts.env
    return dict(
        agent_model=e["agent_model"], agents=e["agents"], tokenizer=parts.tokenizer, model_config=plan.model_config,
        train_dataset=parts.train_dataset, eval_dataset=parts.eval_dataset, reward_func=env.reward_func,
        reward_processor=parts.reward_processor, formatters=env.formatters, external_transition=env.external_transition,
        wandb_config=parts.wandb_config, eval_logger=parts.rows.eval_logger, eval_aggregator=parts.rows.eval_aggregator, args=plan.config,
    )


def actor_critic_kwargs(plan: Any, parts: TrainerParts) -> Dict[str, Any]:
    e, env = parts.entities, parts.env
    tokenizer = parts.tokenizer if parts.tokenizer is not None or not e["agents"] else list(e["agents"])
    return dict(
        agent_model=e["agent_model"], critic_model=e["critic_model"], tokenizer=tokenizer, reward_func=env.reward_func,
        reward_processor=parts.reward_processor, formatters=env.formatters, args=plan.config, train_dataset=parts.train_dataset,
        eval_dataset=parts.eval_dataset, model_config=plan.model_config, wandb_config=parts.wandb_config,
        metrics_callback=parts.rows.metrics_callback, external_transition=env.external_transition, agents=e["agents"], critics=e["critics"],
    )


def preference_kwargs(plan: Any, parts: TrainerParts) -> Dict[str, Any]:
    """MADPO-like constructors take the MAGRPO arguments; MARLHF's actor-critic backends add critics."""
    kwargs = reinforce_kwargs(plan, parts)
    if trains_critics(plan.algorithm, plan.config):
        e = parts.entities
        kwargs.update(critic_model=e["critic_model"], critics=e["critics"], metrics_callback=parts.rows.metrics_callback)
    return kwargs


FAMILIES: Dict[str, KwargsBuilder] = {
    "reinforce": reinforce_kwargs, "actor_critic": actor_critic_kwargs, "preference": preference_kwargs,
}
"""Trainer family -> its keyword builder (``register_family`` adds one)."""


# ----------------------------------------------------------------------------- the records


_REINFORCE = "comlrl.trainers.reinforce"
_AC = "comlrl.trainers.actor_critic"
_PREF = "comlrl.trainers.preference"
ALGORITHMS: Dict[str, Algorithm] = {}
"""Name -> record, in registration order (``register_algorithm`` adds one; read it, do not assign to it)."""


def _check_class(argument: str, value: Any) -> None:
    if isinstance(value, type):
        return
    if isinstance(value, str) and value.count(":") == 1 and all(value.split(":")):
        return
    raise ValueError(f"register_algorithm: {argument}={value!r} must be a class or a 'module:Class' string, "
                     f"e.g. {argument}='my_package.my_module:My{'Trainer' if argument == 'trainer' else 'Config'}'.")


def register_algorithm(
    name: str,
    *,
    trainer: Union[str, type],
    config: Union[str, type],
    family: str,
    sections: Optional[Sequence[str]] = None,
    agents: Optional[int] = None,
    estimator: Optional[str] = None,
    defaults: Optional[Mapping[str, Any]] = None,
    display_name: str = "",
    rl_backend: Optional[str] = None,
    replace: bool = False,
) -> Algorithm:
    """Make ``name`` an algorithm of ``comlrl train --algorithm`` (and its config section(s) readable).

    ``trainer`` / ``config``: the classes, or ``"module:Class"`` strings imported when a run needs them.
    ``family``: a key of ``FAMILIES``, whose keyword builder gives the trainer's constructor arguments.
    ``sections``: the YAML sections read for the config, first found wins (default: ``(name,)``).
    ``agents``: a fixed team size (1 for a single-agent baseline), None for the section's ``num_agents``.
    ``estimator``: the memory estimator's model of the run ("magrpo", "iac", "maac", "madpo", "marlhf"), None if not modelled.
    ``defaults``: config defaults over the config class's own; ``display_name``: the name in logs;
    ``rl_backend``: "group" or "actor_critic" to offer the algorithm as MARLHF's ``rl_algorithm``.
    A name already registered is refused unless ``replace=True``. Returns the record.
    """
    if not isinstance(name, str) or not name or name != name.strip().lower():
        raise ValueError(f"register_algorithm: name={name!r} must be a non-empty lower-case string without spaces "
                         f"around it (comlrl train --algorithm matches names in lower case), e.g. {str(name).strip().lower()!r}.")
    if name in ALGORITHMS and not replace:
        raise ValueError(f"register_algorithm: an algorithm named {name!r} is already registered "
                         f"({ALGORITHMS[name].trainer_name}); choose another name, or pass replace=True to replace it.")
    _check_class("trainer", trainer)
    _check_class("config", config)
    if family not in FAMILIES:
        raise ValueError(f"register_algorithm: family={family!r} is not a trainer family; use one of "
                         f"{', '.join(FAMILIES)}, or register its keyword builder first with register_family({family!r}, build).")
    sections = (name,) if sections is None else tuple(sections)
    if not sections or not all(isinstance(s, str) and s for s in sections):
        raise ValueError(f"register_algorithm: sections={sections!r} must be one or more YAML section names, e.g. ({name!r},).")
    if agents is not None and (isinstance(agents, bool) or not isinstance(agents, int) or agents < 1):
        raise ValueError(f"register_algorithm: agents={agents!r} must be a positive team size, or None for the section's num_agents.")
    if estimator is not None and (not isinstance(estimator, str) or not estimator):
        raise ValueError(f"register_algorithm: estimator={estimator!r} must name a model of the memory estimator "
                         f"('magrpo', 'iac', 'maac', 'madpo' or 'marlhf'), or be None (comlrl estimate then refuses the run).")
    if defaults is not None and (not isinstance(defaults, Mapping) or not all(isinstance(k, str) for k in defaults)):
        raise ValueError(f"register_algorithm: defaults={defaults!r} must map config field names to values, e.g. {{'advantage_mode': 'rloo'}}.")
    if rl_backend not in (None, "group", "actor_critic"):
        raise ValueError(f"register_algorithm: rl_backend={rl_backend!r} must be 'group', 'actor_critic' or None.")
    record = Algorithm(name, trainer, config, sections, family, agents, estimator, MappingProxyType(dict(defaults or {})),
                       display_name, rl_backend)
    ALGORITHMS[name] = record
    return record


def register_family(name: str, build: KwargsBuilder, *, replace: bool = False) -> None:
    """Add a trainer family: ``build(plan, parts)`` returns the constructor arguments of its trainers
    (see ``reinforce_kwargs`` for what ``plan`` and ``parts`` hold). Refused for a taken name unless ``replace=True``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_family: name={name!r} must be a non-empty string.")
    if name in FAMILIES and not replace:
        raise ValueError(f"register_family: the family {name!r} is already registered; choose another name, or pass replace=True.")
    if not callable(build):
        raise ValueError(f"register_family: build={build!r} must be a function build(plan, parts) -> trainer keyword arguments.")
    FAMILIES[name] = build


# the built-in records: name, package, class prefix (<prefix>Trainer, <prefix>Config), sections, family,
# fixed team size, the estimator's model, config defaults, as a MARLHF backend
for _name, _module, _class, _sections, _family, _agents, _estimator, _defaults, _backend in (
    ("magrpo", _REINFORCE, "MAGRPO", ("magrpo",), "reinforce", None, "magrpo", {}, "group"),
    ("mareinforce", _REINFORCE, "MAREINFORCE", ("mareinforce", "magrpo"), "reinforce", None, "magrpo", {"advantage_mode": "raw"}, "group"),
    ("marloo", _REINFORCE, "MARLOO", ("marloo", "magrpo"), "reinforce", None, "magrpo", {"advantage_mode": "rloo"}, "group"),
    ("maremax", _REINFORCE, "MAReMax", ("maremax", "magrpo"), "reinforce", None, "magrpo", {"advantage_mode": "max"}, "group"),
    ("iac", _AC, "IAC", ("iac",), "actor_critic", None, "iac", {}, "actor_critic"),
    ("maac", _AC, "MAAC", ("maac",), "actor_critic", None, "maac", {}, "actor_critic"),
    ("madpo", _PREF, "MADPO", ("madpo",), "preference", None, "madpo", {}, None),
    ("marlhf", _PREF, "MARLHF", ("marlhf",), "preference", None, "marlhf", {}, None),
    ("madpo_iter", _PREF, "MADPOIter", ("madpo_iter", "madpo"), "preference", None, None, {}, None),
    ("marlhf_iter", _PREF, "MARLHFIter", ("marlhf_iter", "marlhf"), "preference", None, None, {}, None),
    # the single-agent baselines, named as the task repositories name them
    ("grpo", _REINFORCE, "MAGRPO", ("grpo",), "reinforce", 1, "magrpo", {}, None),
    ("ac", _AC, "IAC", ("ac",), "actor_critic", 1, "iac", {}, None),
):
    register_algorithm(_name, trainer=f"{_module}:{_class}Trainer", config=f"{_module}:{_class}Config", family=_family,
                       sections=_sections, agents=_agents, estimator=_estimator, defaults=_defaults, display_name=_class,
                       rl_backend=_backend)
del _name, _module, _class, _sections, _family, _agents, _estimator, _defaults, _backend


def algorithm_defaults(name: str) -> Mapping[str, Any]:
    """The config defaults of the algorithm ``name`` (empty for an unknown name)."""
    record = ALGORITHMS.get(name)
    return record.defaults if record is not None else MappingProxyType({})


def rl_backends() -> Dict[str, Algorithm]:
    """The algorithms MARLHF can train with (``rl_algorithm``), by name."""
    return {name: record for name, record in ALGORITHMS.items() if record.rl_backend is not None}


def trains_critics(algorithm: Algorithm, config: object) -> bool:
    """Whether a run of ``algorithm`` with ``config`` has critic entities (IAC/MAAC, and MARLHF with
    an actor-critic ``rl_algorithm``)."""
    if algorithm.family == "actor_critic":
        return True
    backend = ALGORITHMS.get(getattr(config, "rl_algorithm", None) or "") if algorithm.family == "preference" else None
    return backend is not None and backend.rl_backend == "actor_critic"


def algorithm_sections() -> set:
    return {section for algorithm in ALGORITHMS.values() for section in algorithm.sections}
