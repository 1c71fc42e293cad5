"""One step of the actor-critic family (IAC, MAAC, and MARLHF's actor-critic backends), top to bottom:

  1. rollout   episodes of a batch of items: rollout trees with one joint response per branch
               (multi-turn) or K one-step episodes of each prompt; one generate call per agent per turn
  2. values    every sample's critic estimate V(h_t) (or Q(h_t, a_t)): one no-grad forward per critic,
               each distinct critic input computed once
  3. targets   one-step TD targets and TD-error advantages per agent episode
  4. update    full buffers are drained together: per turn, advantages standardised per agent,
               shuffled minibatches of ``train_batch_size`` joint samples; per minibatch every actor
               takes one step (with its value head's loss, in shared-head IAC, from the same
               forward) and every separate critic takes one step on the samples of the agents it serves

Where the critics are and what they read is the ``CriticArrangement``'s (IAC or MAAC).
"""

from __future__ import annotations

import random
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists
from comlrl.models.loading import model_device
from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.tree import RolloutResult, TreeRollout
from comlrl.trainers.actor_critic.entities import CriticArrangement, CriticSet
from comlrl.trainers.actor_critic.rewards import AgentRewards
from comlrl.trainers.actor_critic.samples import NodeSamples, RolloutSample, assign_td_targets, build_node_samples, flat_samples
from comlrl.trainers.actor_critic.updates import SharedValueLoss, critic_step, normalized_advantages, rollout_values
from comlrl.trainers import reference_kl
from comlrl.trainers.reinforce.step import chunked
from comlrl.trainers.run import DatasetEpochs, Run, owner_view
from comlrl.trainers.update import PolicyRows, UpdateSettings, backward_policy_rows


def prefixed(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
    return {f"{prefix}{key}": value for key, value in metrics.items()}


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


class ActorCriticStep(DatasetEpochs):
    """The actor-critic step (see the module docstring). ``reward``: what training episodes are
    scored with (the task reward; MARLHF: its learned one); ``metrics_callback``: 1.4.x's per-item
    metrics of the samples."""

    rank_records = (RolloutSample,)

    def __init__(self, args: Any, run: Run, critics: CriticSet, arrangement: CriticArrangement, reward: RewardFunction,
                 metrics_callback: Any, name: str, team: Any = None):
        self.args = args
        self.run = owner_view(run)  # the run owns its step
        self.team = team if team is not None else run.team  # MARLHF: the actor-critic team over its agents
        self.critics = critics
        self.arrangement = arrangement
        self.reward = reward
        self.metrics_callback = metrics_callback
        self.name = name
        self.update_settings = UpdateSettings.from_config(args, has_references=bool(self.team.reference_models))
        self.buffers: List[List[RolloutSample]] = [[] for _ in range(self.team.num_agents)]
        self._warned_single_q_group = False

    # ------------------------------------------------------------------ the epoch's steps
    @staticmethod
    def items_for(args: Any) -> int:
        """Items whose samples fill one rollout buffer: K per node, over the nodes of a full tree
        (K per turn when K = 1 or there is one turn)."""
        k, turns = args.num_generations, args.num_turns
        per_item = k * sum(k**t for t in range(turns))
        return max(1, args.rollout_buffer_size // per_item)

    def items_per_step(self) -> int:
        return self.items_for(self.args)

    # ------------------------------------------------------------------ 1. rollout
    def tree(self, reward: RewardFunction, *, num_generations: int, greedy: bool) -> TreeRollout:
        """Episodes end early in evaluation too; reference KL is measured there when enabled."""
        a = self.args
        return self.run.tree(reward=AgentRewards(reward), num_generations=num_generations, joint_mode="aligned", greedy=greedy,
                             early_termination_threshold=a.early_termination_threshold, reference_kl=a.reference_kl_enabled)

    def train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        run, team = self.run, self.team
        k = self.args.num_generations
        start = run.state.env_step  # the same on every rank
        result = self.tree(self.reward, num_generations=k, greedy=False).run(items, run.state.env_step, item_ids=item_ids,
                                                                           step_seed=team.step_seed())
        run.state.env_step += team.dist.sum_int(result.env_steps)
        per_item = self.collect(result, training=True)
        samples = [s for item_samples in per_item for s in item_samples]
        for sample in samples:
            sample.policy_version = team.policies[sample.agent_idx].version
            sample.order = [start, *sample.order]
        run.metrics.record(self.rollout_metrics(samples))
        for item_samples in per_item:
            run.metrics.record(self.callback_metrics(item_samples))
        self.record_sample_signal(per_item, k)
        for agent in range(team.num_agents):
            self.buffers[agent].extend(s for s in samples if s.agent_idx == agent)
        if len(self.buffers[0]) >= team.per_rank(self.args.rollout_buffer_size, "rollout_buffer_size"):
            self.drain()

    def flush(self) -> None:
        if any(self.buffers):
            self.drain()

    # ------------------------------------------------------------------ 2-3. values and targets
    def collect(self, result: RolloutResult, *, training: bool) -> List[List[RolloutSample]]:
        """The samples of every item (all agents, all nodes), with values and TD targets when training.

        Order within an item: agent by agent; for each agent the tree's nodes in pre-order and the K
        samples of a node in order, so every agent's list is aligned (entry k of each is one joint sample).
        """
        a = self.args
        kl_coef = reference_kl.penalty_coef(a)
        critic_input = self.critic_input if training else None
        trees: List[List[NodeSamples]] = [
            [build_node_samples(agent, root, kl_coef=kl_coef, critic_input=critic_input) for root in result.roots]
            for agent in range(self.team.num_agents)
        ]
        per_item: List[List[RolloutSample]] = [[] for _ in result.roots]
        for agent_trees in trees:
            for root, tree in zip(result.roots, agent_trees):
                per_item[root.item_index].extend(flat_samples(tree))
        if training:
            self.assign_old_values([s for samples in per_item for s in samples])
            for agent_trees in trees:
                for tree in agent_trees:
                    assign_td_targets(tree, a.discount, a.critic_type)
        return per_item

    def critic_input(self, agent: int, node: Any, j: int, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        return self.arrangement.critic_input(self.team.tokenizers, agent, node, j, prompt_ids, completion_ids)

    def value_model(self, agent: int) -> Tuple[CausalLMWithValueHead, int]:
        slot = self.critics.of_agent[agent]
        if slot is None:
            return self.team.agents[agent], self.team.policies[agent].pad_id
        return self.critics.models[slot], self.critics.pad_ids[slot]

    def assign_old_values(self, samples: List[RolloutSample]) -> None:
        """``old_value`` of every sample: one batched no-grad forward per critic model."""
        groups: Dict[int, Tuple[CausalLMWithValueHead, int, List[RolloutSample]]] = {}
        for sample in samples:
            model, pad = self.value_model(sample.agent_idx)
            groups.setdefault(id(model), (model, pad, []))[2].append(sample)
        precision = self.team.precision
        for model, pad, group in groups.values():
            device = model_device(model)
            with self.team.unsharded([model]):  # one forward per distinct sequence: counts differ between ranks
                values = rollout_values(model, [s.critic_input_ids for s in group], pad, self.args.update_micro_batch_size,
                                        autocast=lambda device=device: precision.autocast(device))
            for sample, value in zip(group, values):
                sample.old_value = value.clone()

    # ------------------------------------------------------------------ metrics of the rollout
    def record_sample_signal(self, per_item: List[List[RolloutSample]], k: int) -> None:
        """Zero-signal groups: each (item, agent, turn)'s K samples, or with K = 1 each (agent, turn)'s
        samples over the step's items."""
        groups: Dict[Tuple[int, ...], List[RolloutSample]] = {}
        for index, samples in enumerate(per_item):
            for sample in samples:
                key = (sample.agent_idx, sample.turn_idx) if k == 1 else (index, sample.agent_idx, sample.turn_idx)
                groups.setdefault(key, []).append(sample)
        self.run.record_signal([[float(s.reward) for s in g] for g in groups.values()], [[s.completion for s in g] for g in groups.values()])

    def rollout_metrics(self, samples: Sequence[RolloutSample]) -> Dict[str, float]:
        """``turn_k/reward_mean``, ``turn_k/expected_return`` (+ reference-KL means), over agents."""
        metrics: Dict[str, float] = {}
        for turn in sorted({s.turn_idx for s in samples}):
            at = [s for s in samples if s.turn_idx == turn]
            metrics[f"turn_{turn + 1}/reward_mean"] = mean([float(s.reward) for s in at])
            metrics[f"turn_{turn + 1}/expected_return"] = mean([float(s.returns) for s in at])
            kls = [s.metadata for s in at if "reference_kl" in s.metadata]
            if kls:
                metrics[f"turn_{turn + 1}/reference_kl_mean"] = mean([m["reference_kl"] for m in kls])
                penalties = [m["reference_kl_penalty"] for m in kls if "reference_kl_penalty" in m]  # reward mode only
                if penalties:
                    metrics[f"turn_{turn + 1}/reference_kl_penalty_mean"] = mean(penalties)
        return metrics

    def callback_metrics(self, samples: List[RolloutSample]) -> Dict[str, float]:
        if self.metrics_callback is None:
            return {}
        extra = self.metrics_callback(samples)
        if not isinstance(extra, dict):
            return {}
        out = {}
        for key, value in extra.items():
            try:
                out[str(key)] = float(value)
            except (TypeError, ValueError):
                continue  # non-numeric entries are not metrics
        return out

    # ------------------------------------------------------------------ 4. update
    def drain(self) -> None:
        """Update on every buffered sample, turn by turn (see module docstring), then empty the buffers."""
        dist = self.team.dist
        buffers, self.buffers = self.buffers, [[] for _ in range(self.team.num_agents)]
        buffers = [self.global_buffer(buffer) for buffer in buffers]
        for turn in sorted({s.turn_idx for s in buffers[0]}):
            group = [[s for s in buffer if s.turn_idx == turn] for buffer in buffers]
            center = self.args.critic_type == "q" and self.args.num_generations == 1
            for samples in group:
                if center and len(samples) == 1:
                    self.warn_single_q_group(turn)
                advantages = normalized_advantages(samples, self.args.advantage_normalization, center_leave_one_out=center)
                for sample, advantage in zip(samples, advantages):
                    sample.normalized_advantage = advantage
            for _ in range(self.args.update_epochs):
                order = list(range(len(group[0])))
                random.shuffle(order)
                order = dist.broadcast_object(order)  # one permutation of the global buffer for every rank
                for minibatch in chunked(order, self.args.train_batch_size):
                    mine = dist.share(minibatch, "train_batch_size")  # this rank's share of the global minibatch
                    self.update_minibatch([[samples[k] for k in mine] for samples in group])

    def global_buffer(self, samples: List[RolloutSample]) -> List[RolloutSample]:
        """The whole run's buffer of which ``samples`` is this rank's block (every rank's samples
        exchanged), in ``RolloutSample.order``: one process and N data-parallel ones hold the same list."""
        everything = [s for block in self.team.dist.all_gather(samples) for s in block]
        return sorted(everything, key=lambda s: s.order)

    def warn_single_q_group(self, turn: int) -> None:
        if self._warned_single_q_group:
            return
        self._warned_single_q_group = True
        warnings.warn(
            f"{self.name}: a drained buffer holds one sample of turn {turn + 1} for an actor; with critic_type='q' "
            f"and num_generations=1 its advantage (Q minus the mean Q of the group's other samples) is exactly 0, so that "
            f"sample teaches its actor nothing. Raise rollout_buffer_size or num_generations. Shown once.",
            stacklevel=2,
        )

    def update_minibatch(self, batch: List[List[RolloutSample]]) -> None:
        """``batch[i]``: agent i's samples of the same joint samples. One step per actor, then one per
        distinct critic (each set concurrently with ``parallel_training="mp"``)."""
        team, metrics = self.team, self.run.metrics
        actor_rows = team.workers.map(lambda agent: self.actor_step(agent, batch[agent]), list(range(team.num_agents)))
        for agent, row in enumerate(actor_rows):
            metrics.record(prefixed(f"agent_{agent}/", row))
        jobs = self.critic_batches(batch)

        def critic_task(index: int) -> Dict[str, float]:
            slot, samples = jobs[index]
            critic = self.critics.models[slot]
            device = model_device(critic)
            label = f"{self.name} critic {slot} (env_step {self.run.state.env_step})"
            return critic_step(
                critic, self.critics.optimizers[slot], samples, pad_id=self.critics.pad_ids[slot], coef=self.args.value_loss_coef,
                clip_range=self.arrangement.value_clip_range, micro_batch_size=self.args.update_micro_batch_size, label=label,
                autocast=lambda: team.precision.autocast(device),
            )

        for (slot, _samples), row in zip(jobs, team.workers.map(critic_task, list(range(len(jobs))))):
            metrics.record(prefixed(self.arrangement.metric_prefix(slot), row))

    def critic_batches(self, batch: List[List[RolloutSample]]) -> List[Tuple[int, List[RolloutSample]]]:
        """Per distinct critic: its first slot and the samples of every agent it serves."""
        groups: Dict[int, Tuple[int, List[RolloutSample]]] = {}
        for agent, slot in enumerate(self.critics.of_agent):
            if slot is not None:
                groups.setdefault(id(self.critics.models[slot]), (slot, []))[1].extend(batch[agent])
        return list(groups.values())

    def actor_step(self, agent: int, samples: List[RolloutSample]) -> Dict[str, float]:
        """One policy-gradient step ``-mean_s A_s log pi(a_s | h_s)`` (+ the shared head's value loss),
        aggregated by the ``loss_type`` loss (the default, "sequence_sum", is that sum; "grpo" divides
        each sample's tokens by its length, and so on: the registry every family shares).

        A sample drawn before this actor's latest optimizer step (a later minibatch or pass over the
        same buffer) is importance-weighted with its sampling log-probs, clipped at
        ``importance_clip_range`` (``epsilon_high`` above); fresh samples take the plain on-policy loss.
        """
        a = self.args
        policy = self.team.policies[agent]
        rows = PolicyRows()
        for sample in samples:
            stale = sample.policy_version != policy.version
            rows.add(sample.prompt_ids, sample.completion_ids, float(sample.normalized_advantage), 1.0 / len(samples),
                     sample.old_token_logprobs, stale, sample.reference_token_logprobs)
        auxiliary = None
        if self.critics.of_agent[agent] is None:
            auxiliary = SharedValueLoss(self.team.agents[agent].value_head, samples, a.value_loss_coef, self.arrangement.value_clip_range,
                                        a.critic_type == "q")
        label = f"{self.name} agent {agent} (env_step {self.run.state.env_step})"
        metrics = backward_policy_rows(policy, rows, self.update_settings, label=label, sum_over_ranks=self.team.dist.sum_tensors,
                                       auxiliary=auxiliary).metrics()
        metrics["policy_loss"] = metrics.pop("loss")
        metrics["grad_norm"] = policy.optimizer.step(label)
        metrics["advantage_mean"] = mean([float(s.advantage) for s in samples])
        return metrics

    # ------------------------------------------------------------------ checkpoint contents
    def named_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        """Every optimizer once, by attribute path ("agent_optimizers.0", critic optimizers, ...)."""
        out = {f"agent_optimizers.{i}": opt for i, opt in enumerate(self.team.optimizers)}
        seen = set()
        for name, optimizer in self.arrangement.named_critic_optimizers([o.optimizer for o in self.critics.optimizers]):
            if id(optimizer) not in seen:
                seen.add(id(optimizer))
                out[name] = optimizer
        return out

    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        components.add_models("critics", self.critics.models)  # a critic shared by several slots is written once
        components.add_models("reference_models", self.team.saved_references())
        for name, optimizer in self.named_optimizers().items():
            components.add_optimizers(name, optimizer)
        buffers = AttributeState(self, "buffers")
        components.add_state("rollout_buffers", buffers, records=(RolloutSample,), check=per_agent_lists(self.team.num_agents, "rollout_buffers"))
