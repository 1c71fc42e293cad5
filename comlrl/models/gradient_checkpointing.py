"""Gradient (activation) checkpointing of trained models, compatible with dropout-free updates.

``enable_gradient_checkpointing`` uses transformers' own switch
(``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``, named
``activation_checkpointing_enable`` in recent releases): each
decoder layer keeps only its input during the forward and recomputes its activations during
backward. Non-reentrant checkpointing needs no input that requires grad, so it also works for LoRA
adapters over a frozen embedding.

Transformers checkpoints a layer only while that layer is in training mode, but comlrl scores in
eval mode (no dropout: the scored policy is the sampling policy). ``scoring_mode`` therefore puts
the model in eval mode and then flags only the checkpointed layers as training: a decoder layer's
own ``forward`` reads its flag for nothing but the checkpointing switch (its attention, MLP and
dropout submodules keep their eval flag), so the recomputed forward is the same dropout-free one
and the gradients equal those without checkpointing.
"""

from __future__ import annotations

from typing import Iterator

import torch.nn as nn


def _backbone(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside comlrl's wrappers (value-head wrapper, LoRA adapter view)."""
    from comlrl.models.value_head import CausalLMWithValueHead

    if isinstance(model, CausalLMWithValueHead):
        model = model.model
    shared = getattr(model, "shared_model", None)  # an adapter view runs a shared PEFT model
    return shared if isinstance(shared, nn.Module) else model


def enable_gradient_checkpointing(model: nn.Module, label: str) -> None:
    """Turn on non-reentrant gradient checkpointing of ``model``'s decoder layers."""
    backbone = _backbone(model)
    kwargs = {"use_reentrant": False}
    if not getattr(backbone, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"gradient_checkpointing=True but {label} ({type(backbone).__name__}) does not support it; use a "
            f"Hugging Face model whose class supports gradient checkpointing, or set gradient_checkpointing=False."
        )
    if hasattr(backbone, "activation_checkpointing_enable"):  # transformers >= 5.2x: the new name
        backbone.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _executed_modules(model: nn.Module) -> Iterator[nn.Module]:
    yield from model.modules()
    for module in list(model.modules()):
        shared = getattr(module, "shared_model", None)
        if isinstance(shared, nn.Module):
            yield from shared.modules()


def _layer_class() -> type:
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # older transformers: the flag lives on the models that loop over layers
        return nn.Module
    return GradientCheckpointingLayer


def scoring_mode(model: nn.Module) -> nn.Module:
    """Eval mode (no dropout), with checkpointed layers still checkpointing (module docstring)."""
    model.eval()
    layer = _layer_class()
    for module in _executed_modules(model):
        if isinstance(module, layer) and getattr(module, "gradient_checkpointing", False) is True:
            module.training = True
    return model
