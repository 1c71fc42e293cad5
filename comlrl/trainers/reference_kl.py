"""The reference KL's settings, read in one place by every trainer family (``penalty_coef``: the
coefficient of the penalty in the rewards, ``reference_kl_mode="reward"``; ``loss_coef``: the
coefficient of the KL loss term, ``reference_kl_mode="loss"``), and the reference-KL helpers of the
CoMLRL 1.4.x public API (``comlrl.utils``)."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

import torch

from comlrl.core.kl import sequence_kl
from comlrl.models.loading import frozen_copy, freeze_model, load_causal_lm
from comlrl.rollout.batch import SequenceBatch, position_ids_from_mask
from comlrl.rollout.scoring import score_completions
from comlrl.config import validate_reference_kl
from comlrl.parallel.devices import resolve_devices


def penalty_coef(args: Any) -> Optional[float]:
    """``reference_kl_coef`` when the KL is a penalty in the rewards (``reference_kl_mode="reward"``,
    CoMLRL 1.4.3), else None."""
    return float(args.reference_kl_coef) if args.reference_kl_enabled and args.reference_kl_mode == "reward" else None


def loss_coef(args: Any, has_references: bool) -> Optional[float]:
    """``reference_kl_coef`` when the KL is its own loss term (``reference_kl_mode="loss"``) and frozen
    references are loaded, else None."""
    return float(args.reference_kl_coef) if args.reference_kl_enabled and args.reference_kl_mode == "loss" and has_references else None


def reference_kl_enabled(args: Any) -> bool:
    return bool(args.reference_kl_enabled)


def reference_kl_coef(args: Any) -> float:
    return float(args.reference_kl_coef)


def validate_reference_kl_config(args: Any, expected_count: int) -> None:
    """Coefficient >= 0 always; when enabled, ``reference_devices`` must resolve for the actors."""
    validate_reference_kl(args)
    if args.reference_kl_enabled and args.reference_devices is not None:
        resolve_devices(args.reference_devices, expected_count, "reference_devices")


def resolve_reference_devices(args: Any, fallback_devices: Sequence[torch.device], expected_count: int) -> List[torch.device]:
    if args.reference_devices is None:
        return list(fallback_devices)
    return resolve_devices(args.reference_devices, expected_count, "reference_devices")


def clone_reference_models(policy_models: Sequence[Any], *, devices: Sequence[torch.device]) -> List[Any]:
    """Frozen deep copies of the policies on ``devices``."""
    return [frozen_copy(model, device) for model, device in zip(policy_models, devices)]


def load_reference_models_from_sources(
    model_sources: Sequence[str], *, devices: Sequence[torch.device], model_kwargs: Optional[Mapping[str, Any]] = None
) -> List[Any]:
    """Fresh frozen loads of each source on its device."""
    return [
        freeze_model(load_causal_lm(source, dict(model_kwargs or {}), f"references[{i}]")).to(device)
        for i, (source, device) in enumerate(zip(model_sources, devices))
    ]


def _response_logprobs(model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, response_len: int) -> torch.Tensor:
    device = next(model.parameters()).device
    end = prompt_len + response_len
    mask = attention_mask[:, :end].to(device)
    batch = SequenceBatch(
        input_ids=sequences[:, : end - 1].to(device),
        attention_mask=mask[:, :-1],
        position_ids=position_ids_from_mask(mask)[:, :-1],
        targets=sequences[:, prompt_len:end].to(device),
        mask=torch.ones(sequences.shape[0], response_len, device=device),
        prompt_width=prompt_len,
    )
    return score_completions(model, batch).logprobs.cpu()


def reference_kl_for_sequence(
    policy_model: Any, reference_model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, response_len: int
) -> torch.Tensor:
    """k3 KL(policy || reference) summed over the ``response_len`` tokens after ``prompt_len``.

    ``sequences`` is ``[1, L]`` (or ``[B, L]``); returns a CPU tensor of shape ``[B]`` (``[]`` for one row).
    """
    if response_len <= 0:
        return torch.zeros(())
    if sequences.dim() == 1:
        sequences, attention_mask = sequences.unsqueeze(0), attention_mask.unsqueeze(0)
    states = [(m, m.training) for m in (policy_model, reference_model)]
    try:
        for model, _ in states:
            model.eval()
        with torch.no_grad():
            policy = _response_logprobs(policy_model, sequences, attention_mask, prompt_len, response_len)
            reference = _response_logprobs(reference_model, sequences, attention_mask, prompt_len, response_len)
    finally:
        for model, was_training in states:
            model.train(was_training)
    kl = sequence_kl(policy, reference, torch.ones_like(policy))
    return kl[0] if kl.shape[0] == 1 else kl
