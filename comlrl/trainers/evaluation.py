"""The evaluation engine of every trainer family and of ``comlrl eval``: episodes on items, decoded
greedily or sampled, and what they are reported as.

An evaluation runs ``samples`` episodes per item (K; 1 when greedy). Each episode is a chain of
turns: a rollout tree of width 1 (``num_generations=1``), so every agent gives one response per turn
and the environment's transition writes the next prompts. The K episodes of an item are K copies of
the item in one tree batch; the copy ``s`` of item ``i`` has the random streams of item id
``i * K + s`` under one step seed for the whole evaluation, so a sampled evaluation does not depend
on its batch size. ``run_episodes`` gives the episodes (``Episode``: per turn every agent's
completion and token count, the joint reward, the return, per-agent rewards when the reward gives
them and, when a ``details`` function is given, the environment's breakdown); ``observe`` sees each
batch's ``RolloutResult`` (the actor-critic family builds its samples from it).

What is reported (``EvalSettings``): the families' own per-turn metrics (``turn_metrics`` for the
MAGRPO family; the actor-critic family's samples), and, when asked, per-agent completion lengths
and rewards, the best of K per item, the breakdown's means per turn and at the episode's end, and
pass@k (``eval_metrics``). ``TRAINING`` is what ``trainer.evaluate()`` runs: greedy, one episode per
item, none of the extra metrics, so its keys and numbers are those of the greedy evaluation alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from comlrl.rollout.sampling import draw_seeds
from comlrl.rollout.tree import Node, RolloutResult, TreeRollout
from comlrl.telemetry.progress import ProgressBar

DetailsFn = Callable[..., List[Dict[str, float]]]
"""``details(completions_1, ..., completions_N, *, batch_items) -> one breakdown per joint response``
(an environment's ``reward_details``)."""


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation decodes and what it reports beyond the family's per-turn metrics."""

    samples: int = 1
    """Episodes per item (K); 1 with greedy decoding."""
    greedy: bool = True
    """Greedy decoding; False samples with the config's temperature, top_p and top_k."""
    pass_k: Tuple[int, ...] = ()
    """The k of each ``pass@k`` to report (each at most ``samples``); needs a breakdown with test counts."""
    per_agent: bool = False
    """Also report each agent's completion length and (when the reward gives one per agent) reward."""
    seed: Optional[int] = None
    """The step seed of sampled episodes (None: one draw from torch's global generator)."""
    progress: bool = False
    """A progress bar over the items."""

    def __post_init__(self) -> None:
        samples = self.samples
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {samples!r}.")
        if not isinstance(self.greedy, bool):
            raise ValueError(f"greedy must be True or False, got {self.greedy!r}.")
        if self.greedy and samples != 1:
            raise ValueError(f"greedy decoding gives one episode per item (every copy would be the same), got samples={samples}; "
                             f"set greedy=False to sample {samples} episodes per item, or samples=1.")
        for k in self.pass_k:
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= samples:
                raise ValueError(f"pass@{k} needs an integer k between 1 and the samples per item ({samples}); draw at least "
                                 f"{k} samples per item, or ask for a smaller k.")


TRAINING = EvalSettings()
"""What ``trainer.evaluate()`` runs."""


@dataclass
class Turn:
    """One turn of an episode."""

    turn: int  # 0-based
    completions: List[str]  # one per agent
    lengths: List[int]  # completion tokens per agent (EOS included when generated)
    reward: float  # the joint reward (processed, as the trainer sees it)
    expected_return: float  # reward-to-go of the episode from this turn (discounted)
    agent_rewards: Optional[List[float]] = None  # one per agent when the reward gives each its own
    details: Optional[Dict[str, float]] = None  # the environment's breakdown of this turn's joint response


@dataclass
class Episode:
    """The turns of one episode: sample ``sample`` of item ``index``."""

    index: int
    sample: int
    item: Any
    turns: List[Turn] = field(default_factory=list)

    def by_turn(self, turn: int) -> Optional[Turn]:
        """The latest turn at or before ``turn`` (an episode that ended early keeps its last answer)."""
        reached = [t for t in self.turns if t.turn <= turn]
        return reached[-1] if reached else None


@dataclass
class EvalReport:
    """An evaluation's episodes and metrics (``eval/...`` keys)."""

    episodes: List[Episode]
    metrics: Dict[str, float]


def run_episodes(make_tree: Callable[[bool], TreeRollout], items: Sequence[Any], settings: EvalSettings, batch_size: int, *,
                 observe: Optional[Callable[[RolloutResult], None]] = None, details: Optional[DetailsFn] = None) -> List[Episode]:
    """``settings.samples`` episodes of every item, ``batch_size`` items per tree batch (see the module
    docstring); ``make_tree(greedy)`` gives the family's rollout tree with one response per agent."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"eval batch size must be an integer >= 1, got {batch_size!r}.")
    k = settings.samples
    tree = make_tree(settings.greedy)
    seed = None
    if not settings.greedy:
        seed = settings.seed if settings.seed is not None else draw_seeds(1)[0]
    items = list(items)
    episodes: List[Episode] = []
    bar = ProgressBar(total=len(items), initial=0, enabled=settings.progress, desc="evaluation")
    try:
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            batch = [item for item in chunk for _ in range(k)]
            ids = [(start + i) * k + s for i in range(len(chunk)) for s in range(k)]
            result = tree.run(batch, item_ids=ids, step_seed=seed)
            if observe is not None:
                observe(result)
            found = [chain_episode(tree, root, start + root.item_index // k, root.item_index % k) for root in result.roots]
            if details is not None:
                add_details(found, details, tree.num_agents)
            episodes.extend(found)
            bar.update(len(chunk))
        bar.finish(None)
    finally:
        bar.close()
    return episodes


def chain_episode(tree: TreeRollout, root: Node, index: int, sample: int) -> Episode:
    """The turns of a width-1 tree from ``root`` (its first joint response at every node)."""
    episode = Episode(index, sample, root.item)
    node: Optional[Node] = root
    while node is not None:
        agents = range(tree.num_agents)
        rows = [node.completions[agent][0] for agent in agents]
        lengths = [int(node.level.completions[agent].tokens[row].numel()) for agent, row in zip(agents, rows)]
        per_agent = None if node.agent_rewards is None else [float(v) for v in node.agent_rewards[:, 0]]
        episode.turns.append(Turn(node.turn, [tree.texts(node, agent)[0] for agent in agents], lengths, float(node.rewards[0]),
                                  float(node.returns[0]), per_agent))
        node = node.children.get(0)
    return episode


def add_details(episodes: Sequence[Episode], details: DetailsFn, num_agents: int) -> None:
    """Each turn's breakdown, one ``details`` call per turn for all the episodes (a code environment
    runs their tests in parallel, or finds them in its cache from the reward call)."""
    depth = max((len(e.turns) for e in episodes), default=0)
    for position in range(depth):
        turns = [(e, e.turns[position]) for e in episodes if len(e.turns) > position]
        lists = [[turn.completions[agent] for _, turn in turns] for agent in range(num_agents)]
        found = details(*lists, batch_items=[episode.item for episode, _ in turns])
        if len(found) != len(turns):
            raise ValueError(f"reward_details returned {len(found)} breakdowns for {len(turns)} joint responses; it must return one each.")
        for (_, turn), breakdown in zip(turns, found):
            turn.details = dict(breakdown)


def turn_metrics(episodes: Sequence[Episode]) -> Dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return`` over the episodes that reached turn k."""
    rewards: Dict[int, List[float]] = {}
    returns: Dict[int, List[float]] = {}
    for episode in episodes:
        for turn in episode.turns:
            rewards.setdefault(turn.turn, []).append(turn.reward)
            returns.setdefault(turn.turn, []).append(turn.expected_return)
    metrics: Dict[str, float] = {}
    for turn in sorted(rewards):
        metrics[f"turn_{turn + 1}/reward_mean"] = sum(rewards[turn]) / len(rewards[turn])
        metrics[f"turn_{turn + 1}/expected_return"] = sum(returns[turn]) / len(returns[turn])
    return metrics

