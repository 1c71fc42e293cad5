"""The sandbox options every code environment has (YAML section ``sandbox``): their checks and the sandbox they make."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from comlrl.envs.base import option
from comlrl.envs.sandbox import Sandbox, SandboxLimits
from comlrl.envs.sandbox.isolation import check_isolation_name, resolve_isolation


@dataclass
class SandboxOptions:
    """The options every code environment's sandbox takes alike; each environment adds its own
    ``test_timeout_s``, ``max_timeouts`` and ``wall_time_s`` (their defaults are its original's)."""

    isolation: str = option("auto", "sandbox.isolation", "Sandbox isolation: auto or bwrap (bubblewrap; refused when missing) or none (no containment: explicit opt-in).")
    workers: Optional[int] = option(None, "sandbox.workers", "Candidates tested in parallel (None: one per CPU core).")
    memory_mb: int = option(1024, "sandbox.memory_mb", "Address-space limit per candidate, MiB.")


def check_sandbox_options(options: Any) -> None:
    """``isolation`` (refused here when it cannot contain code and was not opted out of, before any
    model loads), ``test_timeout_s`` and ``memory_mb`` positive, ``max_timeouts`` >= 1, ``wall_time_s``
    positive or None."""
    options.isolation = check_isolation_name(options.isolation, "isolation (sandbox.isolation)")
    resolve_isolation(options.isolation)
    for name in ("test_timeout_s", "memory_mb"):
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}.")
    if isinstance(options.max_timeouts, bool) or not isinstance(options.max_timeouts, int) or options.max_timeouts < 1:
        raise ValueError(f"max_timeouts must be an integer >= 1, got {options.max_timeouts!r}.")
    wall = options.wall_time_s
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float)) or wall <= 0):
        raise ValueError(f"wall_time_s must be a positive number or null, got {wall!r}.")


def sandbox_of(options: Any, default_wall_s: float) -> Sandbox:
    """The sandbox of checked options: ``wall_time_s`` (else ``default_wall_s``) of wall clock and of
    CPU per job, ``memory_mb`` of address space, ``workers`` jobs at a time."""
    wall = options.wall_time_s or default_wall_s
    limits = SandboxLimits(wall_time_s=wall, cpu_time_s=wall, memory_bytes=int(options.memory_mb) << 20)
    return Sandbox(limits, isolation=options.isolation, workers=options.workers)
