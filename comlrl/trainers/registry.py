"""The algorithms ``comlrl train`` can run: name -> trainer class, config class, YAML section.

Adding one is one ``Algorithm`` entry; a new trainer family (a different constructor) also adds
its keyword builder to ``comlrl.cli.train.TRAINER_KWARGS``. Classes are named as
``"module:attribute"`` and imported only when a run needs them. ``grpo`` and ``ac`` are the task
repositories' single-agent baselines (their ``train_grpo.py`` / ``train_ac.py``): MAGRPO and IAC
with one agent, on an environment built with ``num_agents=1``. The preference trainers read the
``madpo``, ``marlhf``, ``madpo_iter`` and ``marlhf_iter`` sections (the iterative ones fall back to
their base's section).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Algorithm:
    name: str
    trainer: str
    """``"module:Class"`` of the trainer."""
    config: str
    """``"module:Class"`` of its config dataclass."""
    sections: Tuple[str, ...]
    """YAML sections read for the config, first found wins (the MAGRPO variants also read ``magrpo``)."""
    family: str
    """Constructor family: "reinforce" (MAGRPO-like), "actor_critic" (IAC/MAAC-like) or "preference"
    (MADPO-like; MARLHF's actor-critic backends also take critics)."""
    agents: Optional[int] = None
    """A fixed team size (1: a single-agent baseline); None: the section's ``num_agents``."""

    def trainer_class(self) -> type:
        return _load(self.trainer)

    def config_class(self) -> type:
        return _load(self.config)


def _load(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


_REINFORCE = "comlrl.trainers.reinforce"
_AC = "comlrl.trainers.actor_critic"
_PREF = "comlrl.trainers.preference"
ALGORITHMS: Dict[str, Algorithm] = {
    "magrpo": Algorithm("magrpo", f"{_REINFORCE}:MAGRPOTrainer", f"{_REINFORCE}:MAGRPOConfig", ("magrpo",), "reinforce"),
    "mareinforce": Algorithm("mareinforce", f"{_REINFORCE}:MAREINFORCETrainer", f"{_REINFORCE}:MAREINFORCEConfig", ("mareinforce", "magrpo"), "reinforce"),
    "marloo": Algorithm("marloo", f"{_REINFORCE}:MARLOOTrainer", f"{_REINFORCE}:MARLOOConfig", ("marloo", "magrpo"), "reinforce"),
    "maremax": Algorithm("maremax", f"{_REINFORCE}:MAReMaxTrainer", f"{_REINFORCE}:MAReMaxConfig", ("maremax", "magrpo"), "reinforce"),
    "iac": Algorithm("iac", f"{_AC}:IACTrainer", f"{_AC}:IACConfig", ("iac",), "actor_critic"),
    "maac": Algorithm("maac", f"{_AC}:MAACTrainer", f"{_AC}:MAACConfig", ("maac",), "actor_critic"),
    "madpo": Algorithm("madpo", f"{_PREF}:MADPOTrainer", f"{_PREF}:MADPOConfig", ("madpo",), "preference"),
    "marlhf": Algorithm("marlhf", f"{_PREF}:MARLHFTrainer", f"{_PREF}:MARLHFConfig", ("marlhf",), "preference"),
    "madpo_iter": Algorithm("madpo_iter", f"{_PREF}:MADPOIterTrainer", f"{_PREF}:MADPOIterConfig", ("madpo_iter", "madpo"), "preference"),
    "marlhf_iter": Algorithm("marlhf_iter", f"{_PREF}:MARLHFIterTrainer", f"{_PREF}:MARLHFIterConfig", ("marlhf_iter", "marlhf"), "preference"),
    # the single-agent baselines, named as the task repositories name them
    "grpo": Algorithm("grpo", f"{_REINFORCE}:MAGRPOTrainer", f"{_REINFORCE}:MAGRPOConfig", ("grpo",), "reinforce", agents=1),
    "ac": Algorithm("ac", f"{_AC}:IACTrainer", f"{_AC}:IACConfig", ("ac",), "actor_critic", agents=1),
}


def trains_critics(algorithm: Algorithm, config: object) -> bool:
    """Whether a run of ``algorithm`` with ``config`` has critic entities (IAC/MAAC, and MARLHF with
    an actor-critic ``rl_algorithm``)."""
    if algorithm.family == "actor_critic":
        return True
    return algorithm.family == "preference" and getattr(config, "rl_algorithm", None) in ("iac", "maac")


def algorithm_sections() -> set:
    return {section for algorithm in ALGORITHMS.values() for section in algorithm.sections}
