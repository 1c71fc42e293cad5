"""bench/vllm_throughput.py runs end to end with a tiny model and reports its three sides (marked
``vllm``: it needs the real engine, CI's vLLM job)."""

import json
import os
import subprocess
import sys

import pytest
from tests.helpers.common import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600), pytest.mark.usefixtures("real_engines")]


def test_the_throughput_bench_reports_hf_and_the_engine_on_one_workload(vllm_paths):
    command = [sys.executable, os.path.join(REPO_ROOT, "bench", "vllm_throughput.py"), "--model", vllm_paths["llama"], "--prompts", "2",
               "--samples", "2", "--max-new-tokens", "4", "--reps", "1", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["side"] for r in rows] == ["hf", "vllm_engine", "vllm_backend"]
    assert all(r["tokens_per_s"] > 0 and 0 < r["tokens_per_call"] <= 2 * 2 * 4 for r in rows)
    assert "| vllm_engine |" in done.stdout
