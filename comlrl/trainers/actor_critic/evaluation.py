"""Evaluation of the actor-critic family (``ActorCriticEvaluation``): one response per agent per
turn, episodes ending early as in training, scored with the task reward, through the evaluation
engine (``comlrl.trainers.evaluation``). No critic runs. ``evaluate`` is training's greedy
evaluation; ``report`` takes any ``EvalSettings`` (``comlrl eval``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.actor_critic.step import ActorCriticStep, mean, prefixed
from comlrl.trainers.eval_metrics import extra_metrics
from comlrl.trainers.evaluation import TRAINING, DetailsFn, EvalReport, EvalSettings, run_episodes
from comlrl.trainers.run import logged_evaluation


class ActorCriticEvaluation:
    """Evaluation of ``step``'s team with ``reward`` (the task reward)."""

    def __init__(self, step: ActorCriticStep, reward: RewardFunction):
        self.step = step
        self.reward = reward

    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """One greedy response per agent per turn on up to ``num_eval_samples`` eval items
        (default ``eval_num_samples``), episodes ending early as in training.

        Returns ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return`` (+ reference-KL means
        when enabled) and ``eval/<key>`` for each ``metrics_callback`` key, averaged over items; an
        empty dict without an eval dataset or with 0 samples. No critic or extra forward runs.
        """
        return logged_evaluation(self.step.run, self.report, num_eval_samples)

    def report(self, items: Sequence[Any], settings: EvalSettings = TRAINING, details: Optional[DetailsFn] = None) -> EvalReport:
        """The episodes of ``items`` as ``settings`` asks and their metrics (nothing is logged);
        ``metrics_callback`` sees each episode's samples."""
        step = self.step
        per_episode: List[List[RolloutSample]] = []
        episodes = run_episodes(lambda greedy: step.tree(self.reward, num_generations=1, greedy=greedy), items, settings,
                                step.run.args.eval_batch_size, observe=lambda result: per_episode.extend(step.collect(result, training=False)),
                                details=details)
        metrics = prefixed("eval/", step.rollout_metrics([s for samples in per_episode for s in samples]))
        callback_values: Dict[str, List[float]] = {}
        for samples in per_episode:
            for key, value in step.callback_metrics(samples).items():
                callback_values.setdefault(key, []).append(value)
        metrics.update({f"eval/{key}": mean(values) for key, values in callback_values.items()})
        metrics.update(prefixed("eval/", extra_metrics(episodes, settings)))
        return EvalReport(episodes, metrics)
