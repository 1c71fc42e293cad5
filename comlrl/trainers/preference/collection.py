"""Candidate collection and preference pairs.

One collection step over B items (``collect_candidates``): every agent samples K candidates for its
prompt of each item in ONE generate call (B x K rows); the reward function is then called once per
item on its K aligned joint candidates (``score_candidates``). Pairs are chosen among one item's
candidates (``candidate_pairs``, MADPO/MARLHF) or between the current policy's and a comparator's
candidates (``comparison_pairs``, iterative trainers).

A pair keeps, per agent, the prompt ids and the exact sampled ids of the winner and loser (EOS
included), so the losses score what was sampled. Completions known only as text (a comparator
model with another tokenizer, an API) are tokenized with the agent's tokenizer and end with its EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch

from comlrl.core.preference import select_candidate_pairs, select_comparisons
from comlrl.rollout.generation import Completions, SamplingParams
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.tree import row_seed


@dataclass
class AgentPreferenceTensors:
    """One agent's part of a pair: 1-D CPU id tensors (completions without padding, EOS included)."""

    prompt_input_ids: torch.Tensor
    winner_completion_ids: torch.Tensor
    loser_completion_ids: torch.Tensor


@dataclass
class PreferencePair:
    """A joint winner and a joint loser of one item (texts and ids per agent, rewards)."""

    prompts: List[str]
    winner_completions: List[str]
    loser_completions: List[str]
    agent_tensors: List[AgentPreferenceTensors]
    winner_reward: float  # processed rewards (after reward_processor)
    loser_reward: float
    candidate_reward_mean: float  # mean processed reward of every candidate of the item
    raw_rewards: Optional[List[float]] = None  # [winner, loser] before reward_processor
    target_raw_reward: Optional[float] = None  # iterative: the current policy's side
    comparator_raw_reward: Optional[float] = None  # iterative: the comparator's side



@dataclass
class ItemCandidates:
    """K joint candidates of one item: per agent its prompt and K completions, and their rewards."""

    item: Any
    prompts: List[str]  # per agent
    prompt_ids: List[torch.Tensor]  # per agent
    texts: List[List[str]]  # [agent][k]
    ids: List[Optional[List[torch.Tensor]]]  # [agent][k]; None for an agent whose side is text only
    raw_rewards: Optional[torch.Tensor] = None  # [K]
    rewards: Optional[torch.Tensor] = None  # [K]

    @property
    def count(self) -> int:
        return len(self.texts[0])


def collect_candidates(policies: Sequence[Any], prompts: List[List[str]], items: Sequence[Any], k: int, sampling: SamplingParams,
                       step_seed: Optional[int] = None, map_agents: Optional[Callable[..., List[Any]]] = None) -> List[ItemCandidates]:
    """``prompts[agent][b]``; one generate call per agent for all ``len(items) x k`` rows.

    With ``step_seed`` every sampled row has its own random stream (``row_seed(step_seed, agent, b, (), j)``),
    so the candidates do not depend on the order the agents run in; ``map_agents`` (the trainer's
    ``AgentWorkers.map``) runs the agents' generate calls, concurrently under ``parallel_training="mp"``.
    """

    def generate(a: int) -> Completions:
        seeds = None
        if step_seed is not None and sampling.do_sample:
            seeds = [row_seed(step_seed, a, b, (), j) for b in range(len(prompts[a])) for j in range(k)]
        return policies[a].generator.generate(prompts[a], k, sampling, seeds)

    agents = list(range(len(policies)))
    outputs: List[Completions] = map_agents(generate, agents) if map_agents is not None else [generate(a) for a in agents]
    return [
        ItemCandidates(
            item=item,
            prompts=[prompts[a][b] for a in range(len(policies))],
            prompt_ids=[out.prompt_ids[b] for out in outputs],
            texts=[out.texts[b * k : (b + 1) * k] for out in outputs],
            ids=[out.tokens[b * k : (b + 1) * k] for out in outputs],
        )
        for b, item in enumerate(items)
    ]


def score_candidates(reward: RewardFunction, candidates: Sequence[ItemCandidates]) -> None:
    """Raw and processed rewards of every item's K joint candidates: one reward call per item."""
    for c in candidates:
        raw = reward.score_raw(c.texts, c.prompts, c.item)
        c.raw_rewards = torch.tensor(raw, dtype=torch.float32)
        c.rewards = torch.tensor(reward.process(raw), dtype=torch.float32)


def encode_completion(policy: Any, text: str) -> torch.Tensor:
    """A completion known only as text, in an agent's ids: its tokens (no special tokens) then EOS."""
    tokenizer = policy.tokenizer
    encoded = tokenizer(text, add_special_tokens=False)
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded.input_ids)
    eos = policy.generator.eos_ids[0] if policy.generator.eos_ids else None
    if eos is not None:
        ids.append(int(eos))
    return torch.tensor(ids, dtype=torch.long)


def _ids(policies: Sequence[Any], side: ItemCandidates, agent: int, k: int) -> torch.Tensor:
    ids = side.ids[agent]
    return ids[k] if ids is not None else encode_completion(policies[agent], side.texts[agent][k])


def make_pair(policies: Sequence[Any], target: ItemCandidates, winner: ItemCandidates, w: int, loser: ItemCandidates, l: int, mean: float) -> PreferencePair:
    """Winner candidate ``w`` of ``winner`` over loser candidate ``l`` of ``loser`` (prompts of ``target``)."""
    agents = range(len(target.prompts))
    return PreferencePair(
        prompts=list(target.prompts),
        winner_completions=[winner.texts[a][w] for a in agents],
        loser_completions=[loser.texts[a][l] for a in agents],
        agent_tensors=[
            AgentPreferenceTensors(target.prompt_ids[a], _ids(policies, winner, a, w), _ids(policies, loser, a, l)) for a in agents
        ],
        winner_reward=float(winner.rewards[w]),
        loser_reward=float(loser.rewards[l]),
        candidate_reward_mean=mean,
        raw_rewards=[float(winner.raw_rewards[w]), float(loser.raw_rewards[l])],
    )


def candidate_pairs(policies: Sequence[Any], c: ItemCandidates, mode: str, limit: Optional[int]) -> List[PreferencePair]:
    """Pairs among one item's candidates (strict reward gap; see ``select_candidate_pairs``)."""
    mean = float(c.rewards.mean())
    chosen = select_candidate_pairs(c.rewards, mode, limit)
    return [make_pair(policies, c, c, int(w), c, int(l), mean) for w, l in chosen.tolist()]


def comparison_pairs(policies: Sequence[Any], target: ItemCandidates, comparator: ItemCandidates, mode: str, limit: Optional[int]) -> List[PreferencePair]:
    """Candidate j of the current policy against candidate j of the comparator (``select_comparisons``)."""
    mean = float(torch.cat([target.rewards, comparator.rewards]).mean())
    pairs = []
    for j in select_comparisons(target.rewards, comparator.rewards, mode, limit).tolist():
        target_wins = float(target.rewards[j]) > float(comparator.rewards[j])
        winner, loser = (target, comparator) if target_wins else (comparator, target)
        pair = make_pair(policies, target, winner, j, loser, j, mean)
        pair.target_raw_reward = float(target.raw_rewards[j])
        pair.comparator_raw_reward = float(comparator.raw_rewards[j])
        pairs.append(pair)
    return pairs
