"""The shapes the memory estimator reads from a model's ``config.json`` (``ModelShape``: widths,
layers, heads, vocabulary, tied embeddings), the per-token activation sizes of a decoder layer, and
the published models' shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

MIB = 1 << 20
GIB = 1 << 30

# bytes per token per decoder layer saved for backward: coefficient x width, by compute mode.
# q = heads * head_dim, kv = kv_heads * head_dim; "qk_norm" layers (Qwen3) save their normed q/k too.
ACTIVATION_BYTES = {
    # mode: (per hidden, per intermediate, per q width, per kv width, extra per q / kv width with qk_norm)
    "fp32": (24.0, 16.0, 16.0, 0.0, (8.0, 8.0)),
    "bf16-mixed": (16.0, 8.0, 8.0, 12.0, (6.0, 6.0)),
    "bf16": (12.0, 8.0, 8.0, 0.0, (4.0, 4.0)),  # pure half: the fp32 table's tensors in 2 bytes
}
EMBEDDING_OUTPUT_BYTES = 8.0  # per token per hidden unit outside the layers (embedding output, final norm), fp32
LOGPROB_CHUNK_BYTES = 3 * 16 * MIB  # float32 chunks of the log-softmax / entropy (core.logprobs.CHUNK_ELEMENTS)


@dataclass(frozen=True)
class ModelShape:
    """The sizes memory depends on (decoder-only transformer: Llama, Qwen2, Qwen3, GPT-2 style)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    mlp_matrices: int = 3  # gated MLP (gate, up, down); 2 for GPT-2
    layer_norm: bool = False  # GPT-2: LayerNorms with biases, biases on every linear layer
    position_embeddings: int = 0  # GPT-2: learned positions (n_positions)

    @classmethod
    def from_config(cls, config: Any, name: Optional[str] = None) -> "ModelShape":
        """From a transformers config object or its dict (Llama / Qwen / GPT-2 field names)."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        model_type = get("model_type", "")
        hidden = get("hidden_size") or get("n_embd")
        heads = get("num_attention_heads") or get("n_head")
        gpt2 = model_type == "gpt2"
        return cls(
            name=name or get("_name_or_path") or model_type or "model",
            vocab_size=int(get("vocab_size")),
            hidden_size=int(hidden),
            intermediate_size=int(get("intermediate_size") or get("n_inner") or 4 * hidden),
            num_layers=int(get("num_hidden_layers") or get("n_layer")),
            num_heads=int(heads),
            num_kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(get("tie_word_embeddings", True)),
            attention_bias=bool(get("attention_bias", False)) or model_type == "qwen2" or gpt2,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            mlp_matrices=2 if gpt2 else 3,
            layer_norm=gpt2,
            position_embeddings=int(get("n_positions") or 0) if gpt2 else 0,
        )

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        h, q, kv, i = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)
        mlp = self.mlp_matrices * h * i
        if self.layer_norm:  # GPT-2: output-projection and MLP biases, LayerNorm biases
            return attention + h + mlp + i + h + 4 * h
        return attention + mlp + 2 * h

    @property
    def parameters(self) -> int:
        embeddings = self.vocab_size * self.hidden_size + self.position_embeddings * self.hidden_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        final_norm = (2 if self.layer_norm else 1) * self.hidden_size
        return embeddings + head + self.num_layers * self.layer_parameters() + final_norm

    @property
    def largest_tensor(self) -> int:
        return max(self.vocab_size * self.hidden_size, self.hidden_size * self.intermediate_size)

    def lora_parameters(self, rank: int, targets: Sequence[str]) -> int:
        """Adapter size of rank ``rank`` on the named projections (``all-linear``: every one but the head)."""
        h, q, kv, i = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        names = list(shapes) if "all-linear" in targets else [t for t in targets if t in shapes]
        per_layer = sum(rank * (shapes[n][0] + shapes[n][1]) for n in names)
        head = rank * (h + self.vocab_size) if "lm_head" in targets else 0
        return self.num_layers * per_layer + head

    def activation_bytes_per_token(self, mode: str, device: str, length: int) -> float:
        """Bytes autograd saves per token and decoder layer (module docstring)."""
        per_h, per_i, per_q, per_kv, (norm_q, norm_kv) = ACTIVATION_BYTES[mode]
        total = per_h * self.hidden_size + per_i * self.intermediate_size + per_q * self.q_width + per_kv * self.kv_width
        if self.qk_norm:
            total += norm_q * self.q_width + norm_kv * self.kv_width
        element = 4 if mode == "fp32" else 2
        if device == "cpu":
            total += element * self.num_heads * length + 4 * length  # math-path attention probabilities + mask
        else:
            total += 4 * self.num_heads  # log-sum-exp of the fused kernels
        return total


# The published models (``comlrl estimate --published``, ``--model qwen3-1.7b``): the ``config.json``
# values of their Hugging Face Hub pages (see comlrl.cli.published for the runs they were reported in).
QWEN_VOCAB = 151936

PUBLISHED_MODELS: Dict[str, ModelShape] = {
    "qwen2.5-1.5b": ModelShape("Qwen2.5-1.5B", QWEN_VOCAB, 1536, 8960, 28, 12, 2, 128, True, attention_bias=True),
    "qwen3-1.7b": ModelShape("Qwen3-1.7B", QWEN_VOCAB, 2048, 6144, 28, 16, 8, 128, True, qk_norm=True),
    "qwen2.5-coder-3b": ModelShape("Qwen2.5-Coder-3B", QWEN_VOCAB, 2048, 11008, 36, 16, 2, 128, True, attention_bias=True),
    "qwen3-4b": ModelShape("Qwen3-4B", QWEN_VOCAB, 2560, 9728, 36, 32, 8, 128, True, qk_norm=True),
}
