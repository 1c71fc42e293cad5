"""The actor-critic reward convention, on top of the shared calling convention.

The reward function is called once per prompt (per turn) with the K completions of every agent
(``RewardFunction`` decides how the lists are passed) and may return:

- K values (one per joint response): every agent gets the value of its joint response;
- 1 value: every agent and every joint response gets it;
- N values (N != K): agent i gets value i for each of its K completions;
- an N x K table (nested lists, or a 2-D tensor/array): agent i gets ``table[i][j]`` for joint
  response j.

When K == N a flat list of K values is read as one value per joint response (as CoMLRL 1.4.3 did);
per-agent rewards then need the N x K form, which is never ambiguous.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from comlrl.rollout.rewards import RewardFunction, normalize_reward_output


def _is_table(raw: Any) -> bool:
    if isinstance(raw, torch.Tensor) or (hasattr(raw, "ndim") and hasattr(raw, "tolist")):
        return int(raw.ndim) == 2
    return (
        isinstance(raw, (list, tuple))
        and len(raw) > 0
        and all(isinstance(row, (list, tuple)) or (hasattr(row, "tolist") and getattr(row, "ndim", 0) == 1) for row in raw)
    )


def agent_reward_table(raw: Any, num_agents: int, count: int, func: Any) -> List[List[float]]:
    """What a reward function returned for ``count`` joint responses, as ``[N][count]`` floats."""
    if _is_table(raw):
        rows = [normalize_reward_output(row, func) for row in (raw.tolist() if hasattr(raw, "tolist") else raw)]
        if len(rows) != num_agents or any(len(row) != count for row in rows):
            shape = f"{len(rows)} x {sorted({len(r) for r in rows})}"
            raise ValueError(
                f"reward_func returned a table of shape {shape}; a per-agent table must be num_agents x "
                f"num_generations = {num_agents} x {count}."
            )
        return rows
    values = normalize_reward_output(raw, func)
    if len(values) == count:
        return [list(values) for _ in range(num_agents)]
    if len(values) == 1:
        return [values * count for _ in range(num_agents)]
    if len(values) == num_agents:
        return [[value] * count for value in values]
    raise ValueError(
        f"Reward function must return 1 value, num_generations values, or num_agents values: got {len(values)} "
        f"values for {count} joint responses of {num_agents} agents. For per-agent rewards of every joint "
        f"response return a {num_agents} x {count} table."
    )


class AgentRewards:
    """``score(lists, prompts, item) -> [N, J]`` per-agent rewards for the rollout tree."""

    def __init__(self, reward: RewardFunction):
        self.reward = reward
        self.num_agents = reward.num_agents

    def score(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], item: Any) -> torch.Tensor:
        count = len(lists[0])
        raw = self.reward.call(lists, prompts, [item])
        table = agent_reward_table(raw, self.num_agents, count, self.reward.func)
        flat = self.reward.process([value for row in table for value in row])
        return torch.tensor(flat, dtype=torch.float32).reshape(self.num_agents, count)
