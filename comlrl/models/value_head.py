"""Value heads on causal language models (the critics of IAC and MAAC).

``ValueHead`` maps a last-layer hidden state to a scalar. ``CausalLMWithValueHead`` wraps a causal LM
backbone (``.model``) with an optional head (``.value_head``):

- as an IAC actor with ``use_separate_critic=False`` the head sits on the actor's own backbone, so
  one forward gives both the token log-probs and the value;
- as a critic (IAC separate critics, the MAAC central critic) only the final hidden states are
  needed: ``last_token_values`` runs the backbone's transformer without its LM head.

State-dict keys of a head are ``value_projection.{weight,bias}`` and, with a hidden layer,
``pre_projection.0.{weight,bias}`` (the ``value_head.pt`` files of CoMLRL 1.4.x load unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch
import torch.nn as nn

from comlrl.models.signatures import forward_parameters, model_forward_parameters

VALUE_HEAD_FILE = "value_head.pt"


@dataclass
class ActorCriticOutput:
    """Output of ``CausalLMWithValueHead.forward``.

    logits: ``[B, L', V]`` (``L'`` = L, or ``logits_to_keep`` positions).
    values: ``[B, L]`` value at every position, or None (no head, or not requested).
    hidden_states: the backbone's per-layer hidden states when they were computed, else None.
    past_key_values: the backbone's cache when ``use_cache=True``, else None.
    """

    logits: torch.Tensor
    values: Optional[torch.Tensor]
    hidden_states: Optional[Tuple[torch.Tensor, ...]]
    past_key_values: Any = None


class ValueHead(nn.Module):
    """``v = w2 . tanh(W1 h + b1) + b2`` with a hidden layer, else ``v = w . h + b``.

    Every weight starts from N(0, 0.02) and every bias from 0, so initial values are close to 0.
    A ``hidden_dim`` of None or <= 0 means no hidden layer.
    """

    def __init__(self, input_dim: int, hidden_dim: Optional[int] = None):
        super().__init__()
        if hidden_dim is not None and hidden_dim > 0:
            self.pre_projection: Optional[nn.Module] = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Tanh())
            width = hidden_dim
        else:
            self.pre_projection = None
            width = input_dim
        self.value_projection = nn.Linear(width, 1)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[..., H] -> [..., 1]``."""
        if self.pre_projection is not None:
            hidden_states = self.pre_projection(hidden_states)
        return self.value_projection(hidden_states)


def hidden_size_of(model: nn.Module) -> int:
    """The width of a backbone's hidden states (``config.hidden_size`` or ``config.n_embd``)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(
            f"{type(model).__name__} has no config; a value head needs a Hugging Face causal LM whose config "
            f"gives hidden_size (or n_embd)."
        )
    size = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not size:
        raise ValueError(
            f"Unsupported backbone {type(model).__name__}: its config has neither hidden_size nor n_embd, so the "
            f"value head's input width is unknown."
        )
    return int(size)


def final_hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[B, L, H]`` last-layer hidden states of a causal LM (after its final norm), without running
    the LM head: the transformer body (``model.base_model``) when the model has one, else the model
    itself asked for its hidden states with logits for one position only."""
    body = getattr(model, "base_model", None)
    if isinstance(body, nn.Module) and body is not model:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        accepted = forward_parameters(type(body))
        if position_ids is not None and "position_ids" in accepted:
            inputs["position_ids"] = position_ids
        if "use_cache" in accepted:
            inputs["use_cache"] = False
        return body(**inputs).last_hidden_state
    accepted = model_forward_parameters(model)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "output_hidden_states": True}
    if "use_cache" in accepted or not accepted:
        inputs["use_cache"] = False
    if position_ids is not None and ("position_ids" in accepted or not accepted):
        inputs["position_ids"] = position_ids
    if "logits_to_keep" in accepted:
        inputs["logits_to_keep"] = 1
    return model(**inputs).hidden_states[-1]


class CausalLMWithValueHead(nn.Module):
    """A causal LM backbone (``.model``) with an optional value head (``.value_head``)."""

    def __init__(self, base_model: nn.Module, value_head_hidden_dim: Optional[int] = None, attach_value_head: bool = True):
        super().__init__()
        hidden = hidden_size_of(base_model)
        self.model = base_model
        self.value_head: Optional[ValueHead] = None
        if attach_value_head:
            self.attach_value_head(value_head_hidden_dim, hidden)

    def attach_value_head(self, hidden_dim: Optional[int], hidden: Optional[int] = None) -> ValueHead:
        """Add a freshly initialised head on the backbone's device, in float32 whatever the backbone's
        dtype (hidden states are upcast before the head), so small value updates are not rounded away."""
        head = ValueHead(hidden or hidden_size_of(self.model), hidden_dim)
        for parameter in self.model.parameters():
            head.to(device=parameter.device, dtype=torch.float32)
            break
        self.value_head = head
        return head

    def load_value_head(self, source: str) -> "CausalLMWithValueHead":
        """Load a saved head: ``source`` is a ``value_head.pt`` file or a folder holding one (what
        ``save_model`` writes). Same as ``value_head.load_state_dict(torch.load(path, weights_only=True))``
        with a clear error when the file is missing or the head's width differs. Returns ``self``."""
        import os

        path = os.path.join(source, VALUE_HEAD_FILE) if os.path.isdir(source) else source
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No value head at {path}: give a {VALUE_HEAD_FILE} file or the folder save_model wrote it into.")
        if self.value_head is None:
            raise ValueError("this model has no value head to load into; attach one with attach_value_head(hidden_dim).")
        device = next(self.value_head.parameters()).device
        state = torch.load(path, map_location=device, weights_only=True)
        try:
            self.value_head.load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(
                f"{path} does not fit this value head ({exc}). Build the trainer with the value-head hidden dim the "
                f"head was trained with (critic_value_head_hidden_dim / value_head_hidden_dim)."
            ) from None
        return self

    # ------------------------------------------------------------------ Hugging Face conveniences
    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.model, "generation_config", None)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Generation is the backbone's."""
        return self.model.generate(*args, **kwargs)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.resize_token_embeddings(*args, **kwargs)

    # ------------------------------------------------------------------ forwards
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        past_key_values: Any = None,
        use_cache: Optional[bool] = None,
        output_values: bool = True,
        output_hidden_states: Optional[bool] = None,
        logits_to_keep: Optional[int] = None,
        **kwargs: Any,
    ) -> ActorCriticOutput:
        """Logits, and values at every position when a head is attached and ``output_values``.

        Hidden states are computed only when values or ``output_hidden_states`` ask for them, and no
        KV cache is built unless ``use_cache=True``.
        """
        with_values = output_values and self.value_head is not None
        inputs = dict(kwargs, input_ids=input_ids, attention_mask=attention_mask, use_cache=bool(use_cache))
        accepted = model_forward_parameters(self.model)
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        if past_key_values is not None:
            inputs["past_key_values"] = past_key_values
        if logits_to_keep is not None and "logits_to_keep" in accepted:
            inputs["logits_to_keep"] = logits_to_keep
        if with_values or output_hidden_states:
            inputs["output_hidden_states"] = True
        outputs = self.model(**inputs)
        hidden_states = getattr(outputs, "hidden_states", None)
        values = self.head_values(hidden_states[-1]) if with_values else None
        return ActorCriticOutput(
            logits=outputs.logits,
            values=values,
            hidden_states=hidden_states,
            past_key_values=getattr(outputs, "past_key_values", None) if use_cache else None,
        )

    def final_hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B, L, H]`` last-layer hidden states (after the final norm), without the LM head."""
        return final_hidden_states(self.model, input_ids, attention_mask, position_ids)

    def last_token_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B]`` float32 value of the last position of each (left-padded) row."""
        if self.value_head is None:
            raise ValueError("this model has no value head; attach one with attach_value_head(...).")
        hidden = self.final_hidden_states(input_ids, attention_mask, position_ids)
        return self.head_values(hidden[:, -1, :])

    def head_values(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H] -> [...]`` values of the head in float32 (outside any mixed-precision autocast)."""
        return head_values(self.value_head, hidden)


def head_values(head: ValueHead, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` in float32 whatever the backbone's dtype or an enclosing autocast."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return head(hidden.float()).squeeze(-1)
