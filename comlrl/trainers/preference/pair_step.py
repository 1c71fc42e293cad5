"""One step of MADPO's learning phase (``PairStep``): a batch of shuffled preference pairs, one update
per agent on the joint margin loss.

With ``Delta_i = log pi_i(winner_i) - log pi_i(loser_i)`` (every completion token, EOS included,
winners and losers of the batch in one forward per agent):

    L = -log sigmoid(beta * sum_i Delta_i)

Agents on devices of their own keep their graphs until one joint backward (n forwards); otherwise
agents 1..N-1 are scored first without gradient and each agent i in turn takes one step on L with
the other agents' margins held fixed (its exact share of dL; one graph alive at a time).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from comlrl.checkpoint.state import AttributeState, CheckpointComponents
from comlrl.core.logprobs import sequence_logprobs
from comlrl.core.preference import joint_margin_loss, preference_accuracy
from comlrl.models.gradient_checkpointing import scoring_mode
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import score_completions
from comlrl.trainers.optim import backward_together
from comlrl.trainers.preference.collection import PreferencePair
from comlrl.trainers.preference.rounds import PreferenceRounds
from comlrl.trainers.run import owner_view


class PairStep:
    """MADPO's learning step over ``rounds.preference_pairs`` (see the module docstring)."""

    rank_records: tuple = ()

    def __init__(self, rounds: PreferenceRounds, name: str):
        self.rounds = owner_view(rounds)  # the rounds hold this step's reset (after_collection)
        self.run = rounds.run
        self.team = rounds.run.team
        self.args = rounds.run.args
        self.name = name
        self.epoch_order: Optional[torch.Tensor] = None
        self.buffers: List[List[Any]] = [[] for _ in range(self.team.num_agents)]  # MADPO keeps no rollout buffers
        rounds.after_collection.append(self.reset_order)

    def reset_order(self) -> None:
        self.epoch_order = None

    # ------------------------------------------------------------------ the epoch's steps
    def items_per_step(self) -> int:
        return self.args.train_batch_size

    def epoch_length(self) -> Optional[int]:
        return len(self.rounds.preference_pairs)

    def epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        """Batches of the epoch's shuffled pairs (a new order at the start of every epoch)."""
        pairs = self.rounds.preference_pairs
        if start == 0 or self.epoch_order is None:
            self.epoch_order = torch.randperm(len(pairs))
        order = self.epoch_order.tolist()
        size = self.items_per_step()
        for first in range(start, len(pairs), size):
            yield first, [pairs[i] for i in order[first : first + size]]

    def evaluation_due(self, start: int, count: int) -> bool:
        interval = self.args.eval_interval
        return interval > 0 and self.rounds.progress.updates % interval == 0

    def train_step(self, pairs: List[PreferencePair], item_ids: Optional[List[int]] = None) -> None:
        self.run.metrics.record(self.update(pairs))
        self.rounds.progress.updates += 1
        if self.args.use_environment_step:
            self.run.state.env_step += self.args.environment_steps_per_pair * len(pairs)

    def flush(self) -> None:
        pass

    # ------------------------------------------------------------------ the MADPO update
    def label(self, agent: Optional[int] = None) -> str:
        who = f" agent {agent}" if agent is not None else ""
        return f"{self.name}{who} (update {self.rounds.progress.updates})"

    def pair_margins(self, agent: int, pairs: Sequence[PreferencePair], *, others: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``Delta_agent`` of every pair, ``[B]`` (CPU, detached). With ``others`` (the other agents'
        margins) the joint loss is also backpropagated into this agent, micro-batch by micro-batch."""
        policy = self.team.policies[agent]
        size = self.args.update_micro_batch_size or len(pairs)
        margins = []
        for start in range(0, len(pairs), size):
            part = pairs[start : start + size]
            with torch.set_grad_enabled(others is not None):
                delta = self.score_margins(agent, part)
            if others is not None:
                loss = joint_margin_loss(delta + others[start : start + len(part)].to(delta.device), self.args.dpo_beta)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"{self.label(agent)}: the loss is {float(loss.detach())}. Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
                    )
                policy.optimizer.backward(loss * (len(part) / len(pairs)), last=start + len(part) >= len(pairs))
            margins.append(delta.detach().float().cpu())
        return torch.cat(margins)

    def score_margins(self, agent: int, pairs: Sequence[PreferencePair]) -> torch.Tensor:
        """``Delta_agent`` of ``pairs`` (``[B]``, with a graph when grad is enabled): one forward over
        the winners and losers of every pair (2B rows) in the scoring mode of every policy update (no
        dropout, checkpointed layers still checkpointing, the precision's autocast)."""
        policy = self.team.policies[agent]
        scoring_mode(policy.model)
        part = [pair.agent_tensors[agent] for pair in pairs]
        batch = build_sequence_batch([t.prompt_input_ids for t in part] * 2,
                                     [t.winner_completion_ids for t in part] + [t.loser_completion_ids for t in part],
                                     policy.pad_id, policy.device)
        with policy.autocast():
            logprobs = score_completions(policy.model, batch).logprobs
        logps = sequence_logprobs(logprobs.float(), batch.mask)
        return logps[: len(part)] - logps[len(part) :]

    def joint_backward(self, pairs: Sequence[PreferencePair]) -> bool:
        """One joint backward when it costs no device extra memory: every agent on a device of its
        own (each device then holds one graph either way) and no micro-batching asked for. Agents
        sharing a device (the CPU) step one after another, so that one graph is alive at a time."""
        size = self.args.update_micro_batch_size
        devices = [str(policy.device) for policy in self.team.policies]
        return (size is None or size >= len(pairs)) and len(set(devices)) == len(devices)

    def joint_margins(self, pairs: Sequence[PreferencePair]) -> List[torch.Tensor]:
        """Every agent's ``Delta_i`` with its graph (one forward per agent over winners and losers),
        then one backward of the joint loss through all of them: n forwards for n agents."""
        deltas = []
        for agent in range(self.team.num_agents):
            delta = self.score_margins(agent, pairs)
            if not bool(torch.isfinite(delta.detach()).all()):
                raise FloatingPointError(
                    f"{self.label(agent)}: its log-likelihood margins are not finite ({delta.detach().float().cpu().tolist()[:4]}). "
                    f"Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
                )
            deltas.append(delta)
        loss = joint_margin_loss(sum(d.float().cpu() for d in deltas), self.args.dpo_beta)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"{self.label()}: the joint loss is {float(loss.detach())}. Lower agent_learning_rate or dpo_beta, or set max_grad_norm."
            )
        backward_together([policy.optimizer for policy in self.team.policies], loss)
        return [d.detach().float().cpu() for d in deltas]

    def step_agent(self, agent: int) -> float:
        """Finish agent ``agent``'s update; its gradient norm."""
        return self.team.policies[agent].optimizer.step(self.label(agent))

    def update(self, pairs: List[PreferencePair]) -> Dict[str, float]:
        """One step per agent on ``-log sigmoid(beta * sum_i Delta_i)`` (see the module docstring):
        both schedules give each agent the gradient of the joint loss at the weights the update
        started from."""
        n = self.team.num_agents
        metrics: Dict[str, float] = {}
        if self.joint_backward(pairs):
            deltas: List[Optional[torch.Tensor]] = list(self.joint_margins(pairs))
            for i in range(n):
                metrics[f"agent_{i}/grad_norm"] = self.step_agent(i)
        else:
            deltas = [None] + [self.pair_margins(i, pairs) for i in range(1, n)]
            for i in range(n):
                others = sum((deltas[j] for j in range(n) if j != i), torch.zeros(len(pairs)))
                deltas[i] = self.pair_margins(i, pairs, others=others)
                metrics[f"agent_{i}/grad_norm"] = self.step_agent(i)
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

    # ------------------------------------------------------------------ checkpoint contents
    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        components.add_optimizers("optimizers", self.team.optimizers)
        components.add_state("epoch_order", AttributeState(self, "epoch_order"))
