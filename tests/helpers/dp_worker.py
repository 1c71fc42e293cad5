"""One process of a data-parallel test run (started by ``torch.distributed.run`` from test_data_parallel.py).

argv[1]: a JSON file with ``paths`` (tiny model dirs), ``scenario``, ``out`` (a directory) and ``module``
(where the scenario is defined: dp_scenarios or fsdp_scenarios).
The trainer joins torchrun's process group by itself: nothing here sets it up.
"""

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tests.helpers.common  # noqa: E402,F401  (offline settings, one thread)
import torch  # noqa: E402
from tests.helpers.dp_scenarios import seed_everything  # noqa: E402

settings = json.load(open(sys.argv[1]))
rank = int(os.environ["RANK"])
seed_everything(0)
scenarios = importlib.import_module(settings["module"]).SCENARIOS
result = scenarios[settings["scenario"]](settings["paths"], settings["out"])
if rank == 0:
    torch.save(result, os.path.join(settings["out"], f"{settings['scenario']}.pt"))
print(f"rank {rank} done", flush=True)
import torch.distributed as dist  # noqa: E402

if dist.is_initialized():  # leave the group before exit (an abort at interpreter exit fails the launch)
    dist.barrier()
    dist.destroy_process_group()
print(f"rank {rank} left", flush=True)
sys.stdout.flush()
sys.stderr.flush()
# Skip the interpreter's teardown: the C++ threads of torch.distributed have aborted there ("terminate
# called without an active exception") after everything above had finished.
os._exit(0)
