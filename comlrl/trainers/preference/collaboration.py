"""Centralized collaboration (``collaboration_mode="centralized"``): one joint actor writes every
role's output; the adapter builds its prompt from the roles' prompts and splits its completions.

``CentralizedCollaboration`` turns the task (N role formatters, an N-role reward function) into a
one-actor task: ``prompt(item)`` is the joint prompt, and calling it as a reward function scores K
joint completions with ONE call of the user's reward on the K role-split responses.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from comlrl.rollout.formatters import Formatter
from comlrl.rollout.rewards import RewardFunction, resolve_reward_range
from comlrl.trainers.preference.centralized import joint_prompt, split_completion


class CentralizedCollaboration:
    """The joint actor's prompt builder and reward (see the module docstring)."""

    def __init__(self, adapter: Any, role_formatters: Sequence[Formatter], reward_func: Any):
        self.adapter = adapter
        self.role_formatters = list(role_formatters)
        self.num_roles = len(self.role_formatters)
        self.role_reward = RewardFunction(reward_func, self.num_roles)
        self.reward_func = reward_func

    @property
    def reward_range(self):
        return resolve_reward_range(self.reward_func)

    def role_prompts(self, item: Any) -> List[str]:
        return [formatter(item) for formatter in self.role_formatters]

    def prompt(self, item: Any) -> str:
        return joint_prompt(self.adapter, item, self.role_prompts(item))

    def split(self, completion: str, item: Any) -> List[str]:
        return split_completion(self.adapter, completion, item, self.num_roles)

    def role_lists(self, completions: Sequence[str], item: Any) -> List[List[str]]:
        """``[role][k]``: each joint completion split into the roles' outputs."""
        parts = [self.split(text, item) for text in completions]
        return [[p[role] for p in parts] for role in range(self.num_roles)]

    def __call__(self, completions: Sequence[str], batch_items: Optional[Sequence[Any]] = None) -> List[float]:
        item = batch_items[0] if batch_items else {}
        return self.role_reward.score_raw(self.role_lists(completions, item), self.role_prompts(item), item)


class RoleSplittingLogger:
    """``eval_logger`` of a centralized team: the user's logger sees each role's output."""

    def __init__(self, logger: Any, collaboration: CentralizedCollaboration):
        self.logger = logger
        self.collaboration = collaboration

    def __call__(self, agent_completions_turns, batch_items, prompts):
        roles = [[[] for _ in batch_items] for _ in range(self.collaboration.num_roles)]
        for i, (turns, item) in enumerate(zip(agent_completions_turns[0], batch_items)):
            for text in turns:
                for role, part in enumerate(self.collaboration.split(text, item)):
                    roles[role][i].append(part)
        return self.logger(agent_completions_turns=roles, batch_items=batch_items, prompts=prompts)


class RoleSplittingMetrics:
    """``metrics_callback`` of a centralized actor-critic team: one copy of each sample per role,
    its completion the role's output."""

    def __init__(self, callback: Any, collaboration: CentralizedCollaboration):
        self.callback = callback
        self.collaboration = collaboration

    def __call__(self, samples):
        import copy

        out = []
        for sample in samples:
            item = sample.metadata.get("batch_item", {})
            for role, part in enumerate(self.collaboration.split(sample.completion, item)):
                clone = copy.copy(sample)
                clone.agent_idx, clone.completion = role, part
                out.append(clone)
        return self.callback(out)
