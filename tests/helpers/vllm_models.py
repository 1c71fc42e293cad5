"""Tiny models vLLM can run, and reading an engine's weights back.

vLLM's CPU attention supports head sizes 32, 64, 80, ... (not the 16 of ``tiny_models``), so these
are the same two families with hidden size 64 and two heads: ``llama`` (dense ``nn.Linear``
layers, tied embedding) and ``gpt2`` (``Conv1D`` layers, stored transposed).

On the CPU, vLLM repacks linear weights into its GEMM kernel's layout after loading (the module's
``weight`` is then empty), so an engine's weights are read back by what each linear layer computes:
``layer(I) - layer(0)`` is ``W^T`` exactly in float32 and ``layer(0)`` is the bias.
"""

from __future__ import annotations

import os
from typing import Dict

import torch

from tests.helpers.tiny_models import make_gpt2, make_llama, make_tokenizer, save


def build_vllm_models(root: str) -> Dict[str, str]:
    """Create ``root/llama`` and ``root/gpt2`` (once) and return their paths."""
    paths = {"llama": os.path.join(root, "llama"), "gpt2": os.path.join(root, "gpt2")}
    if not os.path.exists(os.path.join(paths["llama"], "config.json")):
        tok = make_tokenizer(300, "<eos>", "<pad>")
        save(make_llama(tok, hidden=64), tok, paths["llama"])
    if not os.path.exists(os.path.join(paths["gpt2"], "config.json")):
        tok = make_tokenizer(360, "<|endoftext|>", None)
        save(make_gpt2(tok, hidden=64), tok, paths["gpt2"])
    return paths


def _dense(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for name, sub in module.named_modules():
        if "Linear" in type(sub).__name__ and hasattr(sub, "input_size"):
            with torch.no_grad():
                zero, eye = (sub(x) for x in (torch.zeros(1, sub.input_size), torch.eye(sub.input_size)))
            zero, eye = (t[0] if isinstance(t, tuple) else t for t in (zero, eye))
            out[f"{name}.weight"] = (eye - zero).T.clone()
            out[f"{name}.bias"] = zero[0].clone()
        else:
            for pname, p in sub.named_parameters(recurse=False):
                out[f"{name}.{pname}"] = p.detach().clone()
    return out


def engine_weights(engine) -> Dict[str, torch.Tensor]:
    """Every weight of an in-process ``VLLMEngine``'s model by vLLM's names, as dense tensors."""
    return engine.llm.apply_model(_dense)[0]


def expected_engine_weights(kind: str, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """What ``engine_weights`` must read after the Hugging Face ``state`` of a one-layer ``kind`` model
    was pushed: vLLM fuses q/k/v and gate/up (Llama), and keeps Conv1D weights as ``nn.Linear`` ones."""
    if kind == "llama":
        layer = "model.layers.0."
        return {
            "model.embed_tokens.weight": state["model.embed_tokens.weight"],
            layer + "self_attn.qkv_proj.weight": torch.cat([state[layer + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
            layer + "self_attn.o_proj.weight": state[layer + "self_attn.o_proj.weight"],
            layer + "mlp.gate_up_proj.weight": torch.cat([state[layer + "mlp.gate_proj.weight"], state[layer + "mlp.up_proj.weight"]]),
            layer + "mlp.down_proj.weight": state[layer + "mlp.down_proj.weight"],
            layer + "input_layernorm.weight": state[layer + "input_layernorm.weight"],
            "model.norm.weight": state["model.norm.weight"],
        }
    layer = "transformer.h.0."
    out = {"transformer.wte.weight": state["transformer.wte.weight"], "transformer.wpe.weight": state["transformer.wpe.weight"],
           "transformer.ln_f.weight": state["transformer.ln_f.weight"]}
    for conv in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        out[f"{layer}{conv}.weight"] = state[f"{layer}{conv}.weight"].T  # Conv1D stores [in, out]
        out[f"{layer}{conv}.bias"] = state[f"{layer}{conv}.bias"]
    return out


def assert_engine_holds(engine, kind: str, state: Dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    """Every expected tensor read back from the engine equals the pushed one (vLLM pads the vocabulary:
    only the first ``vocab`` rows of an embedding are compared)."""
    held = engine_weights(engine)
    for name, want in expected_engine_weights(kind, state).items():
        got = held[name][: want.shape[0]]
        assert got.shape == want.shape, f"{name}: engine {tuple(got.shape)}, pushed {tuple(want.shape)}"
        torch.testing.assert_close(got, want.float(), atol=atol, rtol=0.0, msg=lambda m, n=name: f"{n}: {m}")


def two_token_llama(source: str, target: str, logit: float = 8.0) -> str:
    """A copy of the ``source`` Llama (saved to ``target``) that vLLM can load and whose next token is
    almost always "a" or "b" (``tests.helpers.direction``), each with logit about ``logit``: the
    embedding's first coordinate is a constant 5 (so the residual stream's first coordinate stays
    positive), the final norm keeps only that coordinate, and an untied LM head reads it into the two
    tokens' logits only (vLLM's Llama head has no bias, so the bias of ``two_token_policy`` cannot be used)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.direction import OTHER, PREFERRED

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source)
    ids = [tokenizer.convert_tokens_to_ids(text) for text in (PREFERRED, OTHER)]
    embed = model.get_input_embeddings().weight
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=False)
    with torch.no_grad():
        embed[:, 0] = 5.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        head.weight.zero_()
        head.weight[ids, 0] = 1.0
        model.set_output_embeddings(head)
        model.config.tie_word_embeddings = False
        first = model(input_ids=torch.tensor([tokenizer("Describe a city")["input_ids"]])).logits[0, -1, ids[0]]
        head.weight[ids, 0] = logit / float(first)
    return save(model, tokenizer, target)
