"""What a run reports: the metrics logger and its sinks (JSONL, memory, W&B, TensorBoard), progress
bars, evaluation rows, zero-signal monitoring, the run record (``run_config.json`` /
``run_summary.json``) and credential redaction for everything written."""
