"""The published CoMLRL configurations as data: model shapes, hyper-parameters and the VRAM they were
reported to take, so ``comlrl estimate --published`` and docs/gpu.md can set them side by side.

The model shapes (``PUBLISHED_MODELS``) live in ``comlrl.cli.memory``, which resolves published
names; they are the ``config.json`` values of the models' Hugging Face Hub pages (Qwen/Qwen2.5-1.5B,
Qwen/Qwen3-1.7B, Qwen/Qwen2.5-Coder-3B, Qwen/Qwen3-4B and Qwen/Qwen3-4B-Instruct-2507, which share
one shape). Hyper-parameters are those of the OpenMLRL task repositories' configs (TLDR:
LLM_Collab_Writing ``configs/*_tldr_config.yaml``; CHE: LLM_Collab_Code_Generation
``configs/*_che_config.yaml``; HouseBuild: LLM_Collab_Minecraft). The VRAM figures are CoMLRL's
own measurements quoted in its heterogeneous-loading PR notes (issue 12 of this project). Prompt
lengths are not in any config: the values below are typical lengths of those tasks' prompts in
the Qwen tokenizer, an assumption stated next to every number derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from comlrl.cli.model_shapes import PUBLISHED_MODELS


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration: the team, the algorithm's batch settings and the reported VRAM."""

    name: str
    algorithm: str  # magrpo | iac | maac
    agents: Tuple[str, ...]  # keys of PUBLISHED_MODELS
    critics: Tuple[str, ...]
    settings: Dict[str, Any]  # trainer-config fields
    prompt_tokens: int  # assumed (see the module docstring)
    reported_gb: float  # CoMLRL 1.4.3 on one H100/H200
    use_separate_critic: bool = True


PUBLISHED_RUNS: List[PublishedRun] = [
    PublishedRun("TLDR MAGRPO (Qwen2.5-1.5B + Qwen3-1.7B)", "magrpo", ("qwen2.5-1.5b", "qwen3-1.7b"), (),
                 dict(num_generations=4, max_new_tokens=256, num_turns=1, rollout_buffer_size=1, train_batch_size=1), 512, 45.0),
    PublishedRun("TLDR MAAC (Qwen2.5-1.5B + Qwen3-1.7B, Qwen3-1.7B critic)", "maac", ("qwen2.5-1.5b", "qwen3-1.7b"), ("qwen3-1.7b",),
                 dict(num_generations=4, max_new_tokens=256, num_turns=1, rollout_buffer_size=4, train_batch_size=4), 512, 71.0),
    PublishedRun("TLDR IAC, separate critics", "iac", ("qwen2.5-1.5b", "qwen3-1.7b"), ("qwen2.5-1.5b", "qwen3-1.7b"),
                 dict(num_generations=4, max_new_tokens=256, num_turns=1, rollout_buffer_size=4, train_batch_size=4), 512, 80.0),
    PublishedRun("CHE IAC, separate critics (Qwen2.5-Coder-3B + Qwen3-4B)", "iac", ("qwen2.5-coder-3b", "qwen3-4b"),
                 ("qwen2.5-coder-3b", "qwen3-4b"),
                 dict(num_generations=4, max_new_tokens=256, num_turns=2, rollout_buffer_size=4, train_batch_size=4), 384, 140.0),
    PublishedRun("HouseBuild MAAC (2 x Qwen3-4B, Qwen3-4B critic)", "maac", ("qwen3-4b", "qwen3-4b"), ("qwen3-4b",),
                 dict(num_generations=2, max_new_tokens=512, num_turns=4, rollout_buffer_size=2, train_batch_size=2), 768, 138.0),
]

@dataclass(frozen=True)
class Setting:
    """A column of the published table."""

    label: str
    precision: str
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    optimizer: str = "adamw"
    optimizer_in_backward: bool = True


SETTINGS: List[Setting] = [
    Setting("fp32", "fp32"),
    Setting("bf16-mixed", "bf16-mixed"),
    Setting("bf16-mixed + GC", "bf16-mixed", True),
    Setting("bf16-mixed + GC + 8-bit AdamW", "bf16-mixed", True, optimizer="adamw_8bit"),
    Setting("bf16-mixed + GC + LoRA r=16", "bf16-mixed", True, 16),
    # 1.4.3's dtypes and schedule: pure bf16 weights, gradients and AdamW state, stepped after backward
    Setting("pure bf16, no in-backward step (1.4.3's dtypes)", "bf16", optimizer_in_backward=False),
]


class _Config:
    """The trainer-config fields ``run_shape`` reads, for a published run under one setting."""

    def __init__(self, run: PublishedRun, setting: Setting):
        defaults = dict(joint_mode="aligned", critic_type="v", update_micro_batch_size=None, reference_kl_enabled=False,
                        max_grad_norm=None, use_separate_critic=run.use_separate_critic)
        for key, value in {**defaults, **run.settings}.items():
            setattr(self, key, value)
        self.precision, self.gradient_checkpointing = setting.precision, setting.gradient_checkpointing
        self.optimizer, self.optimizer_in_backward = setting.optimizer, setting.optimizer_in_backward


def published_estimate(run: PublishedRun, precision: str, checkpointing: bool, lora_rank: int, device: str = "cuda",
                       setting: Optional[Setting] = None):
    """The estimate of ``run`` under ``setting`` (or the one given by precision / checkpointing / LoRA rank)."""
    from comlrl.cli.memory import estimate_memory, run_shape

    setting = setting or Setting("", precision, checkpointing, lora_rank)
    lora_rank = setting.lora_rank
    shape = run_shape(
        run.algorithm, [PUBLISHED_MODELS[a] for a in run.agents], _Config(run, setting),
        agent_sources=list(run.agents), critic_shapes=[PUBLISHED_MODELS[c] for c in run.critics],
        critic_sources=[f"critic:{c}:{i}" for i, c in enumerate(run.critics)], prompt_tokens=run.prompt_tokens,
        lora_rank=lora_rank, device=device,
    )
    if lora_rank:  # critics of the agents' model share their LoRA base
        from dataclasses import replace

        critics = [replace(e, source=e.source.split(":")[1]) for e in shape.critics]
        shape = replace(shape, critics=critics)
    return estimate_memory(shape)


def published_table(settings: Optional[List[Setting]] = None) -> str:
    """Markdown: every published run, its reported VRAM, and the predicted peak per setting (GB = 1e9 B)."""
    settings = settings or SETTINGS
    head = "| configuration | reported (1.4.3) | " + " | ".join(s.label for s in settings) + " |"
    lines = [head, "|" + "---|" * (len(settings) + 2)]
    for run in PUBLISHED_RUNS:
        cells = []
        for setting in settings:
            gb = published_estimate(run, setting.precision, setting.gradient_checkpointing, setting.lora_rank, setting=setting).peak / 1e9
            cells.append(f"{gb:.1f} GB ({gb / run.reported_gb:.0%})")
        lines.append(f"| {run.name}, prompts ~{run.prompt_tokens} tokens | {run.reported_gb:.0f} GB | " + " | ".join(cells) + " |")
    return "\n".join(lines)
