"""Rollout trees of joint responses (single- and multi-turn), generated one tree level at a time.

Each node holds one prompt per agent. Every agent samples K completions at the node; the node's
joint responses are the K aligned tuples (aligned mode) or the K^N Cartesian product (cross mode);
the shared reward scores each joint response. Unless the node is at the last turn or terminates
early, every joint response continues into a child node whose prompts come from the external
transition. All nodes of one level of all trees in a batch are generated together: one generate
call per agent per level.

Returns are ``G_j = r_j + gamma * mean(returns of child j)``; each agent's credit for its K
completions is ``G`` itself (aligned) or the mean ``G`` over joint responses containing the
completion (cross).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from comlrl.core.credit import joint_returns_of_agent
from comlrl.core.returns import cross_marginal_returns, node_returns
from comlrl.rollout.formatters import Formatter
from comlrl.rollout.generation import Completions, GenerationBackend, SamplingParams
from comlrl.rollout.prompt_check import PromptTooLongError
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.rows import describe_row, same_row
from comlrl.rollout.sampling import draw_seeds


def row_seed(step_seed: int, agent: int, item_id: int, path: Tuple[int, ...], sample: int) -> int:
    """The seed of one generated row: a hash of where it is (step, agent, item, node path, sample),
    so a row's tokens depend neither on the batch it is generated in nor on the order agents run."""
    key = f"{step_seed}/{agent}/{item_id}/{'.'.join(map(str, path))}/{sample}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)


def run_in_order(task: Callable[[int], Any], agents: Sequence[int]) -> List[Any]:
    return [task(agent) for agent in agents]


@dataclass
class GroupSample:
    """One agent's K completions at one node: the unit a group-baseline update consumes."""

    agent_idx: int
    turn_idx: int
    prompt_ids: torch.Tensor  # 1-D
    completion_ids: List[torch.Tensor]  # K 1-D, EOS included
    returns: torch.Tensor  # [K] credit of each completion (before any KL penalty)
    node_env_step: int
    node_mean_reward: float
    node_mean_return: float
    reference_kl: Optional[torch.Tensor] = None  # [K] k3 estimate of KL to the frozen reference (logged)
    old_logprobs: Optional[List[torch.Tensor]] = None  # K 1-D log-probs recorded while sampling
    policy_version: int = 0  # the agent's optimizer steps when it sampled these (stale once it steps again)
    reference_log_ratio: Optional[torch.Tensor] = None  # [K] log pi - log pi_ref: the KL penalty's basis
    reference_logprobs: Optional[List[torch.Tensor]] = None  # K 1-D per-token log-probs under the reference
    # [rollout env_step, turn, item id, *path]: the same for this group in every process layout; a
    # drain orders its buffer by it, so one process and N data-parallel ones shuffle the same list
    order: List[int] = field(default_factory=list)
    joint_returns: Optional[torch.Tensor] = None  # cross mode: [K, K^(N-1)] returns against each context of the others
    node_key: Optional[Tuple[Any, ...]] = None  # (node_env_step, item_id, path): the node's identity in its step


@dataclass
class Node:
    item: Any
    item_index: int  # position in the batch given to ``run``
    item_id: int  # the item's identity for its random streams (its index in the global step)
    path: Tuple[int, ...]  # joint responses from the root to this node
    turn: int
    prompts: List[str]  # one per agent: exactly what the agent was given
    prompt_history: List[List[str]]  # per agent, this turn included
    response_history: List[List[str]]  # per agent, earlier turns only
    completions: List[List[int]] = field(default_factory=list)  # per agent: row indices into level output
    joint_actions: List[Tuple[int, ...]] = field(default_factory=list)
    rewards: Optional[torch.Tensor] = None  # [J]
    agent_rewards: Optional[torch.Tensor] = None  # [N, J] when the reward gives each agent its own value
    returns: Optional[torch.Tensor] = None  # [J]
    children: Dict[int, "Node"] = field(default_factory=dict)
    env_step: int = 0
    terminated: bool = False
    level: Optional["LevelOutput"] = None


@dataclass
class LevelOutput:
    """What one tree level produced for each agent."""

    completions: List[Completions]  # per agent
    extras: List[Dict[str, Any]]  # per agent: optional "reference_kl" and "reference_log_ratio" [R]


# (agent index, that agent's completions at this level) -> {"reference_kl": Tensor[R], "reference_log_ratio": Tensor[R]}
RowScorer = Callable[[int, Completions], Dict[str, Any]]


@dataclass
class RolloutResult:
    roots: List[Node]
    samples: List[GroupSample]  # every (node, agent), ordered by node env_step then agent
    env_steps: int  # joint rewards computed
    turn_metrics: Dict[str, float]


class TreeRollout:
    """Builds the rollout trees of a batch of items (see module docstring)."""

    def __init__(
        self,
        *,
        generators: Sequence[GenerationBackend],
        formatters: Sequence[Formatter],
        reward: RewardFunction,
        num_generations: int,
        num_turns: int,
        joint_mode: str,
        discount: float,
        sampling: SamplingParams,
        early_termination_threshold: Optional[float] = None,
        external_transition: Optional[Callable[..., Any]] = None,
        external_prompt_passthrough: bool = False,
        row_scorer: Optional[RowScorer] = None,
        map_agents: Callable[[Callable[[int], Any], Sequence[int]], List[Any]] = run_in_order,
    ):
        self.generators = list(generators)
        self.formatters = list(formatters)
        self.reward = reward
        self.num_agents = len(self.generators)
        self.k = num_generations
        self.num_turns = num_turns
        self.joint_mode = joint_mode if self.num_agents > 1 else "aligned"
        self.discount = discount
        self.sampling = sampling
        self.threshold = early_termination_threshold
        self.transition = external_transition
        self.passthrough = external_prompt_passthrough
        self.row_scorer = row_scorer
        self.map_agents = map_agents

    # ------------------------------------------------------------------ public
    def run(
        self, items: Sequence[Any], env_step: int = 0, item_ids: Optional[Sequence[int]] = None, step_seed: Optional[int] = None
    ) -> RolloutResult:
        """Build the trees of ``items``. Row ``k`` of agent ``a`` at the node reached by joint responses
        ``path`` from item ``item_ids[i]``'s root is sampled with ``row_seed(step_seed, a, item_id, path, k)``;
        ``step_seed`` defaults to one draw from torch's global generator (so checkpoints cover it)."""
        ids = list(range(len(items))) if item_ids is None else [int(i) for i in item_ids]
        if len(ids) != len(items):
            raise ValueError(f"{len(ids)} item ids for {len(items)} items.")
        if step_seed is None and self.sampling.do_sample:
            step_seed = draw_seeds(1)[0]
        self.step_seed = step_seed
        roots = [self._root(item, index, item_id) for index, (item, item_id) in enumerate(zip(items, ids))]
        level, start = roots, env_step
        while level:
            output = self._generate(level)
            for node in level:
                env_step = self._score(node, output, env_step)
            level = self._expand(level)
        for root in roots:
            self._compute_returns(root)
        nodes = sorted(self._walk(roots), key=lambda n: n.env_step)
        samples = [self._group_sample(node, agent) for node in nodes for agent in range(self.num_agents)]
        return RolloutResult(roots, samples, env_step - start, self._turn_metrics(nodes))

    # ------------------------------------------------------------------ levels
    def _root(self, item: Any, index: int, item_id: int) -> Node:
        prompts = [fmt(item) for fmt in self.formatters]
        return Node(item, index, item_id, (), 0, prompts, [[p] for p in prompts], [[] for _ in prompts])

    def _seeds(self, level: List[Node], agent: int) -> Optional[List[int]]:
        if not self.sampling.do_sample:
            return None
        return [row_seed(self.step_seed, agent, node.item_id, node.path, k) for node in level for k in range(self.k)]

    def _generate(self, level: List[Node]) -> LevelOutput:
        """One generate call per agent for every node of the level (agents concurrently when
        ``map_agents`` runs them so: each reads only its own seeds)."""

        def task(agent: int) -> Tuple[Completions, Dict[str, Any]]:
            prompts = [node.prompts[agent] for node in level]
            try:
                completions = self.generators[agent].generate(prompts, self.k, self.sampling, self._seeds(level, agent))
            except PromptTooLongError as error:
                if error.index is None:
                    raise
                node = level[error.index]
                raise PromptTooLongError(f"agents[{agent}]'s prompt at turn {node.turn + 1} for {describe_row(node.item)}: "
                                         f"{error}") from None
            return completions, (self.row_scorer(agent, completions) if self.row_scorer else {})

        done = self.map_agents(task, list(range(self.num_agents)))
        result = LevelOutput([c for c, _ in done], [e for _, e in done])
        for position, node in enumerate(level):
            node.level = result
            node.completions = [list(range(position * self.k, (position + 1) * self.k)) for _ in self.generators]
        return result

    def _joint_actions(self) -> List[Tuple[int, ...]]:
        if self.joint_mode == "cross":
            return list(itertools.product(range(self.k), repeat=self.num_agents))
        return [(j,) * self.num_agents for j in range(self.k)]

    def texts(self, node: Node, agent: int) -> List[str]:
        texts = node.level.completions[agent].texts
        return [texts[row] for row in node.completions[agent]]

    def _score(self, node: Node, output: LevelOutput, env_step: int) -> int:
        node.joint_actions = self._joint_actions()
        per_agent = [self.texts(node, agent) for agent in range(self.num_agents)]
        lists = [[per_agent[agent][action[agent]] for action in node.joint_actions] for agent in range(self.num_agents)]
        rewards = self.reward.score(lists, node.prompts, node.item)
        if isinstance(rewards, torch.Tensor) and rewards.dim() == 2:  # per-agent rewards [N, J]
            node.agent_rewards = rewards.float()
            node.rewards = node.agent_rewards.mean(dim=0)
        else:
            node.rewards = torch.tensor(rewards, dtype=torch.float32)
        env_step += node.rewards.numel()
        node.env_step = env_step
        node.terminated = self.threshold is not None and float(node.rewards.mean()) > self.threshold
        return env_step

    def _expand(self, level: List[Node]) -> List[Node]:
        children = []
        for node in level:
            if node.terminated or node.turn >= self.num_turns - 1:
                continue
            texts = [self.texts(node, agent) for agent in range(self.num_agents)]
            for j, action in enumerate(node.joint_actions):
                chosen = [texts[agent][action[agent]] for agent in range(self.num_agents)]
                child = self._child(node, chosen, j)
                node.children[j] = child
                children.append(child)
        return children

    def _child(self, node: Node, chosen: List[str], j: int) -> Node:
        responses = [history + [text] for history, text in zip(node.response_history, chosen)]
        external = self.transition(
            prompt=node.item.get("prompt", "") if hasattr(node.item, "get") else "",
            agent_completions=list(chosen),
            num_agents=self.num_agents,
            prompt_history_per_agent=[list(h) for h in node.prompt_history],
            response_history_per_agent=[list(h) for h in responses],
        )
        if not isinstance(external, (list, tuple)) or len(external) != self.num_agents:
            raise ValueError(
                f"External transition must return per-agent prompts: a list of {self.num_agents} strings, "
                f"got {type(external).__name__}"
                + (f" of length {len(external)}" if isinstance(external, (list, tuple)) else "")
                + "."
            )
        prompts = []
        for agent, text in enumerate(external):
            if not isinstance(text, str):
                raise ValueError(f"External transition returned {type(text).__name__} for agent {agent}; prompts must be str.")
            if self.passthrough:
                prompts.append(text)
            else:
                item = same_row(dict(node.item), node.item) if hasattr(node.item, "keys") else {"prompt": text}
                item["prompt"] = text
                prompts.append(self.formatters[agent](item, external_prompts=text))
        history = [h + [p] for h, p in zip(node.prompt_history, prompts)]
        return Node(node.item, node.item_index, node.item_id, node.path + (j,), node.turn + 1, prompts, history, responses)

    # ------------------------------------------------------------------ returns
    def _compute_returns(self, node: Node) -> torch.Tensor:
        for child in node.children.values():
            self._compute_returns(child)
        child_means = None
        if node.children:
            child_means = torch.full_like(node.rewards, float("nan"))
            for j, child in node.children.items():
                child_means[j] = child.returns.mean()
        node.returns = node_returns(node.rewards, child_means, self.discount)
        return node.returns

    def _walk(self, nodes: Sequence[Node]):
        for node in nodes:
            yield node
            yield from self._walk(list(node.children.values()))

    def _group_sample(self, node: Node, agent: int) -> GroupSample:
        completions = node.level.completions[agent]
        rows = node.completions[agent]
        joint = None
        if self.joint_mode == "cross":
            credit = cross_marginal_returns(node.returns, self.num_agents, self.k)[agent]
            joint = joint_returns_of_agent(node.returns, agent, self.num_agents, self.k)
        else:
            credit = node.returns.clone()
        extras = node.level.extras[agent]
        kl = extras.get("reference_kl")
        log_ratio = extras.get("reference_log_ratio")
        reference = extras.get("reference_logprobs")
        old = completions.logprobs
        return GroupSample(
            agent_idx=agent,
            turn_idx=node.turn,
            prompt_ids=completions.prompt_of_row(rows[0]),
            completion_ids=[completions.tokens[row] for row in rows],
            returns=credit,
            node_env_step=node.env_step,
            node_mean_reward=float(node.rewards.mean()),
            node_mean_return=float(node.returns.mean()),
            reference_kl=kl[rows[0] : rows[-1] + 1].clone() if kl is not None else None,
            reference_log_ratio=log_ratio[rows[0] : rows[-1] + 1].clone() if log_ratio is not None else None,
            old_logprobs=[old[row] for row in rows] if old is not None else None,
            reference_logprobs=[reference[row] for row in rows] if reference is not None else None,
            order=[node.turn, node.item_id, *node.path],
            joint_returns=joint,
            node_key=(node.env_step, node.item_id, node.path),
        )

    def _turn_metrics(self, nodes: List[Node]) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        for turn in range(self.num_turns):
            at_turn = [n for n in nodes if n.turn == turn]
            if not at_turn:
                continue
            rewards = torch.cat([n.rewards for n in at_turn])
            returns = torch.cat([n.returns for n in at_turn])
            metrics[f"turn_{turn + 1}/reward_mean"] = float(rewards.mean())
            metrics[f"turn_{turn + 1}/expected_return"] = float(returns.mean())
        return metrics
