"""Device specs: from what a config says to one ``torch.device`` per model."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch


PARALLEL_MODES = ("none", "mp")


def normalize_parallel_training(mode: object) -> str:
    """"none" or "mp" (None and "null" mean "none"; case and surrounding spaces are ignored)."""
    value = "none" if mode is None else str(mode).strip().lower()
    value = "none" if value == "null" else value
    if value not in PARALLEL_MODES:
        raise ValueError(f"parallel_training only supports: none, mp. Got {mode!r}.")
    return value


def _parse(spec: Any, kind: str) -> torch.device:
    if isinstance(spec, torch.device):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{kind} entries must be device strings such as 'cpu' or 'cuda:0'. Got {spec!r}.")
    try:
        device = torch.device(spec.strip())
    except RuntimeError as exc:
        raise ValueError(f"{kind}: {spec!r} is not a torch device ({exc}).") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{kind} asks for {spec!r} but CUDA is not available on this machine; use 'cpu'.")
        index = device.index if device.index is not None else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"{kind} asks for {spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist."
            )
        device = torch.device("cuda", index)
    return device


def auto_devices(count: int) -> List[torch.device]:
    """cuda:0..n-1 when there are enough GPUs, all on cuda:0 when there are fewer, else cpu."""
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if gpus >= count:
            return [torch.device("cuda", i) for i in range(count)]
        return [torch.device("cuda", 0)] * count
    return [torch.device("cpu")] * count


def resolve_devices(spec: Any, count: int, kind: str = "devices") -> List[torch.device]:
    """One device per model.

    ``spec``: None or "auto" (see ``auto_devices``), one device string for all, or a list of length 1
    (broadcast) or ``count``.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return auto_devices(count)
    if isinstance(spec, (str, torch.device)):
        return [_parse(spec, kind)] * count
    if isinstance(spec, Sequence):
        entries = list(spec)
        if not entries:
            raise ValueError(f"{kind} must not be an empty list; give one device, or one per model.")
        if len(entries) == 1:
            return resolve_devices(entries[0], count, kind)
        if len(entries) != count:
            raise ValueError(f"{kind} length ({len(entries)}) must be 1 or {count}.")
        out = []
        for entry in entries:
            out.extend(auto_devices(1) if isinstance(entry, str) and entry.strip().lower() == "auto" else [_parse(entry, kind)])
        return out
    raise ValueError(f"{kind} must be None, 'auto', a device string or a list of them. Got {spec!r}.")


def resolve_single_device(*specs: Any) -> torch.device:
    """The first device named by the first non-None spec (CoMLRL 1.4.3 helper)."""
    for spec in specs:
        if spec is not None:
            return resolve_devices(spec, 1, "device")[0]
    return auto_devices(1)[0]


class DeviceScheduler:
    """Resolve device specs into one torch.device per model."""

    @staticmethod
    def resolve_devices(spec: Any, num_devices: int, *, kind: str = "devices") -> List[torch.device]:
        return resolve_devices(spec, num_devices, kind)

    @staticmethod
    def resolve_single_device(*specs: Any) -> torch.device:
        return resolve_single_device(*specs)

    @staticmethod
    def assign_devices(num_agents: int, agent_devices: Any, critic_devices: Any, *, use_separate_critic: bool):
        """``(agent devices, critic devices)``; critics default to their agent's device."""
        agents = resolve_devices(agent_devices, num_agents, "agent_devices")
        if not use_separate_critic:
            return agents, []
        critics = agents if critic_devices is None else resolve_devices(critic_devices, num_agents, "critic_devices")
        return agents, critics

    @staticmethod
    def assign_shared_critic_device(agent_devices: Sequence[torch.device], critic_devices: Optional[Any]) -> torch.device:
        """One device for a shared critic: the first of ``critic_devices``, else the first agent's."""
        if critic_devices is None:
            return agent_devices[0] if agent_devices else auto_devices(1)[0]
        return resolve_devices(critic_devices, 1, "critic_devices")[0]
