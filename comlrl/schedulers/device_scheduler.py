"""Device assignment (CoMLRL 1.4.x import path); it lives in ``comlrl.parallel.devices``."""

from comlrl.parallel.devices import DeviceScheduler, normalize_parallel_training

__all__ = ["DeviceScheduler", "normalize_parallel_training"]
