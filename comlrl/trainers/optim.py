"""An agent's optimizer, stepped after backward or inside it.

``AgentOptimizer`` wraps one ``torch.optim.AdamW`` (kept public as ``.optimizer`` with its usual
state dict) and offers two schedules with the same arithmetic:

- after backward: gradients of every micro-batch accumulate, then (optional) global-norm
  clipping and one ``step()``;
- inside backward (``in_backward=True``): each parameter is updated by a hook as soon as its
  gradient of the last micro-batch is complete, and the gradient is freed at once. A model never
  holds a full set of gradients, which saves their memory (the size of the model) and the time to
  allocate them. Global-norm clipping needs every gradient before any step, so it requires the
  after-backward schedule.

Parameters sharded by FSDP (``fsdp=True``; DTensors) take the after-backward schedule: FSDP
reduce-scatters their gradients itself (``grad_sync`` is for the replicated ones only), its
multi-tensor AdamW step then updates each rank's shard in one call instead of one call per
parameter inside the reduce-scatter, and the global norm (clipping, the non-finite check) is
reduced over ranks once, so every rank takes the same decision. Under FSDP a model's gradients are
1/N of it, which leaves little for the in-backward schedule to save.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from comlrl.parallel.fsdp import clip_grad_norm_, is_sharded_tensor


def adamw_8bit(groups, **hyper) -> torch.optim.Optimizer:
    """bitsandbytes' ``AdamW8bit`` (block-wise 8-bit moments) over ``groups``."""
    try:
        import bitsandbytes as bnb
    except ImportError as exc:
        raise ImportError(
            "optimizer='adamw_8bit' needs bitsandbytes: pip install 'comlrl[bnb]' (or choose optimizer='adamw')."
        ) from exc
    return bnb.optim.AdamW8bit(groups, **hyper)


def backward_together(optimizers: Iterable["AgentOptimizer"], loss: torch.Tensor) -> None:
    """One backward of ``loss`` through several models' graphs, as every optimizer's last micro-batch
    (each in-backward optimizer steps its parameters as their gradients complete)."""
    optimizers = list(optimizers)
    for optimizer in optimizers:
        optimizer._armed = optimizer.in_backward
    try:
        loss.backward()
    finally:
        for optimizer in optimizers:
            optimizer._armed = False


def _weak_hook(method: Callable[[nn.Parameter], None]) -> Callable[[nn.Parameter], None]:
    """A parameter hook that calls ``method`` while its object lives. A hook holding the optimizer
    itself would keep it, and through it every parameter and AdamW state, alive after the trainer is
    gone: the cycle passes through autograd's C++ side, where Python's garbage collector cannot see it."""
    ref = weakref.WeakMethod(method)

    def hook(param: nn.Parameter) -> None:
        bound = ref()
        if bound is not None:
            bound(param)

    return hook


class AgentOptimizer:
    def __init__(
        self,
        parameters: Iterable[nn.Parameter],
        *,
        lr: float,
        betas: tuple,
        eps: float,
        weight_decay: float,
        fused: Optional[bool],
        max_grad_norm: Optional[float],
        in_backward: bool,
        grad_sync: Optional[Callable[[torch.Tensor], Any]] = None,
        kind: str = "adamw",
    ):
        self.params: List[nn.Parameter] = [p for p in parameters if p.requires_grad]
        if in_backward and max_grad_norm is not None:
            raise ValueError(
                "optimizer_in_backward=True cannot clip gradients by their global norm; set max_grad_norm=None "
                "or optimizer_in_backward=False."
            )
        sharded = [is_sharded_tensor(p) for p in self.params]
        if in_backward and any(sharded):
            raise ValueError(
                "parameters sharded with FSDP are stepped after backward; set optimizer_in_backward=None or False with fsdp=True."
            )
        mixed = any(sharded) and not all(sharded)  # a sharded backbone with a replicated value head
        if fused and mixed:
            raise ValueError(
                "optimizer_fused=True cannot update FSDP-sharded and replicated parameters (a value head) in one fused "
                "kernel; set optimizer_fused=None."
            )
        if fused is None:
            fused = not mixed and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in self.params)
        groups = [{"params": [p]} for p in self.params] if in_backward else [{"params": self.params}]
        if kind == "adamw_8bit":
            self.optimizer = adamw_8bit(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(
                groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=bool(fused) or None
            )
        self.max_grad_norm = max_grad_norm
        self.in_backward = in_backward
        # data parallelism: averages a gradient across ranks in place, before it is used
        self.grad_sync = grad_sync
        self.updates = 0  # optimizer steps taken (the policy version of the samples an agent draws)
        self._armed = False
        self._sq_norm: Optional[torch.Tensor] = None
        self._nonfinite: List[str] = []
        self._handles = []
        if in_backward:
            # By position, not by dict: load_state_dict replaces the group dicts but keeps their order.
            self._group_index: Dict[int, int] = {id(g["params"][0]): i for i, g in enumerate(self.optimizer.param_groups)}
            self._handles = [p.register_post_accumulate_grad_hook(_weak_hook(self._step_parameter)) for p in self.params]

    # ------------------------------------------------------------------ in-backward schedule
    def _step_parameter(self, param: nn.Parameter) -> None:
        if not self._armed:
            return  # an earlier micro-batch: keep accumulating
        grad = param.grad
        if self.grad_sync is not None:
            self.grad_sync(grad)
        flat = grad.detach().reshape(-1)
        flat = flat if flat.dtype == torch.float32 else flat.float()
        square = torch.dot(flat, flat)  # a fused multiply-add: no squared copy of the gradient
        self._sq_norm = square if self._sq_norm is None else self._sq_norm + square
        if not torch.isfinite(square):
            self._nonfinite.append(str(tuple(param.shape)))
        else:
            all_groups = self.optimizer.param_groups
            self.optimizer.param_groups = [all_groups[self._group_index[id(param)]]]
            try:
                self.optimizer.step()
            finally:
                self.optimizer.param_groups = all_groups
        param.grad = None

    # ------------------------------------------------------------------ shared interface
    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backpropagate ``loss``; ``last`` marks the final micro-batch before the step."""
        self._armed = self.in_backward and last
        try:
            loss.backward()
        finally:
            self._armed = False

    def step(self, label: str) -> float:
        """Finish the update and return the global gradient norm (before any clipping)."""
        self.updates += 1
        if self.in_backward:
            norm = math.sqrt(float(self._sq_norm)) if self._sq_norm is not None else 0.0
            self._sq_norm = None
            if self._nonfinite:
                shapes, self._nonfinite = self._nonfinite, []
                raise FloatingPointError(
                    f"{label}: non-finite gradients in parameters of shape {shapes[:3]}. Lower the learning rate "
                    f"or check the rewards."
                )
            return norm
        if self.grad_sync is not None:  # every rank reduces every parameter, in the same order
            for p in self.params:
                if is_sharded_tensor(p):
                    continue  # FSDP has reduce-scattered it already
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self.grad_sync(p.grad)
        limit = self.max_grad_norm if self.max_grad_norm is not None else math.inf
        norm = clip_grad_norm_(self.params, limit)
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"{label}: the gradient norm is {norm}. Lower the learning rate, check the rewards, or set max_grad_norm."
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
