"""The actor-critic loop IAC and MAAC share; they differ only in where their critics are and what
the critics read.

One training step (``_train_step``):
  1. rollout   episodes of a batch of items: rollout trees with one joint response per branch
               (multi-turn) or K one-step episodes of each prompt; one generate call per agent per turn
  2. values    every sample's critic estimate V(h_t) (or Q(h_t, a_t)): one no-grad forward per critic,
               each distinct critic input computed once
  3. targets   one-step TD targets and TD-error advantages per agent episode
  4. update    full buffers are drained together: per turn, advantages standardised per agent,
               shuffled minibatches of ``train_batch_size`` joint samples; per minibatch every actor
               takes one step (with its value head's loss, in shared-head IAC, from the same
               forward) and every separate critic takes one step on the samples of the agents it serves
"""

from __future__ import annotations

import random
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.loading import check_model_config, model_device
from comlrl.models.lora import normalize_peft_configs
from comlrl.models.saving import all_or_nothing, check_folder_path
from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.rollout.tree import RolloutResult, TreeRollout
from comlrl.trainers.actor_critic.config import ActorCriticFields
from comlrl.trainers.actor_critic.entities import ActorCriticEntities
from comlrl.trainers.actor_critic.export import ExportEntry, write_exports
from comlrl.trainers.actor_critic.rewards import AgentRewards
from comlrl.trainers.actor_critic.samples import (
    NodeSamples,
    RolloutSample,
    assign_td_targets,
    build_node_samples,
    flat_samples,
)
from comlrl.trainers.actor_critic.updates import SharedValueLoss, critic_step, normalized_advantages, rollout_values
from comlrl.trainers.base import TrainerBase, chunked
from comlrl.trainers.construction import bind_task, plan_team
from comlrl.trainers.policy import PolicyRows, backward_policy_rows
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, per_agent_lists
from comlrl.parallel.fsdp import full_model_state, is_sharded
from comlrl.telemetry.progress import library_bars
from comlrl.telemetry.wandb_sink import check_wandb_ready


def _prefixed(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
    return {f"{prefix}{key}": value for key, value in metrics.items()}


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


class ActorCriticTrainerBase(ActorCriticEntities, TrainerBase):
    """Shared construction, rollout, TD targets, update and evaluation of IAC and MAAC.

    Subclasses say where the critics are (``_plan_critics``, ``_critic_slots``), which tokenizer
    each critic reads (``_critic_reader``), what it reads (``_critic_input``), and how models are
    exported (``_export_entries``).
    """

    algorithm_name = "ActorCritic"
    default_config_cls: Any = None
    config_family: Any = ActorCriticFields

    def __init__(
        self,
        agent_model: Any = None,
        critic_model: Any = None,
        tokenizer: Any = None,
        reward_func: Any = None,
        reward_processor: Any = None,
        formatters: Any = None,
        args: Optional[ActorCriticFields] = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        model_config: Optional[Dict[str, Any]] = None,
        wandb_config: Optional[Dict[str, Any]] = None,
        metrics_callback: Any = None,
        external_transition: Any = None,
        agents: Optional[List[Any]] = None,
        critics: Optional[List[Any]] = None,
        peft_config: Any = None,
        critic_peft_config: Any = None,
    ):
        args = self._resolve_args(args)
        self._check_arguments(args, agent_model, agents, tokenizer, reward_func, external_transition, metrics_callback, (critic_model, critics))
        count, plan = plan_team(args, agent_model, agents, None, tokenizer)
        critic_plan = self._plan_critics(args, critic_model, critics, count)
        model_config = check_model_config(model_config)
        peft_configs = (
            normalize_peft_configs(peft_config, count),
            normalize_peft_configs(critic_peft_config, len(critic_plan.sources) if critic_plan else 0, "critic_peft_config"),
        )
        if critic_plan is None and critic_peft_config is not None:
            raise ValueError(
                "critic_peft_config was given but there is no critic model (use_separate_critic=False puts value heads on "
                "the actors, which follow peft_config); drop critic_peft_config."
            )
        head_dims = (self._actor_head_dim(args, model_config), self._head_dim(args, model_config, "critic_value_head_hidden_dim"))
        self.args = args
        self.num_agents = count
        self.model_name = plan.model_name
        train_dataset, eval_dataset = bind_task(
            self, count, formatters=formatters, train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, pass_none_external_prompts=True, max_new_tokens=args.max_new_tokens)
        self._join_data_parallel(args)
        check_wandb_ready(wandb_config)  # a missing login is one line now, not a traceback after loading
        self.agent_devices = self._model_devices(args.agent_devices, count, "agent_devices")
        critic_devices = self._resolve_critic_devices(count)
        reference_devices = self._reference_devices(self.agent_devices)
        with library_bars(self.console_enabled(args, wandb_config)):
            self._load_entities(plan, critic_plan, model_config, critic_devices, reference_devices, head_dims, peft_configs)
        self._store_task(train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
                         reward_processor=reward_processor, external_transition=external_transition)
        self.metrics_callback = metrics_callback
        self.rollout_buffers: List[List[RolloutSample]] = [[] for _ in range(count)]
        self._init_services(wandb_config, self._wandb_run_config())

    def named_models(self) -> Dict[str, nn.Module]:
        """Every model of the trainer once, by attribute path ("agents.0", "critics.0", ...)."""
        out: Dict[str, nn.Module] = {}
        seen = set()
        for attribute in ("agents", "critics", "reference_models"):
            for index, model in enumerate(getattr(self, attribute)):
                if id(model) not in seen:
                    seen.add(id(model))
                    out[f"{attribute}.{index}"] = model
        return out

    def _run_models(self) -> List[Tuple[str, nn.Module, Any]]:
        """Actors, then each distinct critic, with their sources (``run_summary.json``)."""
        models = super()._run_models()
        seen = set()
        for slot, (critic, source) in enumerate(zip(self.critics, self._critic_sources)):
            if id(critic) not in seen:
                seen.add(id(critic))
                models.append((f"critics.{slot}", critic, source))
        return models

    def named_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        """Every optimizer once, by attribute path ("agent_optimizers.0", critic optimizers, ...)."""
        out = {f"agent_optimizers.{i}": opt for i, opt in enumerate(self.agent_optimizers)}
        seen = set()
        for name, optimizer in self._named_critic_optimizers():
            if id(optimizer) not in seen:
                seen.add(id(optimizer))
                out[name] = optimizer
        return out

    def _named_critic_optimizers(self) -> List[Tuple[str, torch.optim.Optimizer]]:
        raise NotImplementedError

    def _rank_records(self) -> tuple:
        return (RolloutSample,)

    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        components.add_models("critics", self.critics)  # a critic shared by several slots is written once
        components.add_models("reference_models", self._saved_references())
        for name, optimizer in self.named_optimizers().items():
            components.add_optimizers(name, optimizer)
        buffers = AttributeState(self, "rollout_buffers")
        components.add_state("rollout_buffers", buffers, records=(RolloutSample,), check=per_agent_lists(self.num_agents, "rollout_buffers"))
        return components.add_callbacks({**self._user_callbacks(), "metrics_callback": self.metrics_callback})

    def _wandb_run_config(self) -> Dict[str, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ rollout
    def _tree(self, *, num_generations: int, greedy: bool = False, training: bool = True) -> TreeRollout:
        """Episodes end early in evaluation too; reference KL is measured there when enabled."""
        a = self.args
        return self._rollout_tree(
            reward=AgentRewards(self.reward), num_generations=num_generations, joint_mode="aligned", greedy=greedy,
            early_termination_threshold=a.early_termination_threshold, reference_kl=a.reference_kl_enabled,
        )

    def _collect(self, result: RolloutResult, num_generations: int, *, training: bool) -> List[List[RolloutSample]]:
        """The samples of every item (all agents, all nodes), with values and TD targets when training.

        Order within an item: agent by agent; for each agent the tree's nodes in pre-order and the K
        samples of a node in order, so every agent's list is aligned (entry k of each is one joint sample).
        """
        a = self.args
        kl_coef = a.reference_kl_coef if a.reference_kl_enabled and a.reference_kl_mode == "reward" else None
        critic_input = self._critic_input if training else None
        trees: List[List[NodeSamples]] = [
            [build_node_samples(agent, root, kl_coef=kl_coef, critic_input=critic_input) for root in result.roots]
            for agent in range(self.num_agents)
        ]
        per_item: List[List[RolloutSample]] = [[] for _ in result.roots]
        for agent_trees in trees:
            for root, tree in zip(result.roots, agent_trees):
                per_item[root.item_index].extend(flat_samples(tree))
        if training:
            self._assign_old_values([s for samples in per_item for s in samples])
            for agent_trees in trees:
                for tree in agent_trees:
                    assign_td_targets(tree, self.args.discount, self.args.critic_type)
        return per_item

    def _critic_input(self, agent: int, node: Any, j: int, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _value_model(self, agent: int) -> Tuple[CausalLMWithValueHead, int]:
        slot = self._critic_of_agent[agent]
        if slot is None:
            return self.agents[agent], self.policies[agent].pad_id
        return self.critics[slot], self._critic_pad_ids[slot]

    def _assign_old_values(self, samples: List[RolloutSample]) -> None:
        """``old_value`` of every sample: one batched no-grad forward per critic model."""
        groups: Dict[int, Tuple[CausalLMWithValueHead, int, List[RolloutSample]]] = {}
        for sample in samples:
            model, pad = self._value_model(sample.agent_idx)
            groups.setdefault(id(model), (model, pad, []))[2].append(sample)
        for model, pad, group in groups.values():
            device = model_device(model)
            with self._unsharded([model]):  # one forward per distinct sequence: counts differ between ranks
                values = rollout_values(
                    model, [s.critic_input_ids for s in group], pad, self.args.update_micro_batch_size,
                    autocast=lambda device=device: self.precision.autocast(device),
                )
            for sample, value in zip(group, values):
                sample.old_value = value.clone()

    # ------------------------------------------------------------------ training step
    def _items_per_step(self) -> int:
        """Items whose samples fill one rollout buffer: K per node, over the nodes of a full tree
        (K per turn when K = 1 or there is one turn)."""
        k, turns = self.args.num_generations, self.args.num_turns
        per_item = k * sum(k**t for t in range(turns))
        return max(1, self.args.rollout_buffer_size // per_item)

    def _train_step(self, items: List[Any], item_ids: Optional[List[int]] = None) -> None:
        k = self.args.num_generations
        start = self.env_step  # the same on every rank
        result = self._tree(num_generations=k).run(items, self.env_step, item_ids=item_ids, step_seed=self._step_seed())
        self.env_step += self._dist.sum_int(result.env_steps)
        per_item = self._collect(result, k, training=True)
        samples = [s for item_samples in per_item for s in item_samples]
        for sample in samples:
            sample.policy_version = self.policies[sample.agent_idx].version
            sample.order = [start, *sample.order]
        self.metrics.record(self._rollout_metrics(samples))
        for item_samples in per_item:
            self.metrics.record(self._callback_metrics(item_samples))
        self._record_sample_signal(per_item, k)
        for agent in range(self.num_agents):
            self.rollout_buffers[agent].extend(s for s in samples if s.agent_idx == agent)
        if len(self.rollout_buffers[0]) >= self._per_rank(self.args.rollout_buffer_size, "rollout_buffer_size"):
            self._drain()

    def _record_sample_signal(self, per_item: List[List[RolloutSample]], k: int) -> None:
        """Zero-signal groups: each (item, agent, turn)'s K samples, or with K = 1 each (agent, turn)'s
        samples over the step's items."""
        groups: Dict[Tuple[int, ...], List[RolloutSample]] = {}
        for index, samples in enumerate(per_item):
            for sample in samples:
                key = (sample.agent_idx, sample.turn_idx) if k == 1 else (index, sample.agent_idx, sample.turn_idx)
                groups.setdefault(key, []).append(sample)
        self._record_signal([[float(s.reward) for s in g] for g in groups.values()], [[s.completion for s in g] for g in groups.values()])

    def _flush_buffers(self) -> None:
        if any(self.rollout_buffers):
            self._drain()

    def _rollout_metrics(self, samples: Sequence[RolloutSample]) -> Dict[str, float]:
        """``turn_k/reward_mean``, ``turn_k/expected_return`` (+ reference-KL means), over agents."""
        metrics: Dict[str, float] = {}
        for turn in sorted({s.turn_idx for s in samples}):
            at = [s for s in samples if s.turn_idx == turn]
            metrics[f"turn_{turn + 1}/reward_mean"] = _mean([float(s.reward) for s in at])
            metrics[f"turn_{turn + 1}/expected_return"] = _mean([float(s.returns) for s in at])
            kls = [s.metadata for s in at if "reference_kl" in s.metadata]
            if kls:
                metrics[f"turn_{turn + 1}/reference_kl_mean"] = _mean([m["reference_kl"] for m in kls])
                penalties = [m["reference_kl_penalty"] for m in kls if "reference_kl_penalty" in m]  # reward mode only
                if penalties:
                    metrics[f"turn_{turn + 1}/reference_kl_penalty_mean"] = _mean(penalties)
        return metrics

    def _callback_metrics(self, samples: List[RolloutSample]) -> Dict[str, float]:
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

    # ------------------------------------------------------------------ update
    def _drain(self) -> None:
        """Update on every buffered sample, turn by turn (see module docstring), then empty the buffers."""
        buffers, self.rollout_buffers = self.rollout_buffers, [[] for _ in range(self.num_agents)]
        buffers = [self._global_buffer(buffer) for buffer in buffers]
        for turn in sorted({s.turn_idx for s in buffers[0]}):
            group = [[s for s in buffer if s.turn_idx == turn] for buffer in buffers]
            center = self.args.critic_type == "q" and self.args.num_generations == 1
            for samples in group:
                if center and len(samples) == 1:
                    self._warn_single_q_group(turn)
                advantages = normalized_advantages(samples, self.args.advantage_normalization, center_leave_one_out=center)
                for sample, advantage in zip(samples, advantages):
                    sample.normalized_advantage = advantage
            for _ in range(self.args.update_epochs):
                order = list(range(len(group[0])))
                random.shuffle(order)
                order = self._dist.broadcast_object(order)  # one permutation of the global buffer for every rank
                for minibatch in chunked(order, self.args.train_batch_size):
                    mine = self._dist.share(minibatch, "train_batch_size")  # this rank's share of the global minibatch
                    self._update_minibatch([[samples[k] for k in mine] for samples in group])

    def _global_buffer(self, samples: List[RolloutSample]) -> List[RolloutSample]:
        """The whole run's buffer of which ``samples`` is this rank's block (every rank's samples
        exchanged), in ``RolloutSample.order``: one process and N data-parallel ones hold the same list."""
        everything = [s for block in self._dist.all_gather(samples) for s in block]
        return sorted(everything, key=lambda s: s.order)

    def _warn_single_q_group(self, turn: int) -> None:
        if getattr(self, "_warned_single_q_group", False):
            return
        self._warned_single_q_group = True
        warnings.warn(
            f"{self.algorithm_name}: a drained buffer holds one sample of turn {turn + 1} for an actor; with critic_type='q' "
            f"and num_generations=1 its advantage (Q minus the mean Q of the group's other samples) is exactly 0, so that "
            f"sample teaches its actor nothing. Raise rollout_buffer_size or num_generations. Shown once.",
            stacklevel=2,
        )

    def _update_minibatch(self, batch: List[List[RolloutSample]]) -> None:
        """``batch[i]``: agent i's samples of the same joint samples. One step per actor, then one per
        distinct critic (each set concurrently with ``parallel_training="mp"``)."""
        actor_rows = self._workers.map(lambda agent: self._actor_step(agent, batch[agent]), list(range(self.num_agents)))
        for agent, metrics in enumerate(actor_rows):
            self.metrics.record(_prefixed(f"agent_{agent}/", metrics))
        jobs = self._critic_batches(batch)

        def critic_task(index: int) -> Dict[str, float]:
            slot, samples = jobs[index]
            label = f"{self.algorithm_name} critic {slot} (env_step {self.env_step})"
            return critic_step(
                self.critics[slot], self._critic_optimizers[slot], samples, pad_id=self._critic_pad_ids[slot],
                coef=self.args.value_loss_coef, clip_range=self._value_clip_range(),
                micro_batch_size=self.args.update_micro_batch_size, label=label, autocast=self._critic_autocast(slot),
            )

        for (slot, _samples), metrics in zip(jobs, self._workers.map(critic_task, list(range(len(jobs))))):
            self.metrics.record(_prefixed(self._critic_metric_prefix(slot), metrics))

    def _critic_batches(self, batch: List[List[RolloutSample]]) -> List[Tuple[int, List[RolloutSample]]]:
        """Per distinct critic: its first slot and the samples of every agent it serves."""
        groups: Dict[int, Tuple[int, List[RolloutSample]]] = {}
        for agent, slot in enumerate(self._critic_of_agent):
            if slot is not None:
                groups.setdefault(id(self.critics[slot]), (slot, []))[1].extend(batch[agent])
        return list(groups.values())

    def _critic_metric_prefix(self, slot: int) -> str:
        return f"critic_{slot}/"

    def _critic_autocast(self, slot: int):
        device = model_device(self.critics[slot])
        return lambda: self.precision.autocast(device)

    def _value_clip_range(self) -> Optional[float]:
        return None

    def _actor_step(self, agent: int, samples: List[RolloutSample]) -> Dict[str, float]:
        """One policy-gradient step ``-mean_s A_s log pi(a_s | h_s)`` (+ the shared head's value loss).

        A sample drawn before this actor's latest optimizer step (a later minibatch or pass over the
        same buffer) is importance-weighted with its sampling log-probs, clipped at
        ``importance_clip_range``; fresh samples take the plain on-policy loss.
        """
        a = self.args
        policy = self.policies[agent]
        rows = PolicyRows()
        for sample in samples:
            stale = sample.policy_version != policy.version
            rows.add(sample.prompt_ids, sample.completion_ids, float(sample.normalized_advantage), 1.0 / len(samples),
                     sample.old_token_logprobs, stale, sample.reference_token_logprobs)
        auxiliary = None
        if self._critic_of_agent[agent] is None:
            auxiliary = SharedValueLoss(
                self.agents[agent].value_head, samples, a.value_loss_coef, self._value_clip_range(), a.critic_type == "q"
            )
        label = f"{self.algorithm_name} agent {agent} (env_step {self.env_step})"
        metrics = backward_policy_rows(
            policy, rows, temperature=a.temperature, clip_range=a.importance_clip_range,
            micro_batch_size=a.update_micro_batch_size, label=label, auxiliary=auxiliary,
            kl_coef=a.reference_kl_coef if a.reference_kl_enabled and a.reference_kl_mode == "loss" and self.reference_models else None,
        )
        metrics["policy_loss"] = metrics.pop("loss")
        metrics["grad_norm"] = policy.optimizer.step(label)
        metrics["advantage_mean"] = _mean([float(s.advantage) for s in samples])
        return metrics

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """One greedy response per agent per turn on up to ``num_eval_samples`` eval items
        (default ``eval_num_samples``), episodes ending early as in training.

        Returns ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return`` (+ reference-KL means
        when enabled) and ``eval/<key>`` for each ``metrics_callback`` key, averaged over items; an
        empty dict without an eval dataset or with 0 samples. No critic or extra forward runs.
        """
        items = self._evaluation_items(num_eval_samples)
        if not items:
            return {}
        tree = self._tree(num_generations=1, greedy=True, training=False)
        per_item: List[List[RolloutSample]] = []
        for start in range(0, len(items), self.args.eval_batch_size):
            result = tree.run(items[start : start + self.args.eval_batch_size])
            per_item.extend(self._collect(result, 1, training=False))
        metrics = _prefixed("eval/", self._rollout_metrics([s for samples in per_item for s in samples]))
        callback_values: Dict[str, List[float]] = {}
        for samples in per_item:
            for key, value in self._callback_metrics(samples).items():
                callback_values.setdefault(key, []).append(value)
        metrics.update({f"eval/{key}": _mean(values) for key, values in callback_values.items()})
        self.metrics.write(metrics, self.env_step)
        return metrics

    # ------------------------------------------------------------------ export
    def _export_entries(self, output_dir: str) -> List[ExportEntry]:
        raise NotImplementedError

    def save_model(self, output_dir: str, overwrite: bool = False, merge_adapters: bool = False) -> None:
        """Export actors, value heads and critics (layout: see the trainer's ``_export_entries``).

        Every folder loads back with ``AutoModelForCausalLM`` (a LoRA-trained model: its adapter,
        loadable with ``PeftModel.from_pretrained(base, folder)``, or with ``merge_adapters=True``
        the merged full model); ``value_head.pt`` holds a head's state dict
        (``load_state_dict(torch.load(path, weights_only=True))``). Existing files are refused unless
        ``overwrite=True``. A W&B run stays open.
        """
        check_folder_path(output_dir, "save_model(output_dir)")
        entries = self._export_entries(output_dir)
        for entry in entries:  # collective: every rank gathers a sharded backbone
            entry.backbone_state = full_model_state(entry.model.model) if is_sharded(entry.model.model) else None
        if self._dist.is_main:  # under torchrun rank 0 writes (every rank holds the same weights)
            with library_bars(self.verbose), all_or_nothing([entry.path for entry in entries]):
                write_exports(entries, overwrite, merge_adapters)
            if self._wandb is not None:
                self._wandb.write({"final_model_saved": 1.0}, self.env_step)
        self._dist.barrier()
