"""Learned joint reward models (the reward-model entity of MARLHF).

``JointRewardModel`` puts a scalar head on a causal LM backbone and reads it at the last non-padding
token of each row, from the final hidden state (no vocabulary logits, no per-layer hidden states).
The reward model scores the *joint* response of the team, written by ``joint_text``.

Entity rules (all checked before anything loads):
- source: ``reward_model_name`` (a hub id or a local causal-LM directory); default the first actor's
  identifier: its id or directory, or for a model object its ``config._name_or_path`` when that is a
  directory or a hub id; otherwise the trainer refuses with a ValueError naming ``reward_model_name``;
- tokenizer: the reward model's own, loaded from the same source (pad := eos when missing);
- a directory written by ``save_reward_model`` (backbone + ``reward_head.pt`` + tokenizer) loads
  back with its trained head.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.models.loading import load_causal_lm, own_cpu_parameters, resolve_model_kwargs
from comlrl.models.saving import write_dir_atomically
from comlrl.models.sources import describe_source, infer_model_name
from comlrl.models.tokenizers import ensure_pad_token, load_tokenizers
from comlrl.models.value_head import final_hidden_states

REWARD_HEAD_FILE = "reward_head.pt"
REWARD_MODEL_INFO = "reward_model.json"
REWARD_MODEL_DIR = "reward_model"
JOINT_TEXT_HEADER = "Joint multi-agent response"


def joint_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
    """The text a joint reward model reads (CoMLRL 1.4.3's format)::

        Joint multi-agent response

        Agent 1 prompt:
        <prompt 1>

        Agent 1 response:
        <completion 1>

        Agent 2 prompt:
        ...

    Missing entries are empty. A centralized team writes one "Agent 1" section with the joint
    prompt and the joint response.
    """
    count = max(len(prompts), len(completions))
    parts = [JOINT_TEXT_HEADER]
    for k in range(count):
        prompt = prompts[k] if k < len(prompts) else ""
        completion = completions[k] if k < len(completions) else ""
        parts.append(f"Agent {k + 1} prompt:\n{prompt}")
        parts.append(f"Agent {k + 1} response:\n{completion}")
    return "\n\n".join(parts)


def reward_hidden_size(backbone: nn.Module) -> int:
    """The backbone's hidden width: ``config.hidden_size``, ``n_embd`` or ``d_model``."""
    config = getattr(backbone, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        size = getattr(config, name, None) if config is not None else None
        if isinstance(size, int) and size > 0:
            return size
    raise ValueError(
        f"Could not infer reward model hidden size: {type(backbone).__name__} has no config with hidden_size, "
        f"n_embd or d_model. Give a Hugging Face causal LM as the reward model backbone."
    )


class JointRewardModel(nn.Module):
    """A causal LM backbone (``.backbone``) with a float32 scalar head (``.reward_head``).

    ``forward(input_ids, attention_mask) -> [B]`` float32 scores, read at the last position whose
    mask is 1 in each row (so left, right or inner padding give the same score; a row without any
    token reads position 0). The head starts from N(0, 0.02) weights and a zero bias.
    ``freeze_backbone=True`` trains only the head (the backbone then runs without autograd).
    """

    def __init__(self, backbone: nn.Module, freeze_backbone: bool = False):
        super().__init__()
        hidden = reward_hidden_size(backbone)
        self.backbone = backbone
        self.reward_head = nn.Linear(hidden, 1)
        nn.init.normal_(self.reward_head.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.reward_head.bias)
        device = next((p.device for p in backbone.parameters()), torch.device("cpu"))
        self.reward_head.to(device=device, dtype=torch.float32)
        self.freeze_backbone = bool(freeze_backbone)
        if self.freeze_backbone:
            for parameter in backbone.parameters():
                parameter.requires_grad_(False)

    @property
    def config(self) -> Any:
        return getattr(self.backbone, "config", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        mask = attention_mask.long()
        if position_ids is None:  # count attended tokens only, so padding never shifts positions
            position_ids = (mask.cumsum(dim=-1) - 1).clamp_min(0) * mask
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_backbone):
            hidden = final_hidden_states(self.backbone, input_ids, mask, position_ids)
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = (positions * mask).amax(dim=1)  # the last attended position of each row (0 if none)
        states = hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]
        return self.reward_head(states.float()).squeeze(-1)


# ----------------------------------------------------------------------------- entity resolution
def _is_hub_id(name: str) -> bool:
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return "/" in name and not name.startswith((".", "/"))
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def loadable_name(source: Any) -> Optional[str]:
    """A name ``from_pretrained`` can load for ``source``: the string itself, or a model object's
    ``config._name_or_path`` when that is an existing directory or a hub id; else None."""
    if isinstance(source, str):
        return source
    name = infer_model_name(source)
    if name is None:
        return None
    if os.path.isdir(name) or (not os.path.exists(name) and _is_hub_id(name)):
        return name
    return None


def resolve_reward_model_source(reward_model_name: Optional[str], agent_sources: Sequence[Any]) -> str:
    """The reward model's source: ``reward_model_name``, else the first actor's loadable name."""
    if reward_model_name is not None:
        return reward_model_name
    first = agent_sources[0]
    name = loadable_name(first)
    if name is None:
        raise ValueError(
            f"reward_model_name must be provided when agent models are objects: the first actor is "
            f"{describe_source(first)} and has no loadable name (config._name_or_path is neither a directory nor a "
            f"hub id). Set reward_model_name to a hub id or a local causal-LM directory."
        )
    return name


# ----------------------------------------------------------------------------- loading and export
def load_reward_tokenizer(source: str) -> Any:
    """The reward model's own tokenizer from ``source``, with a pad token."""
    return ensure_pad_token(load_tokenizers([source])[0])


def load_reward_model(
    source: str,
    *,
    model_config: Optional[Mapping[str, Any]] = None,
    device: torch.device = torch.device("cpu"),
    freeze_backbone: bool = False,
) -> JointRewardModel:
    """Load the backbone from ``source`` (float32 unless ``model_config`` names a dtype) and wrap it;
    a directory written by ``save_reward_model`` also restores its trained head."""
    model_config = dict(model_config or {})
    kwargs = resolve_model_kwargs(model_config, model_config.get("model_kwargs"))
    kwargs.setdefault("dtype", torch.float32)
    backbone = load_causal_lm(source, kwargs, "the reward model (reward_model_name)")
    model = JointRewardModel(backbone, freeze_backbone=freeze_backbone)
    head_path = os.path.join(source, REWARD_HEAD_FILE) if os.path.isdir(source) else None
    if head_path is not None and os.path.isfile(head_path):
        state = torch.load(head_path, map_location="cpu", weights_only=True)
        try:
            model.reward_head.load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(f"{head_path} does not fit the reward model loaded from {source!r}: {exc}") from exc
    model.to(device)
    own_cpu_parameters(model)
    return model.eval()


def save_reward_model(path: str, model: JointRewardModel, tokenizer: Any = None, overwrite: bool = False) -> None:
    """Write ``path`` atomically: the backbone (``save_pretrained``, loadable with
    ``AutoModelForCausalLM``), ``reward_head.pt`` (the head's state dict), ``reward_model.json`` and the
    reward tokenizer. ``load_reward_model(path)`` (or ``reward_model_name=path``) loads it back."""

    def write(directory: str) -> None:
        model.backbone.save_pretrained(directory)
        torch.save({k: v.detach().cpu() for k, v in model.reward_head.state_dict().items()}, os.path.join(directory, REWARD_HEAD_FILE))
        info = {"format": "comlrl.joint_reward_model", "version": 1, "head_file": REWARD_HEAD_FILE,
                "hidden_size": int(model.reward_head.in_features), "input": "joint_text (comlrl.models.reward_model)"}
        with open(os.path.join(directory, REWARD_MODEL_INFO), "w", encoding="utf-8") as handle:
            json.dump(info, handle, indent=2)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(directory)

    write_dir_atomically(path, write, overwrite)


def trainable_state(model: JointRewardModel) -> Tuple[dict, bool]:
    """A CPU copy of what reward learning changes (the head, plus the backbone unless frozen), and
    whether the backbone is included: what a fresh restart of reward learning restores."""
    if model.freeze_backbone:
        return {f"reward_head.{k}": v.detach().cpu().clone() for k, v in model.reward_head.state_dict().items()}, False
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, True
