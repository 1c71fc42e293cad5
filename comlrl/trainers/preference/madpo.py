"""MADPO: multi-agent direct preference optimization from the team's own ranked samples.

A run is one round of phases (the iterative trainers repeat them):

  1. collect   every item: each agent samples K candidates (one generate call per agent for a batch
               of items), one reward call per item scores the K aligned joint candidates, and
               strict-gap pairs (winner, loser) are kept
  2. learn     ``num_train_epochs`` epochs over the pairs in shuffled batches of ``train_batch_size``;
               per batch, with ``Delta_i = log pi_i(winner_i) - log pi_i(loser_i)`` (every completion
               token, EOS included, winners and losers of the batch in one forward per agent):
                   L = -log sigmoid(beta * sum_i Delta_i)
               agents 1..N-1 are scored first without gradient; then each agent i in turn takes one
               step on L with the other agents' margins held fixed (its exact share of dL)

A checkpoint can be taken after collection, after every epoch, and every ``checkpoint_steps`` steps
of either phase (docs/checkpoints.md).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from comlrl.core.losses import sequence_logprobs
from comlrl.core.preference import joint_margin_loss, preference_accuracy
from comlrl.models.gradient_checkpointing import scoring_mode
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.formatters import build_formatters
from comlrl.rollout.scoring import score_completions
from comlrl.trainers.base import dataset_length
from comlrl.trainers.preference.centralized import TaggedCentralizedComparatorAdapter, check_adapter
from comlrl.trainers.preference.collaboration import CentralizedCollaboration, RoleSplittingLogger
from comlrl.trainers.preference.checkpointing import PAIR_RECORDS, pair_list_check
from comlrl.trainers.preference.collection import (
    AgentPreferenceTensors,
    ItemCandidates,
    PreferencePair,
    candidate_pairs,
    collect_candidates,
    score_candidates,
)
from comlrl.trainers.preference.config import MADPOConfig
from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer
from comlrl.checkpoint import layout
from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, DataclassState
from comlrl.trainers.optim import backward_together
from comlrl.telemetry.progress import ProgressBar

__all__ = ["AgentPreferenceTensors", "MADPOConfig", "MADPOTrainer", "PreferencePair", "PreferenceProgress"]

PHASES = ("collect", "reward", "policy")
GENERATION_ROWS = 64  # default candidates per generate call (collection_batch_size=None)


@dataclass
class PreferenceProgress:
    """Where a preference run is, beyond the epoch cursor (``TrainingState``) of its learning phase."""

    round: int = 0  # rounds complete (iterative trainers)
    phase: str = "collect"  # the phase to run next: collect -> reward (MARLHF) -> policy
    collected: int = 0  # items of the training set collected so far in this round
    updates: int = 0  # MADPO updates so far (the eval schedule counts them)


class MADPOTrainer(MAGRPOTrainer):
    """Multi-Agent DPO trainer (see the module docstring and ``MADPOConfig``).

    Agents, tokenizers, formatters, reward and datasets as for ``MAGRPOTrainer``. With
    ``collaboration_mode="centralized"`` one actor (``agents=[one]`` or ``agent_model``) writes every
    role's output: ``centralized_comparator_adapter`` (default ``TaggedCentralizedComparatorAdapter``)
    builds its prompt from the ``num_agents`` role prompts and splits its answers for the reward.
    """

    default_config_cls = MADPOConfig
    config_family = MADPOConfig
    algorithm_name = "MADPO"
    data_parallel = False  # collection, reward learning and pair updates run in one process

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
        args: Optional[MADPOConfig] = None,
        *,
        centralized_comparator_adapter: Any = None,
        peft_config: Any = None,
    ):
        if peft_config is not None:
            raise ValueError(
                f"peft_config is not supported by {type(self).__name__} yet: the preference trainers train full weights "
                f"(their pair scoring and reward learning have no adapter path). Remove peft_config, or train LoRA "
                f"adapters with MAGRPOTrainer / IACTrainer / MAACTrainer."
            )
        args = self._resolve_args(args)
        self.centralized_adapter = check_adapter(centralized_comparator_adapter or TaggedCentralizedComparatorAdapter())
        self.collaboration: Optional[CentralizedCollaboration] = None
        roles = None
        if args.collaboration_mode == "centralized":
            roles = args.num_agents
            agent_model, agents, tokenizer, formatters, reward_func, eval_logger = self._centralize(
                args, agent_model, agents, num_agents, tokenizer, formatters, reward_func, eval_logger
            )
            num_agents = None
            args.num_agents = 1  # the one joint actor; restored to the role count below
        self.progress = PreferenceProgress()
        self.preference_pairs: List[PreferencePair] = []  # what the learning phase trains on
        self._round_pairs: List[PreferencePair] = []  # this round's collected pairs
        self._epoch_order: Optional[torch.Tensor] = None
        super().__init__(
            agent_model=agent_model, agents=agents, num_agents=num_agents, tokenizer=tokenizer, model_config=model_config,
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func, reward_processor=reward_processor,
            formatters=formatters, external_transition=external_transition, wandb_config=wandb_config,
            eval_logger=eval_logger, eval_aggregator=eval_aggregator, args=args,
        )
        self.num_roles = roles if roles is not None else self.num_agents
        if roles is not None:
            self.args.num_agents = roles

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _madpo_arguments(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """The ``MADPOTrainer`` arguments among a subclass's ``*args, **kwargs`` (defaults filled in)."""
        signature = inspect.signature(MADPOTrainer.__init__)
        known = {k: v for k, v in kwargs.items() if k in signature.parameters}
        bound = signature.bind(None, *args, **known)
        bound.apply_defaults()
        return dict(bound.arguments)

    def _centralize(self, args, agent_model, agents, num_agents, tokenizer, formatters, reward_func, eval_logger):
        """One joint actor for ``args.num_agents`` roles: checks, then its prompt builder and reward."""
        roles = args.num_agents
        if agents is not None and (isinstance(agents, (str, bytes)) or len(agents) != 1):
            raise ValueError(
                f"collaboration_mode='centralized' trains exactly one actor model (it writes all {roles} roles); got "
                f"agents of length {len(agents) if not isinstance(agents, (str, bytes)) else 'str'}. Pass agents=[one] or agent_model."
            )
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(f"collaboration_mode='centralized' has one actor, so give one tokenizer (got a list of {len(tokenizer)}).")
        if reward_func is None or not callable(reward_func):
            raise ValueError(f"reward_func must be a callable that scores the {roles} roles' joint responses, got {reward_func!r}.")
        if num_agents is not None and num_agents != roles:
            raise ValueError(
                f"num_agents must match args.num_agents in centralized mode (the number of roles): num_agents={num_agents}, "
                f"args.num_agents={roles}."
            )
        self.collaboration = CentralizedCollaboration(self.centralized_adapter, build_formatters(formatters, roles), reward_func)
        if agents is None and agent_model is not None:
            agent_model, agents = None, [agent_model]
        logger = RoleSplittingLogger(eval_logger, self.collaboration) if eval_logger is not None else None
        return agent_model, agents, tokenizer, self.collaboration.prompt, self.collaboration, logger

    def _uses_reference_models(self) -> bool:
        return False  # the MADPO loss is reference-free: no frozen copies are loaded

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        config = {
            "model_name": self.model_name, "num_agents": a.num_agents, "num_turns": a.num_turns, "algorithm": self.algorithm_name,
            "agent_learning_rate": a.agent_learning_rate, "num_train_epochs": a.num_train_epochs, "max_new_tokens": a.max_new_tokens,
            "preference_num_candidates": a.preference_num_candidates, "preference_pairs_per_sample": a.preference_pairs_per_sample,
            "pair_selection": a.pair_selection, "dpo_beta": a.dpo_beta, "collaboration_mode": a.collaboration_mode,
        }
        if a.collaboration_mode == "centralized":
            config.update(num_roles=a.num_agents, num_actor_models=1)
        return config

    # ------------------------------------------------------------------ the round
    def _num_rounds(self) -> int:
        return 1

    def _run_epochs(self) -> None:
        """The phases of every round (see the module docstring), from where ``progress`` points."""
        p = self.progress
        while p.round < self._num_rounds():
            if p.phase == "collect":
                self._collection_phase()
                p.phase = "reward"
                self._checkpoint_commit(self._phase_checkpoint_name("collected"))
            if p.phase == "reward":
                learned = self._reward_phase()
                p.phase = "policy"
                if learned:
                    self._checkpoint_commit(self._phase_checkpoint_name("reward-model"))
            if self._has_training_data():
                super()._run_epochs()  # the epoch loop of TrainerBase over this trainer's learning steps
            elif self.verbose and self.state.epoch == 0:
                print(f"{self.algorithm_name}: no preference pairs this round (every candidate tied); nothing to learn.")
            if not self._end_round():
                return

    def _checkpoint_commit(self, name: str) -> None:
        """A checkpoint at a phase boundary into folder ``name`` (when ``train`` has a checkpoint_dir)."""
        schedule = self._checkpoint_schedule
        if schedule is not None and schedule.directory is not None:
            self._checkpoint_save_to_directory(schedule, name)

    def _phase_checkpoint_name(self, phase: str, epoch: Optional[int] = None) -> str:
        """``checkpoint-collected`` / ``checkpoint-reward-model`` (epochs keep ``checkpoint-<E>``)."""
        return layout.phase_checkpoint_name(phase, epoch=epoch)

    def _end_round(self) -> bool:
        """Called after a round's learning; True to start another round (iterative trainers)."""
        return False

    def _has_training_data(self) -> bool:
        return bool(self.preference_pairs)

    def _reward_phase(self) -> bool:
        """Reward learning between collection and policy learning (MARLHF); True if it ran."""
        return False

    # ------------------------------------------------------------------ collection
    def _collection_batch_size(self) -> int:
        a = self.args
        return a.collection_batch_size or max(a.rollout_buffer_size, GENERATION_ROWS // a.preference_num_candidates)

    def _collection_phase(self) -> None:
        """Collect this round's pairs over the training set (resumable at any step)."""
        p = self.progress
        bar = ProgressBar(total=dataset_length(self.train_dataset), initial=p.collected, enabled=self.verbose,
                          desc=f"{self.algorithm_name} collect" + (f" (round {p.round + 1})" if self._num_rounds() > 1 else ""))
        try:
            for start, items in self._dataset_steps(self.train_dataset, p.collected, self._collection_batch_size()):
                self._round_pairs.extend(self._collect_items(items))
                p.collected = start + len(items)
                self.state.global_step += 1
                bar.update(len(items), self.metrics.flush(self.env_step))
                self._checkpoint_after_step(self.state.global_step)
        finally:
            bar.close()
        self.metrics.flush(self.env_step, force=True)
        p.collected = 0
        self.preference_pairs = self._training_pairs(self._round_pairs)
        self._epoch_order = None
        self.state.epoch = self.state.position = 0

    def _item_prompts(self, items: Sequence[Any]) -> List[List[str]]:
        return [[formatter(item) for item in items] for formatter in self.formatters]

    def _collect_items(self, items: List[Any]) -> List[PreferencePair]:
        """Candidates of a batch of items, their rewards, and the pairs kept."""
        a = self.args
        candidates = collect_candidates(self.policies, self._item_prompts(items), items, a.preference_num_candidates, self._sampling(),
                                        self._step_seed(), self._workers.map)
        score_candidates(self.reward, candidates)
        pairs = [pair for c in candidates for pair in candidate_pairs(self.policies, c, a.pair_selection, a.preference_pairs_per_sample)]
        self._record_collection(candidates, len(pairs))
        return pairs

    def _record_collection(self, candidates: Sequence[ItemCandidates], pairs: int) -> None:
        rewards = torch.cat([c.rewards for c in candidates])
        self.metrics.record({
            "collect/reward_mean": float(rewards.mean()), "collect/reward_std": float(rewards.std(unbiased=False)),
            "collect/pairs_per_item": pairs / len(candidates),
        })

    def _training_pairs(self, round_pairs: List[PreferencePair]) -> List[PreferencePair]:
        """What this round learns from (iterative trainers mix in replayed rounds)."""
        return list(round_pairs)

    # ------------------------------------------------------------------ learning steps (the epoch loop's hooks)
    def _epoch_length(self) -> Optional[int]:
        return len(self.preference_pairs)

    def _items_per_step(self) -> int:
        return self.args.train_batch_size

    def _epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        """Batches of the epoch's shuffled pairs (a new order at the start of every epoch)."""
        pairs = self.preference_pairs
        if start == 0 or self._epoch_order is None:
            self._epoch_order = torch.randperm(len(pairs))
        order = self._epoch_order.tolist()
        size = self._items_per_step()
        for first in range(start, len(pairs), size):
            yield first, [pairs[i] for i in order[first : first + size]]

    def _maybe_evaluate(self, start: int, count: int) -> None:
        interval = self.args.eval_interval
        if self.eval_dataset is not None and interval > 0 and self.progress.updates % interval == 0:
            self.evaluate()

    def _train_step(self, pairs: List[PreferencePair], item_ids: Optional[List[int]] = None) -> None:
        self.metrics.record(self._madpo_update(pairs))
        self.progress.updates += 1
        if self.args.use_environment_step:
            self.env_step += self.args.environment_steps_per_pair * len(pairs)

    def _flush_buffers(self) -> None:
        pass

    # ------------------------------------------------------------------ the MADPO update
    def _pair_margins(self, agent: int, pairs: Sequence[PreferencePair], *, others: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``Delta_agent`` of every pair, ``[B]`` (CPU, detached). With ``others`` (the other agents'
        margins) the joint loss is also backpropagated into this agent, micro-batch by micro-batch."""
        policy = self.policies[agent]
        size = self.args.update_micro_batch_size or len(pairs)
        margins = []
        for start in range(0, len(pairs), size):
            part = pairs[start : start + size]
            with torch.set_grad_enabled(others is not None):
                delta = self._score_margins(agent, part)
            if others is not None:
                loss = joint_margin_loss(delta + others[start : start + len(part)].to(delta.device), self.args.dpo_beta)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"{self.algorithm_name} agent {agent} (update {self.progress.updates}): the loss is {float(loss.detach())}. "
                        f"Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
                    )
                policy.optimizer.backward(loss * (len(part) / len(pairs)), last=start + len(part) >= len(pairs))
            margins.append(delta.detach().float().cpu())
        return torch.cat(margins)

    def _score_margins(self, agent: int, pairs: Sequence[PreferencePair]) -> torch.Tensor:
        """``Delta_agent`` of ``pairs`` (``[B]``, with a graph when grad is enabled): one forward over
        the winners and losers of every pair (2B rows) in the scoring mode of every policy update (no
        dropout, checkpointed layers still checkpointing, the precision's autocast)."""
        policy = self.policies[agent]
        scoring_mode(policy.model)
        part = [pair.agent_tensors[agent] for pair in pairs]
        batch = build_sequence_batch([t.prompt_input_ids for t in part] * 2,
                                     [t.winner_completion_ids for t in part] + [t.loser_completion_ids for t in part],
                                     policy.pad_id, policy.device)
        with policy.autocast():
            logprobs = score_completions(policy.model, batch).logprobs
        logps = sequence_logprobs(logprobs.float(), batch.mask)
        return logps[: len(part)] - logps[len(part) :]

    def _joint_backward(self, pairs: Sequence[PreferencePair]) -> bool:
        """One joint backward when it costs no device extra memory: every agent on a device of its
        own (each device then holds one graph either way) and no micro-batching asked for. Agents
        sharing a device (the CPU) step one after another, so that one graph is alive at a time."""
        size = self.args.update_micro_batch_size
        devices = [str(policy.device) for policy in self.policies]
        return (size is None or size >= len(pairs)) and len(set(devices)) == len(devices)

    def _joint_margins(self, pairs: Sequence[PreferencePair]) -> List[torch.Tensor]:
        """Every agent's ``Delta_i`` with its graph (one forward per agent over winners and losers),
        then one backward of the joint loss through all of them: n forwards for n agents."""
        deltas = []
        for agent in range(self.num_agents):
            delta = self._score_margins(agent, pairs)
            if not bool(torch.isfinite(delta.detach()).all()):
                raise FloatingPointError(
                    f"{self.algorithm_name} agent {agent} (update {self.progress.updates}): its log-likelihood margins are not "
                    f"finite ({delta.detach().float().cpu().tolist()[:4]}). Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
                )
            deltas.append(delta)
        loss = joint_margin_loss(sum(d.float().cpu() for d in deltas), self.args.dpo_beta)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"{self.algorithm_name} (update {self.progress.updates}): the joint loss is {float(loss.detach())}. "
                f"Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
            )
        backward_together([policy.optimizer for policy in self.policies], loss)
        return [d.detach().float().cpu() for d in deltas]

    def _step_agent(self, agent: int) -> float:
        """Finish agent ``agent``'s update; its gradient norm."""
        return self.policies[agent].optimizer.step(f"{self.algorithm_name} agent {agent} (update {self.progress.updates})")

    def _madpo_update(self, pairs: List[PreferencePair]) -> Dict[str, float]:
        """One step per agent on ``-log sigmoid(beta * sum_i Delta_i)`` (see the module docstring).

        ``_joint_backward``: every agent's graph is kept until one joint backward (n forwards).
        Otherwise the agents step one after another, each micro-batch backpropagated at once, the
        other agents' margins computed first without gradient (2n - 1 forwards, one graph alive at a
        time). Both give each agent the gradient of the joint loss at the weights the update started
        from."""
        n = self.num_agents
        metrics: Dict[str, float] = {}
        if self._joint_backward(pairs):
            deltas: List[Optional[torch.Tensor]] = list(self._joint_margins(pairs))
            for i in range(n):
                metrics[f"agent_{i}/grad_norm"] = self._step_agent(i)
        else:
            deltas = [None] + [self._pair_margins(i, pairs) for i in range(1, n)]
            for i in range(n):
                others = sum((deltas[j] for j in range(n) if j != i), torch.zeros(len(pairs)))
                deltas[i] = self._pair_margins(i, pairs, others=others)
                metrics[f"agent_{i}/grad_norm"] = self._step_agent(i)
        for i in range(n):
            metrics[f"agent_{i}/logp_margin"] = float(deltas[i].mean())
        beta = self.args.dpo_beta
        joint = torch.stack(deltas).sum(dim=0)
        reward_mean = sum(p.candidate_reward_mean for p in pairs) / len(pairs)
        metrics.update({
            "madpo/loss": float(joint_margin_loss(joint, beta)),
            "madpo/reward_margin": float(beta * joint.mean()),  # the implicit reward margin beta * sum_i Delta_i
            "madpo/accuracy": float(preference_accuracy(joint)),
            "turn_1/reward_mean": reward_mean,
            "turn_1/expected_return": reward_mean,
        })
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        progress = DataclassState(self.progress)
        components.add_state("preference_progress", progress, check=self._check_progress(progress))
        for name in ("preference_pairs", "_round_pairs"):
            components.add_state(name.strip("_"), AttributeState(self, name), records=PAIR_RECORDS, check=pair_list_check(name))
        components.add_state("epoch_order", AttributeState(self, "_epoch_order"))
        return components

    def _check_progress(self, progress: DataclassState):
        def check(state: Any) -> None:
            progress.check(state)
            if state["phase"] not in PHASES:
                raise CheckpointError(f"The checkpoint's preference phase {state['phase']!r} is not one of {PHASES}.")
            for name in ("round", "collected", "updates"):
                value = state[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise CheckpointError(f"The checkpoint's preference progress {name}={value!r} is not a non-negative integer.")
            if state["round"] > self._num_rounds():
                raise CheckpointError(
                    f"The checkpoint has {state['round']} rounds complete but this run has {self._num_rounds()}; raise num_iterations to resume it."
                )

        return check

    def _checkpoint_epoch_length(self, states: Mapping[str, Any]) -> Optional[int]:
        return len(states["preference_pairs"])

