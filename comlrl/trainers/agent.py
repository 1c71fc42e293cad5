"""One agent of a team: its model, tokenizer, sampler, optimizer and optional frozen reference
(``PolicyAgent``), and building the frozen references (``build_references``)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, ContextManager, Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.core.kl import sequence_kl, sequence_log_ratio
from comlrl.models.loading import frozen_copy, model_device
from comlrl.models.lora import adapter_free_reference
from comlrl.models.precision import Precision
from comlrl.models.tokenizers import eos_token_ids, pad_token_id
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.generation import Completions, GenerationBackend, HFGenerator
from comlrl.rollout.scoring import score_completions
from comlrl.trainers.optim import AgentOptimizer


def compute_context(precision: Optional[Precision], device: torch.device) -> ContextManager:
    """The compute-dtype context of forwards on ``device`` under ``precision`` (None: a no-op)."""
    return precision.autocast(device) if precision is not None else contextlib.nullcontext()


class PolicyAgent:
    """One agent: model, tokenizer, sampler, optimizer, optional frozen reference.

    ``precision`` decides the compute dtype of its forwards (``autocast()``); ``generator`` is the
    sampling backend (Hugging Face ``generate`` unless a trainer installs another one).
    """

    def __init__(self, index: int, model: nn.Module, tokenizer: Any, device: torch.device, reference: Optional[nn.Module] = None,
                 precision: Optional[Precision] = None):
        self.index = index
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.reference = reference
        self.precision = precision
        self.pad_id = pad_token_id(tokenizer)
        self.eos_ids = tuple(eos_token_ids(tokenizer, model))  # the ids every generation backend stops at
        autocast = functools.partial(compute_context, precision, device)  # not a bound method: no agent <-> generator cycle
        self.generator: GenerationBackend = HFGenerator(model, tokenizer, device, autocast=autocast)
        self.optimizer: Optional[AgentOptimizer] = None

    def autocast(self) -> ContextManager:
        """The compute-dtype context of this agent's forwards (a no-op unless mixed precision)."""
        return compute_context(self.precision, self.device)

    def token_logprobs(self, model: nn.Module, prompts: Sequence[torch.Tensor], completions: Sequence[torch.Tensor], temperature: float) -> torch.Tensor:
        """``[R, C]`` log-probs of the completions under ``model`` (no grad, eval mode)."""
        device = model_device(model)
        batch = build_sequence_batch(prompts, completions, self.pad_id, device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self.autocast():
                logprobs = score_completions(model, batch, temperature).logprobs
        finally:
            model.train(was_training)
        return (logprobs * batch.mask).cpu()

    @property
    def version(self) -> int:
        """Optimizer steps this agent has taken: a sample drawn at another version is stale."""
        return self.optimizer.updates if self.optimizer is not None else 0

    def rollout_extras(self, completions: Completions, temperature: float, *, reference_kl: bool) -> Dict[str, Any]:
        """Per row of ``completions`` (when asked and a reference exists): ``reference_kl``, the k3 estimate
        of KL(pi || pi_ref) (logged), and ``reference_log_ratio``, k1 = log pi - log pi_ref (the penalty:
        see ``core.kl.sequence_log_ratio``) and ``reference_logprobs``, each row's per-token reference
        log-probs (the KL loss of ``reference_kl_mode="loss"``). The policy's side is the log-probs recorded while sampling;
        only greedy completions (which record none) need a forward of the policy."""
        if not (reference_kl and self.reference is not None):
            return {}
        prompts = [completions.prompt_of_row(r) for r in range(len(completions.tokens))]
        reference = self.token_logprobs(self.reference, prompts, completions.tokens, temperature)
        if completions.logprobs is not None:
            policy = torch.zeros_like(reference)
            for r, logprobs in enumerate(completions.logprobs):
                policy[r, : len(logprobs)] = logprobs
        else:
            policy = self.token_logprobs(self.model, prompts, completions.tokens, temperature)
        mask = torch.zeros_like(policy)
        for r, t in enumerate(completions.tokens):
            mask[r, : len(t)] = 1.0
        return {"reference_kl": sequence_kl(policy, reference, mask), "reference_log_ratio": sequence_log_ratio(policy, reference, mask),
                "reference_logprobs": [reference[r, : len(t)].clone() for r, t in enumerate(completions.tokens)]}


def build_references(
    agents: Sequence[nn.Module], sources: Sequence[Any], devices: Sequence[torch.device], dtype: Optional[torch.dtype] = None
) -> List[nn.Module]:
    """Frozen copies of the initial agents (in ``dtype`` when given); agents loaded from the same id
    share one reference. An agent that is a LoRA adapter over a frozen base gets its initial policy
    over that base instead of a copy (``SharedBase.reference_module``)."""
    shared: Dict[Any, nn.Module] = {}
    references = []
    for model, source, device in zip(agents, sources, devices):
        reference = adapter_free_reference(model)  # each adapter's own initial policy, never shared by source
        if reference is not None:
            references.append(reference)
            continue
        key = (source, device) if isinstance(source, str) else None
        if key is not None and key in shared:
            references.append(shared[key])
            continue
        if reference is None:
            reference = frozen_copy(model, device, dtype)
        if key is not None:
            shared[key] = reference
        references.append(reference)
    return references
