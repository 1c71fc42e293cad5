"""Actor-critic samples: one per (agent, joint response, turn), built from rollout trees.

With ``num_generations=1`` a rollout tree is a chain of turns, i.e. one episode; with one turn and K
generations it is K one-step episodes of the same prompt. ``episodes_of`` walks both shapes the
same way: episode (root, j) follows joint response j from turn to turn.

Targets are one-step TD targets ``y_t = r_t + gamma * V(h_{t+1})`` with no bootstrap after the
last collected turn (the horizon, or an early stop), where ``r_t`` is the agent's reward minus its
reference-KL penalty and ``V`` the critic's estimate at rollout time. The advantage of a sample is
its TD error ``y_t - V(h_t)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from comlrl.core.returns import rewards_to_go, td_targets
from comlrl.rollout.tree import Node


@dataclass
class RolloutSample:
    """One agent's completion at one turn of one episode (CoMLRL 1.4.3 fields first).

    Scalars are 0-d CPU tensors. ``metadata`` (shown to ``metrics_callback``) holds ``turn_idx``,
    ``generation_idx``, ``batch_item`` and, with reference KL, ``reference_kl``,
    ``reference_kl_penalty`` and ``environment_reward``.
    """

    agent_idx: int
    prompt: str  # exactly what the agent was given
    completion: str  # decoded, special tokens removed
    full_input_ids: torch.Tensor  # [P + C] prompt then completion (EOS included when sampled)
    attention_mask: torch.Tensor  # [P + C] ones
    prompt_len: int  # P
    response_len: int  # C
    old_logprob: Optional[torch.Tensor]  # sum of sampling log-probs; None unless they were computed
    old_value: Optional[torch.Tensor]  # the critic's estimate at rollout (None in evaluation)
    reward: torch.Tensor  # the agent's environment reward
    returns: torch.Tensor  # discounted reward-to-go of the KL-shaped rewards
    advantage: Optional[torch.Tensor]  # TD error: value_target - old_value
    normalized_advantage: Optional[torch.Tensor] = None  # what the actor update used
    metadata: Dict[str, Any] = field(default_factory=dict)
    # beyond CoMLRL 1.4.3
    value_target: Optional[torch.Tensor] = None  # one-step TD target of the critic
    old_token_logprobs: Optional[torch.Tensor] = None  # [C] sampling log-probs (importance ratios)
    critic_input_ids: Optional[torch.Tensor] = None  # 1-D ids the critic reads for this sample

    @property
    def turn_idx(self) -> int:
        return int(self.metadata.get("turn_idx", 0))

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.full_input_ids[: self.prompt_len]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.full_input_ids[self.prompt_len : self.prompt_len + self.response_len]


@dataclass
class Episode:
    item_index: int
    generation: int
    nodes: List[Node]  # one per turn


@dataclass
class AgentEpisode:
    samples: List[RolloutSample]  # one per turn
    shaped_rewards: List[float]  # reward minus reference-KL penalty, per turn


def episodes_of(roots: List[Node], num_generations: int) -> List[Episode]:
    """Every (root, j) path: joint response j at the root, then at each child along it."""
    episodes = []
    for root in roots:
        for j in range(num_generations):
            nodes, node = [], root
            while node is not None:
                nodes.append(node)
                node = node.children.get(j)
            episodes.append(Episode(root.item_index, j, nodes))
    return episodes


# (agent, node, generation j, prompt ids, completion ids) -> the 1-D ids its critic reads
CriticInput = Callable[[int, Node, int, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]


def build_agent_episode(
    agent: int,
    episode: Episode,
    *,
    kl_coef: Optional[float],
    critic_input: Optional[CriticInput],
) -> AgentEpisode:
    """The samples of one agent along one episode (values and targets are filled in later)."""
    samples, shaped = [], []
    for node in episode.nodes:
        j = episode.generation
        completions = node.level.completions[agent]
        row = node.completions[agent][j]
        prompt_ids, completion_ids = completions.prompt_of_row(row), completions.tokens[row]
        reward = float(node.agent_rewards[agent, j] if node.agent_rewards is not None else node.rewards[j])
        extras = node.level.extras[agent]
        metadata: Dict[str, Any] = {"turn_idx": node.turn, "generation_idx": j, "batch_item": node.item}
        penalty = 0.0
        if kl_coef is not None and extras.get("reference_kl") is not None:
            kl = float(extras["reference_kl"][row])
            penalty = kl_coef * kl
            metadata.update(reference_kl=kl, reference_kl_penalty=penalty, environment_reward=reward)
        old_tokens = extras["old_logprobs"][row] if extras.get("old_logprobs") is not None else None
        samples.append(
            RolloutSample(
                agent_idx=agent,
                prompt=node.prompts[agent],
                completion=completions.texts[row],
                full_input_ids=torch.cat([prompt_ids, completion_ids]),
                attention_mask=torch.ones(len(prompt_ids) + len(completion_ids), dtype=torch.long),
                prompt_len=len(prompt_ids),
                response_len=len(completion_ids),
                old_logprob=old_tokens.sum() if old_tokens is not None else None,
                old_value=None,
                reward=torch.tensor(reward),
                returns=torch.tensor(reward - penalty),
                advantage=None,
                metadata=metadata,
                old_token_logprobs=old_tokens,
                critic_input_ids=critic_input(agent, node, j, prompt_ids, completion_ids) if critic_input else None,
            )
        )
        shaped.append(reward - penalty)
    return AgentEpisode(samples, shaped)


def assign_td_targets(episode: AgentEpisode, discount: float) -> None:
    """Fill ``value_target``, ``advantage`` and ``returns`` from the shaped rewards and old values."""
    rewards = torch.tensor(episode.shaped_rewards, dtype=torch.float32)
    values = torch.stack([s.old_value.float() for s in episode.samples])
    next_values = torch.cat([values[1:], values.new_zeros(1)])
    terminal = torch.zeros(len(values), dtype=torch.bool)
    terminal[-1] = True  # the last collected turn: the horizon or an early stop
    targets = td_targets(rewards, next_values, terminal, discount)
    returns = rewards_to_go(episode.shaped_rewards, discount)
    for sample, target, value, ret in zip(episode.samples, targets, values, returns):
        sample.value_target = target.clone()
        sample.advantage = (target - value).clone()
        sample.returns = torch.tensor(ret)
