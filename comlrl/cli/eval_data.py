"""The rows ``comlrl eval`` evaluates: an environment's split or a user's JSON-lines file, checked
against the environment before any model loads (every row must give each agent its prompt, and
pass@k needs an environment whose reward breakdown counts tests)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple


def read_dataset(path: str) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The rows of a JSON-lines file (one JSON object per non-empty line)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--dataset {path!r}: no such file; give a JSON-lines file with one row (a JSON object) per line.")
    from comlrl.cli.jsonl import json_lines

    rows = []
    for number, row in json_lines(path, f"--dataset {path!r}"):
        if not isinstance(row, dict):
            raise ValueError(f"--dataset {path!r}, line {number}: a {type(row).__name__}, not a row; give one JSON object (the "
                             f"environment's columns) per line.")
        rows.append(row)
    return rows, {"source": os.path.abspath(path)}


def load_split(env: Any, plan: Any, split: str) -> Tuple[List[Any], Dict[str, Any]]:
    """The environment's ``split`` rows, as the run config selects them (its dataset, slice and
    ``offline``), as a list."""
    d = plan.dataset
    try:
        dataset = env.load_dataset(split, d["offline"], hf_split=d[f"{split}_split"], source=d["name"],
                                   allow_sample_fallback=d["allow_sample_fallback"])
    except ValueError as error:
        raise ValueError(f"--split {split}: {error}") from None
    return [dataset[i] for i in range(len(dataset))], dict(env.data_sources.get(split) or {})


def check_rows(env: Any, items: List[Any], args: Any, plan: Any, settings: Any) -> None:
    """Refuse, before any model loads, rows the environment cannot evaluate (see the module docstring)."""
    from comlrl.trainers.eval_metrics import reports_tests

    where = f"--dataset {args.dataset!r}" if args.dataset else f"--split {args.split} of {env.name}"
    if not items:
        raise ValueError(f"{where} has no rows to evaluate; choose another split (--split train|eval) or give --dataset FILE.jsonl.")
    for number, item in enumerate(items, start=1):
        for agent, formatter in enumerate(env.formatters):
            try:
                formatter(item)
            except (KeyError, ValueError, TypeError, AttributeError) as error:
                raise ValueError(f"{where}: row {number} does not fit the {env.name} environment (agent {agent}'s prompt: "
                                 f"{type(error).__name__}: {error}); rows need the environment's columns.") from None
    if plan.config.num_turns > 1 and env.external_transition is None:
        raise ValueError(f"--num-turns {plan.config.num_turns}: the {env.name} environment has one turn (no transition writes a next "
                         f"prompt); use --num-turns 1.")
    if not (args.dataset or settings.pass_k):
        return
    try:  # the breakdown of an empty joint response: what the reward reads of a row, and which terms it reports
        probe = env.reward_details(*[[""] for _ in env.formatters], batch_items=[items[0]])[0]
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"{where}: row 1 does not fit the {env.name} reward ({type(error).__name__}: {error}); rows need the "
                         f"environment's columns.") from None
    if settings.pass_k and not reports_tests(probe):
        raise ValueError(f"--pass-k {args.pass_k}: the {env.name} environment's reward breakdown counts no tests (passed_tests, "
                         f"total_tests), so no answer can be judged correct; pass@k is for the code environments (humaneval, "
                         f"coophumaneval, mbpp, ...). Drop --pass-k.")
