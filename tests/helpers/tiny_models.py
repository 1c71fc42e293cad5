"""Tiny models and tokenizers built in code, saved to directories so ids are real local paths.

Two families with different tokenizers, so heterogeneous teams are tested for real:
- ``llama``: LlamaForCausalLM, byte-level BPE vocabulary of ~300, eos "<eos>" and pad "<pad>";
- ``gpt2``:  GPT2LMHeadModel, byte-level BPE vocabulary of ~360, eos "<|endoftext|>" used as pad too.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

CORPUS = """
Describe a city in the clouds. Invent a new holiday and explain it. Write a bedtime story for a dragon.
Explain how teleportation might work. Tell a joke about dinosaurs. Describe a world without electricity.
Create a superhero with a unique power. Write a scene where the moon talks. Invent a new type of fruit.
The quick brown fox jumps over the lazy dog. Once upon a time there was a small town by the sea.
Answer briefly. Answer in detail. Please revise your previous attempt. def aux(x): return x + 1
"""


# Positions of the tiny models: a prompt plus max_new_tokens (256 by default) must fit their context.
CONTEXT = 1024


def make_tokenizer(vocab_size: int, eos: str, pad: Optional[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [eos] + ([pad] if pad and pad != eos else [])
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([line for line in CORPUS.splitlines() if line.strip()] * 2, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, pad_token=pad or eos, model_max_length=256)


def make_llama(tokenizer, seed: int = 0, hidden: int = 32, layers: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=CONTEXT, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    return LlamaForCausalLM(config).float()


def make_gpt2(tokenizer, seed: int = 1, hidden: int = 32, layers: int = 1):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=2, n_positions=256, n_inner=2 * hidden,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return with_context(GPT2LMHeadModel(config).float(), CONTEXT)


def with_context(model, positions: int):
    """A GPT-2 whose learned position table is extended to ``positions`` rows: the first 256 rows and every
    other weight are those drawn above (so the model computes what it did with 256 positions), the new
    rows come from a generator of their own (the global random stream is not touched)."""
    table = model.transformer.wpe.weight.data
    extra = torch.randn(positions - table.shape[0], table.shape[1], generator=torch.Generator().manual_seed(7)) * 0.02
    model.transformer.wpe = torch.nn.Embedding.from_pretrained(torch.cat([table, extra]), freeze=False)
    model.config.n_positions = positions
    return model


def save(model, tokenizer, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_models(root: str) -> dict:
    """Create ``root/llama`` and ``root/gpt2`` (once) and return their paths."""
    paths = {"llama": os.path.join(root, "llama"), "gpt2": os.path.join(root, "gpt2")}
    if not os.path.exists(os.path.join(paths["llama"], "config.json")):
        tok = make_tokenizer(300, "<eos>", "<pad>")
        save(make_llama(tok), tok, paths["llama"])
    if not os.path.exists(os.path.join(paths["gpt2"], "config.json")):
        tok = make_tokenizer(360, "<|endoftext|>", None)
        save(make_gpt2(tok), tok, paths["gpt2"])
    return paths
