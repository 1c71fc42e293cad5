"""Optional packages of the GPU path and the choice of each agent's generation backend.

Checked before any model loads: ``optimizer="adamw_8bit"`` needs bitsandbytes,
``generation_backend="vllm"`` needs vLLM (``comlrl[bnb]`` / ``comlrl[vllm]`` extras).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Sequence

_EXTRAS = {
    "bitsandbytes": ("optimizer='adamw_8bit'", "bnb", "optimizer='adamw'"),
    "vllm": ("generation_backend='vllm'", "vllm", "generation_backend='hf'"),
}


def require_package(module: str) -> None:
    """ImportError naming the setting that needs ``module``, the extra that installs it and the fallback."""
    if importlib.util.find_spec(module) is None:
        setting, extra, fallback = _EXTRAS[module]
        raise ImportError(f"{setting} needs the {module} package: pip install 'comlrl[{extra}]' (or set {fallback}).")


def require_optional_packages(args: Any) -> None:
    if args.optimizer == "adamw_8bit":
        require_package("bitsandbytes")
    if args.generation_backend == "vllm":
        from comlrl.rollout import vllm_backend

        if vllm_backend.ENGINE_FACTORY is vllm_backend.colocated_engine:  # a real engine, not an injected one
            require_package("vllm")
            from comlrl.rollout.vllm_engine import multiprocess_requested

            multiprocess_requested()  # a VLLM_ENABLE_V1_MULTIPROCESSING vLLM cannot read fails here, before loading


def install_generation_backends(policies: Sequence[Any], args: Any) -> None:
    """Replace each agent's Hugging Face sampler by a vLLM engine when the config asks for it."""
    if args.generation_backend != "vllm":
        return
    from comlrl.rollout.vllm_backend import VLLMGenerator

    for policy in policies:
        policy.generator = VLLMGenerator.for_policy(policy, gpu_memory_utilization=args.vllm_gpu_memory_utilization)
