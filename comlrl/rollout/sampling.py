"""Drawing the next token: temperature, top-k and top-p (nucleus) filtering, our own random streams,
and the sampling log-probability of every drawn token.

``NucleusFilter`` keeps exactly Hugging Face's set of tokens: after dividing by the temperature and
keeping the ``top_k`` largest logits, a token survives top-p when the probability mass of the tokens
ranked strictly above it is below ``top_p`` (so the most likely token always survives). Instead of
sorting the whole vocabulary at every decoding step, the ``probe`` most likely tokens are taken with
``topk``; when they already hold at least ``top_p`` of the mass (almost always, since nucleus
sampling is used to cut a long tail) the answer lies among them, and only when they do not does it
fall back to a full sort.

``TokenSampler`` is a logits processor for Hugging Face's *greedy* ``generate`` loop that makes the
sampling decision itself: it draws the token from the filtered distribution with one uniform number
per row from that row's own ``torch.Generator`` (inverse CDF over the kept tokens), records
``log softmax(logits / T)[token]`` (the tempered, untruncated log-probability that scoring computes
later, so importance ratios start at 1), and returns scores whose only finite entry is the drawn
token, which the greedy loop then selects. No global random state is used, so the samples of a row
depend only on its seed.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

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

    def tempered(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()
        return scores / self.temperature if self.temperature != 1.0 else scores

    def candidates(self, tempered: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(values, indices, keep)`` of the candidate tokens, most likely first, with ``keep`` the
        (prefix) mask of those that survive; None when every token is kept (no top-k, no top-p)."""
        vocab = tempered.shape[-1]
        top_k = self.top_k if 0 < self.top_k < vocab else 0
        if self.top_p >= 1.0 and not top_k:
            return None
        if top_k:
            values, indices = torch.topk(tempered, top_k, dim=-1)  # the top-k set, descending
            if self.top_p >= 1.0:
                return values, indices, torch.ones_like(values, dtype=torch.bool)
            log_total = torch.logsumexp(values, dim=-1, keepdim=True)  # top-p renormalises within top-k
        else:
            log_total = torch.logsumexp(tempered, dim=-1, keepdim=True)
            values, indices = torch.topk(tempered, min(self.probe, vocab), dim=-1)
        probs = torch.exp(values - log_total)
        above = torch.cumsum(probs, dim=-1) - probs  # mass ranked strictly above each candidate
        covered = (above[..., -1] + probs[..., -1]) >= self.top_p
        if not top_k and values.shape[-1] < vocab and not bool(covered.all()):
            values, indices = torch.sort(tempered, dim=-1, descending=True)
            probs = torch.exp(values - log_total)
            above = torch.cumsum(probs, dim=-1) - probs
        keep = above < self.top_p
        keep[..., 0] = True
        return values, indices, keep

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tempered = self.tempered(scores)
        found = self.candidates(tempered)
        if found is None:
            return tempered
        values, indices, keep = found
        filtered = torch.full_like(tempered, float("-inf"))
        return filtered.scatter(-1, indices, values.masked_fill(~keep, float("-inf")))


def row_generators(seeds: Sequence[int]) -> List[torch.Generator]:
    """One CPU generator per row, seeded with its own seed."""
    generators = []
    for seed in seeds:
        generator = torch.Generator()
        generator.manual_seed(int(seed))
        generators.append(generator)
    return generators


def draw_seeds(count: int) -> List[int]:
    """``count`` 63-bit seeds drawn from torch's global generator (so a checkpoint of the global RNG
    state covers them)."""
    return [int(s) for s in torch.randint(0, 2**63 - 1, (count,), dtype=torch.long)]


class TokenSampler:
    """Logits processor that draws each row's next token itself (see module docstring).

    ``seeds``: one per row of the generate batch (the rows HF builds: prompt-major, K per prompt).
    After ``generate``, ``logprobs()`` is ``[R, steps]`` float32 on the CPU: entry ``[r, t]`` is the
    tempered log-probability of the token drawn for row r at step t (meaningless after its EOS).
    """

    def __init__(self, temperature: float, top_k: Optional[int], top_p: float, seeds: Sequence[int], max_steps: int, probe: int = 1024):
        self.filter = NucleusFilter(temperature, top_k, top_p, probe)
        # every uniform a row can need, drawn up front: one generator call per row, not per step
        self._uniforms = torch.stack([torch.rand(max_steps, generator=g, dtype=torch.float64) for g in row_generators(seeds)])
        self._steps: List[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = len(self._steps)
        if scores.shape[0] != self._uniforms.shape[0]:
            raise RuntimeError(f"TokenSampler was built for {self._uniforms.shape[0]} rows but generate has {scores.shape[0]}.")
        if step >= self._uniforms.shape[1]:
            raise RuntimeError("TokenSampler was asked for more steps than max_new_tokens.")
        tempered = self.filter.tempered(scores)
        log_total = torch.logsumexp(tempered, dim=-1, keepdim=True)
        u = self._uniforms[:, step].to(device=tempered.device)
        found = self.filter.candidates(tempered)
        if found is None:
            values, indices, keep = tempered, None, None
        else:
            values, indices, keep = found
        # inverse CDF over the kept tokens, in float64 so the cumulative sum of a long tail stays exact enough
        weights = torch.exp(values.double() - log_total.double())
        if keep is not None:
            weights = weights * keep
        cdf = torch.cumsum(weights, dim=-1)
        target = (u * cdf[:, -1]).unsqueeze(-1)
        position = torch.searchsorted(cdf, target, right=True).clamp_max(values.shape[-1] - 1)
        if keep is not None:  # never past the last kept token (rounding at the very top of the CDF)
            position = torch.minimum(position, keep.sum(dim=-1, keepdim=True) - 1)
        chosen = position if indices is None else indices.gather(-1, position)
        self._steps.append((tempered.gather(-1, chosen) - log_total).squeeze(-1).cpu())
        out = scores.new_full(scores.shape, float("-inf"))
        return out.scatter_(-1, chosen, 0.0)

    def logprobs(self) -> torch.Tensor:
        if not self._steps:
            return torch.zeros(self._uniforms.shape[0], 0)
        return torch.stack(self._steps, dim=1)
