"""Device scheduling (CoMLRL 1.4.x import path)."""

from comlrl.parallel.devices import DeviceScheduler, normalize_parallel_training

__all__ = ["DeviceScheduler", "normalize_parallel_training"]
