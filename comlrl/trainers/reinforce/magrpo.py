"""MAGRPO: every agent samples K completions per prompt, joint responses share one reward, and each
agent follows the policy gradient of its completions' advantages against their group.

One training step (``_train_step``):
  1. rollout   the trees of a batch of items, one generate call per agent per tree level
  2. buffer    each (node, agent) group goes to that agent's rollout buffer
  3. update    every full buffer is drained: per turn, shuffled minibatches of ``train_batch_size``
               groups, one batched forward/backward and one optimizer step each
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional

import torch

from comlrl.core.credit import sequential_ratio, zero_signal_fraction
from comlrl.models.entities import load_agents
from comlrl.models.loading import check_model_config
from comlrl.models.lora import normalize_peft_configs
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.sampling import draw_seeds
from comlrl.rollout.tree import GroupSample, RolloutResult, TreeRollout
from comlrl.trainers.base import TrainerBase, chunked
from comlrl.trainers.construction import bind_task, plan_team
from comlrl.trainers.policy import PolicyRows, backward_policy_rows
from comlrl.trainers.reinforce.config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists
from comlrl.telemetry.progress import library_bars
from comlrl.telemetry.wandb_sink import check_wandb_ready
from comlrl.trainers.reinforce.credit import credit_correlation, kl_in_reward, turn_advantages

# The record a rollout buffer holds (CoMLRL 1.4.3 name).
NodeSample = GroupSample


class MAGRPOTrainer(TrainerBase):
    """Multi-Agent GRPO trainer (see the module docstring and ``MAGRPOConfig``).

    Agents: ``agent_model`` (an id or directory) with ``num_agents`` for identical independent copies,
    or ``agents`` (ids, directories or loaded models, one per agent). ``tokenizer`` is one tokenizer
    for all agents or a list with one per agent; it may be omitted when every agent is given by id.
    ``peft_config`` (one peft config for all agents, or a list with one entry or None per agent)
    trains LoRA adapters instead of full weights; agents of the same base share it (docs/gpu.md).
    """

    default_config_cls = MAGRPOConfig
    config_family = MAGRPOConfig
    algorithm_name = "MAGRPO"

    def __init__(
        self,
        agent_model: Any = None,
        agents: Optional[List[Any]] = None,
        num_agents: Optional[int] = None,
        tokenizer: Any = None,
        model_config: Optional[Dict[str, Any]] = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Any = None,
        reward_processor: Any = None,
        formatters: Any = None,
        external_transition: Any = None,
        wandb_config: Optional[Dict[str, Any]] = None,
        eval_logger: Any = None,
        eval_aggregator: Any = None,
        args: Optional[MAGRPOConfig] = None,
        peft_config: Any = None,
    ):
        args = self._resolve_args(args)
        if type(args) is MAGRPOConfig and not args.is_explicit("advantage_mode"):
            args.advantage_mode = self.default_config_cls.advantage_mode
        if agent_model is None and agents is None:
            raise ValueError("Either agent_model or agents must be provided (a model id, a directory, or a list of them).")
        count, plan = plan_team(args, agent_model, agents, num_agents, tokenizer)
        train_dataset, eval_dataset = bind_task(
            self, count, formatters=formatters, train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, pass_none_external_prompts=False, max_new_tokens=args.max_new_tokens)
        self._check_transition(args, external_transition, "MAGRPO")
        for name, value in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if value is not None and not callable(value):
                raise ValueError(f"{name} must be callable, got {type(value).__name__}.")
        model_config = check_model_config(model_config)
        peft_configs = normalize_peft_configs(peft_config, count)
        self.args = args
        self._join_data_parallel(args)
        check_wandb_ready(wandb_config)  # a missing login is one line now, not a traceback after loading
        self.agent_devices = self._model_devices(args.agent_devices, count, "agent_devices")
        reference_devices = self._reference_devices(self.agent_devices)

        options = self._load_options(model_config)

        self.num_agents = count
        self.model_name = plan.model_name
        with library_bars(self.console_enabled(args, wandb_config)):
            self.agents, self.tokenizers = load_agents(plan, model_config, self.agent_devices, options, peft_configs, self._lora,
                                                       self.prompt_check)
            self.tokenizer = self.tokenizers[0]
            self._build_policies(self.agents, self.agents, plan.sources, reference_devices)
        self.optimizers = [policy.optimizer.optimizer for policy in self.policies]
        self._store_task(train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
                         reward_processor=reward_processor, external_transition=external_transition)
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.rollout_buffers: List[List[GroupSample]] = [[] for _ in range(count)]
        self._init_services(wandb_config, self._wandb_run_config())

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        return {
            "model_name": self.model_name, "num_agents": self.num_agents, "num_turns": a.num_turns,
            "algorithm": self.algorithm_name, "advantage_mode": a.advantage_mode,
            "advantage_normalization": a.advantage_normalization, "reference_kl_enabled": a.reference_kl_enabled,
            "reference_kl_coef": a.reference_kl_coef, "reference_devices": a.reference_devices,
            "agent_learning_rate": a.agent_learning_rate, "num_train_epochs": a.num_train_epochs,
            "max_new_tokens": a.max_new_tokens, "num_generations": a.num_generations,
        }

    def _rank_records(self) -> tuple:
        return (GroupSample,)

    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        components.add_models("reference_models", self._saved_references())
        components.add_optimizers("optimizers", self.optimizers)
        buffers = AttributeState(self, "rollout_buffers")
        components.add_state("rollout_buffers", buffers, records=(GroupSample,), check=per_agent_lists(self.num_agents, "rollout_buffers"))
        components.add_state("reward_per_response", AttributeState(self.reward, "per_response"))
        callbacks = {**self._user_callbacks(), "eval_logger": self.eval_logger, "eval_aggregator": self.eval_aggregator}
        return components.add_callbacks(callbacks)

    # ------------------------------------------------------------------ rollout
    def _tree(self, *, num_generations: int, greedy: bool = False, training: bool = True) -> TreeRollout:
        a = self.args
        return self._rollout_tree(
            reward=self._rollout_reward(training), num_generations=num_generations, joint_mode=a.joint_mode, greedy=greedy,
            early_termination_threshold=a.early_termination_threshold if training else None,
            reference_kl=training and a.reference_kl_enabled,
        )

    def _rollout_reward(self, training: bool) -> RewardFunction:
        """The reward rollouts are scored with (MARLHF trains on a learned one, evaluates on the task's)."""
        return self.reward

    def _nodes_per_tree(self) -> int:
        a = self.args
        width = a.num_generations ** (self.num_agents if a.joint_mode == "cross" else 1)
        return sum(width**t for t in range(a.num_turns))

    def _items_per_step(self) -> int:
        groups = self.args.rollout_buffer_size * self.args.buffers_per_generation
        return max(1, groups // self._nodes_per_tree())

    def _train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        tree = self._tree(num_generations=self.args.num_generations)
        start = self.env_step  # the same on every rank
        result = tree.run(items, self.env_step, item_ids=item_ids, step_seed=self._step_seed())
        self.env_step += self._dist.sum_int(result.env_steps)
        self._record_rollout(result)
        self._record_tree_signal(tree, result)
        correlation = credit_correlation(result.samples, self.args, self.num_agents, self.args.num_generations)
        if correlation is not None:
            self.metrics.record({"agents/credit_correlation": correlation})
        for sample in result.samples:
            sample.policy_version = self.policies[sample.agent_idx].version
            sample.order = [start, *sample.order]
            self.rollout_buffers[sample.agent_idx].append(sample)
        size = self._per_rank(self.args.rollout_buffer_size, "rollout_buffer_size")
        batches: List[List[List[GroupSample]]] = [[] for _ in self.rollout_buffers]
        for agent, buffer in enumerate(self.rollout_buffers):
            while len(buffer) >= size:
                batches[agent].append(buffer[:size])
                buffer = buffer[size:]
            self.rollout_buffers[agent] = buffer
        self._run_updates(batches)

    def _run_updates(self, batches: List[List[List[GroupSample]]]) -> None:
        """Drain ``batches[agent]`` (full buffers, in order) for every agent, concurrently with
        ``parallel_training="mp"``. Each drain shuffles with its own generator, seeded here in agent
        order, so both schedules compute the same numbers. With ``sequential_updates`` the agents
        drain in order and each later agent's advantages carry the earlier agents' ratios."""
        seeds = [draw_seeds(len(agent_batches)) if agent_batches else [] for agent_batches in batches]
        seeds = self._dist.broadcast_object(seeds)  # every rank shuffles the global buffer alike
        batches = [[self._global_buffer(batch) for batch in agent_batches] for agent_batches in batches]
        factors: Optional[Dict[Any, torch.Tensor]] = {} if self.args.sequential_updates else None

        def task(agent: int) -> List[Dict[str, float]]:
            rows: List[Dict[str, float]] = []
            passes_on = factors is not None and agent < self.num_agents - 1  # a later agent reads its ratio
            before = self._sequence_logprobs(agent, batches[agent]) if passes_on else None
            for batch, seed in zip(batches[agent], seeds[agent]):
                rows.extend(self._update(agent, batch, random.Random(seed), factors))
            if before is not None:
                after = self._sequence_logprobs(agent, batches[agent])
                for key, old in before.items():
                    ratio = sequential_ratio(after[key], old, self.args.importance_clip_range)
                    factors[key[0]] = factors.get(key[0], torch.ones_like(ratio)) * ratio
            return rows

        agents = [agent for agent, agent_batches in enumerate(batches) if agent_batches]
        runs = map(task, agents) if factors is not None else self._workers.map(task, agents)
        for rows in runs:
            for row in rows:
                self.metrics.record(row)

    def _sequence_logprobs(self, agent: int, buffers: List[List[GroupSample]]) -> Dict[Any, torch.Tensor]:
        """``{(node_key, turn): [K] log pi(completion)}`` of the agent's samples under its current policy."""
        policy = self.policies[agent]
        out: Dict[Any, torch.Tensor] = {}
        for sample in (s for buffer in buffers for s in buffer):
            prompts = [sample.prompt_ids] * len(sample.completion_ids)
            token_logprobs = policy.token_logprobs(policy.model, prompts, sample.completion_ids, self.args.temperature)
            out[(sample.node_key, sample.turn_idx)] = token_logprobs.sum(dim=-1)
        return out

    def _record_rollout(self, result: RolloutResult) -> None:
        metrics = dict(result.turn_metrics)
        if self.args.reference_kl_enabled:
            for turn in sorted({s.turn_idx for s in result.samples}):
                at = [s for s in result.samples if s.turn_idx == turn and s.reference_kl is not None]
                if at:
                    metrics[f"turn_{turn + 1}/reference_kl_mean"] = float(torch.cat([s.reference_kl for s in at]).mean())
                    if not self._kl_in_reward():
                        continue
                    penalty = torch.cat([s.reference_log_ratio for s in at]).mean() * self.args.reference_kl_coef
                    metrics[f"turn_{turn + 1}/reference_kl_penalty_mean"] = float(penalty)
        self.metrics.record(metrics)

    def _record_tree_signal(self, tree: TreeRollout, result: RolloutResult) -> None:
        """Groups of the zero-signal metrics: each node's credited returns (what the advantages are
        computed from) and each (node, agent)'s K completions."""
        nodes, stack = [], list(result.roots)
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        returns = [node.returns.tolist() for node in nodes]
        completions = [tree.texts(node, agent) for node in nodes for agent in range(self.num_agents)]
        self._record_signal(returns, completions)

    def _flush_buffers(self) -> None:
        batches = [[buffer] if buffer else [] for buffer in self.rollout_buffers]
        self.rollout_buffers = [[] for _ in self.rollout_buffers]
        self._run_updates(batches)

    # ------------------------------------------------------------------ update
    def _kl_in_reward(self) -> bool:
        return kl_in_reward(self.args)

    def _kl_loss_coef(self) -> Optional[float]:
        """The coefficient of the per-token KL loss term (None unless ``reference_kl_mode="loss"``)."""
        a = self.args
        return a.reference_kl_coef if a.reference_kl_enabled and a.reference_kl_mode == "loss" and self.reference_models else None

    def _global_buffer(self, samples: List[GroupSample]) -> List[GroupSample]:
        """The whole run's buffer of which ``samples`` is this rank's block (every rank's groups, token
        ids, returns and log-probs exchanged), in the order of ``GroupSample.order``: one process and
        N data-parallel ones hold the same list."""
        everything = [s for block in self._dist.all_gather(samples) for s in block]
        return sorted(everything, key=lambda s: s.order)

    def _update(self, agent: int, samples: List[GroupSample], rng: random.Random,
                factors: Optional[Dict[Any, torch.Tensor]] = None) -> List[Dict[str, float]]:
        """Per turn (ascending): the turn's advantages over the global buffer ``samples``
        (``credit.turn_advantages``), shuffle, split into minibatches of ``train_batch_size`` groups, one
        optimizer step per minibatch (each data-parallel rank takes its share of every minibatch, their
        gradients averaged); returns each step's metrics. ``factors`` holds the earlier agents' ratios of
        a sequential update, by node."""
        rows = []
        for turn in sorted({s.turn_idx for s in samples}):
            group = [s for s in samples if s.turn_idx == turn]
            advantages = turn_advantages(group, self.args)
            if factors is not None:
                advantages = [a * factors[s.node_key].to(a.dtype) if s.node_key in factors else a for s, a in zip(group, advantages)]
            pairs = list(zip(group, advantages))
            rng.shuffle(pairs)
            for minibatch in chunked(pairs, self.args.train_batch_size):
                share = self._dist.share(list(minibatch), "train_batch_size")
                metrics = self._policy_step(agent, share)
                if factors:
                    metrics["sequential_factor_mean"] = float(torch.cat([factors.get(s.node_key, a.new_ones(a.shape)) for s, a in share]).mean())
                rows.append({f"agent_{agent}/{k}": v for k, v in metrics.items()})
        return rows

    def _policy_step(self, agent: int, minibatch: List[tuple]) -> Dict[str, float]:
        """Mean over groups of the mean over their completions of the ``loss_type`` loss (1.4.3:
        ``-A * log pi(completion)``); ``minibatch`` holds (sample, [K] advantages) pairs.

        A group drawn before this agent's latest optimizer step (a leftover of an earlier buffer, a
        later turn, a later minibatch of the same buffer, or a later buffer of one generation call) is
        stale: its completions are importance-weighted with the log-probs recorded while sampling and
        clipped at ``importance_clip_range`` (``epsilon_high`` above). Fresh groups take the plain
        on-policy loss.
        """
        policy = self.policies[agent]
        rows = PolicyRows()
        for sample, advantages in minibatch:
            weight = 1.0 / (len(sample.completion_ids) * len(minibatch))
            stale = sample.policy_version != policy.version
            for k, completion in enumerate(sample.completion_ids):
                old = sample.old_logprobs[k] if sample.old_logprobs is not None else None
                reference = sample.reference_logprobs[k] if sample.reference_logprobs is not None else None
                rows.add(sample.prompt_ids, completion, float(advantages[k]), weight, old, stale, reference)
        label = f"{self.algorithm_name} agent {agent} (env_step {self.env_step})"
        a = self.args
        metrics = backward_policy_rows(
            policy, rows, temperature=a.temperature, clip_range=a.importance_clip_range,
            micro_batch_size=a.update_micro_batch_size, label=label, kl_coef=self._kl_loss_coef(), loss_type=a.loss_type,
            clip_high=a.epsilon_high, max_length=a.max_new_tokens, batch_tokens=self._step_tokens(rows) if a.loss_type == "dapo" else None,
        )
        metrics["grad_norm"] = policy.optimizer.step(label)  # before clipping
        stacked = torch.cat([adv for _, adv in minibatch])
        metrics["advantage_std"] = float(stacked.std(unbiased=False)) if stacked.numel() > 1 else 0.0
        metrics["advantage_abs_mean"] = float(stacked.abs().mean())
        metrics["frac_zero_signal_groups"] = zero_signal_fraction([adv for _, adv in minibatch])
        metrics["return_mean"] = float(torch.cat([s.returns for s, _ in minibatch]).mean())
        return metrics

    def _step_tokens(self, rows: PolicyRows) -> float:
        """DAPO's normaliser: real tokens per row over the step's rows on every data-parallel rank."""
        tokens, count = self._dist.sum_tensors(torch.tensor([float(sum(len(c) for c in rows.completions))]),
                                               torch.tensor([float(len(rows))]))
        return float(tokens[0]) / max(float(count[0]), 1.0)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """One greedy response per agent per turn on up to ``num_eval_samples`` eval items.

        Returns ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return`` (plus the keys of
        ``eval_aggregator``); an empty dict without an eval dataset or with 0 samples.
        """
        items = self._evaluation_items(num_eval_samples)
        if not items:
            return {}
        tree = self._tree(num_generations=1, greedy=True, training=False)
        rewards: Dict[int, List[float]] = {}
        returns: Dict[int, List[float]] = {}
        completions = [[[] for _ in items] for _ in range(self.num_agents)]  # [agent][item][turn]
        for start in range(0, len(items), self.args.eval_batch_size):
            batch = items[start : start + self.args.eval_batch_size]
            result = tree.run(batch)
            for root in result.roots:
                node = root
                while node is not None:
                    rewards.setdefault(node.turn, []).append(float(node.rewards[0]))
                    returns.setdefault(node.turn, []).append(float(node.returns[0]))
                    for agent in range(self.num_agents):
                        completions[agent][start + root.item_index].append(tree.texts(node, agent)[0])
                    node = node.children.get(0)
        metrics: Dict[str, float] = {}
        for turn in sorted(rewards):
            metrics[f"eval/turn_{turn + 1}/reward_mean"] = sum(rewards[turn]) / len(rewards[turn])
            metrics[f"eval/turn_{turn + 1}/expected_return"] = sum(returns[turn]) / len(returns[turn])
        if self.eval_logger is not None and self.eval_aggregator is not None:
            per_item = self.eval_logger(
                agent_completions_turns=completions,
                batch_items=items,
                prompts=[item.get("prompt", "") if hasattr(item, "get") else "" for item in items],
            )
            aggregated = self.eval_aggregator(per_item, num_turns=self.args.num_turns)
            for key, value in (aggregated or {}).items():
                metrics[key if key.startswith("eval/") else f"eval/{key}"] = float(value)
        self.metrics.write(metrics, self.env_step)
        return metrics


class MAREINFORCETrainer(MAGRPOTrainer):
    """MAGRPO with ``advantage_mode="raw"`` by default (no baseline)."""

    default_config_cls = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


class MARLOOTrainer(MAGRPOTrainer):
    """MAGRPO with the leave-one-out baseline by default."""

    default_config_cls = MARLOOConfig
    algorithm_name = "MARLOO"


class MAReMaxTrainer(MAGRPOTrainer):
    """MAGRPO with the group-max baseline by default."""

    default_config_cls = MAReMaxConfig
    algorithm_name = "MAReMax"
