"""One step of the MAGRPO family (MAGRPO, MAREINFORCE, MARLOO, MAReMax, and MARLHF's group backends),
top to bottom:

  1. rollout   the trees of a batch of items: every agent samples K completions per node, one
               generate call per agent per tree level; one reward per joint response
  2. buffer    each (node, agent) group goes to that agent's rollout buffer (with DAPO's dynamic
               sampling only a group whose credited rewards differ: the buffer then fills from the
               next steps' items)
  3. credit    every full buffer is drained: per turn, the advantages of its groups
               (``GroupCredit``: baseline, normalisation, grouping, counterfactual credit)
  4. update    shuffled minibatches of ``train_batch_size`` groups, one batched forward/backward
               and one optimizer step each (``update.backward_policy_rows``); with
               ``sequential_updates`` a later agent's advantages carry the earlier agents' ratios
"""

from __future__ import annotations

import random
from typing import Any, Dict, Iterator, List, Optional

import torch

from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists
from comlrl.core.credit import sequential_ratio, zero_signal_fraction
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.sampling import draw_seeds
from comlrl.rollout.tree import GroupSample, RolloutResult, TreeRollout
from comlrl.trainers.reinforce.group_credit import GroupCredit
from comlrl.trainers.run import DatasetEpochs, Run, owner_view
from comlrl.trainers.update import PolicyRows, UpdateSettings, backward_policy_rows


def chunked(values: List[Any], size: int) -> Iterator[List[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def credit_metrics(minibatch: List[tuple]) -> Dict[str, float]:
    """The advantages' and returns' statistics of a minibatch of (sample, [K] advantages) pairs: taken
    over the whole (global) minibatch, so a data-parallel run logs what one process would (a rank's
    share alone has another spread)."""
    stacked = torch.cat([adv for _, adv in minibatch])
    return {"advantage_std": float(stacked.std(unbiased=False)) if stacked.numel() > 1 else 0.0,
            "advantage_abs_mean": float(stacked.abs().mean()),
            "frac_zero_signal_groups": zero_signal_fraction([adv for _, adv in minibatch]),
            "return_mean": float(torch.cat([s.returns for s, _ in minibatch]).mean())}


class GroupStep(DatasetEpochs):
    """The MAGRPO-family step (see the module docstring). ``reward``: what training rollouts are
    scored with (the task reward; MARLHF: its learned one)."""

    rank_records = (GroupSample,)

    def __init__(self, args: Any, run: Run, reward: RewardFunction, name: str):
        self.args = args
        self.run = owner_view(run)  # the run owns its step
        self.team = run.team
        self.reward = reward
        self.name = name
        self.credit = GroupCredit.from_config(args)
        self.update_settings = UpdateSettings.from_config(args, has_references=bool(self.team.reference_models),
                                                          overlong_filtering=args.overlong_filtering)
        self.buffers: List[List[GroupSample]] = [[] for _ in range(self.team.num_agents)]

    # ------------------------------------------------------------------ the epoch's steps
    @staticmethod
    def items_for(args: Any, num_agents: int) -> int:
        """Items whose groups fill ``buffers_per_generation`` rollout buffers: the nodes of a full tree
        (K^N per level in cross mode) per item."""
        width = args.num_generations ** (num_agents if args.joint_mode == "cross" else 1)
        nodes = sum(width**t for t in range(args.num_turns))
        return max(1, args.rollout_buffer_size * args.buffers_per_generation // nodes)

    def items_per_step(self) -> int:
        return self.items_for(self.args, self.team.num_agents)

    # ------------------------------------------------------------------ 1-2. rollout and buffers
    def tree(self) -> TreeRollout:
        a = self.args
        return self.run.tree(reward=self.reward, num_generations=a.num_generations, joint_mode=a.joint_mode, greedy=False,
                             early_termination_threshold=a.early_termination_threshold, reference_kl=a.reference_kl_enabled)

    def train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        run, team = self.run, self.team
        tree = self.tree()
        start = run.state.env_step  # the same on every rank
        result = tree.run(items, run.state.env_step, item_ids=item_ids, step_seed=team.step_seed())
        run.state.env_step += team.dist.sum_int(result.env_steps)
        self.record_rollout(result)
        self.record_tree_signal(tree, result)
        correlation = self.credit.correlation(result.samples, team.num_agents, self.args.num_generations)
        if correlation is not None:
            run.metrics.record({"agents/credit_correlation": correlation})
        for sample in self.kept(result.samples):
            sample.policy_version = team.policies[sample.agent_idx].version
            sample.order = [start, *sample.order]
            self.buffers[sample.agent_idx].append(sample)
        size = team.per_rank(self.args.rollout_buffer_size, "rollout_buffer_size")
        batches: List[List[List[GroupSample]]] = [[] for _ in self.buffers]
        for agent, buffer in enumerate(self.buffers):
            while len(buffer) >= size:
                batches[agent].append(buffer[:size])
                buffer = buffer[size:]
            self.buffers[agent] = buffer
        self.run_updates(batches)

    def kept(self, samples: List[GroupSample]) -> List[GroupSample]:
        """The groups that enter the buffers: all of them, or with ``dynamic_sampling`` those whose
        credited rewards differ (DAPO); the dropped fraction is logged."""
        if not self.args.dynamic_sampling:
            return samples
        kept = [s for s in samples if self.credit.carries_signal(s)]
        if samples:
            self.run.metrics.record({"dynamic_sampling/dropped_fraction": 1.0 - len(kept) / len(samples)})
        return kept

    def flush(self) -> None:
        batches = [[buffer] if buffer else [] for buffer in self.buffers]
        self.buffers = [[] for _ in self.buffers]
        self.run_updates(batches)

    def record_rollout(self, result: RolloutResult) -> None:
        metrics = dict(result.turn_metrics)
        if self.args.reference_kl_enabled:
            for turn in sorted({s.turn_idx for s in result.samples}):
                at = [s for s in result.samples if s.turn_idx == turn and s.reference_kl is not None]
                if at:
                    metrics[f"turn_{turn + 1}/reference_kl_mean"] = float(torch.cat([s.reference_kl for s in at]).mean())
                    if self.credit.kl_penalty is None:
                        continue
                    penalty = torch.cat([s.reference_log_ratio for s in at]).mean() * self.args.reference_kl_coef
                    metrics[f"turn_{turn + 1}/reference_kl_penalty_mean"] = float(penalty)
        self.run.metrics.record(metrics)

    def record_tree_signal(self, tree: TreeRollout, result: RolloutResult) -> None:
        """Groups of the zero-signal metrics: each node's credited returns (what the advantages are
        computed from) and each (node, agent)'s K completions."""
        nodes, stack = [], list(result.roots)
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        returns = [node.returns.tolist() for node in nodes]
        completions = [tree.texts(node, agent) for node in nodes for agent in range(self.team.num_agents)]
        self.run.record_signal(returns, completions)

    # ------------------------------------------------------------------ 3-4. credit and update
    def run_updates(self, batches: List[List[List[GroupSample]]]) -> None:
        """Drain ``batches[agent]`` (full buffers, in order) for every agent, concurrently with
        ``parallel_training="mp"``. Each drain shuffles with its own generator, seeded here in agent
        order, so both schedules compute the same numbers. With ``sequential_updates`` the agents
        drain in order and each later agent's advantages carry the earlier agents' ratios."""
        dist = self.team.dist
        seeds = [draw_seeds(len(agent_batches)) if agent_batches else [] for agent_batches in batches]
        seeds = dist.broadcast_object(seeds)  # every rank shuffles the global buffer alike
        batches = [[self.global_buffer(batch) for batch in agent_batches] for agent_batches in batches]
        factors: Optional[Dict[Any, torch.Tensor]] = {} if self.args.sequential_updates else None

        def task(agent: int) -> List[Dict[str, float]]:
            rows: List[Dict[str, float]] = []
            passes_on = factors is not None and agent < self.team.num_agents - 1  # a later agent reads its ratio
            before = self.sequence_logprobs(agent, batches[agent]) if passes_on else None
            for batch, seed in zip(batches[agent], seeds[agent]):
                rows.extend(self.update(agent, batch, random.Random(seed), factors))
            if before is not None:
                after = self.sequence_logprobs(agent, batches[agent])
                for key, old in before.items():
                    ratio = sequential_ratio(after[key], old, self.args.importance_clip_range)
                    factors[key[0]] = factors.get(key[0], torch.ones_like(ratio)) * ratio
            return rows

        agents = [agent for agent, agent_batches in enumerate(batches) if agent_batches]
        runs = map(task, agents) if factors is not None else self.team.workers.map(task, agents)
        for rows in runs:
            for row in rows:
                self.run.metrics.record(row)

    def global_buffer(self, samples: List[GroupSample]) -> List[GroupSample]:
        """The whole run's buffer of which ``samples`` is this rank's block (every rank's groups, token
        ids, returns and log-probs exchanged), in the order of ``GroupSample.order``: one process and
        N data-parallel ones hold the same list."""
        everything = [s for block in self.team.dist.all_gather(samples) for s in block]
        return sorted(everything, key=lambda s: s.order)

    def sequence_logprobs(self, agent: int, buffers: List[List[GroupSample]]) -> Dict[Any, torch.Tensor]:
        """``{(node_key, turn): [K] log pi(completion)}`` of the agent's samples under its current policy."""
        policy = self.team.policies[agent]
        out: Dict[Any, torch.Tensor] = {}
        for sample in (s for buffer in buffers for s in buffer):
            prompts = [sample.prompt_ids] * len(sample.completion_ids)
            token_logprobs = policy.token_logprobs(policy.model, prompts, sample.completion_ids, self.args.temperature)
            out[(sample.node_key, sample.turn_idx)] = token_logprobs.sum(dim=-1)
        return out

    def update(self, agent: int, samples: List[GroupSample], rng: random.Random,
               factors: Optional[Dict[Any, torch.Tensor]] = None) -> List[Dict[str, float]]:
        """Per turn (ascending): the turn's advantages over the global buffer ``samples``, shuffle, split
        into minibatches of ``train_batch_size`` groups, one optimizer step per minibatch (each
        data-parallel rank takes its share of every minibatch, their gradients averaged); returns each
        step's metrics. ``factors`` holds the earlier agents' ratios of a sequential update, by node."""
        rows = []
        for turn in sorted({s.turn_idx for s in samples}):
            group = [s for s in samples if s.turn_idx == turn]
            advantages = self.credit.advantages(group)
            if factors is not None:
                advantages = [a * factors[s.node_key].to(a.dtype) if s.node_key in factors else a for s, a in zip(group, advantages)]
            pairs = list(zip(group, advantages))
            rng.shuffle(pairs)
            for minibatch in chunked(pairs, self.args.train_batch_size):
                share = self.team.dist.share(list(minibatch), "train_batch_size")
                metrics = self.policy_step(agent, share)
                metrics.update(credit_metrics(minibatch))  # over the global minibatch: every rank logs the same
                if factors:
                    carried = [factors.get(s.node_key, a.new_ones(a.shape)) for s, a in minibatch]
                    metrics["sequential_factor_mean"] = float(torch.cat(carried).mean())
                rows.append({f"agent_{agent}/{k}": v for k, v in metrics.items()})
        return rows

    def policy_step(self, agent: int, minibatch: List[tuple]) -> Dict[str, float]:
        """One optimizer step on ``minibatch`` ((sample, [K] advantages) pairs): the mean over groups of
        the mean over their completions of the ``loss_type`` loss (1.4.3: ``-A * log pi(completion)``).

        A group drawn before this agent's latest optimizer step (a leftover of an earlier buffer, a
        later turn, a later minibatch of the same buffer, or a later buffer of one generation call) is
        stale: its completions are importance-weighted with the log-probs recorded while sampling and
        clipped at ``importance_clip_range`` (``epsilon_high`` above). Fresh groups take the plain
        on-policy loss.
        """
        policy = self.team.policies[agent]
        rows = PolicyRows()
        for sample, advantages in minibatch:
            weight = 1.0 / (len(sample.completion_ids) * len(minibatch))
            stale = sample.policy_version != policy.version
            for k, completion in enumerate(sample.completion_ids):
                old = sample.old_logprobs[k] if sample.old_logprobs is not None else None
                reference = sample.reference_logprobs[k] if sample.reference_logprobs is not None else None
                rows.add(sample.prompt_ids, completion, float(advantages[k]), weight, old, stale, reference)
        label = f"{self.name} agent {agent} (env_step {self.run.state.env_step})"
        metrics = backward_policy_rows(policy, rows, self.update_settings, label=label, sum_over_ranks=self.team.dist.sum_tensors).metrics()
        metrics["grad_norm"] = policy.optimizer.step(label)  # before clipping
        return metrics

    # ------------------------------------------------------------------ checkpoint contents
    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        components.add_models("reference_models", self.team.saved_references())
        components.add_optimizers("optimizers", self.team.optimizers)
        buffers = AttributeState(self, "buffers")
        components.add_state("rollout_buffers", buffers, records=(GroupSample,), check=per_agent_lists(self.team.num_agents, "rollout_buffers"))
