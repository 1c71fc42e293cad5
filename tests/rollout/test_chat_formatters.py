"""chat_formatters: each agent's message in its own chat template, one BOS, plain text without a template."""

from __future__ import annotations

import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from comlrl.rollout.formatters import adds_bos_token, build_formatters, chat_formatters
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio
from tests.helpers.tiny_models import make_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def chat_tokenizer(adds_bos: bool):
    """A tiny tokenizer with a chat template that writes the BOS; optionally it also adds BOS when
    encoding, as Llama-style tokenizers do."""
    tok = make_tokenizer(300, "<eos>", "<pad>")
    tok.add_special_tokens({"bos_token": "<bos>"})
    if adds_bos:
        tok._tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    tok.chat_template = TEMPLATE
    return tok


def test_each_agent_gets_its_own_template_and_message(tiny_paths):
    chat = chat_tokenizer(adds_bos=False)
    plain = AutoTokenizer.from_pretrained(tiny_paths["gpt2"])  # no chat template: the message as it is
    brief, detailed = chat_formatters(["Briefly: {prompt}", lambda row: f"In detail ({row['topic']}): {row['prompt']}"], [chat, plain])
    row = {"prompt": "Describe a city", "topic": "cities"}
    assert brief(row) == "<bos><user>Briefly: Describe a city<eos><assistant>"
    assert detailed(row) == "In detail (cities): Describe a city"
    assert not adds_bos_token(chat) and not adds_bos_token(plain)


def test_one_bos_when_the_tokenizer_adds_it_too():
    tok = chat_tokenizer(adds_bos=True)
    assert adds_bos_token(tok)
    (formatter,) = chat_formatters("{prompt}", tok, num_agents=1)
    text = formatter({"prompt": "hi"})
    assert text == "<user>hi<eos><assistant>"  # the template's BOS is dropped from the text ...
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # ... and encoding adds exactly one


def test_system_prompt_and_sharing():
    tok = chat_tokenizer(adds_bos=False)
    formatters = chat_formatters("{prompt}", tok, system_prompt="Be kind.", num_agents=2)
    assert len(formatters) == 2
    assert formatters[1]({"prompt": "x"}) == "<bos><system>Be kind.<eos><user>x<eos><assistant>"


def test_ids_and_folders_are_loaded(tiny_paths):
    formatters = chat_formatters(["{prompt}", "{prompt}!"], [tiny_paths["llama"], tiny_paths["gpt2"]])
    assert [f({"prompt": "a"}) for f in formatters] == ["a", "a!"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda tok: chat_formatters(["a", "b", "c"], [tok, tok]), "one entry per agent: got 3 message"),
        (lambda tok: chat_formatters("{prompt}", tok), "one entry per agent"),
        (lambda tok: chat_formatters([3], [tok]), r"messages\[0\] must be a format string"),
        (lambda tok: chat_formatters(["{question}"], [tok])[0]({"prompt": "p"}), r"names the field 'question'.*\['prompt'\]"),
    ],
)
def test_mistakes_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call(chat_tokenizer(adds_bos=False))


def test_trainer_uses_them_and_they_pass_the_formatter_checks(tiny_paths, prompts_dataset):
    formatters = chat_formatters(["{prompt}", "More: {prompt}"], [tiny_paths["llama"], tiny_paths["gpt2"]])
    wrapped = build_formatters(formatters, 2)
    assert wrapped[1]({"prompt": "x"}) == "More: x"
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, eval_interval=0, verbose=False)
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, formatters=formatters,
                            train_dataset=prompts_dataset, args=config)
    trainer.train()
    assert trainer.env_step == 8
