"""Device assignment of the CoMLRL 1.4.x public API, on comlrl.parallel.devices."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from comlrl.parallel.devices import auto_devices, normalize_parallel_training, resolve_devices, resolve_single_device

__all__ = ["DeviceScheduler", "normalize_parallel_training"]


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
