"""Promises of README, docs/differences.md and docs/checkpoints.md that no other test holds to:
prompts are never cut at a pad token (pad == eos), added special tokens get embedding rows,
train(**kwargs) refuses unknown and reserved settings and those that reshape the sampled distribution,
and passes the distribution-free rest to generate, and
checkpoint_interval > 1 still saves after the last epoch."""

import os

import pytest
import torch
from tests.helpers.common import PROMPTS, no_signal_expected, prompt_dataset

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.checkpoint.layout import read_checkpoint_metadata

BASE = dict(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False, rollout_buffer_size=1)




def capture_generate(model):
    """The keyword arguments of every ``generate`` call of ``model``."""
    calls = []
    original = model.generate

    def generate(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    model.generate = generate
    return calls


def test_a_pad_token_inside_the_prompt_is_kept_when_pad_is_eos(tiny_paths):
    # differences.md #15: 1.4.3 cut prompts at their first pad token; with SmolLM2's chat template,
    # whose pad is <|im_end|>, the token occurs inside every prompt. The gpt2 tiny model has pad == eos.
    def formatter(item):
        return f"System says hi<|endoftext|>{item['prompt']}"

    trainer = MAGRPOTrainer(agents=[tiny_paths["gpt2"]], num_agents=1, formatters=formatter, train_dataset=prompt_dataset(1),
                            reward_func=lambda c: [float(len(x)) for x in c], args=MAGRPOConfig(**BASE, num_agents=1))
    tok = trainer.tokenizers[0]
    assert tok.pad_token_id == tok.eos_token_id
    prompt_ids = tok(formatter({"prompt": PROMPTS[0]}))["input_ids"]
    assert tok.pad_token_id in prompt_ids[1:-1]  # really in the middle
    calls = capture_generate(trainer.agents[0])
    trainer.train()
    (call,) = calls
    ids, mask = call["input_ids"][0], call["attention_mask"][0]
    assert ids.tolist() == prompt_ids and mask.tolist() == [1] * len(prompt_ids)  # whole prompt, every token attended


def test_added_special_tokens_get_embedding_rows(tiny_paths):
    trainer = MAGRPOTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [0.0] * len(a),
        model_config={"special_tokens": {"additional_special_tokens": ["<tool>", "</tool>"]}}, args=MAGRPOConfig(**BASE),
    )
    for agent, tok in zip(trainer.agents, trainer.tokenizers):
        ids = tok.convert_tokens_to_ids(["<tool>", "</tool>"])
        assert tok.unk_token_id not in ids
        rows = agent.get_input_embeddings().num_embeddings
        assert rows >= len(tok) and max(ids) < rows
        with torch.no_grad():  # the new ids run through the model
            logits = agent(input_ids=torch.tensor([ids])).logits
        assert logits.shape[-1] == agent.get_output_embeddings().weight.shape[0] >= len(tok)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": 0.1}, r"train\(\) cannot override \['temperature'\]"),
    ({"max_new_tokens": 9, "top_p": 0.5}, r"cannot override \['max_new_tokens', 'top_p'\]"),
    ({"repetiton_penalty": 1.2}, r"unknown generation settings \['repetiton_penalty'\]"),
    # these change the distribution before comlrl's sampler draws (issue 20, point 6)
    ({"repetition_penalty": 1.3}, r"settings \['repetition_penalty'\] that change the distribution"),
    ({"min_new_tokens": 2, "bad_words_ids": [[5]]}, r"\['bad_words_ids', 'min_new_tokens'\] that change"),
    ({"no_repeat_ngram_size": 2}, r"no_repeat_ngram_size.*MAGRPOConfig: temperature, top_p"),
    ({"max_length": 20}, r"max_length -> max_new_tokens"),
])
def test_train_refuses_unknown_and_reserved_generation_settings(tiny_paths, kwargs, message):
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=lambda c: [0.0] * len(c),
                            train_dataset=prompt_dataset(1), args=MAGRPOConfig(**BASE, num_agents=1))
    calls = capture_generate(trainer.agents[0])
    with pytest.raises(ValueError, match=message):
        trainer.train(**kwargs)
    assert calls == [] and trainer.state.global_step == 0  # refused before anything ran


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_train_passes_distribution_free_generation_settings_to_generate(tiny_paths):
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=lambda c: [0.0] * len(c),
                            train_dataset=prompt_dataset(1), args=MAGRPOConfig(**BASE, num_agents=1, temperature=0.9))
    calls = capture_generate(trainer.agents[0])
    trainer.train(use_cache=False, max_time=60.0)
    config = calls[0]["generation_config"]
    assert config.use_cache is False and config.max_time == 60.0 and config.max_new_tokens == 3


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_checkpoint_interval_above_one_still_saves_after_the_last_epoch(tiny_paths, tmp_path):
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            train_dataset=prompt_dataset(1), args=MAGRPOConfig(**{**BASE, "num_train_epochs": 3}, num_agents=1))
    trainer.train(checkpoint_dir=str(tmp_path), checkpoint_interval=2)
    epochs = sorted(read_checkpoint_metadata(str(tmp_path / name))["progress"]["epoch"] for name in os.listdir(tmp_path) if name.startswith("checkpoint-"))
    assert epochs == [2, 3]  # every 2nd epoch, and the last one although 3 is not a multiple of 2
