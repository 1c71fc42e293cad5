"""W&B helpers of the CoMLRL 1.4.x public API."""

from comlrl.telemetry.wandb_sink import verbose_from_wandb_config, wandb_init_kwargs

__all__ = ["verbose_from_wandb_config", "wandb_init_kwargs"]
