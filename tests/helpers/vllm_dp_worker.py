"""One process of a torchrun job that builds a vLLM engine beside the job's own process group
(started by ``tests/rollout/test_vllm_engine.py``): the engine generates and closes, and the job's
group must still work afterwards. Each rank writes its result to ``OUT_DIR/rank<N>.json`` (one file
per rank: two ranks printing to one shared stdout can interleave their lines).

    python -m torch.distributed.run --nproc_per_node=2 tests/helpers/vllm_dp_worker.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    from comlrl.rollout.vllm_engine import RowRequest, VLLMEngine

    engine = VLLMEngine(model_dir, torch.device("cpu"), 0.3)
    tokens = engine.generate([RowRequest([5, 9, 17], 4, 0.0, 1.0, 0, None, [0])])[0].token_ids
    engine.close()
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)  # the job's group after the engine closed
    result = {"rank": dist.get_rank(), "tokens": tokens, "group_alive": dist.is_initialized(), "all_reduce": float(total)}
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as handle:
        json.dump(result, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
