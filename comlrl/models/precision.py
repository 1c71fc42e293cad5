"""Numeric precision of a run: which dtype each kind of weight is stored in and what compute runs in.

| precision | trainable weights + AdamW state | frozen weights (references, LoRA bases) | compute |
|---|---|---|---|
| ``fp32`` | float32 | float32 | float32 |
| ``bf16-mixed`` | float32 (master copy) | bfloat16 | bfloat16 under ``torch.autocast`` |
| ``bf16`` / ``fp16`` | bfloat16 / float16 (pure: CoMLRL 1.4.3's memory) | the same | the same |

Under ``bf16-mixed`` the matrix products of generation, scoring and value forwards run in bfloat16
while every weight that is updated, its gradient and its AdamW moments stay float32, so updates of
``lr * g / sqrt(v)`` far below bfloat16's resolution (about 0.4 % of a weight) still accumulate.
Log-probabilities, entropies and value heads are computed in float32 in every precision.

``model_config["dtype"]`` keeps working: it names the dtype the weights load in. With an explicit
``precision`` the two must agree (float32 for fp32 / bf16-mixed, bfloat16 for bf16, float16 for
fp16); without one, a half dtype there means pure half-precision training (the old behaviour) and
float32 (or nothing) takes the device default: bf16-mixed on CUDA devices with bfloat16, else fp32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Iterable, Mapping, Optional, Sequence

import torch
import torch.nn as nn

PRECISIONS = ("fp32", "bf16-mixed", "bf16", "fp16")
_ALIASES = {
    "float32": "fp32", "32": "fp32", "32-true": "fp32",
    "bf16_mixed": "bf16-mixed", "bf16mixed": "bf16-mixed", "mixed": "bf16-mixed",
    "bfloat16": "bf16", "bf16-true": "bf16", "float16": "fp16", "half": "fp16", "fp16-true": "fp16",
}
_WEIGHTS = {"fp32": torch.float32, "bf16-mixed": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_KEYS = ("dtype", "torch_dtype")


def normalize_precision(value: Optional[str]) -> Optional[str]:
    """The canonical name of a precision setting (None stays None); raises naming the choices."""
    if value is None:
        return None
    key = value.strip().lower() if isinstance(value, str) else value
    key = _ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} or None (the device default). Got {value!r}.")
    return key


@dataclass(frozen=True)
class Precision:
    """A resolved precision (see the module docstring). ``weights`` is the dtype trainable weights
    load in, or "auto" (the checkpoint's own, only when ``model_config`` asks for it)."""

    name: str
    weights: Any

    @property
    def frozen(self) -> Any:
        """Dtype of frozen copies: bfloat16 under bf16-mixed (no master copy is needed for weights
        that never change), else the weights' dtype."""
        return torch.bfloat16 if self.name == "bf16-mixed" else self.weights

    @property
    def compute(self) -> Optional[torch.dtype]:
        """The autocast dtype (None: the weights' own dtype)."""
        return torch.bfloat16 if self.name == "bf16-mixed" else None

    def autocast(self, device: Any) -> ContextManager:
        """``torch.autocast`` in the compute dtype on ``device``'s type; a no-op without mixed precision."""
        if self.compute is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.compute)


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(value: Any) -> Any:
    """A torch dtype, "auto", or None from a dtype or its usual spellings ("bf16", "torch.float32")."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key == "auto":
            return "auto"
        if key in _DTYPES:
            return _DTYPES[key]
    raise ValueError(
        f"dtype {value!r} is not understood; use one of float32, bfloat16, float16, auto (or a torch.dtype)."
    )


def _config_dtypes(model_config: Mapping[str, Any]) -> Iterable[tuple]:
    for where, section in (("model_config", model_config), *(
        (f"model_config[{key!r}]", model_config.get(key) or {}) for key in ("model_kwargs", "critic_model_kwargs")
    )):
        for key in _DTYPE_KEYS:
            if section.get(key) is not None:
                yield f"{where}[{key!r}]", parse_dtype(section[key])


def default_precision(devices: Sequence[torch.device]) -> str:
    """bf16-mixed when every device is a CUDA device with bfloat16 support, else fp32."""
    cuda = bool(devices) and all(torch.device(d).type == "cuda" for d in devices)
    return "bf16-mixed" if cuda and torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def resolve_precision(value: Optional[str], model_config: Mapping[str, Any], devices: Sequence[torch.device]) -> Precision:
    """The run's precision from the config field and ``model_config``'s dtypes (before any loading).

    A contradiction (an explicit precision and a dtype that cannot hold its trainable weights) is a
    ValueError naming both and the fix.
    """
    name = normalize_precision(value)
    dtypes = list(_config_dtypes(model_config))
    if name is None:
        half = [d for _, d in dtypes if d in (torch.bfloat16, torch.float16)]
        if half:  # CoMLRL 1.4.x's way of asking for half precision: train in it (warned about at load)
            return Precision("bf16" if half[0] == torch.bfloat16 else "fp16", half[0])
        name = default_precision(devices)
        auto = any(d == "auto" for _, d in dtypes)
        return Precision(name, "auto" if auto else _WEIGHTS[name])
    wanted = _WEIGHTS[name]
    for where, dtype in dtypes:
        if dtype != wanted:
            shown = dtype if dtype == "auto" else str(dtype).removeprefix("torch.")
            raise ValueError(
                f"precision={name!r} keeps trainable weights in {str(wanted).removeprefix('torch.')} but {where} asks "
                f"for {shown!r}. Drop the dtype from model_config (precision decides it), or choose the precision "
                f"that matches it ("
                + ("precision='bf16' for bfloat16 weights" if dtype == torch.bfloat16 else
                   "precision='fp16' for float16 weights" if dtype == torch.float16 else
                   "precision='fp32' or 'bf16-mixed' for float32 weights")
                + ")."
            )
    return Precision(name, wanted)


def check_object_dtype(model: nn.Module, precision: Precision, label: str, explicit: bool) -> None:
    """A model object's trainable weights must already be in the precision's dtype when the
    precision was asked for explicitly (objects are never cast in place behind the caller's back)."""
    if not explicit or precision.weights == "auto":
        return
    # value heads are float32 in every precision (models/value_head.py)
    dtypes = {p.dtype for n, p in model.named_parameters() if p.dtype.is_floating_point and not n.startswith("value_head.")}
    if dtypes and dtypes != {precision.weights}:
        have = "/".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        want = str(precision.weights).removeprefix("torch.")
        raise ValueError(
            f"{label} holds {have} weights but precision={precision.name!r} trains {want} weights. Pass the model "
            f"in {want} (e.g. model.to(torch.{want})), or give its id/directory so comlrl loads it in that dtype."
        )
