"""Sharding agents over the torchrun processes with FSDP2 (``torch.distributed.fsdp.fully_shard``).

With ``fsdp=True`` under torchrun, every agent's language model is sharded over all ranks: each
decoder layer (the model's ``_no_split_modules`` classes; the root alone when it names none) is
one FSDP unit, then the root holds the rest (embeddings, final norm, head). Each rank keeps 1/N of
the agent's parameters, gradients and AdamW state; FSDP all-gathers a unit's parameters for its
forward and backward and reduce-scatters its gradients, which replaces the gradient all-reduce of
plain data parallelism for those parameters. Each rank still rolls out its own items. Value heads,
critics and frozen references are not sharded: they stay replicated (gradients averaged as
before).

Three rules keep every rank issuing the same collectives in the same order:

- a forward whose count can differ between ranks (generation, whose decode steps depend on the
  sampled lengths; value forwards over a rank's distinct sequences; rank 0's evaluation) runs
  with the model unsharded (``Sharding.unsharded``): its parameters are all-gathered once on every
  rank and no forward inside issues a collective;
- the update's forward/backward runs sharded; the number of micro-batches is the same on every
  rank because every rank holds the same number of samples;
- states are gathered (``full_model_state``, ``full_optimizer_state``) and restored
  (``load_full_model_state``, ``shard_optimizer_state``) by every rank together.

A checkpoint or ``save_model`` folder holds the full (unsharded) tensors, written by rank 0 in the
layout of an unsharded run.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn


@functools.lru_cache(maxsize=None)
def _dtensor_class() -> Optional[type]:
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (a parameter, gradient or optimizer state sharded by FSDP)."""
    cls = _dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def is_sharded(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is sharded."""
    return any(is_sharded_tensor(p) for p in module.parameters())


def plain_class_name(module: nn.Module) -> str:
    """The module's class name without the ``FSDP`` prefix ``fully_shard`` gives the class it swaps in
    (a checkpoint names the model's own class, with or without sharding)."""
    cls = type(module)
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FSDPModule

        if isinstance(module, FSDPModule):
            cls = next(base for base in cls.__mro__[1:] if not issubclass(base, FSDPModule))
    return cls.__name__


def decoder_layers(model: nn.Module) -> List[nn.Module]:
    """The submodules of ``model`` whose class is one of its ``_no_split_modules`` (the decoder
    layers of a Hugging Face model); empty when it names none."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


class Sharding:
    """The FSDP2 side of a trainer under torchrun: shards agents and unshards them on demand."""

    def __init__(self, device_type: str, world_size: int):
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(device_type, (world_size,))
        self.roots: List[nn.Module] = []
        self._depth: Dict[int, int] = {}

    def shard(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place: each decoder layer is a unit resharded after its forward (and
        gathered again for backward); the root unit stays gathered from its forward to its backward,
        which follows at once. Returns the same object (its class now also an ``FSDPModule``)."""
        from torch.distributed.fsdp import fully_shard

        if id(model) in self._depth:  # one model object given for two agents: sharded once
            return model
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh, reshard_after_forward=True)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=False)
        self.roots.append(model)
        self._depth[id(model)] = 0
        return model

    def _roots_in(self, modules: Optional[Iterable[nn.Module]]) -> List[nn.Module]:
        if modules is None:
            return list(self.roots)
        inside = {id(sub) for module in modules for sub in module.modules()}
        return [root for root in self.roots if id(root) in inside]

    @contextlib.contextmanager
    def unsharded(self, modules: Optional[Iterable[nn.Module]] = None) -> Iterator[None]:
        """Hold the sharded models in ``modules`` (every sharded agent when None) unsharded inside the
        block: collective on entry (one all-gather per FSDP unit, every rank must enter), local on
        exit. Re-entrant: a nested block for a model that is already unsharded does nothing."""
        roots = self._roots_in(modules)
        entered = []
        try:
            for root in roots:
                self._depth[id(root)] += 1
                entered.append(root)
                if self._depth[id(root)] == 1:
                    _unshard(root)
            yield
        finally:
            for root in reversed(entered):
                self._depth[id(root)] -= 1
                if self._depth[id(root)] == 0:
                    _reshard(root)

    def generation(self, backend: Any, model: nn.Module) -> "UnshardedGeneration":
        return UnshardedGeneration(backend, self, model)


def _fsdp_units(root: nn.Module) -> List[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def _unshard(root: nn.Module) -> None:
    units = _fsdp_units(root)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.unshard()


def _reshard(root: nn.Module) -> None:
    for unit in _fsdp_units(root):
        unit.reshard()
        unit.set_reshard_after_forward(unit is not root, recurse=False)  # the settings of ``shard``


class UnshardedGeneration:
    """A generation backend whose ``generate`` runs with its agent's model unsharded (every rank calls
    it the same number of times: one call per agent per tree level of the same step)."""

    def __init__(self, backend: Any, sharding: Sharding, model: nn.Module):
        self.backend = backend
        self._sharding = sharding
        self._model = model

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._sharding.unsharded([self._model]):
            return self.backend.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the backend's other attributes (tokenizer, encode, ...)
        if name in ("backend", "_sharding", "_model"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.backend, name)


# ----------------------------------------------------------------------------- states
def full_model_state(module: nn.Module) -> Dict[str, torch.Tensor]:
    """``module.state_dict()`` with every sharded tensor gathered: full CPU tensors on rank 0, an
    empty dict on the other ranks. Collective. Keys that share one tensor in the module (tied
    embeddings) share one tensor here too, so files dedupe them as in an unsharded run."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if full:
        first: Dict[int, str] = {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            owner = first.setdefault(id(tensor), name)
            if owner != name and name in full and owner in full:
                full[name] = full[owner]
    return full


def load_full_model_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a full state dict (held by every rank) into a module with sharded parameters. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, dict(state), options=StateDictOptions(full_state_dict=True))


def _optimizer_params(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> Optional[Dict[str, Any]]:
    """``optimizer.state_dict()`` (integer parameter ids, the layout of an unsharded run) with every
    sharded state tensor gathered to a full CPU tensor; returned where ``keep`` (rank 0), else None.
    Collective: every rank gathers the same tensors in the same order."""
    state = optimizer.state_dict()
    gathered: Dict[Any, Dict[str, Any]] = {}
    for key, entry in state["state"].items():
        gathered[key] = {}
        for name, value in entry.items():
            if is_sharded_tensor(value):
                value = value.full_tensor()
            gathered[key][name] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    return {"state": gathered, "param_groups": state["param_groups"]} if keep else None


def shard_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> Dict[str, Any]:
    """A full optimizer state dict (read by every rank) with each state tensor of a sharded parameter
    cut to this rank's shard, ready for ``optimizer.load_state_dict``. Local: every rank holds the
    full tensors, so each takes its own slice."""
    from torch.distributed.tensor import distribute_tensor

    params = _optimizer_params(optimizer)
    out: Dict[Any, Dict[str, Any]] = {}
    for key, entry in state["state"].items():
        param = params[int(key)]
        out[key] = dict(entry)
        if not is_sharded_tensor(param):
            continue
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(param.shape) and value.dim() > 0:
                local = value.to(device=param.device, dtype=param.dtype)
                out[key][name] = distribute_tensor(local, param.device_mesh, param.placements, src_data_rank=None)
    return {"state": out, "param_groups": state["param_groups"]}


def optimizer_is_sharded(optimizer: Any) -> bool:
    return isinstance(optimizer, torch.optim.Optimizer) and any(is_sharded_tensor(p) for p in _optimizer_params(optimizer))


def gather_states(models: Mapping[str, nn.Module], optimizers: Mapping[str, Any], keep: bool) -> Dict[int, Any]:
    """Full states of the sharded models and optimizers among ``models`` / ``optimizers`` (a
    checkpoint's components), by ``id`` of the object; empty where not ``keep``. Collective: every
    rank passes the same components."""
    out: Dict[int, Any] = {}
    for module in models.values():
        if id(module) not in out and is_sharded(module):
            out[id(module)] = full_model_state(module)
    for optimizer in optimizers.values():
        if optimizer_is_sharded(optimizer):
            out[id(optimizer)] = full_optimizer_state(optimizer, keep)
    return out if keep else {}


# ----------------------------------------------------------------------------- gradients
def clip_grad_norm_(parameters: Sequence[torch.Tensor], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over parameters that may mix sharded gradients (FSDP
    DTensors, whose norm is reduced over ranks) and replicated ones (already averaged): the global
    L2 norm ``sqrt(|g_sharded|^2 + |g_replicated|^2)``, the same on every rank, and every gradient
    scaled by ``min(1, max_norm / (norm + 1e-6))``. Returns the norm before clipping."""
    with_grad = [p for p in parameters if p.grad is not None]
    sharded = [p for p in with_grad if is_sharded_tensor(p.grad)]
    if not sharded:
        return float(torch.nn.utils.clip_grad_norm_(with_grad, max_norm)) if with_grad else 0.0
    replicated = [p for p in with_grad if not is_sharded_tensor(p.grad)]
    norms = [torch.nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor()]
    if replicated:
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in replicated]).to(norms[0].device))
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in (sharded, replicated):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return float(total)
