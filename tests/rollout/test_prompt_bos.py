"""Prompts rendered by a chat template that writes the BOS start with exactly one BOS, as with the
Llama-3 / Gemma / Mistral tokenizers that also add a BOS themselves."""

import torch
from datasets import Dataset
from tokenizers import processors
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from comlrl.rollout.generation import HFGenerator
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.tiny_models import make_tokenizer

TEMPLATE = "{{ bos_token }}{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def bos_model_dir(tmp_path):
    tok = make_tokenizer(320, "<eos>", "<pad>")
    tok.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)])
    tok.chat_template = TEMPLATE
    path = tmp_path / "bos-model"
    tok.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=256, bos_token_id=bos, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def test_the_tokenizer_would_double_the_bos(tmp_path):
    tok = AutoTokenizer.from_pretrained(bos_model_dir(tmp_path))
    ids = tok(chat(tok, "Tell a joke")).input_ids
    assert ids[:2] == [tok.bos_token_id, tok.bos_token_id]  # the trap: template BOS + tokenizer BOS


def test_prompts_start_with_one_bos(tmp_path):
    path = bos_model_dir(tmp_path)
    tok = AutoTokenizer.from_pretrained(path)
    gen = HFGenerator(LlamaForCausalLM.from_pretrained(path), tok, torch.device("cpu"))
    templated, plain = gen.encode([chat(tok, "Tell a joke"), "Tell a joke"])
    assert templated[0] == tok.bos_token_id and templated[1] != tok.bos_token_id
    assert plain[0] == tok.bos_token_id and plain[1] != tok.bos_token_id  # the tokenizer's own BOS is kept


def test_training_prompts_have_one_bos(tmp_path):
    path = bos_model_dir(tmp_path)
    tok = AutoTokenizer.from_pretrained(path)
    seen = []
    trainer = MAGRPOTrainer(
        agent_model=path, num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
        formatters=lambda item: chat(tok, item["prompt"]), train_dataset=Dataset.from_dict({"prompt": ["Tell a joke", "Describe a city"]}),
        args=MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False, rollout_buffer_size=1),
    )
    original = trainer.agents[0].generate

    def spy(*args, **kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        for row, row_mask in zip(ids, mask):
            real = row[row_mask.bool()].tolist()
            seen.append(real[:2])
        return original(*args, **kwargs)

    trainer.agents[0].generate = spy
    trainer.train()
    assert seen and all(first[0] == tok.bos_token_id and first[1] != tok.bos_token_id for first in seen)
