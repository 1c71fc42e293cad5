"""Temperature, top-k and top-p (nucleus) filtering in one logits processor, without a full-vocabulary
sort in the common case.

The kept set is exactly Hugging Face's: after dividing by the temperature and keeping the ``top_k``
largest logits, a token survives top-p when the probability mass of the tokens ranked strictly above
it is below ``top_p`` (so the most likely token always survives). Instead of sorting the whole
vocabulary at every decoding step, the ``probe`` most likely tokens are taken with ``topk``; when they
already hold at least ``top_p`` of the mass (almost always, since nucleus sampling is used to cut a
long tail) the answer lies among them, and only rows where they do not fall back to a full sort.
"""

from __future__ import annotations

from typing import Optional

import torch


class NucleusFilter:
    """``__call__(input_ids, scores) -> scores`` with filtered entries set to ``-inf``."""

    def __init__(self, temperature: float = 1.0, top_k: Optional[int] = None, top_p: float = 1.0, probe: int = 1024):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        self.temperature = float(temperature)
        self.top_k = int(top_k) if top_k else 0
        self.top_p = float(top_p)
        self.probe = int(probe)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()
        if self.temperature != 1.0:
            scores = scores / self.temperature
        vocab = scores.shape[-1]
        if 0 < self.top_k < vocab:
            kth = torch.topk(scores, self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p >= 1.0:
            return scores
        return self._top_p(scores)

    def _top_p(self, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        width = min(self.probe, vocab, self.top_k or vocab)
        log_total = torch.logsumexp(scores, dim=-1, keepdim=True)
        values, indices = torch.topk(scores, width, dim=-1)  # descending
        probs = torch.exp(values - log_total)
        above = torch.cumsum(probs, dim=-1) - probs  # mass ranked strictly above each candidate
        covered = (above[..., -1] + probs[..., -1]) >= self.top_p
        if width < vocab and not bool(covered.all()):
            values, indices = torch.sort(scores, dim=-1, descending=True)
            probs = torch.exp(values - log_total)
            above = torch.cumsum(probs, dim=-1) - probs
        keep = above < self.top_p
        keep[..., 0] = True
        filtered = torch.full_like(scores, float("-inf"))
        return filtered.scatter(-1, indices, values.masked_fill(~keep, float("-inf")))
