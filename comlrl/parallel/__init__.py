"""The one place that knows ranks and devices: device placement (``devices``), the ``mp`` agent
workers (``workers``), torchrun data parallelism (``data_parallel``) and FSDP2 sharding (``fsdp``).
See docs/distributed.md."""
