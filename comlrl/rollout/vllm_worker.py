"""The two classes comlrl hands to vLLM by qualified name (imported by vLLM, where vLLM is installed).

- ``DeviceExecutor``: vLLM's single-process executor with one change: the worker's local rank is the
  agent's CUDA device index (``additional_config["comlrl_device_index"]``). vLLM's own executor
  reads the index from ``device_config.device``, which has none, so every engine landed on cuda:0.
- ``WeightSync``: a worker extension whose ``comlrl_reload_weights`` loads ``(name, tensor)`` pairs
  into the worker's model with vLLM's in-place reload. Called through ``collective_rpc`` by method
  name, so it works whether the engine runs in this process (the tensors are passed as they are) or
  in its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``: one safetensors payload, as bytes; vLLM's RPC
  cannot send a Python function, which is what ``apply_model`` sends, and turns tensors nested in
  untyped arguments into lists).
"""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import safetensors.torch
import torch
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from comlrl.rollout.vllm_engine import DEVICE_INDEX_KEY


class DeviceExecutor(UniProcExecutor):
    """``UniProcExecutor`` whose worker sits on ``cuda:<additional_config["comlrl_device_index"]>``."""

    def _distributed_args(self) -> Tuple[str, int, int]:
        init_method, rank, local_rank = super()._distributed_args()
        extra = self.vllm_config.additional_config
        index = extra.get(DEVICE_INDEX_KEY) if isinstance(extra, dict) else None
        return init_method, rank, local_rank if index is None else int(index)


class WeightSync:
    """Mixed into vLLM's worker class (``worker_extension_cls``)."""

    def comlrl_reload_weights(self, weights: Union[bytes, Sequence[Tuple[str, torch.Tensor]]]) -> None:
        """Load ``(name, tensor)`` pairs (or a safetensors payload of them, from another process) into the
        worker's model through vLLM's in-place reload, which re-runs each layer's post-load processing
        (the CPU backend repacks linear weights) once all of that layer's tensors have arrived."""
        pairs = list(safetensors.torch.load(weights).items()) if isinstance(weights, bytes) else list(weights)
        self.reload_weights(weights_iterator=pairs, is_checkpoint_format=True)  # type: ignore[attr-defined]
