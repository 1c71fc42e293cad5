"""Evaluation of the actor-critic family: one greedy response per agent per turn, episodes ending
early as in training, scored with the task reward (``ActorCriticEvaluation``). No critic runs."""

from __future__ import annotations

from typing import Dict, List, Optional

from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.actor_critic.samples import RolloutSample
from comlrl.trainers.actor_critic.step import ActorCriticStep, mean, prefixed
from comlrl.trainers.run import evaluation_items


class ActorCriticEvaluation:
    """Greedy evaluation of ``step``'s team with ``reward`` (the task reward)."""

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
        step, run = self.step, self.step.run
        items = evaluation_items(run.args, run.task.eval_dataset, num_eval_samples)
        if not items:
            return {}
        tree = step.tree(self.reward, num_generations=1, greedy=True)
        per_item: List[List[RolloutSample]] = []
        batch = run.args.eval_batch_size
        for start in range(0, len(items), batch):
            per_item.extend(step.collect(tree.run(items[start : start + batch]), training=False))
        metrics = prefixed("eval/", step.rollout_metrics([s for samples in per_item for s in samples]))
        callback_values: Dict[str, List[float]] = {}
        for samples in per_item:
            for key, value in step.callback_metrics(samples).items():
                callback_values.setdefault(key, []).append(value)
        metrics.update({f"eval/{key}": mean(values) for key, values in callback_values.items()})
        run.metrics.write(metrics, run.state.env_step)
        return metrics
