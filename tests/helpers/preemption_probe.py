"""Imported by ``comlrl train --import tests.helpers.preemption_probe`` in the cluster tests.

- Registers ``tldr_probe``: the TLDR environment's data and prompts with a reward tiny models can
  tell apart (how much longer agent 2's completion is than agent 1's, capped at 3: the TLDR reward
  scores their random text 0, which trains nothing). When ``COMLRL_TEST_HANDSHAKE`` is
  ``<folder>:<call>``, the reward stops at its ``call``-th call for a handshake with the test: it writes its pid into the FIFO ``<folder>/rank<RANK>/ready`` and waits until the test writes to
  ``<folder>/rank<RANK>/go``. The test sends its signal in between, so the signal always arrives in the
  middle of a training step, and the step still has work to finish after it.
- Writes what this process sees of its node into ``$COMLRL_TEST_PROBE_OUT/rank<RANK>.json`` (ranks
  from torchrun's rendezvous, the cache settings), when that variable is set.
"""

from __future__ import annotations

import functools
import json
import os

from comlrl.envs import register_environment
from comlrl.envs.base import Environment, environment_spec

HANDSHAKE = "COMLRL_TEST_HANDSHAKE"
PROBE_OUT = "COMLRL_TEST_PROBE_OUT"
NODE_SETTINGS = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "HF_HOME", "HF_TOKEN_PATH", "TRITON_CACHE_DIR",
                 "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "COMLRL_CACHE", "TMPDIR")


def handshake(folder: str) -> None:
    """Tell the test (FIFO ``ready``) that the step is under way, then wait for its ``go``."""
    with open(os.path.join(folder, "ready"), "w") as ready:
        ready.write(f"{os.getpid()}\n")
    with open(os.path.join(folder, "go")) as go:
        go.read()


def length_ratio(completions_1, completions_2):
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions_1, completions_2)]


def build(options):
    env = environment_spec("tldr").build(options)
    reward = length_ratio
    setting = os.environ.get(HANDSHAKE)
    if setting:
        folder, call = setting.rsplit(":", 1)
        folder = os.path.join(folder, f"rank{os.environ.get('RANK', '0')}")
        calls = [0]

        @functools.wraps(length_ratio)  # the same signature: the reward convention is read from it
        def reward(*args, **kwargs):
            calls[0] += 1
            if calls[0] == int(call):
                handshake(folder)
            return length_ratio(*args, **kwargs)

    return Environment(name="tldr_probe", num_agents=env.num_agents, num_turns=env.num_turns, formatters=env.formatters,
                       reward_func=reward, options=env.options, loader=env._loader, rows=env.rows)


def record_node() -> None:
    out = os.environ.get(PROBE_OUT)
    if not out:
        return
    seen = {name: os.environ.get(name) for name in NODE_SETTINGS}
    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as handle:
        json.dump(seen, handle)


register_environment("tldr_probe", build, options=environment_spec("tldr").options_cls, agent_counts=(1, 2),
                     description="TLDR with a test handshake in its reward", replace=True)
record_node()
