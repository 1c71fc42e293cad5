"""``save_model`` of the actor-critic trainers: which folder holds which model.

Each ``ExportEntry`` is one folder: a backbone (``save_pretrained``), its ``value_head.pt`` when it
has a head, optionally a tokenizer, and optionally a critic in ``<folder>/critic/`` (backbone and
``value_head.pt``). Folders are written atomically; existing ones are refused unless ``overwrite``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from comlrl.models.critics import value_model_writer
from comlrl.models.saving import check_target_free, write_dir_atomically, write_into_dir
from comlrl.models.value_head import CausalLMWithValueHead

CRITIC_DIR = "critic"


@dataclass
class ExportEntry:
    path: str
    model: CausalLMWithValueHead
    tokenizer: Any = None
    critic: Optional[CausalLMWithValueHead] = None  # written to ``path/critic``
    into_existing: bool = False  # write the files into ``path`` itself (which may hold other files)
    backbone_state: Optional[dict] = None  # full weights of a sharded (FSDP) backbone


def _writer(entry: ExportEntry, merge: bool):
    extra = None
    if entry.critic is not None:
        critic_writer = value_model_writer(entry.critic, merge=merge)

        def extra(directory: str) -> None:
            write_dir_atomically(os.path.join(directory, CRITIC_DIR), critic_writer)

    return value_model_writer(entry.model, entry.tokenizer, extra, entry.backbone_state, merge=merge)


def write_exports(entries: Sequence[ExportEntry], overwrite: bool, merge: bool = False) -> None:
    """Write every entry; new folders are checked to be free before anything is written. ``merge``:
    LoRA backbones are written as merged full models instead of adapters."""
    for entry in entries:
        if not entry.into_existing:
            check_target_free(entry.path, overwrite)
    for entry in entries:
        if entry.into_existing:
            write_into_dir(entry.path, _writer(entry, merge), overwrite)
        else:
            write_dir_atomically(entry.path, _writer(entry, merge), overwrite)


def agent_dirs(output_dir: str, count: int) -> List[str]:
    return [os.path.join(output_dir, f"agent_{i}") for i in range(count)]
