"""Tolerances derived from the computation they cover, so that a comparison holds on any machine,
seed and thread count (docs/testing.md, "Numerics").

A float sum of ``n`` terms, in whatever order a kernel takes them (SIMD width, threads, batch
shape), differs from the exact sum by at most ``gamma_n * sum |x_i|`` with ``gamma_n = n u / (1 - n u)``
and ``u = eps / 2`` the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1).
For every ``n`` met here ``n u << 1``, so ``n * eps * scale`` bounds it with room to spare: that is
:func:`rounding_bound`. Through a chain of such sums the first-order relative errors add, which is how
:func:`logprob_bound` bounds a float32 log-probability of a small causal LM.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2**-23


def rounding_bound(terms: int, scale: float, dtype: torch.dtype = torch.float32) -> float:
    """Worst-case rounding error of an accumulation of ``terms`` values whose magnitudes sum to
    ``scale`` (``terms * eps * scale``): two orders of the same sum differ by at most twice this."""
    return terms * torch.finfo(dtype).eps * scale


def log_softmax_bound(logits: torch.Tensor, temperature: float = 1.0) -> float:
    """The float32 error bound of ``log_softmax(logits / T)`` at given logits (any dtype): rounding the
    logits to float32 moves each by ``eps/2 |z| / T``, the sum of ``V`` exponentials inside the logarithm
    adds ``V eps``, and the logarithm and subtractions ``eps`` times magnitudes below ``2 (M + log V)``,
    ``M = max |z| / T``. The gradient ``(onehot - softmax) / T`` moves by at most ``(2 bound + eps) / T``."""
    vocab = logits.shape[-1]
    scale = float(logits.detach().abs().max()) / temperature
    return EPS32 * (vocab + 2 + 5 * (scale + math.log(vocab)))


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers causal LM inside a PEFT model (or comlrl's one-adapter view of a shared one), a
    value-head wrapper (its ``.model``) or a reward model (its ``.backbone``)."""
    if getattr(model, "shared", None) is not None:
        model = model.shared.peft_model
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    while not hasattr(model, "get_output_embeddings") or getattr(model, "config", None) is None:
        inner = getattr(model, "model", None) or getattr(model, "backbone", None)
        if inner is None:
            raise TypeError(f"logprob_bound needs a transformers causal LM, got {type(model).__name__}")
        model = inner
    return model


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "model", None) or getattr(model, "transformer", None)
    for name in ("norm", "ln_f"):
        if inner is not None and hasattr(inner, name):
            return getattr(inner, name)
    raise TypeError(f"logprob_bound knows llama's model.norm and gpt2's transformer.ln_f, not {type(model).__name__}")


def logprob_bound(model: torch.nn.Module, length: int, temperature: float = 1.0) -> float:
    """A first-order bound on ``|log pi(y | x) - exact|`` for one token of ``model``'s float32 forward
    over a sequence of ``length`` tokens (log-softmax of the logits / ``temperature``), whatever order
    its kernels sum in. Two float32 computations of it are at most twice this apart.

    - ``A``, the largest magnitude a logit is summed from: ``|z_i| <= sum_j |W_ij h_j| + |b_i|``, where
      ``h`` leaves the final RMSNorm / LayerNorm, so ``|h_j| <= sqrt(d) |gamma_j| + |beta_j|`` for any input.
    - the chain of accumulations from the embeddings to a logit, per layer ``3d`` (q/k/v, then the
      output projection and the MLP's first one, each of width ``d``), the head dimension (scores),
      ``2 * length`` (softmax sum and the weighted sum of values) and the MLP width; then ``d`` for the head.
      Normalisations, softmax and activations are well-conditioned, so the relative errors add:
      ``|dz_i| <= chain * eps * A``.
    - ``log_softmax`` of ``z / T``: ``z_y / T - lse(z / T)`` moves by at most ``2 max |dz| / T``, the vocabulary
      sum inside the logarithm adds ``V * eps`` and the final subtractions ``eps`` times magnitudes below
      ``2 (A / T + log V)``.
    """
    adapter = getattr(model, "adapter_name", None)
    model = _causal_lm(model)
    vocab = model.config.vocab_size
    scale = _head_scale(model.get_output_embeddings(), _hidden_bound(model), adapter) / temperature
    return EPS32 * (2 * forward_chain(model, length) * scale + vocab + 4 * (scale + math.log(vocab)))


def logit_bound(model: torch.nn.Module, length: int, extra_terms: int = 0) -> float:
    """The float32 error bound of a logit of ``model`` over ``length`` tokens (the first part of
    :func:`logprob_bound`); ``extra_terms`` lengthens the chain (a LoRA adapter's rank, say)."""
    adapter = getattr(model, "adapter_name", None)
    model = _causal_lm(model)
    return (forward_chain(model, length) + extra_terms) * EPS32 * _head_scale(model.get_output_embeddings(), _hidden_bound(model), adapter)


def forward_chain(model: torch.nn.Module, length: int) -> int:
    """The accumulation lengths from a causal LM's embeddings to its head, over ``length`` tokens (see
    :func:`logprob_bound`)."""
    config = _causal_lm(model).config
    d = config.hidden_size
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    return config.num_hidden_layers * (3 * d + d // config.num_attention_heads + 2 * length + width) + d


def _hidden_bound(model: torch.nn.Module) -> torch.Tensor:
    """Per component, the largest magnitude of a hidden state leaving the final norm: ``sqrt(d) |gamma| + |beta|``."""
    norm = _final_norm(model)
    gamma = norm.weight.detach().double().abs()
    beta = norm.bias.detach().double().abs() if getattr(norm, "bias", None) is not None else torch.zeros_like(gamma)
    return math.sqrt(model.config.hidden_size) * gamma + beta


def _head_scale(head: torch.nn.Linear, h: torch.Tensor, adapter: Optional[str] = None) -> float:
    """``max_i sum_j |W_ij| h_j + |b_i|``: the largest sum of magnitudes an output of ``head`` adds up
    (``W`` with the LoRA ``adapter``'s delta when the head carries it)."""
    with torch.no_grad():
        weight = head.weight.detach().double()
        if adapter is not None and adapter in getattr(head, "lora_A", {}):
            weight = weight + head.get_delta_weight(adapter).detach().double()
        scale = weight.abs() @ h
        if getattr(head, "bias", None) is not None:
            scale = scale + head.bias.detach().double().abs()
    return float(scale.max())


def value_bound(model: torch.nn.Module, head: torch.nn.Module, length: int) -> float:
    """The float32 error bound of a scalar head's output (a value head, a reward head: one ``Linear``,
    or ``pre_projection`` + tanh + ``value_projection``) on the final hidden state of ``model``'s
    backbone over ``length`` tokens, as :func:`logprob_bound` bounds a logit: the chain of accumulations
    times the magnitudes summed into the output; a hidden layer's tanh is 1-Lipschitz and bounded by 1,
    so its errors reach the value through ``sum |w2|``."""
    lm = _causal_lm(model)
    chain = forward_chain(lm, length)
    h = _hidden_bound(lm)
    if isinstance(head, torch.nn.Linear) or head.pre_projection is None:
        linear = head if isinstance(head, torch.nn.Linear) else head.value_projection
        return chain * EPS32 * _head_scale(linear, h)
    first = head.pre_projection[0]
    hidden_error = chain * EPS32 * _head_scale(first, h)
    w2 = float(head.value_projection.weight.detach().double().abs().sum())
    ones = torch.ones(first.out_features, dtype=torch.float64)
    return w2 * hidden_error + first.out_features * EPS32 * _head_scale(head.value_projection, ones)


def k3_noise(delta: float, tokens: int) -> float:
    """The largest k3 KL estimate, summed over ``tokens`` tokens, of a policy and a reference whose
    log-probs differ by float rounding only (``|d| <= delta`` per token): ``expm1(d) - d <= d^2 e^|d| / 2``,
    plus the rounding of its two float32 operations (``2 eps |d|``)."""
    return tokens * (delta**2 * math.exp(delta) / 2 + 2 * EPS32 * delta)


def gradient_bound(model: torch.nn.Module, length: int, reference: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """How far apart two float32 computations of a gradient through ``model`` can be, normwise: the
    backward repeats the forward's accumulations (:func:`forward_chain`) once more, so the chain is
    twice as long, and two computations are at most twice one's error. Relative to the magnitude of
    ``reference`` (its largest entry, or a gradient's norm, which bounds that): a first-order bound for
    a well-conditioned backward, where no entry is the difference of terms much larger than that."""
    return 2 * 2 * forward_chain(model, length) * torch.finfo(dtype).eps * float(reference.detach().abs().max())


def adamw_gap(lr: float, steps: int, betas=(0.9, 0.999), grad_error: Optional[float] = None, eps: float = 1e-8) -> float:
    """How far two AdamW runs from the same weights can end apart, per weight, when their gradients
    differ by float rounding: a step moves a weight by at most ``lr`` on the first step and
    ``lr r``, ``r = (1 - beta1) / sqrt(1 - beta2)``, after (Kingma & Ba 2015, sec. 2.1, when r > 1), and
    rounding in a gradient near zero can turn a step's direction around: ``2 lr r`` per step.

    With ``grad_error``, a bound on how far the two runs' gradient entries are apart (float64 runs make
    it tiny), step ``t`` differs by at most ``lr t (1 + r) grad_error / eps`` when that is smaller: to
    first order ``m / (sqrt(v) + eps)`` moves by ``1 / eps`` per unit change of m and by ``r / eps`` through
    v (as ``|m| <= r sqrt(v)``), and its moments hold the ``t`` gradients so far."""
    r = max(1.0, (1 - betas[0]) / math.sqrt(1 - betas[1]))
    total = 0.0
    for t in range(1, steps + 1):
        flip = 2 * lr * (1.0 if t == 1 else r)
        total += flip if grad_error is None else min(flip, lr * t * (1 + r) * grad_error / eps)
    return total


def scored_length(tokenizer, prompts, new_tokens: int) -> int:
    """The longest sequence a forward sees: the longest tokenized prompt plus ``new_tokens``."""
    return max(len(tokenizer(p)["input_ids"]) for p in prompts) + new_tokens


def ratio_bound(model: torch.nn.Module, length: int, temperature: float = 1.0) -> float:
    """How far from 1 a token's ratio ``exp(log pi - log pi_sampling)`` of two float32 forwards of the
    same policy can be: ``expm1(2 * logprob_bound)``; a mean of such ratios adds at most its own rounding."""
    return math.expm1(2 * logprob_bound(model, length, temperature))
