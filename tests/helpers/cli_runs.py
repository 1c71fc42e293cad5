"""``comlrl train`` runs with tiny settings, shared by the CLI and environment tests."""

from __future__ import annotations

import json

from comlrl.cli.main import main


def merged(*groups):
    """Override lists joined with a later key replacing an earlier one (``comlrl train`` refuses a key twice)."""
    by_key = {}
    for group in groups:
        for text in group:
            by_key[text.split("=", 1)[0]] = text
    return list(by_key.values())


def tiny(section: str, *, turns=None, generations=None):
    settings = [
        "dataset.offline=true", "dataset.num_train_items=2", "dataset.num_eval_items=1", f"{section}.num_train_epochs=1",
        f"{section}.max_new_tokens=6", f"{section}.eval_interval=2", f"{section}.eval_num_samples=1", f"{section}.logging_steps=1",
        "output.verbose=false",
    ]
    if turns is not None:
        settings.append(f"{section}.num_turns={turns}")
    if generations is not None:
        settings.append(f"{section}.num_generations={generations}")
    return settings


def train(config, overrides, run_dir, extra=()):
    assert main(["train", "--config", config, "--output-dir", str(run_dir), *extra, "--override", *overrides]) == 0
    return run_dir


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]
