"""The field groups every RL config shares: ``CommonTrainingFields`` (optimizer, memory, output, the
GPU path) and ``RolloutFields`` (CoMLRL 1.4.3's sampling, episode, evaluation and reference-KL fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from comlrl.config.base import ConfigBase
from comlrl.core.registry import get_policy_loss, policy_loss_names
from comlrl.config.checks import require_at_least, require_bool_fields, require_choice, require_in_range, require_int_at_least, require_optional_positive
from comlrl.models.precision import normalize_precision
from comlrl.models.saving import check_folder_path

OPTIMIZERS = ("adamw", "adamw_8bit")
GENERATION_BACKENDS = ("hf", "vllm")


@dataclass
class CommonTrainingFields(ConfigBase):
    """Fields every comlrl RL config has beyond CoMLRL 1.4.3 (optimizer, memory, output)."""

    max_grad_norm: Optional[float] = None
    """Clip each model's gradient to this global norm before its optimizer step (None: no clipping;
    the norm is logged either way)."""
    weight_decay: float = 0.01
    """AdamW weight decay (torch's default)."""
    adam_betas: Tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2): decay rates of the gradient's running mean and running square."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon added to the denominator for numerical stability."""
    optimizer_fused: Optional[bool] = None
    """Use torch's fused AdamW kernel (None: wherever the parameters' device supports it)."""
    optimizer_in_backward: Optional[bool] = None
    """Update each parameter inside backward as soon as its gradient is complete and free the
    gradient at once (same arithmetic, no full set of gradients in memory). None: on unless
    ``max_grad_norm`` is set (global-norm clipping needs every gradient first)."""
    update_micro_batch_size: Optional[int] = None
    """Rows (completions) per forward/backward inside one optimizer step; None puts a whole
    minibatch in one forward. Lower it to bound activation memory."""
    output_dir: Optional[str] = None
    """Where the run writes its metrics log (``metrics.jsonl``), its resolved config
    (``run_config.json``) and a summary (``run_summary.json``); None keeps logs in memory only. A
    ``metrics.jsonl`` of another run there is refused (see ``overwrite_output_dir``); a run resumed
    from a checkpoint continues its own, without the rows written after the checkpoint."""
    overwrite_output_dir: bool = False
    """Start ``output_dir/metrics.jsonl`` afresh when it holds another run's rows, instead of refusing
    to mix two runs in one log."""
    tensorboard: bool = False
    """Also write every logged row to TensorBoard under ``output_dir/tensorboard`` (needs the
    ``tensorboard`` package and ``output_dir``)."""
    verbose: Optional[bool] = None
    """Console output and progress bars (None: from ``wandb_config.config_sections.output.verbose``,
    default True)."""
    # --- GPU path: precision, memory, rollout engine (docs/gpu.md)
    precision: Optional[str] = None
    """Numeric precision: "fp32" (float32 everything), "bf16-mixed" (float32 master weights and AdamW
    state, bfloat16 compute under autocast; frozen references and LoRA bases stored in bfloat16),
    "bf16" or "fp16" (pure half precision: weights and optimizer state in it, CoMLRL 1.4.3's memory;
    small updates round away, warned about). None: bf16-mixed when every agent is on a CUDA device
    with bfloat16 support, else fp32; a half dtype in ``model_config`` then means pure half precision.
    An explicit value and a ``model_config`` dtype must agree. Resolved at construction (the config
    then holds the value used)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations during backward instead of keeping them (agents and
    critics): less activation memory, about one extra forward of time, the same gradients."""
    optimizer: str = "adamw"
    """"adamw" (torch's AdamW) or "adamw_8bit" (bitsandbytes' 8-bit AdamW: optimizer state in 2
    bytes per parameter instead of 8; needs ``pip install comlrl[bnb]`` and CUDA parameters)."""
    generation_backend: str = "hf"
    """Rollout engine: "hf" (transformers ``generate``) or "vllm" (a colocated vLLM engine per agent on
    the training GPU, weights synced after every update; needs ``pip install comlrl[vllm]``)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Fraction of the GPU each vLLM engine may reserve (weights + KV cache) with
    ``generation_backend="vllm"``; engines sleep (release it) while the trainer updates."""
    fsdp: bool = False
    """Under torchrun, shard every agent's language model over the processes with FSDP2 (each
    decoder layer, then the rest): each rank holds 1/N of its parameters, gradients and AdamW state,
    and FSDP's reduce-scatter replaces the gradient all-reduce for them. Each rank still rolls out
    its own items, with the agent unsharded while it generates. Value heads, critics and references
    stay replicated; the optimizer steps after backward. In a single process it has no effect (a
    warning says so). See docs/distributed.md."""

    def _validate_common(self) -> None:
        require_bool_fields(self)
        require_optional_positive(self, "max_grad_norm")
        if self.optimizer_in_backward and self.max_grad_norm is not None:
            raise ValueError(
                "optimizer_in_backward=True cannot be combined with max_grad_norm (clipping needs every gradient "
                "before the first update); set one of them to None."
            )
        require_at_least(self, "weight_decay", 0.0)
        betas = tuple(self.adam_betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1). Got {self.adam_betas!r}.")
        self.adam_betas = (float(betas[0]), float(betas[1]))
        require_in_range(self, "adam_epsilon", 0.0, float("inf"), low_open=True)
        if self.update_micro_batch_size is not None:
            require_int_at_least(self, "update_micro_batch_size", 1)
        if not isinstance(self.fsdp, bool):
            raise ValueError(f"fsdp must be True or False. Got {self.fsdp!r}.")
        if self.fsdp and self.optimizer_in_backward:
            raise ValueError(
                "fsdp=True steps sharded parameters after backward (FSDP reduce-scatters their gradients first); "
                "set optimizer_in_backward=None or False."
            )
        if self.output_dir is not None and not isinstance(self.output_dir, str):
            raise ValueError(f"output_dir must be a path string or None. Got {self.output_dir!r}.")
        if self.output_dir:
            check_folder_path(self.output_dir, "output_dir")
        if not isinstance(self.overwrite_output_dir, bool):
            raise ValueError(f"overwrite_output_dir must be True or False. Got {self.overwrite_output_dir!r}.")
        if self.tensorboard and not self.output_dir:
            raise ValueError("tensorboard=True writes under output_dir; set output_dir as well.")
        self.precision = normalize_precision(self.precision)
        if not isinstance(self.gradient_checkpointing, bool):
            raise ValueError(f"gradient_checkpointing must be True or False. Got {self.gradient_checkpointing!r}.")
        require_choice(self, "optimizer", OPTIMIZERS, {"adamw8bit": "adamw_8bit", "adamw-8bit": "adamw_8bit"})
        require_choice(self, "generation_backend", GENERATION_BACKENDS)
        require_in_range(self, "vllm_gpu_memory_utilization", 0.0, 1.0, low_open=True)
        if self.fsdp and self.generation_backend == "vllm":
            raise ValueError(
                "generation_backend='vllm' keeps a full copy of each agent's weights in its engine, which fsdp=True exists "
                "to avoid (and the engine's weight sync reads unsharded parameters); use generation_backend='hf' with fsdp=True, "
                "or fsdp=False with vLLM."
            )


# Fields of every RL config that may differ between a checkpoint and the run that resumes it.
# precision and gradient_checkpointing may change because every stored tensor is checked against the
# trainer's (a change of weight dtype is refused there, naming the tensor); checkpointing changes no value.
RESUMABLE_RUN_FIELDS = frozenset(
    {"num_train_epochs", "agent_devices", "reference_devices", "parallel_training", "logging_steps", "output_dir",
     "overwrite_output_dir", "verbose", "precision", "gradient_checkpointing"}
)


@dataclass
class RolloutFields(CommonTrainingFields):
    """CoMLRL 1.4.3 fields with the same meaning and default in every RL config (sampling, episodes,
    evaluation, reference KL); ``_validate_rollout`` checks them."""

    num_agents: int = 2
    """Number of agents. When ``agents`` is given to the trainer and this field is left at its
    default, it follows ``len(agents)``; set explicitly, it must agree."""
    parallel_training: Optional[str] = "none"
    """"none" or "mp" (one device per model, from the ``*_devices`` fields)."""
    agent_devices: Any = None
    """Device spec: None/"auto" (cuda:i when there are enough GPUs, else cuda:0, else cpu), one device
    string for all agents, or a list with one device per agent."""
    # --- sampling
    max_new_tokens: int = 256
    """Most tokens sampled per completion (the end-of-sequence token included)."""
    temperature: float = 0.6
    """Sampling temperature; log-probs are scored under the same tempered distribution."""
    top_p: float = 0.6
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p
    (1.0 disables it)."""
    top_k: Optional[int] = None
    """Top-k filter at sampling time; None or 0 disables it."""
    # --- episodes
    num_turns: int = 2
    """Turns per episode; more than one needs an ``external_transition``."""
    discount: float = 1.0
    """Gamma: weight of the next turn's return (MAGRPO tree returns, IAC/MAAC TD targets)."""
    early_termination_threshold: Optional[float] = -0.2
    """An episode (in MAGRPO: a tree branch) stops after a turn whose mean reward is above this value
    (None: never early)."""
    external_prompt_passthrough: bool = False
    """Use the prompts returned by ``external_transition`` verbatim instead of passing them through
    the formatters."""
    # --- evaluation
    eval_interval: int = 16
    """Evaluate before every ``eval_interval``-th training item of an epoch (0: only when called)."""
    eval_num_samples: int = 4
    """Evaluation items per evaluation (0 evaluates nothing)."""
    eval_batch_size: int = 1
    """Evaluation items generated together per agent."""
    # --- reference KL
    reference_kl_enabled: bool = False
    """Penalise ``reference_kl_coef * KL(agent || frozen initial agent)`` in every reward/return."""
    reference_kl_coef: float = 0.1
    """Weight of the KL penalty when ``reference_kl_enabled``."""
    reference_kl_mode: str = "loss"
    """Where the KL penalty enters the update: "loss" (a per-token term ``coef * (log pi - log pi_ref)^2 / 2``
    added to each agent's policy loss, outside the advantages, so a group whose rewards tie moves the
    policy only by about ``coef``) or "reward" (CoMLRL 1.4.3: ``coef * (log pi - log pi_ref)`` summed
    over the completion is subtracted from its return before the group baseline, normalisation and,
    in IAC/MAAC, the TD targets)."""
    reference_devices: Any = None
    """Devices of the frozen references (default: the agents' devices)."""

    def _validate_rollout(self) -> None:
        require_int_at_least(self, "max_new_tokens", 1)
        require_in_range(self, "temperature", 0.0, float("inf"), low_open=True)
        require_in_range(self, "top_p", 0.0, 1.0, low_open=True)
        if self.top_k is not None:
            require_int_at_least(self, "top_k", 0)
        require_in_range(self, "discount", 0.0, 1.0)
        threshold = self.early_termination_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
            raise ValueError(f"early_termination_threshold must be a number or None. Got {threshold!r}.")


@dataclass
class PolicyLossFields(ConfigBase):
    """The policy loss of every RL family (MAGRPO's, IAC's, MAAC's, MARLHF's RL phase): one registry of
    losses, one update path (docs/algorithms.md). A config that mixes this in also has
    ``importance_clip_range`` (the stale-ratio clip its family documents); ``_validate_policy_loss``
    resolves a loss's own clip range into it."""

    loss_type: str = "sequence_sum"
    """How the per-token terms (the policy's and the reference KL's, ``reference_kl_mode="loss"``) are
    aggregated: "sequence_sum" (1.4.3: summed over each completion, mean over completions), "grpo"
    (per-sequence token mean), "dr_grpo" (divided by max_new_tokens), "dapo" (token mean over the
    optimizer step), "bnpo" (token mean over each micro-batch), "gspo" (sequence-level importance
    ratio, GSPO's clip range by default), or a name registered with ``comlrl.core.register_policy_loss``."""
    epsilon_high: Optional[float] = None
    """Upper clip of stale samples' importance ratio, ``1 + epsilon_high`` (DAPO's clip-higher; the lower
    bound stays ``1 - importance_clip_range``), with any loss_type. None: symmetric. Under a loss with
    a clip range of its own (gspo: 3e-4 / 4e-4), ``importance_clip_range`` defaults to its lower value
    when unset and ``epsilon_high`` to its upper one when neither is set; the config then holds the
    values used."""

    def _validate_policy_loss(self) -> None:
        """``loss_type`` against the registry, ``epsilon_high``, and the loss's own clip range as the
        default of ``importance_clip_range`` (unset) and ``epsilon_high`` (unset, with the first unset)."""
        require_choice(self, "loss_type", policy_loss_names())
        require_optional_positive(self, "epsilon_high")
        own = get_policy_loss(self.loss_type).clip_range
        if own is not None and not self.is_explicit("importance_clip_range"):
            self.importance_clip_range = own[0]
            if not self.is_explicit("epsilon_high"):
                self.epsilon_high = own[1]
        if self.epsilon_high is not None and self.importance_clip_range is None:
            raise ValueError("epsilon_high needs importance_clip_range (the lower clip bound); set both or neither.")
