"""Pieces of the direction tests: a policy that can only say "a" or "b", log-probs of fixed
completions from a scoring forward, and parameter comparisons that weight decay cannot satisfy.

The two-token policy is a tiny model whose LM head is untied and biased towards the tokens "a" and
"b"; with ``max_new_tokens=1`` and ``top_k=2`` every sampled completion is exactly one of them, so
a reward can prefer one completion and the test can measure both completions' log-probabilities
before and after training.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PREFERRED, OTHER = "b", "a"

# Sampling and optimiser settings shared by every direction test: one token per completion drawn
# from the top two, the scored distribution equal to the sampling one (T = 1), and no weight decay,
# so that parameters move only where a gradient is.
ONE_TOKEN = dict(max_new_tokens=1, top_k=2, top_p=1.0, temperature=1.0, weight_decay=0.0)


def two_token_policy(path: str, bias: float = 6.0, tokens: Sequence[str] = (PREFERRED, OTHER)):
    """``(model, tokenizer, {token: id})`` for the tiny model at ``path``, its LM head biased towards the
    two ``tokens`` (default "b" and "a"; the tokenizer's EOS token may be one of them)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = {text: tokenizer.convert_tokens_to_ids(text) for text in tokens}
    assert all(tokenizer.decode([i]) == text for text, i in ids.items())
    embeddings = model.get_input_embeddings().weight
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(embeddings)
        head.bias.zero_()
        for i in ids.values():
            head.bias[i] = bias
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False
    return model, tokenizer, ids


def preference_reward(completions: Sequence[str]) -> List[float]:
    """+1 for the preferred completion, -1 for the other (a one-agent reward)."""
    return [1.0 if c == PREFERRED else -1.0 for c in completions]


def completion_logprobs(lm, tokenizer, prompts: Sequence[str], token_ids: Dict[str, int], temperature: float = 1.0) -> Dict[str, torch.Tensor]:
    """``{text: [P] log pi(text | prompt)}`` of the one-token completions, from one scoring forward
    (in float32, or in float64 for a float64 ``lm``: a reference free of float32 rounding)."""
    out = {text: [] for text in token_ids}
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            logits = lm(input_ids=ids).logits[0, -1]
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
            logprobs = torch.log_softmax(logits, -1)
            for text, index in token_ids.items():
                out[text].append(logprobs[index])
    return {text: torch.stack(values) for text, values in out.items()}


def assert_preference_learned(before: Dict[str, torch.Tensor], after: Dict[str, torch.Tensor]) -> None:
    """On every prompt the preferred completion became more likely and the other less likely."""
    rise = after[PREFERRED] - before[PREFERRED]
    fall = after[OTHER] - before[OTHER]
    assert torch.all(rise > 1e-3), f"log pi({PREFERRED!r}) changed by {rise.tolist()}"
    assert torch.all(fall < -1e-3), f"log pi({OTHER!r}) changed by {fall.tolist()}"


def assert_unchanged(module, before: Sequence[torch.Tensor], what: str) -> None:
    """Bit for bit: with weight decay 0 a zero gradient leaves AdamW's parameters exactly as they were."""
    for index, (old, new) in enumerate(zip(before, module.parameters())):
        assert torch.equal(old, new), f"{what}: parameter {index} moved by up to {float((old - new).abs().max())}"


def adam_steps(optimizer: torch.optim.Optimizer) -> List[int]:
    """The AdamW step count of every parameter (0 where it was never stepped)."""
    counts = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            counts.append(int(state["step"]) if "step" in state else 0)
    return counts


def agent_steps(trainer, models=None) -> int:
    """The most AdamW steps any parameter of ``models`` (default: the trainer's agents) took."""
    owned = {id(p) for m in (trainer.agents if models is None else models) for p in m.parameters()}
    optimizers = trainer.named_optimizers().values() if hasattr(trainer, "named_optimizers") else trainer.optimizers
    return max((count for opt in optimizers for count, p in zip(adam_steps(opt), (p for g in opt.param_groups for p in g["params"]))
                if id(p) in owned), default=0)


def record_calls(trainer) -> List[dict]:
    """Every metrics dict ``trainer`` records, in order: each update's own values, before the
    logger averages them into a row."""
    calls: List[dict] = []
    original = trainer.metrics.record

    def record(metrics):
        calls.append(dict(metrics))
        return original(metrics)

    trainer.metrics.record = record
    return calls


def negated_mean_baseline() -> str:
    """Register (once) and name the mean baseline with its sign flipped: what a sign bug in a variant
    would do, for the direction tests' control runs."""
    from comlrl.core import get_advantage, register_advantage

    @register_advantage("test_negated_mean", replace=True)
    def negated_mean(returns: torch.Tensor) -> torch.Tensor:
        return -get_advantage("mean")(returns)

    return "test_negated_mean"
