"""Training checkpoints: the folder layout and manifest (``layout``), atomic sharded files with SHA-256
records (``files``), the component registry and plain-value encoding (``state``), and the mixin behind
every trainer's ``save_checkpoint`` / ``load_checkpoint`` (``store``). See docs/checkpoints.md."""
