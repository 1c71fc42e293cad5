"""Actor-critic samples: one per (agent, node of the rollout tree, joint response).

A rollout tree has one node per history: every agent samples K completions at a node, joint
response j continues into child node j (multi-turn), and a node without children ends its branch
(the horizon, or an early stop). With K = 1 the tree is a chain of turns, i.e. one episode; with one
turn it is K one-step episodes of the same prompt.

Targets are one-step TD targets ``y = r + gamma * mean_k value(child, k)``: the next history of
joint response j is child node j, whose K samples' critic estimates are averaged (for a V critic
they are all V(h'); for a Q critic this is expected SARSA over the child's sampled actions). There is
no bootstrap where j has no child. ``r`` is the agent's reward minus its reference-KL penalty and
the values are the critic's estimates at rollout time.

Advantages: for a V critic, the TD error ``y - V(h)``. For a Q critic, ``Q(h, a_j) - b_j(h)`` with a
baseline that does not depend on the sampled action: the mean of Q over the node's other K - 1
samples (K > 1; leave-one-out, so ``A_j = K / (K - 1) * (Q_j - mean_k Q_k)``). The TD error ``r + gamma Q(h', a') - Q(h, a)`` that CoMLRL 1.4.3 used has expectation zero
given (h, a) for an accurate critic, so the actor would learn only from the critic's errors. With
K = 1 the node has no other sample, so the raw ``Q(h, a)`` is stored and the update centres it on the
mean of the other samples of its (agent, turn) group (``normalized_advantages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from comlrl.rollout.tree import Node


@dataclass
class RolloutSample:
    """One agent's completion at one turn of one episode (CoMLRL 1.4.3 fields first).

    Scalars are 0-d CPU tensors. ``metadata`` (shown to ``metrics_callback``) holds ``turn_idx``,
    ``generation_idx``, ``batch_item`` and, with reference KL, ``reference_kl`` and
    ``environment_reward`` (and ``reference_kl_penalty`` with ``reference_kl_mode="reward"``).
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
    old_token_logprobs: Optional[torch.Tensor] = None  # [C] log-probs recorded while sampling
    critic_input_ids: Optional[torch.Tensor] = None  # 1-D ids the critic reads for this sample
    policy_version: int = 0  # the agent's optimizer steps when this was sampled (stale once it steps again)
    reference_token_logprobs: Optional[torch.Tensor] = None  # [C] under the frozen reference (KL loss)
    # [rollout env_step, item id, node path (+1 each), 0, j]: the same in every process layout and in
    # the buffer's order (items, then each tree in pre-order); a drain sorts the exchanged buffer by it
    order: List[int] = field(default_factory=list)

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
class NodeSamples:
    """One agent's K samples at one tree node, and its samples at each child node (by joint response)."""

    samples: List[RolloutSample]  # K, in joint-response order
    shaped_rewards: List[float]  # K: reward minus reference-KL penalty
    children: Dict[int, "NodeSamples"] = field(default_factory=dict)

    def walk(self) -> Iterator["NodeSamples"]:
        """This node, then its children's subtrees in joint-response order (pre-order)."""
        yield self
        for j in sorted(self.children):
            yield from self.children[j].walk()


def flat_samples(tree: NodeSamples) -> List[RolloutSample]:
    """Every sample of the subtree: nodes in pre-order, the K samples of a node in order (with K = 1
    that is turn order, with one turn it is joint-response order)."""
    return [sample for node in tree.walk() for sample in node.samples]


# (agent, node, generation j, prompt ids, completion ids) -> the 1-D ids its critic reads
CriticInput = Callable[[int, Node, int, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]


def _sample(agent: int, node: Node, j: int, kl_coef: Optional[float], critic_input: Optional[CriticInput]) -> tuple:
    """``kl_coef`` (``reference_kl_mode="reward"`` only) subtracts the KL penalty from the reward."""
    completions = node.level.completions[agent]
    row = node.completions[agent][j]
    prompt_ids, completion_ids = completions.prompt_of_row(row), completions.tokens[row]
    reward = float(node.agent_rewards[agent, j] if node.agent_rewards is not None else node.rewards[j])
    extras = node.level.extras[agent]
    metadata: Dict[str, Any] = {"turn_idx": node.turn, "generation_idx": j, "batch_item": node.item}
    penalty = 0.0
    if kl_coef is not None and extras.get("reference_kl") is not None:
        kl = float(extras["reference_kl"][row])
        # the penalty is k1 = log pi - log pi_ref (core.kl.sequence_log_ratio); the logged KL is k3
        penalty = kl_coef * float(extras["reference_log_ratio"][row])
        metadata.update(reference_kl=kl, reference_kl_penalty=penalty, environment_reward=reward)
    elif extras.get("reference_kl") is not None:
        metadata.update(reference_kl=float(extras["reference_kl"][row]), environment_reward=reward)
    reference_tokens = extras["reference_logprobs"][row] if extras.get("reference_logprobs") is not None else None
    old_tokens = completions.logprobs[row] if completions.logprobs is not None else None
    sample = RolloutSample(
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
        reference_token_logprobs=reference_tokens,
        order=[node.item_id, *[p + 1 for p in node.path], 0, j],
    )
    return sample, reward - penalty


def build_node_samples(agent: int, node: Node, *, kl_coef: Optional[float], critic_input: Optional[CriticInput]) -> NodeSamples:
    """The samples of one agent over the subtree of ``node`` (values and targets are filled in later)."""
    pairs = [_sample(agent, node, j, kl_coef, critic_input) for j in range(len(node.joint_actions))]
    out = NodeSamples([p[0] for p in pairs], [p[1] for p in pairs])
    for j, child in node.children.items():
        out.children[j] = build_node_samples(agent, child, kl_coef=kl_coef, critic_input=critic_input)
    return out


def assign_td_targets(tree: NodeSamples, discount: float, critic_type: str = "v") -> List[float]:
    """Fill ``value_target``, ``advantage`` and ``returns`` of every sample of the subtree (see the
    module docstring) from the shaped rewards and the old values; returns the node's K returns.

    ``returns`` (logged, not trained on) are ``G_j = r_j + gamma * mean_k G(child j, k)``.
    """
    values = torch.stack([s.old_value.float() for s in tree.samples])
    child_returns: Dict[int, List[float]] = {j: assign_td_targets(child, discount, critic_type) for j, child in tree.children.items()}
    returns = []
    for j, (sample, reward) in enumerate(zip(tree.samples, tree.shaped_rewards)):
        child = tree.children.get(j)
        if child is not None:
            bootstrap = torch.stack([s.old_value.float() for s in child.samples]).mean()
        else:
            bootstrap = torch.zeros((), dtype=torch.float32)
        target = torch.tensor(reward, dtype=torch.float32) + discount * bootstrap
        sample.value_target = target.clone()
        if critic_type == "q":
            # Q(h, a_j) - mean_{k != j} Q(h, a_k); with one sample the update centres it (see module docstring)
            others = (values.sum() - values[j]) / (len(values) - 1) if len(values) > 1 else None
            sample.advantage = (values[j] - others).clone() if others is not None else values[j].clone()
        else:
            sample.advantage = (target - values[j]).clone()
        if child is not None:
            g = float(reward) + discount * (sum(child_returns[j]) / len(child_returns[j]))
        else:
            g = float(reward)
        returns.append(g)
        sample.returns = torch.tensor(g)
    return returns
