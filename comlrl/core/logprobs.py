"""Log-probabilities of chosen tokens under a tempered softmax, with a memory-lean backward.

``selected_logprobs(logits, targets, T) = log softmax(logits / T)[targets]``.

The autograd version keeps exactly one ``[R, C, V]`` tensor alive from the forward to the end of
the backward: the logits themselves. The forward computes ``logsumexp`` in row chunks (bounded
temporaries), and the backward turns the saved logits, in place, into the gradient

    d logp_y / d z = (onehot(y) - softmax(z / T)) / T.

So the caller must hand over the logits: they are overwritten during backward (they are a model
output nobody else reads). Without grad (or for inputs that do not require it) nothing is changed.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 22  # ~16 MB of float32 temporaries per chunk


def row_chunk(width: int) -> int:
    """Rows of a ``[N, width]`` tensor per chunk so that a float32 temporary stays ~16 MB."""
    return max(1, CHUNK_ELEMENTS // max(width, 1))


def _logsumexp_chunked(flat: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logsumexp(flat / T)`` per row of ``[N, V]``, float32, in bounded chunks."""
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    step = row_chunk(flat.shape[1])
    for start in range(0, flat.shape[0], step):
        chunk = flat[start : start + step].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        out[start : start + step] = torch.logsumexp(chunk, dim=-1)
    return out


class _SelectedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        flat_targets = targets.reshape(-1)
        lse = _logsumexp_chunked(flat, temperature)
        picked = flat.gather(-1, flat_targets.unsqueeze(-1)).squeeze(-1).float() / temperature
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return (picked - lse).reshape(targets.shape)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        temperature = ctx.temperature
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)  # overwritten below with the gradient
        flat_targets = targets.reshape(-1)
        g = grad_output.reshape(-1).float()
        step = row_chunk(vocab)
        for start in range(0, flat.shape[0], step):
            chunk = flat[start : start + step]
            probs = (chunk.float() / temperature - lse[start : start + step, None]).exp_()
            probs.mul_(-(g[start : start + step, None] / temperature))
            probs.scatter_add_(
                -1,
                flat_targets[start : start + step, None],
                (g[start : start + step, None] / temperature),
            )
            chunk.copy_(probs)
        return flat.reshape(logits.shape), None, None


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[..., V]`` logits and ``[...]`` targets -> ``[...]`` float32 log-probs (see module doc)."""
    if logits.requires_grad and torch.is_grad_enabled():
        return _SelectedLogProbs.apply(logits, targets, float(temperature))
    flat = logits.reshape(-1, logits.shape[-1])
    lse = _logsumexp_chunked(flat, temperature)
    picked = flat.gather(-1, targets.reshape(-1, 1)).squeeze(-1).float() / temperature
    return (picked - lse).reshape(targets.shape)


def sequence_logprobs(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y | x) = sum_t log pi(y_t | x, y_<t)`` over the real tokens of each row: ``[R, C] -> [R]``."""
    return (token_logprobs * mask.to(token_logprobs.dtype)).sum(dim=-1)
