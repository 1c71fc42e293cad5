"""What an evaluation reports beyond a family's per-turn reward and return, when ``EvalSettings`` asks
(keys without the ``eval/`` prefix; ``k`` counts turns from 1):

- ``turn_k/agent_i/completion_length`` (tokens) and, when the reward gives each agent its own value,
  ``turn_k/agent_i/reward_mean`` (``per_agent``);
- ``turn_k/best_of_K/reward_mean``: the mean over items of the best of the item's K episodes (K > 1);
- the environment's breakdown (episodes evaluated with ``details``): ``turn_k/<term>`` over the
  episodes that reached turn k, and ``<term>`` over every episode's last turn (what training's
  ``eval_rows`` aggregation reports);
- ``turn_k/pass@n`` and ``pass@n`` (``pass_k``): Chen et al.'s unbiased estimator from the K episodes of
  each item, averaged over items. An episode counts as correct at turn k when its answer then (its
  last turn at or before k: an episode that ended early keeps its answer) passed every test, as the
  environment's breakdown says (``passed_tests == total_tests > 0``: the code environments report
  both); ``pass@n`` reads each episode's last turn.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from comlrl.core.pass_at_k import mean_pass_at_k
from comlrl.telemetry.eval_rows import mean_numbers
from comlrl.trainers.evaluation import EvalSettings, Episode, Turn

TEST_KEYS = ("passed_tests", "total_tests")


def all_tests_passed(details: Optional[Mapping[str, float]]) -> Optional[bool]:
    """Whether a breakdown says every test passed; None when it reports no test counts."""
    if details is None or any(key not in details for key in TEST_KEYS):
        return None
    total = float(details["total_tests"])
    return total > 0 and float(details["passed_tests"]) >= total


def reports_tests(details: Optional[Mapping[str, float]]) -> bool:
    """Whether an environment's breakdown carries the test counts pass@k reads."""
    return all_tests_passed(details) is not None


def extra_metrics(episodes: Sequence[Episode], settings: EvalSettings) -> Dict[str, float]:
    """The metrics of the module docstring that ``settings`` asks for (empty for ``TRAINING``)."""
    metrics: Dict[str, float] = {}
    if not episodes:
        return metrics
    items = by_item(episodes)
    detailed = any(turn.details is not None for episode in episodes for turn in episode.turns)
    for turn in sorted({t.turn for episode in episodes for t in episode.turns}):
        prefix = f"turn_{turn + 1}/"
        reached = [t for episode in episodes for t in episode.turns if t.turn == turn]
        if settings.per_agent:
            metrics.update(agent_metrics(reached, prefix))
        if settings.samples > 1:
            best = [max(t.reward for t in at) for at in ([t for e in group for t in e.turns if t.turn == turn] for group in items) if at]
            metrics[f"{prefix}best_of_{settings.samples}/reward_mean"] = sum(best) / len(best)
        if detailed:
            metrics.update({f"{prefix}{key}": value for key, value in mean_numbers([t.details or {} for t in reached]).items()})
        for k in settings.pass_k:
            metrics[f"{prefix}pass@{k}"] = pass_rate(items, k, lambda e, turn=turn: e.by_turn(turn))
    if detailed:
        metrics.update(mean_numbers([episode.turns[-1].details or {} for episode in episodes]))
    for k in settings.pass_k:
        metrics[f"pass@{k}"] = pass_rate(items, k, lambda e: e.turns[-1])
    return metrics


def by_item(episodes: Sequence[Episode]) -> List[List[Episode]]:
    """The episodes grouped by item, in the order items first appear."""
    groups: Dict[int, List[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.index, []).append(episode)
    return list(groups.values())


def agent_metrics(turns: Sequence[Turn], prefix: str) -> Dict[str, float]:
    metrics: Dict[str, float] = {}
    for agent in range(len(turns[0].lengths)):
        metrics[f"{prefix}agent_{agent}/completion_length"] = sum(t.lengths[agent] for t in turns) / len(turns)
    rewarded = [t.agent_rewards for t in turns if t.agent_rewards is not None]
    if rewarded:
        for agent in range(len(rewarded[0])):
            metrics[f"{prefix}agent_{agent}/reward_mean"] = sum(r[agent] for r in rewarded) / len(rewarded)
    return metrics


def pass_rate(items: Sequence[Sequence[Episode]], k: int, answer) -> float:
    """Mean pass@k over items; ``answer(episode)`` is the turn whose breakdown decides correctness."""
    counts = []
    for group in items:
        verdicts = [all_tests_passed(answer(episode).details) for episode in group]
        if any(v is None for v in verdicts):
            raise ValueError("pass@k needs the environment's breakdown with passed_tests and total_tests for every answer "
                             "(the code environments report them); evaluate with details=env.reward_details, or drop pass_k.")
        counts.append((len(group), sum(verdicts)))
    return mean_pass_at_k(counts, k)
