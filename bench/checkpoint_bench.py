#!/usr/bin/env python
"""Cost of a training checkpoint: save time, load time and size on disk, for a two-agent MAGRPO team.

Only the public API (``train(checkpoint_dir=...)``, ``save_checkpoint``, ``load_checkpoint``) is used,
so the same script measures CoMLRL 1.4.3 in its own venv and this project in ours:

    python bench/checkpoint_bench.py --model bench/models/smollm2-135m-instruct     (python bench/bench_models.py builds it)
    $BASELINE_PY bench/checkpoint_bench.py --model bench/models/smollm2-135m-instruct   (an interpreter with CoMLRL 1.4.3)

One short training epoch (one item) runs first so the optimizers hold their moments; then the
trainer's state is saved into a fresh folder and loaded into a second trainer built the same way.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def folder_bytes(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(directory, name)) for name in files)
    return total


def build(model: str, dataset):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=8, num_train_epochs=1, rollout_buffer_size=1,
                        eval_interval=0, agent_learning_rate=1e-6)
    return MAGRPOTrainer(agents=[model, model], reward_func=lambda a, b: [float(len(y) > len(x)) for x, y in zip(a, b)],
                         args=args, train_dataset=dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local model folder used for both agents")
    parser.add_argument("--work-dir", default=None, help="where checkpoints are written (default: a temp dir)")
    options = parser.parse_args()

    import torch
    from datasets import Dataset

    torch.manual_seed(0)
    dataset = Dataset.from_dict({"prompt": ["Write a haiku about the sea."]})
    work = tempfile.mkdtemp(prefix="ckbench-", dir=options.work_dir)
    try:
        trainer = build(options.model, dataset)
        trainer.train(checkpoint_dir=os.path.join(work, "during"))
        target = os.path.join(work, "saved")
        start = time.perf_counter()
        path = trainer.save_checkpoint(target)
        save_s = time.perf_counter() - start
        fresh = build(options.model, dataset)
        start = time.perf_counter()
        fresh.load_checkpoint(path)
        load_s = time.perf_counter() - start
        same = all(torch.equal(a, b) for a, b in zip(trainer.agents[0].parameters(), fresh.agents[0].parameters()))
        files = sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)
        print(json.dumps({
            "python": sys.executable, "model": options.model, "save_s": round(save_s, 2), "load_s": round(load_s, 2),
            "checkpoint_mib": round(folder_bytes(path) / 2**20, 1), "files": len(files), "largest_file_mib":
            round(max(os.path.getsize(os.path.join(path, f)) for f in files) / 2**20, 1), "restored_equal": same,
        }))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
