"""Is a training step learning anything? Zero-signal metrics and a warning shown once.

A group-baseline update (MAGRPO) compares the completions of a group with each other: when every
reward of a group is the same, every advantage is zero and the group adds nothing to the gradient;
when a model answers every prompt with its end-of-turn token (an instruct model given a prompt
without its chat template), every completion is empty and the rewards are usually all equal too.

``signal_metrics`` measures both per step:

- ``frac_reward_zero_std``: the fraction of reward groups (two values or more) whose values are all
  equal (as TRL's metric of that name);
- ``frac_all_empty_groups``: the fraction of completion groups whose completions are all empty
  (nothing but whitespace after decoding).

``ZeroSignalMonitor`` warns once per trainer (``NoLearningSignalWarning``) when one of them is 1.0
for a whole step.
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional, Sequence

TOLERANCE = 1e-9  # rewards closer than this count as equal


class NoLearningSignalWarning(UserWarning):
    """A training step had no learning signal (see ``comlrl.telemetry.signal``)."""


def is_flat(values: Sequence[float]) -> bool:
    return max(values) - min(values) <= TOLERANCE


def signal_metrics(reward_groups: Sequence[Sequence[float]], completion_groups: Sequence[Sequence[str]]) -> Dict[str, float]:
    """``frac_reward_zero_std`` over the reward groups with at least two values (absent when there is
    none) and ``frac_all_empty_groups`` over the completion groups (absent when there is none)."""
    metrics: Dict[str, float] = {}
    measured = [group for group in reward_groups if len(group) >= 2]
    if measured:
        metrics["frac_reward_zero_std"] = sum(is_flat(group) for group in measured) / len(measured)
    groups = [group for group in completion_groups if len(group) > 0]
    if groups:
        metrics["frac_all_empty_groups"] = sum(all(not text.strip() for text in group) for group in groups) / len(groups)
    return metrics


class ZeroSignalMonitor:
    """Warns the first time a step has no learning signal; later steps are only logged."""

    def __init__(self, trainer_name: str):
        self.trainer_name = trainer_name
        self.warned = False

    def message(self, metrics: Dict[str, float], env_step: int) -> Optional[str]:
        where = f"{self.trainer_name}: no learning signal in the step that ended at env_step {env_step}"
        if metrics.get("frac_all_empty_groups") == 1.0:
            return (
                f"{where}: every completion was empty (the models ended their answers at once), so the rewards "
                f"cannot tell them apart and the update does nothing. Instruct models answer inside their chat "
                f"template: build the formatters with comlrl.utils.chat_formatters(...). Logged as "
                f"frac_all_empty_groups and frac_reward_zero_std; this warning is shown once."
            )
        if metrics.get("frac_reward_zero_std") == 1.0:
            return (
                f"{where}: within every group all rewards were equal, so every group-relative advantage is zero. "
                f"Check that reward_func tells the completions apart (more num_generations, a finer reward) and "
                f"that the prompts make the models answer. Logged as frac_reward_zero_std; this warning is shown "
                f"once."
            )
        return None

    def check(self, metrics: Dict[str, float], env_step: int) -> None:
        if self.warned:
            return
        message = self.message(metrics, env_step)
        if message is not None:
            self.warned = True
            warnings.warn(message, NoLearningSignalWarning, stacklevel=3)
