"""Evaluation of the MAGRPO family, MADPO and MARLHF's group backends (``GroupEvaluation``): episodes
of one response per agent per turn on the eval items, scored with the task reward, through the
evaluation engine (``comlrl.trainers.evaluation``). ``evaluate`` is training's greedy evaluation;
``report`` takes any ``EvalSettings`` (``comlrl eval``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.eval_metrics import extra_metrics
from comlrl.trainers.evaluation import TRAINING, DetailsFn, EvalReport, EvalSettings, Episode, run_episodes, turn_metrics
from comlrl.trainers.run import Run, logged_evaluation


class GroupEvaluation:
    """Evaluation over the eval dataset (``reward``: the task reward; ``hooks``: the object whose
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
        return logged_evaluation(self.run, self.report, num_eval_samples)

    def report(self, items: Sequence[Any], settings: EvalSettings = TRAINING, details: Optional[DetailsFn] = None) -> EvalReport:
        """The episodes of ``items`` as ``settings`` asks and their metrics (nothing is logged)."""
        run, args = self.run, self.run.args

        def make_tree(greedy: bool):
            return run.tree(reward=self.reward, num_generations=1, joint_mode=args.joint_mode, greedy=greedy,
                            early_termination_threshold=None, reference_kl=False)

        episodes = run_episodes(make_tree, items, settings, args.eval_batch_size, details=details)
        metrics = {f"eval/{key}": value for key, value in turn_metrics(episodes).items()}
        metrics.update(self._aggregated(episodes))
        metrics.update({f"eval/{key}": value for key, value in extra_metrics(episodes, settings).items()})
        return EvalReport(episodes, metrics)

    def _aggregated(self, episodes: List[Episode]) -> Dict[str, float]:
        """``eval_aggregator(eval_logger(...))`` as ``eval/<key>`` metrics (nothing without both); the
        logger sees ``[agent][episode][turn]`` completions, one episode per item unless sampled."""
        eval_logger = getattr(self.hooks, "eval_logger", None)
        eval_aggregator = getattr(self.hooks, "eval_aggregator", None)
        if eval_logger is None or eval_aggregator is None:
            return {}
        num_agents = self.run.team.num_agents
        completions = [[[turn.completions[agent] for turn in episode.turns] for episode in episodes] for agent in range(num_agents)]
        items = [episode.item for episode in episodes]
        per_item = eval_logger(
            agent_completions_turns=completions, batch_items=items,
            prompts=[item.get("prompt", "") if hasattr(item, "get") else "" for item in items],
        )
        aggregated = eval_aggregator(per_item, num_turns=self.run.args.num_turns)
        return {key if key.startswith("eval/") else f"eval/{key}": float(value) for key, value in (aggregated or {}).items()}
