"""LoRA (and other peft) adapters: one frozen base per distinct model, one adapter per trained entity.

``peft_config`` gives every agent (or critic) an adapter instead of full fine-tuning. Entities loaded
from the same id or directory on the same device share **one** frozen base: a single peft model
holds one named adapter per entity ("agent_0", "agent_1", "critic_0", ...), so the base's memory is
counted once however many agents train on it.

- ``AdapterModel`` is what the trainer holds as ``agents[i]`` (or a critic's backbone): a module
  whose own parameters (and ``state_dict``) are exactly its adapter's tensors, and whose forward and
  ``generate`` run the shared peft model with that adapter active. Optimizers, checkpoints and
  ``own_cpu_parameters`` therefore see only the adapter; the base is never copied or saved.
- ``BaseReference`` is the frozen reference of reference KL for such agents: the policy as loaded.
  For an adapter that starts at zero (peft's default ``init_lora_weights=True``) that is the shared
  base with every adapter disabled (no extra copy); an adapter that starts elsewhere (a saved adapter
  continued, PiSSA / OLoRA / LoftQ, ``init_lora_weights=False``) gets a frozen copy of its initial
  tensors as one more named adapter (``AdapterReference``), so the reference never penalises the
  adapter it inherited.
- ``save_pretrained(dir)`` writes the adapter in peft's layout (``adapter_config.json`` +
  ``adapter_model.safetensors``, loadable with ``PeftModel.from_pretrained(base, dir)``);
  ``save_pretrained(dir, merge=True)`` writes the merged full model (float32, merged on the CPU).
- A directory holding ``adapter_config.json`` given as a source continues training that adapter on
  the base its config names (``base_model_name_or_path``).

Adapter weights are float32 in every precision (peft's ``autocast_adapter_dtype``); the base is
stored in the precision's frozen dtype (bfloat16 under bf16-mixed). Entities sharing a base switch
the active adapter before each forward, so they run one at a time: every forward and ``generate``
over a shared base holds its lock (``parallel_training="mp"`` threads included), and a backward that
recomputes a forward (gradient checkpointing) is refused under "mp" for entities sharing a base.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def is_adapter_dir(source: Any) -> bool:
    """A local directory written by peft (it holds ``adapter_config.json``)."""
    return isinstance(source, str) and os.path.isfile(os.path.join(source, ADAPTER_CONFIG_FILE))


def adapter_base_source(directory: str) -> str:
    """The base model an adapter directory was trained on (``base_model_name_or_path``)."""
    with open(os.path.join(directory, ADAPTER_CONFIG_FILE), encoding="utf-8") as handle:
        base = json.load(handle).get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{directory} holds a peft adapter whose {ADAPTER_CONFIG_FILE} names no base model "
            f"(base_model_name_or_path); set it to the base model's id or directory."
        )
    return base


def normalize_peft_configs(peft_config: Any, count: int, argument: str = "peft_config") -> List[Any]:
    """One peft config (or None) per entity from None, one config for all, or a list (checked, no loading)."""
    if peft_config is None:
        return [None] * count
    if isinstance(peft_config, (list, tuple)):
        configs = list(peft_config)
        if len(configs) != count:
            raise ValueError(
                f"{argument} has {len(configs)} entries for {count} models; give one peft config for all of them or "
                f"a list with one entry (a config or None) per model."
            )
    else:
        configs = [peft_config] * count
    from peft import PeftConfig

    for index, config in enumerate(configs):
        if config is None:
            continue
        if not isinstance(config, PeftConfig):
            raise ValueError(
                f"{argument}[{index}] must be a peft config (e.g. peft.LoraConfig(r=16, target_modules='all-linear')), "
                f"got {type(config).__name__}."
            )
        if config.is_prompt_learning:
            raise ValueError(f"{argument}[{index}] is a prompt-learning config ({config.peft_type}); use LoRA (peft.LoraConfig).")
        if getattr(config, "inference_mode", False):
            raise ValueError(f"{argument}[{index}] has inference_mode=True, which freezes the adapter; set inference_mode=False.")
    return configs


class SharedBase:
    """A frozen base model and the named adapters a peft model holds on it."""

    def __init__(self, base: nn.Module, source: Optional[str]):
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        self.base = base
        self.source = source
        self.peft_model: Optional[nn.Module] = None
        self.adapters: Dict[str, List[nn.Parameter]] = {}
        self.active: Optional[str] = None
        self.reference: Optional[BaseReference] = None
        self.references: Dict[str, "BaseReference"] = {}
        self.from_zero: Dict[str, bool] = {}  # adapter name -> it starts as the identity (its reference is the bare base)
        # one forward, generate or reference forward at a time: the active adapter is global state
        self.lock = threading.RLock()

    def add(self, name: str, config: Any = None, directory: Optional[str] = None) -> "AdapterModel":
        """A new adapter ``name`` from ``config``, or trained further from a saved adapter ``directory``."""
        from peft import PeftModel, get_peft_model

        if directory is not None:
            if self.peft_model is None:
                self.peft_model = PeftModel.from_pretrained(self.base, directory, adapter_name=name, is_trainable=True)
            else:
                self.peft_model.load_adapter(directory, adapter_name=name, is_trainable=True)
        else:
            config = copy.deepcopy(config)
            if self.source is not None and not config.base_model_name_or_path:
                config.base_model_name_or_path = self.source
            if self.peft_model is None:
                self.peft_model = get_peft_model(self.base, config, adapter_name=name)
            else:
                self.peft_model.add_adapter(name, config)
        self.adapters[name] = self._tensors(name)
        if not self.adapters[name]:
            raise ValueError(f"the peft config of {name} created no trainable tensors; check its target_modules.")
        init = getattr(config, "init_lora_weights", None) if directory is None else None
        self.from_zero[name] = init in (True, "gaussian") and all(
            not bool(p.detach().any()) for n, p in self.peft_model.named_parameters() if f".{name}." in f"{n}." and "lora_B" in n
        )
        self.activate(name, force=True)
        return AdapterModel(self, name)

    def _tensors(self, name: str) -> List[nn.Parameter]:
        marker = f".{name}."
        return [p for n, p in self.peft_model.named_parameters() if marker in f"{n}."]

    def _trainable(self) -> None:
        # peft's set_adapter / disable_adapter freeze every inactive adapter; each entity's optimizer
        # must keep seeing its own parameters as trainable
        for parameters in self.adapters.values():
            for parameter in parameters:
                parameter.requires_grad_(True)

    def activate(self, name: str, force: bool = False) -> None:
        if force or self.active != name:
            self.peft_model.base_model.set_adapter(name)
            self.active = name
            self._trainable()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Run the base alone (every adapter off)."""
        with self.peft_model.disable_adapter():
            yield
        self.activate(self.active, force=True)

    def reference_module(self, name: str) -> "BaseReference":
        """The frozen initial policy of adapter ``name``: the bare base when the adapter starts at
        zero, else a frozen copy of its initial tensors (one more adapter, never trained or saved)."""
        if self.from_zero.get(name, False):
            if self.reference is None:
                self.reference = BaseReference(self)
            return self.reference
        if name not in self.references:
            self.references[name] = AdapterReference(self, self._frozen_copy(name))
        return self.references[name]

    def _frozen_copy(self, name: str) -> str:
        copy_name = f"{name}__reference"
        config = copy.deepcopy(self.peft_model.peft_config[name])
        config.inference_mode = False
        if hasattr(config, "init_lora_weights"):
            config.init_lora_weights = True  # PiSSA / OLoRA / LoftQ init would rewrite the base again
        if hasattr(config, "loftq_config"):
            config.loftq_config = {}
        with self.lock:
            active = self.active
            self.peft_model.add_adapter(copy_name, config)
            parameters = dict(self.peft_model.named_parameters())
            pairs = [(p, parameters[n.replace(f".{name}.", f".{copy_name}.")]) for n, p in parameters.items() if f".{name}." in f"{n}."]
            with torch.no_grad():
                for original, frozen in pairs:
                    frozen.copy_(original)
                    frozen.requires_grad_(False)
            self.activate(active, force=True)
        return copy_name

    def describe(self) -> Dict[str, Any]:
        """What a checkpoint records about the base it does not save."""
        count = sum(p.numel() for p in self.base.parameters())
        return {"source": self.source, "class": type(self.base).__name__, "parameters": count, "adapters": sorted(self.adapters)}


class _SharedView(nn.Module):
    """Delegation to a shared peft model that is not a submodule (so not in ``parameters()``)."""

    def __init__(self, shared: SharedBase):
        super().__init__()
        self.__dict__["shared"] = shared

    @property
    def shared_model(self) -> nn.Module:
        return self.shared.peft_model

    @property
    def signature_source(self) -> nn.Module:
        """The model whose forward signature decides which inputs a forward may be given."""
        return self.shared.base

    @property
    def config(self) -> Any:
        return self.shared.base.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.shared.base, "generation_config", None)

    @generation_config.setter
    def generation_config(self, value: Any) -> None:
        self.shared.base.generation_config = value

    @property
    def device(self) -> torch.device:
        return next(self.shared.base.parameters()).device

    def get_input_embeddings(self) -> nn.Module:
        return self.shared.base.get_input_embeddings()

    def train(self, mode: bool = True) -> "_SharedView":
        super().train(mode)
        self.shared.peft_model.train(mode)
        return self


class AdapterModel(_SharedView):
    """One entity's adapter over a shared base (see the module docstring)."""

    def __init__(self, shared: SharedBase, name: str):
        super().__init__(shared)
        self.adapter_name = name
        prefix = "base_model.model."
        marker = f".{name}"
        params = {}
        for full, parameter in shared.peft_model.named_parameters():
            if any(parameter is p for p in shared.adapters[name]):
                key = full.removeprefix(prefix).replace(marker, "")
                params[key.replace(".", "__")] = parameter
        self.adapter = nn.ParameterDict(params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.lock:
            self.shared.activate(self.adapter_name)
            return self.shared.peft_model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.lock:
            self.shared.activate(self.adapter_name)
            return self.shared.peft_model.generate(*args, **kwargs)

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("the embeddings of a shared LoRA base cannot be resized after adapters are attached.")

    def save_pretrained(self, directory: str, merge: bool = False, **kwargs: Any) -> None:
        """The adapter in peft's layout, or (``merge``) the merged full model, into ``directory``."""
        if merge:
            self.merged_model().save_pretrained(directory, **kwargs)
            return
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        state = get_peft_model_state_dict(self.shared.peft_model, adapter_name=self.adapter_name)
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, os.path.join(directory, ADAPTER_WEIGHTS_FILE),
                  metadata={"format": "pt"})
        config = copy.deepcopy(self.shared.peft_model.peft_config[self.adapter_name])
        config.inference_mode = True  # what peft writes; PeftModel.from_pretrained(..., is_trainable=True) trains it again
        if self.shared.source is not None:
            config.base_model_name_or_path = self.shared.source
        config.save_pretrained(directory)

    def merged_model(self) -> nn.Module:
        """A float32 CPU copy of the base with this adapter merged in (the shared base is untouched).

        When the output layer carries an adapter and shares its weight with the input embedding
        (``tie_word_embeddings``, as in Qwen2.5 / Qwen3), the copy is untied first, so the merge
        changes the output layer only, as the adapter did."""
        clone = copy.deepcopy(self.shared.peft_model).to(device="cpu", dtype=torch.float32)
        base = clone.get_base_model()
        output = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        inner = getattr(output, "base_layer", None)
        if inner is not None and inner.weight is base.get_input_embeddings().weight:
            inner.weight = nn.Parameter(inner.weight.detach().clone())
            base.config.tie_word_embeddings = False
        return clone.merge_and_unload(adapter_names=[self.adapter_name])

    def adapted_weights(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """``(name, W + delta)`` of every layer this adapter changes, by the base model's own parameter
        names and in the base's dtype: what a rollout engine holding the base must load to sample from
        this agent (nothing else differs from the base)."""
        name = self.adapter_name
        with torch.no_grad():
            for path, module in self.shared.peft_model.get_base_model().named_modules():
                layer = getattr(module, "base_layer", None)
                if layer is None or name not in getattr(module, "lora_A", {}):
                    continue
                weight = layer.weight
                yield f"{path}.weight", (weight + module.get_delta_weight(name).to(weight.dtype)).detach()


class BaseReference(_SharedView):
    """The shared base with every adapter disabled: the frozen reference of reference KL for adapters
    that start at zero."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.lock, self.shared.disabled():
            return self.shared.peft_model(*args, **kwargs)


class AdapterReference(BaseReference):
    """The shared base with a frozen copy of an adapter's initial tensors active (see the module docstring)."""

    def __init__(self, shared: SharedBase, adapter: str):
        super().__init__(shared)
        self.reference_adapter = adapter

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        shared = self.shared
        with shared.lock:
            previous = shared.active
            shared.peft_model.base_model.set_adapter(self.reference_adapter)
            shared.active = self.reference_adapter
            try:
                return shared.peft_model(*args, **kwargs)
            finally:
                shared.activate(previous, force=True)


class _MergedExport:
    """What ``save_pretrained_dir`` writes for ``save_model(..., merge_adapters=True)``."""

    def __init__(self, model: "AdapterModel"):
        self.model = model

    def save_pretrained(self, directory: str, **kwargs: Any) -> None:
        self.model.save_pretrained(directory, merge=True, **kwargs)


def export_view(model: nn.Module, merge: bool) -> Any:
    """The object whose ``save_pretrained`` exports ``model`` (merged when ``merge`` and it is an adapter)."""
    return _MergedExport(model) if merge and isinstance(model, AdapterModel) else model


def save_backbone(model: nn.Module, directory: str, merge: bool = False, state_dict: Optional[dict] = None) -> None:
    """``model.save_pretrained(directory)``; an adapter model writes its adapter, or merged weights;
    ``state_dict`` (the gathered full weights of an FSDP-sharded model) replaces the model's own."""
    if isinstance(model, AdapterModel):
        if state_dict is not None:
            raise ValueError("LoRA adapters on FSDP-sharded models are not supported (docs/distributed.md).")
        model.save_pretrained(directory, merge=merge)
    elif state_dict is not None:
        model.save_pretrained(directory, state_dict=state_dict)
    else:
        model.save_pretrained(directory)


def adapter_free_reference(model: nn.Module) -> Optional[nn.Module]:
    """The frozen initial policy of an ``AdapterModel`` over its shared base (None for any other model)."""
    return model.shared.reference_module(model.adapter_name) if isinstance(model, AdapterModel) else None


class LoraBases:
    """The shared bases of one trainer, by (base source, device); objects get their own base.

    ``attach(...)`` turns loaded (or to-be-loaded) bases into adapter models; a trainer passes the
    same registry to its agents and critics, so a critic loaded from the agents' id shares their base.
    """

    def __init__(self, no_shared_recompute: Optional[str] = None) -> None:
        self.bases: Dict[Any, SharedBase] = {}
        # set (to the settings' description) when entities may not share a base: concurrent threads
        # whose backward recomputes a forward would recompute it under another entity's adapter
        self.no_shared_recompute = no_shared_recompute

    def _key(self, source: Any, device: torch.device) -> Any:
        return (source if isinstance(source, str) else id(source), str(device))

    def refuse_sharing(self, *groups: Tuple[Sequence[Any], Optional[Sequence[Any]], Sequence[torch.device], str]) -> None:
        """Raise before anything loads if two LoRA entities of ``groups`` (``(sources, peft_configs,
        devices, prefix)`` each, e.g. the agents then the critics) would share a base while
        ``no_shared_recompute`` is set."""
        if self.no_shared_recompute is None:
            return
        seen = {key: "an earlier model" for key in self.bases}
        for sources, configs, devices, prefix in groups:
            for index, (source, config, device) in enumerate(zip(sources, configs or [None] * len(sources), devices)):
                directory = source if is_adapter_dir(source) else None
                if config is None and directory is None:
                    continue
                key = self._key(adapter_base_source(directory) if directory else source, device)
                if key in seen:
                    raise ValueError(
                        f"{prefix}s[{index}] would share its LoRA base on {device} with {seen[key]} under {self.no_shared_recompute}: "
                        f"a backward that recomputes activations would run under the other model's adapter. Set "
                        f"gradient_checkpointing=False, parallel_training='none', or give the models different devices."
                    )
                seen[key] = f"{prefix}s[{index}]"

    def base_for(self, source: Any, device: torch.device, load: Callable[[str], nn.Module]) -> Tuple[SharedBase, bool]:
        """The shared base of ``source`` on ``device`` and whether it was created by this call."""
        key = self._key(source, device)
        created = key not in self.bases
        if created:
            model = load(source) if isinstance(source, str) else source
            self.bases[key] = SharedBase(model.to(device), source if isinstance(source, str) else None)
        return self.bases[key], created

    def attach(
        self, sources: Sequence[Any], configs: Sequence[Any], devices: Sequence[torch.device], *, prefix: str,
        load: Callable[[str], nn.Module], prepare: Callable[[nn.Module, str], None],
    ) -> Dict[int, AdapterModel]:
        """Adapter models for the entries of ``sources`` that have a config or are adapter directories."""
        self.refuse_sharing((sources, configs, devices, prefix))
        out: Dict[int, AdapterModel] = {}
        for index, (source, config, device) in enumerate(zip(sources, configs, devices)):
            directory = source if is_adapter_dir(source) else None
            if config is None and directory is None:
                continue
            shared, created = self.base_for(adapter_base_source(directory) if directory else source, device, load)
            if created:
                prepare(shared.base, f"{prefix}s[{index}] (LoRA base)")
            name = f"{prefix}_{index}"
            if name in shared.adapters:
                raise ValueError(f"{prefix}s[{index}]: adapter {name!r} already exists on its base.")
            out[index] = shared.add(name, config, directory)
        return out

    def state_dict(self) -> List[Dict[str, Any]]:
        return [base.describe() for base in self.bases.values()]

    def load_state_dict(self, state: Any) -> None:
        """Nothing to restore: the bases are frozen and come from their sources (``describe_mismatch``
        tells a trainer whether a checkpoint was written over the same ones)."""


def describe_mismatch(saved: Sequence[Dict[str, Any]], current: Sequence[Dict[str, Any]]) -> Optional[str]:
    """Why the frozen bases of a checkpoint differ from this trainer's (None when they agree)."""
    if list(saved) == list(current):
        return None
    return f"the checkpoint's frozen LoRA bases are {list(saved)}, this trainer's are {list(current)}"

