"""Batched sampling and scoring agree with unbatched computation, padding and EOS handled right."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.tolerances import logprob_bound, scored_length

from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.generation import HFGenerator, SamplingParams, completion_lengths
from comlrl.rollout.scoring import score_completions

PROMPTS = ["Hi", "Describe a city in the clouds", "Tell a joke about dinosaurs please now"]


@pytest.fixture(params=["llama", "gpt2"])
def agent(request, tiny_paths):
    path = tiny_paths[request.param]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def reference_logprobs(model, prompt_ids, completion, temperature):
    """One unpadded sequence, full forward, full log-softmax: the plain definition."""
    ids = torch.cat([prompt_ids, completion]).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)


def test_batched_scores_equal_unpadded_scores(agent):
    model, tok = agent
    gen = HFGenerator(model, tok, torch.device("cpu"))
    torch.manual_seed(0)
    out = gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, temperature=0.7, top_p=1.0))
    assert len(out.tokens) == 6 and len({len(p) for p in out.prompt_ids}) == 3  # really left-padded
    prompts = [out.prompt_of_row(r) for r in range(6)]
    batch = build_sequence_batch(prompts, out.tokens, gen.pad_id, torch.device("cpu"))
    with torch.no_grad():
        scores = score_completions(model, batch, 0.7, with_entropy=True).logprobs
    atol = 2 * logprob_bound(model, scored_length(tok, PROMPTS, 8), 0.7)  # two float32 forwards: padded and batched, alone
    for row, completion in enumerate(out.tokens):
        expected = reference_logprobs(model, prompts[row], completion, 0.7)
        torch.testing.assert_close(scores[row, : len(completion)], expected, atol=atol, rtol=0)
        assert batch.mask[row].sum() == len(completion)


def test_greedy_generation_is_the_argmax_of_the_scored_distribution(agent):
    """Position ids and masks of the training forward match what generate used."""
    model, tok = agent
    gen = HFGenerator(model, tok, torch.device("cpu"))
    out = gen.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, do_sample=False))
    batch = build_sequence_batch(out.prompt_ids, out.tokens, gen.pad_id, torch.device("cpu"))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    width = batch.completion_width
    predicted = logits[:, -width:].argmax(-1)
    for row, completion in enumerate(out.tokens):
        assert torch.equal(predicted[row, : len(completion)], completion)


def test_completion_ends_at_the_first_eos_which_is_kept():
    new = torch.tensor([[5, 6, 0, 0, 0], [5, 6, 7, 8, 9], [0, 1, 1, 1, 1]])
    assert completion_lengths(new, [0]).tolist() == [3, 5, 1]
    assert completion_lengths(new, []).tolist() == [5, 5, 5]
    assert completion_lengths(new, [9, 0]).tolist() == [3, 5, 1]


def test_texts_drop_the_eos_and_tokens_keep_it(tiny_paths):
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    # make EOS overwhelmingly likely at every step
    def push_eos(module, args, output):
        output.logits[..., tok.eos_token_id] += 100.0
        return output

    model.register_forward_hook(push_eos)
    gen = HFGenerator(model, tok, torch.device("cpu"))
    out = gen.generate(["Tell a joke"], 3, SamplingParams(max_new_tokens=5, temperature=1.0))
    for tokens, text in zip(out.tokens, out.texts):
        assert tokens.tolist() == [tok.eos_token_id]
        assert text == ""


def test_token_entropy_matches_the_definition_in_chunks(monkeypatch):
    import comlrl.rollout.scoring as scoring

    torch.manual_seed(0)
    logits = torch.randn(3, 4, 50)
    probs = torch.softmax(logits / 0.5, -1)
    expected = -(probs * probs.log()).sum(-1)
    monkeypatch.setattr(scoring, "row_chunk", lambda width: 5)  # several chunks, the last one partial
    torch.testing.assert_close(scoring.token_entropy(logits, 0.5), expected)
