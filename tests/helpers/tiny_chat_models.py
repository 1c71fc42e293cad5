"""Tiny chat models like the task repositories' real ones, saved to directories (ids are local paths).

``qwen``: a Qwen2ForCausalLM with a ChatML chat template, pad == eos == ``<|im_end|>``, weights saved in
bfloat16 (``torch_dtype`` bfloat16 in its config) and a ``generation_config.json`` with sampling
settings (which comlrl must not inherit). ``llama``: a LlamaForCausalLM with another vocabulary, a
tokenizer that prepends a BOS, its own chat template, float32. Both tokenizers are trained on the
environments' own prompts, so prompts of thousands of characters stay a few hundred tokens.
"""

from __future__ import annotations

import os

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_CHAT = "{{ bos_token }}{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"


def corpus():
    """Prompts of every environment (first turn and one feedback turn) plus code and commands."""
    from comlrl.envs import get_environment, list_environments

    texts = ["def aux(x):\n    return x\n", "/setblock 0 0 0 stone\n/fill 0 0 0 1 1 1 planks\n/kill\n"]
    for name in list_environments():
        env = get_environment(name, **({"seed": 0} if name == "housebuild" else {}))
        for row in env.load_dataset("train", offline=True).select(range(2)):
            prompts = [f(row) for f in env.formatters]
            texts += prompts
            if env.external_transition is not None:
                texts += env.external_transition(prompt=row["prompt"], agent_completions=["x", "y"], num_agents=2,
                                                 prompt_history_per_agent=[[p] for p in prompts], response_history_per_agent=[["x"], ["y"]])
    return texts


def make_tokenizer(texts, *, vocab_size, specials, eos, pad, bos=None, chat_template=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    if bos is not None:
        bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bpe.token_to_id(bos))])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, pad_token=pad, bos_token=bos, model_max_length=8192)
    tok.chat_template = chat_template
    return tok


def build_chat_models(root: str) -> dict:
    """Create ``root/qwen`` and ``root/llama`` (once) and return their paths."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    paths = {"qwen": os.path.join(root, "qwen"), "llama": os.path.join(root, "llama")}
    if os.path.exists(os.path.join(paths["llama"], "config.json")):
        return paths
    texts = corpus()
    qwen_tok = make_tokenizer(texts, vocab_size=1200, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos="<|im_end|>",
                              pad="<|im_end|>", chat_template=CHATML)
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(qwen_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=8192, tie_word_embeddings=True,
        eos_token_id=qwen_tok.eos_token_id, pad_token_id=qwen_tok.pad_token_id, bos_token_id=None,
    )).to(torch.bfloat16)
    qwen.generation_config = GenerationConfig(do_sample=True, temperature=1.3, top_k=3, top_p=0.5, repetition_penalty=1.5,
                                              eos_token_id=qwen_tok.eos_token_id, pad_token_id=qwen_tok.pad_token_id)
    _save(qwen, qwen_tok, paths["qwen"])
    llama_tok = make_tokenizer(texts, vocab_size=900, specials=["<s>", "</s>", "<pad>"], eos="</s>", pad="<pad>", bos="<s>",
                               chat_template=LLAMA_CHAT)
    torch.manual_seed(1)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(llama_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
        eos_token_id=llama_tok.eos_token_id, pad_token_id=llama_tok.pad_token_id, bos_token_id=llama_tok.bos_token_id,
    )).float()
    _save(llama, llama_tok, paths["llama"])
    return paths


def _save(model, tokenizer, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
