"""The algorithms ``comlrl train`` can run: name -> trainer class, config class, YAML section.

Adding one is one ``Algorithm`` entry; a new trainer family (a different constructor) also adds
its keyword builder to ``comlrl.train_cli.TRAINER_KWARGS``. Classes are named as
``"module:attribute"`` and imported only when a run needs them. ``grpo`` and ``ac`` are the task
repositories' single-agent baselines (their ``train_grpo.py`` / ``train_ac.py``): MAGRPO and IAC
with one agent, on an environment built with ``num_agents=1``.
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
    """Constructor family: "reinforce" (MAGRPO-like) or "actor_critic" (IAC/MAAC-like)."""
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
ALGORITHMS: Dict[str, Algorithm] = {
    "magrpo": Algorithm("magrpo", f"{_REINFORCE}:MAGRPOTrainer", f"{_REINFORCE}:MAGRPOConfig", ("magrpo",), "reinforce"),
    "mareinforce": Algorithm("mareinforce", f"{_REINFORCE}:MAREINFORCETrainer", f"{_REINFORCE}:MAREINFORCEConfig", ("mareinforce", "magrpo"), "reinforce"),
    "marloo": Algorithm("marloo", f"{_REINFORCE}:MARLOOTrainer", f"{_REINFORCE}:MARLOOConfig", ("marloo", "magrpo"), "reinforce"),
    "maremax": Algorithm("maremax", f"{_REINFORCE}:MAReMaxTrainer", f"{_REINFORCE}:MAReMaxConfig", ("maremax", "magrpo"), "reinforce"),
    "iac": Algorithm("iac", f"{_AC}:IACTrainer", f"{_AC}:IACConfig", ("iac",), "actor_critic"),
    "maac": Algorithm("maac", f"{_AC}:MAACTrainer", f"{_AC}:MAACConfig", ("maac",), "actor_critic"),
    # the single-agent baselines, named as the task repositories name them
    "grpo": Algorithm("grpo", f"{_REINFORCE}:MAGRPOTrainer", f"{_REINFORCE}:MAGRPOConfig", ("grpo",), "reinforce", agents=1),
    "ac": Algorithm("ac", f"{_AC}:IACTrainer", f"{_AC}:IACConfig", ("ac",), "actor_critic", agents=1),
}


def algorithm_sections() -> set:
    return {section for algorithm in ALGORITHMS.values() for section in algorithm.sections}
