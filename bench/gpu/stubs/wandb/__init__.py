"""A stand-in for wandb, which CoMLRL 1.4.3 imports at module level but the benchmark never uses
(no wandb_config is given) and the GPU image does not have. Any use raises."""


def __getattr__(name):
    raise RuntimeError(f"wandb.{name} used in the GPU benchmark, which runs without W&B")
