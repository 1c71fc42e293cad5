"""Where features meet: every refusal of a combination that one config cannot decide by itself (it
depends on the launch, the team or the trainer class), in one place and before any model loads.

Combinations of one config's own fields are refused by that config's ``__post_init__``
(``comlrl.config`` and the family configs); the train-time ``generate`` settings by
``Run.set_generation_kwargs``; sharing a LoRA base between models of different roles by
``models.lora.LoraBases`` (it needs the models' sources). Everything else is here:

| combination | refused because |
|---|---|
| ``fsdp=True`` with ``parallel_training="mp"`` | one shards over processes, the other places agents in one process |
| torchrun with a trainer that does not split its work over processes | the preference trainers' collection and pair updates run in one process |
| torchrun with ``parallel_training="mp"`` | not supported together yet |
| torchrun with counts that do not split evenly over the processes | ranks would hold different numbers of samples and updates |
| torchrun, several turns and ``early_termination_threshold`` | branches end on each rank's own rewards |
| torchrun and ``dynamic_sampling`` | each rank drops its own tied groups, so the ranks' buffers fill at different steps |
| ``peft_config`` with a preference trainer | their pair scoring and reward learning have no adapter path |
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from comlrl.parallel.data_parallel import DataParallel
from comlrl.trainers.datasets import dataset_length


def join_process_group(args: Any, trainer: str, *, data_parallel: bool) -> DataParallel:
    """This process's place in torchrun's group (a single process outside torchrun), once every launch
    combination of ``args`` is known to be supported. ``data_parallel``: the trainer splits its work."""
    if args.fsdp and args.parallel_training == "mp":
        raise ValueError(
            "fsdp=True shards each agent over torchrun's processes, parallel_training='mp' puts agents on devices of "
            "one process; use one of them (see docs/distributed.md)."
        )
    dist = DataParallel.current()
    if dist.enabled and not data_parallel:
        raise ValueError(
            f"{trainer} does not run under torchrun yet (this process is rank {dist.rank} of {dist.world_size}): its "
            f"preference collection and pair updates are not split over processes. Launch it as one process "
            f"(`python script.py`), with parallel_training='mp' to use several devices."
        )
    if dist.enabled and args.parallel_training == "mp":
        raise ValueError(
            "parallel_training='mp' (agents on several devices of one process) cannot be combined with torchrun's "
            "data parallelism yet; use one of them (see docs/distributed.md)."
        )
    if args.fsdp and not dist.enabled:
        warnings.warn(
            "fsdp=True has no effect in a single process: there is nothing to shard over. Launch with "
            "`torchrun --nproc_per_node=N script.py` (N > 1) to shard the agents, or set fsdp=False.",
            stacklevel=4,
        )
    return dist


def check_data_parallel(args: Any, dist: DataParallel, items_per_step: int, dataset: Any) -> None:
    """Under torchrun, the whole-run counts must split evenly over the processes (checked when the
    trainer is built and again when ``train()`` starts, with the fix in the message)."""
    world = dist.world_size
    if world <= 1:
        return
    dist.per_rank(args.rollout_buffer_size, "rollout_buffer_size")
    dist.per_rank(args.train_batch_size, "train_batch_size")
    if items_per_step % world:
        raise ValueError(
            f"a training step covers {items_per_step} items (from rollout_buffer_size={args.rollout_buffer_size}), which cannot "
            f"be split over {world} processes; choose rollout_buffer_size so that the items per step are a multiple of {world}."
        )
    length = dataset_length(dataset) if dataset is not None else None
    if length is not None and length % world:
        raise ValueError(
            f"the training dataset has {length} items, which cannot be split evenly over {world} processes: uneven item "
            f"counts would leave ranks with different numbers of updates. Use a dataset length that is a multiple of {world}."
        )
    if args.num_turns > 1 and args.early_termination_threshold is not None:
        raise ValueError(
            "early_termination_threshold ends tree branches depending on each rank's rewards, so ranks would hold "
            "different numbers of samples; set early_termination_threshold=None for data-parallel multi-turn training."
        )


def refuse_dynamic_sampling_under_torchrun(args: Any) -> None:
    """DAPO's dynamic sampling keeps a different number of groups on every rank, while a drain is a
    collective of every rank at the same step (checked before any model loads)."""
    if args.dynamic_sampling and DataParallel.current().enabled:
        raise ValueError(
            "dynamic_sampling=True drops each rank's tied groups, so the ranks' rollout buffers would fill at different "
            "steps and their updates (collectives) would no longer meet; run it in one process, or set dynamic_sampling=False "
            "under torchrun."
        )


def refuse_adapters(trainer: str, peft_config: Optional[Any]) -> None:
    """The preference trainers train full weights."""
    if peft_config is not None:
        raise ValueError(
            f"peft_config is not supported by {trainer} yet: the preference trainers train full weights "
            f"(their pair scoring and reward learning have no adapter path). Remove peft_config, or train LoRA "
            f"adapters with MAGRPOTrainer / IACTrainer / MAACTrainer."
        )
