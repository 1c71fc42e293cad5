"""Loading training entities, placing them on devices, and frozen copies for references."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.gradient_checkpointing import enable_gradient_checkpointing
from comlrl.models.lora import LoraBases, is_adapter_dir
from comlrl.models.precision import Precision, check_object_dtype, parse_dtype
from comlrl.models.sources import check_source_exists, describe_source, load_failure_fix

MODEL_CONFIG_KEYS = frozenset(
    {
        "torch_dtype",
        "dtype",
        "attn_implementation",
        "special_tokens",
        "model_kwargs",
        "critic_model_kwargs",
        "critic_value_head_hidden_dim",
        "value_head_hidden_dim",
        "trust_remote_code",
    }
)

def check_model_config(model_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Validate ``model_config`` and return a plain dict (unknown keys warn, they are not used)."""
    if model_config is None:
        return {}
    if not isinstance(model_config, Mapping):
        raise ValueError(f"model_config must be a dict, got {type(model_config).__name__}.")
    unknown = sorted(set(model_config) - MODEL_CONFIG_KEYS)
    if unknown:
        warnings.warn(
            f"model_config keys {unknown} are not used by comlrl (known: {sorted(MODEL_CONFIG_KEYS)}).",
            stacklevel=3,
        )
    for key in ("model_kwargs", "critic_model_kwargs", "special_tokens"):
        if model_config.get(key) is not None and not isinstance(model_config[key], Mapping):
            raise ValueError(f"model_config[{key!r}] must be a dict, got {type(model_config[key]).__name__}.")
    for key in ("torch_dtype", "dtype"):
        parse_dtype(model_config.get(key))
    return dict(model_config)


def resolve_model_kwargs(model_config: Optional[Mapping[str, Any]], overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """``from_pretrained`` keyword arguments from ``model_config`` and a nested override dict.

    dtype: ``overrides`` dtype/torch_dtype, else ``model_config`` dtype/torch_dtype.
    attn_implementation: overrides, else model_config, else ``model_config["model_kwargs"]``.
    Any other key of ``overrides`` is passed through (e.g. ``trust_remote_code``).
    """
    model_config = dict(model_config or {})
    overrides = dict(overrides or {})
    kwargs: Dict[str, Any] = {}
    dtype = None
    for source in (overrides, model_config):
        for key in ("dtype", "torch_dtype"):
            if source.get(key) is not None and dtype is None:
                dtype = parse_dtype(source[key])
    if dtype is not None:
        kwargs["dtype"] = dtype
    nested = dict(model_config.get("model_kwargs") or {})
    for source in (overrides, model_config, nested):
        if "attn_implementation" in source:
            if source["attn_implementation"] is not None:
                kwargs["attn_implementation"] = source["attn_implementation"]
            break
    if model_config.get("trust_remote_code") is not None:
        kwargs["trust_remote_code"] = bool(model_config["trust_remote_code"])
    for key, value in overrides.items():
        if key not in ("dtype", "torch_dtype", "attn_implementation"):
            kwargs[key] = value
    return kwargs


TRAINABLE_DEFAULT_DTYPE = torch.float32


def load_causal_lm(name: str, kwargs: Mapping[str, Any], label: str) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(name, **kwargs)``, in float32 unless ``kwargs`` name a
    dtype (transformers 5 would otherwise keep the checkpoint's dtype, e.g. bfloat16); a local path
    that does not exist, or any loading failure, is one ValueError naming ``label``, the source and
    the fix."""
    from transformers import AutoModelForCausalLM

    check_source_exists(name, label)
    kwargs = dict(kwargs)
    if kwargs.get("dtype") is None and kwargs.get("torch_dtype") is None:
        kwargs["dtype"] = TRAINABLE_DEFAULT_DTYPE
    try:
        return AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, safetensors' SafetensorError, ...
        if not isinstance(exc, (OSError, ValueError)) and "safetensor" not in type(exc).__name__.lower():
            raise
        reason = " ".join(str(exc).split()).rstrip(".")
        raise ValueError(f"Could not load {label} from {name!r}: {reason}. {load_failure_fix(name)}") from exc


@dataclass(frozen=True)
class LoadOptions:
    """How trainable models are loaded: ``precision`` (None: float32 unless ``model_config`` names a
    dtype), whether it was asked for explicitly (then model objects must already match it), and
    gradient checkpointing."""

    precision: Optional[Precision] = None
    explicit_precision: bool = False
    gradient_checkpointing: bool = False

    def model_kwargs(self, kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """``from_pretrained`` kwargs with the precision's weight dtype unless a dtype is already named."""
        kwargs = dict(kwargs)
        if self.precision is not None and kwargs.get("dtype") is None and kwargs.get("torch_dtype") is None:
            kwargs["dtype"] = self.precision.weights
        return kwargs

    def prepare(self, model: nn.Module, label: str) -> None:
        """Checks and switches applied to every loaded or adopted trainable model."""
        if self.precision is not None:
            check_object_dtype(model, self.precision, label, self.explicit_precision)
        warn_low_precision(model, label)
        if self.gradient_checkpointing:
            enable_gradient_checkpointing(model, label)

    def prepare_frozen_base(self, model: nn.Module, label: str) -> None:
        """A LoRA base is frozen: any dtype will do, only checkpointing applies."""
        if self.gradient_checkpointing:
            enable_gradient_checkpointing(model, label)


def load_models(
    sources: Sequence[Any],
    *,
    kind: str,
    model_kwargs: Mapping[str, Any],
    devices: Sequence[torch.device],
    options: LoadOptions = LoadOptions(),
    peft_configs: Optional[Sequence[Any]] = None,
    lora: Optional[LoraBases] = None,
) -> List[nn.Module]:
    """One model per source, each with its own parameters, placed on its device.

    A string is loaded once; further entries naming the same string get deep copies (independent
    parameters, no second read from disk). Model objects are used as given. Entries with a peft
    config (or that are saved adapter directories) become adapters over a frozen base that ``lora``
    shares between every entry of the same base and device.
    """
    kwargs = options.model_kwargs(model_kwargs)
    adapters: Dict[int, nn.Module] = {}
    if peft_configs is not None and any(c is not None for c in peft_configs) or any(is_adapter_dir(s) for s in sources):
        frozen_kwargs = dict(kwargs)
        if options.precision is not None and isinstance(options.precision.frozen, torch.dtype):
            frozen_kwargs["dtype"] = options.precision.frozen if model_kwargs.get("dtype") is None else model_kwargs["dtype"]
        adapters = (lora or LoraBases()).attach(
            sources, peft_configs or [None] * len(sources), devices, prefix=kind.rstrip("s"),
            load=lambda name: load_causal_lm(name, frozen_kwargs, f"the LoRA base of {kind} ({name})"),
            prepare=options.prepare_frozen_base,
        )
    loaded: Dict[str, nn.Module] = {}
    models: List[nn.Module] = []
    for index, source in enumerate(sources):
        if index in adapters:
            model = adapters[index]
        elif isinstance(source, str):
            if source in loaded:
                model = copy.deepcopy(loaded[source])
            else:
                model = load_causal_lm(source, kwargs, f"{kind}[{index}]")
                loaded[source] = model
        else:
            model = source
        models.append(model)
    for index, model in enumerate(models):
        if index not in adapters:
            options.prepare(model, f"{kind}[{index}]")
    # Move only after every copy is made, so copies never hold a second device's memory.
    return [model if index in adapters else model.to(device) for index, (model, device) in enumerate(zip(models, devices))]


def warn_low_precision(model: nn.Module, label: str) -> None:
    """Warn when a model about to be trained holds half-precision weights (pure bf16/fp16 training)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad and p.dtype.is_floating_point}
    low = sorted(str(d).removeprefix("torch.") for d in dtypes & {torch.bfloat16, torch.float16})
    if low:
        warnings.warn(
            f"{label} will train with {'/'.join(low)} weights and optimizer state: AdamW updates smaller than about "
            f"{'0.4%' if 'bfloat16' in low else '0.05%'} of a weight round away to nothing, so at small learning rates "
            f"most weights never move while the loss still looks normal. Leave the dtype unset to train in float32 "
            f"(comlrl's default), or pass a float32 model.",
            stacklevel=3,
        )


def own_cpu_parameters(model: nn.Module) -> None:
    """Give every CPU parameter its own anonymous memory.

    Models loaded from safetensors can keep parameters inside a read-only file mapping; the first
    optimizer update then copies them page by page (copy-on-write faults), which costs about ten
    times a plain copy. One sequential copy per parameter up front is much cheaper.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.device.type == "cpu" and parameter.requires_grad:
                parameter.data = parameter.data.clone()


def freeze_model(model: nn.Module) -> nn.Module:
    """Put a model in eval mode with every parameter frozen (for references)."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def frozen_copy(model: nn.Module, device: torch.device, dtype: Optional[torch.dtype] = None) -> nn.Module:
    """An independent frozen copy of ``model`` on ``device`` (cast to ``dtype`` when given)."""
    copy_ = freeze_model(copy.deepcopy(model))
    return copy_.to(device=device, dtype=dtype) if isinstance(dtype, torch.dtype) else copy_.to(device)


def model_device(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    device = getattr(model, "device", None)  # a view over a shared model owns no parameters itself
    return device if isinstance(device, torch.device) else torch.device("cpu")


def resize_for_tokenizer(model: nn.Module, tokenizer: Any, label: str) -> None:
    """Grow the embedding when special tokens were added to this model's tokenizer."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        if not hasattr(model, "resize_token_embeddings"):
            raise ValueError(f"{label} ({describe_source(model)}) cannot resize its embeddings for the added tokens.")
        model.resize_token_embeddings(len(tokenizer))
