"""Evaluation of the MAGRPO family, MADPO and MARLHF's group backends: one greedy response per agent
per turn on the eval items, scored with the task reward (``GroupEvaluation``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.run import Run, evaluation_items


class GroupEvaluation:
    """Greedy evaluation over the eval dataset (``reward``: the task reward; ``hooks``: the object whose
    ``eval_logger`` / ``eval_aggregator`` attributes, CoMLRL 1.4.x's per-item logger and its
    aggregation, are read at each evaluation: the trainer, whose user may set them at any time)."""

    def __init__(self, run: Run, reward: RewardFunction, hooks: Any = None):
        self.run = run
        self.reward = reward
        self.hooks = hooks

    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """One greedy response per agent per turn on up to ``num_eval_samples`` eval items.

        Returns ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return`` (plus the keys of
        ``eval_aggregator``); an empty dict without an eval dataset or with 0 samples.
        """
        run = self.run
        args = run.args
        items = evaluation_items(args, run.task.eval_dataset, num_eval_samples)
        if not items:
            return {}
        tree = run.tree(reward=self.reward, num_generations=1, joint_mode=args.joint_mode, greedy=True,
                        early_termination_threshold=None, reference_kl=False)
        num_agents = run.team.num_agents
        rewards: Dict[int, List[float]] = {}
        returns: Dict[int, List[float]] = {}
        completions = [[[] for _ in items] for _ in range(num_agents)]  # [agent][item][turn]
        for start in range(0, len(items), args.eval_batch_size):
            result = tree.run(items[start : start + args.eval_batch_size])
            for root in result.roots:
                node = root
                while node is not None:
                    rewards.setdefault(node.turn, []).append(float(node.rewards[0]))
                    returns.setdefault(node.turn, []).append(float(node.returns[0]))
                    for agent in range(num_agents):
                        completions[agent][start + root.item_index].append(tree.texts(node, agent)[0])
                    node = node.children.get(0)
        metrics: Dict[str, float] = {}
        for turn in sorted(rewards):
            metrics[f"eval/turn_{turn + 1}/reward_mean"] = sum(rewards[turn]) / len(rewards[turn])
            metrics[f"eval/turn_{turn + 1}/expected_return"] = sum(returns[turn]) / len(returns[turn])
        metrics.update(self._aggregated(completions, items))
        run.metrics.write(metrics, run.state.env_step)
        return metrics

    def _aggregated(self, completions: List[List[List[str]]], items: List[Any]) -> Dict[str, float]:
        """``eval_aggregator(eval_logger(...))`` as ``eval/<key>`` metrics (nothing without both)."""
        logger = self.hooks.eval_logger if self.hooks is not None else None
        aggregator = self.hooks.eval_aggregator if self.hooks is not None else None
        if logger is None or aggregator is None:
            return {}
        per_item = logger(
            agent_completions_turns=completions, batch_items=items,
            prompts=[item.get("prompt", "") if hasattr(item, "get") else "" for item in items],
        )
        aggregated = aggregator(per_item, num_turns=self.run.args.num_turns)
        return {key if key.startswith("eval/") else f"eval/{key}": float(value) for key, value in (aggregated or {}).items()}
