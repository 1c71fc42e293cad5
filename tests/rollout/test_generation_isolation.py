"""Samples come from exactly the distribution the trainer scores, whatever the checkpoint's own
generation_config says, and every sampled token's log-probability is recorded as it is drawn."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from tests.helpers.tolerances import logprob_bound, rounding_bound, scored_length

from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.generation import HFGenerator, SamplingParams
from comlrl.rollout.scoring import score_completions
from comlrl.rollout.sampling import TokenSampler

PROMPT = "Tell a joke"
# Frequency checks: |freq - p| < Z * sqrt(p (1 - p) / n). A two-sided normal tail beyond 5 sd is 5.7e-7,
# so no seed fails by chance; a distorted distribution (suppressed tokens, top-k 5, temperature 0.5)
# moves these frequencies by tens of standard deviations.
Z = 5.0


def next_token_probs(model, tok, prompt, temperature=1.0):
    ids = torch.tensor([tok(prompt).input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float()
    return torch.softmax(logits / temperature, -1)


@pytest.fixture
def opinionated_model(tiny_paths, tmp_path):
    """The tiny llama saved with a generation_config like Qwen3/Gemma-3 ship, plus more: sampling
    settings, min_p, a repetition penalty and suppressed tokens — the suppressed ones being the two
    most likely next tokens, so any leak shows up as a missing mode."""
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    top2 = torch.topk(next_token_probs(model, tok, PROMPT), 2).indices.tolist()
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.5, top_p=0.95, top_k=5, min_p=0.2, repetition_penalty=1.1,
        suppress_tokens=top2, max_new_tokens=3, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    path = tmp_path / "opinionated"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    assert loaded.generation_config.suppress_tokens == top2 and loaded.generation_config.min_p == 0.2
    return loaded, tok, top2


def test_samples_follow_the_scored_distribution_not_the_checkpoints_settings(opinionated_model):
    model, tok, top2 = opinionated_model
    probs = next_token_probs(model, tok, PROMPT)  # the distribution the trainer scores at temperature 1
    gen = HFGenerator(model, tok, torch.device("cpu"))
    n = 2400
    out = gen.generate([PROMPT], n, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=1.0, top_k=None))
    drawn = torch.tensor([int(t[0]) for t in out.tokens])
    for token in top2:  # suppress_tokens / min_p / top_k=5 / temperature 0.5 would each distort these
        p = float(probs[token])
        freq = float((drawn == token).float().mean())
        se = math.sqrt(p * (1 - p) / n)
        assert abs(freq - p) < Z * se, (token, freq, p, se)
    # top_k=5 from the checkpoint would allow at most 5 distinct tokens; the model's distribution is broad
    assert len(set(drawn.tolist())) > 20
    assert model.generation_config.suppress_tokens == top2  # the model's own config is left as it was


def test_greedy_is_the_argmax_of_the_scored_logits(opinionated_model):
    model, tok, top2 = opinionated_model
    gen = HFGenerator(model, tok, torch.device("cpu"))
    out = gen.generate([PROMPT], 1, SamplingParams(max_new_tokens=1, do_sample=False))
    assert int(out.tokens[0][0]) == top2[0]  # suppressed by the checkpoint's config, chosen by ours
    assert out.logprobs is None


def test_recorded_logprobs_are_the_scored_ones(tiny_paths):
    tok = AutoTokenizer.from_pretrained(tiny_paths["gpt2"])
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    gen = HFGenerator(model, tok, torch.device("cpu"))
    sampling = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=40)
    out = gen.generate(["Tell a joke", "Describe a city in the clouds"], 3, sampling)
    batch = build_sequence_batch([out.prompt_of_row(r) for r in range(6)], out.tokens, gen.pad_id, torch.device("cpu"))
    with torch.no_grad():
        scored = score_completions(model, batch, temperature=0.7).logprobs
    # two float32 forwards of the same weights (cached generation, batched scoring): 2 logprob_bound apart at most
    atol = 2 * logprob_bound(model, scored_length(tok, ["Tell a joke", "Describe a city in the clouds"], 6), 0.7)
    for row, recorded in enumerate(out.logprobs):
        assert recorded.shape == out.tokens[row].shape
        torch.testing.assert_close(recorded, scored[row, : len(recorded)], atol=atol, rtol=0)


def test_a_rows_samples_depend_only_on_its_seed(tiny_paths):
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    gen = HFGenerator(model, tok, torch.device("cpu"))
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95)
    alone = gen.generate(["Tell a joke"], 2, sampling, seeds=[11, 12])
    together = gen.generate(["Describe a world without electricity", "Tell a joke"], 2, sampling, seeds=[5, 6, 11, 12])
    assert [t.tolist() for t in alone.tokens] == [t.tolist() for t in together.tokens[2:]]
    other = gen.generate(["Tell a joke"], 2, sampling, seeds=[13, 14])
    assert [t.tolist() for t in other.tokens] != [t.tolist() for t in alone.tokens]
    with pytest.raises(ValueError, match="one seed per row"):
        gen.generate(["Tell a joke"], 2, sampling, seeds=[1])


def test_token_sampler_keeps_hugging_faces_nucleus():
    """Over many draws the sampler only ever picks tokens of the top-k/top-p set, in proportion."""
    torch.manual_seed(0)
    scores = torch.randn(1, 30) * 2
    sampler = TokenSampler(temperature=0.8, top_k=10, top_p=0.7, seeds=range(4000), max_steps=1)
    rows = scores.expand(4000, 30).clone()
    chosen = sampler(None, rows).argmax(-1)
    tempered = scores[0] / 0.8
    topk = torch.topk(tempered, 10)
    probs = torch.softmax(topk.values, -1)
    keep = (torch.cumsum(probs, -1) - probs) < 0.7
    kept = topk.indices[keep]
    assert set(chosen.tolist()) <= set(kept.tolist())
    renormalised = probs[keep] / probs[keep].sum()
    for token, p in zip(kept.tolist(), renormalised.tolist()):
        freq = float((chosen == token).float().mean())
        # p is a float32 softmax over the top 10, renormalised: rounding_bound(2 * 10 + 2, 1) covers its rounding
        assert abs(freq - p) <= Z * math.sqrt(p * (1 - p) / 4000) + rounding_bound(22, 1.0)
    # the recorded value is the untruncated tempered log-prob (what scoring computes)
    expected = torch.log_softmax(tempered, -1)[chosen]
    torch.testing.assert_close(sampler.logprobs()[:, 0], expected)
