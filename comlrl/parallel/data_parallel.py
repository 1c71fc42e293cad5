"""Data parallelism across processes with torch.distributed (launched by ``torchrun``).

One place knows about ranks. ``DataParallel.current()`` notices torchrun's environment (``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and joins the default process group itself
(NCCL when CUDA is available, else gloo; ``COMLRL_DIST_BACKEND`` overrides), so an unchanged training
script runs under ``torchrun --nproc_per_node=N script.py``. Outside torchrun it is a single process and
every collective below is the identity.

What a trainer does with it (``trainers.team.Team``, ``trainers.run.Run``):
- each rank rolls out a disjoint shard of every step's items (``shard``), with the item's index in
  the global step as the identity of its random streams, so samples do not depend on the world size;
- every optimizer averages each gradient across ranks before it steps (``average_``);
- quantities of the whole run stay global: env steps (``sum_int``), logged metrics (``merge_metrics``),
  the statistics of advantage normalisation (``sum_tensors``);
- only rank 0 logs, exports and writes checkpoints, which hold every rank's own state
  (``gather_objects``); the others wait at a ``barrier``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

BACKEND_ENV = "COMLRL_DIST_BACKEND"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def leave_process_group(*, wait: bool = True) -> None:
    """Leave the process group this process joined (a no-op without one): after a barrier when
    ``wait`` (every rank done), at once otherwise (a failed rank must not wait for the others).
    ``comlrl train`` calls it when a run ends, so a torchrun launch does not end in the abort that
    torch.distributed's threads can raise while an interpreter with an open group exits."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()


def exit_worker_rank(code: int = 0) -> None:
    """End a finished rank other than 0 now, without interpreter finalization (``os._exit`` after
    flushing its output). Such a rank wrote nothing of its own (rank 0 owns the run directory, the
    logs and the exports), so nothing is lost, and it cannot die in the abort ("terminate called
    without an active exception") that torch.distributed's C++ threads can raise while an interpreter
    tears down, which would make torchrun fail a run that finished."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ joining
    @classmethod
    def current(cls) -> "DataParallel":
        """The process group this process belongs to, joined now if torchrun started it."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()), dist.get_backend())
        world = _env_int("WORLD_SIZE", 1)
        if world <= 1:
            return cls()
        if not dist.is_available():
            raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed; run a single process.")
        missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if missing:
            raise RuntimeError(
                f"WORLD_SIZE={world} but {', '.join(missing)} is not set: launch with torchrun (it sets them), e.g. "
                f"`torchrun --nproc_per_node={world} script.py`."
            )
        local_rank = _env_int("LOCAL_RANK", 0)
        backend = os.environ.get(BACKEND_ENV) or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, backend)

    def device(self) -> torch.device:
        """This rank's device when the config leaves devices to comlrl: cuda:LOCAL_RANK, else the CPU."""
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    # ------------------------------------------------------------------ work split
    def shard(self, start: int, items: Sequence[Any]) -> Tuple[List[Any], List[int]]:
        """This rank's items of a step whose first item is number ``start`` of the epoch, and their
        indices in the step (contiguous blocks: rank r takes block r)."""
        if len(items) % self.world_size:
            raise ValueError(
                f"a training step of {len(items)} items cannot be split evenly over {self.world_size} processes; make "
                f"the number of items per step and the dataset length multiples of the world size."
            )
        size = len(items) // self.world_size
        first = self.rank * size
        return list(items[first : first + size]), list(range(first, first + size))

    def per_rank(self, count: int, name: str) -> int:
        """A whole-run quantity (groups per buffer, per optimizer step) as this rank's share."""
        if count % self.world_size:
            raise ValueError(
                f"{name}={count} counts groups of the whole run and cannot be split evenly over {self.world_size} "
                f"processes; use a multiple of {self.world_size}."
            )
        return count // self.world_size

    def share(self, rows: Sequence[Any], name: str) -> List[Any]:
        """This rank's contiguous share of a global minibatch ``rows`` (all of it in one process)."""
        if len(rows) % self.world_size:
            raise ValueError(
                f"a minibatch of {len(rows)} groups cannot be split evenly over {self.world_size} processes; make {name} "
                f"and the groups per turn of every rollout buffer multiples of {self.world_size}."
            )
        size = len(rows) // self.world_size
        return list(rows[self.rank * size : (self.rank + 1) * size])

    def all_gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, by rank, on every rank."""
        if not self.enabled:
            return [value]
        import torch.distributed as dist

        everything: List[Any] = [None] * self.world_size
        dist.all_gather_object(everything, value)
        return everything

    # ------------------------------------------------------------------ collectives
    def average_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` across ranks in place."""
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            tensor.div_(self.world_size)
        return tensor

    def sum_tensors(self, *tensors: torch.Tensor) -> List[torch.Tensor]:
        """Element-wise sums across ranks (float64 on the CPU, whatever the inputs' devices)."""
        if not self.enabled:
            return list(tensors)
        import torch.distributed as dist

        device = self.device() if self.backend == "nccl" else torch.device("cpu")
        flat = torch.cat([t.detach().double().reshape(-1).to(device) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.cpu()
        out, offset = [], 0
        for t in tensors:
            out.append(flat[offset : offset + t.numel()].reshape(t.shape))
            offset += t.numel()
        return out

    def sum_int(self, value: int) -> int:
        if not self.enabled:
            return int(value)
        return int(self.sum_tensors(torch.tensor([float(value)]))[0].item())

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if not self.enabled:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, value: Any) -> Optional[List[Any]]:
        """Every rank's ``value`` (by rank) on rank 0, None elsewhere."""
        if not self.enabled:
            return [value]
        import torch.distributed as dist

        out: Optional[List[Any]] = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, out, dst=0)
        return out

    def merge_metrics(self, sums: Dict[str, float], counts: Dict[str, int]) -> Tuple[Dict[str, float], Dict[str, int]]:
        """Sums and counts of pending metrics added up over ranks (every rank gets the result)."""
        if not self.enabled:
            return sums, counts
        import torch.distributed as dist

        everything: List[Any] = [None] * self.world_size
        dist.all_gather_object(everything, (dict(sums), dict(counts)))
        merged_sums: Dict[str, float] = {}
        merged_counts: Dict[str, int] = {}
        for rank_sums, rank_counts in everything:
            for key, value in rank_sums.items():
                merged_sums[key] = merged_sums.get(key, 0.0) + value
                merged_counts[key] = merged_counts.get(key, 0) + rank_counts[key]
        return merged_sums, merged_counts

    def broadcast_parameters(self, modules: Sequence[torch.nn.Module]) -> None:
        """Every rank starts from rank 0's weights (fresh value heads are random on each rank).
        Parameters sharded by FSDP are skipped: they were broadcast before they were sharded."""
        if not self.enabled:
            return
        import torch.distributed as dist

        from comlrl.parallel.fsdp import is_sharded_tensor

        seen = set()
        with torch.no_grad():
            for module in modules:
                for tensor in list(module.parameters()) + list(module.buffers()):
                    if id(tensor) not in seen and not is_sharded_tensor(tensor):
                        seen.add(id(tensor))
                        dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()


SINGLE_PROCESS = DataParallel()
