"""The CPU-runnable parts of the GPU benchmark (bench/gpu): flags, models built from the published
shapes at toy sizes, the tokenizer, the budgeted driver and its JSON report, one real toy job."""

import importlib.util
import json
import os
import sys

import pytest
from tests.helpers.common import REPO_ROOT
import torch

from comlrl.cli.published import PUBLISHED_MODELS

HERE = os.path.join(REPO_ROOT, "bench", "gpu")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", os.path.join(HERE, "gpu_bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_bench", None)


def test_flags(bench):
    args = bench.parse_args(["--out", "x.json", "--budget-s", "100", "--only", "tldr-maac/bf16-mixed+gc", "--steps", "3"])
    assert (args.out, args.budget_s, args.only, args.steps, args.scale) == ("x.json", 100.0, ["tldr-maac/bf16-mixed+gc"], 3, "full")
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    assert len({job.name for job in bench.JOBS}) == len(bench.JOBS)
    assert all(job.run in bench.RUNS for job in bench.JOBS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_MODELS))
def test_models_are_built_from_the_published_shapes(bench, name):
    shape = bench.scaled_shape(PUBLISHED_MODELS[name], "tiny")
    model = bench.build_model(shape, torch.float32, "cpu")
    assert sum(p.numel() for p in model.parameters()) == shape.parameters
    assert type(model).__name__ == ("Qwen3ForCausalLM" if shape.qk_norm else "Qwen2ForCausalLM")
    with torch.device("meta"):  # the full-size model has exactly the published parameter count
        full = bench.build_model(PUBLISHED_MODELS[name], torch.bfloat16, "meta")
    assert sum(p.numel() for p in full.parameters()) == PUBLISHED_MODELS[name].parameters


def test_tokenizer_and_prompts_cover_the_vocabulary(bench):
    tok = bench.build_tokenizer(512)
    assert len(tok) == 512 and tok.eos_token_id == 0 == tok.pad_token_id
    prompts = bench.synthetic_prompts(3, 40, 512)
    ids = [tok(p).input_ids for p in prompts]
    assert all(len(row) == 40 and 0 not in row for row in ids)
    assert tok.decode([5, 511]) == "w5 w511"
    assert bench.length_ratio(["ab", "a"], ["abcd", "a"], batch_items=None) == [2.0, 1.0]


def test_driver_writes_every_result_and_respects_the_budget(bench, tmp_path, monkeypatch):
    def child(job, args):
        if job.name.endswith("gc+lora"):
            return [sys.executable, "-c", "import sys; sys.stderr.write('CUDA out of memory'); sys.exit(1)"]
        return [sys.executable, "-c", f"import json; print(json.dumps({{'job': {job.name!r}, 'peak_allocated_gib': 1.5}}))"]

    monkeypatch.setattr(bench, "_child_command", child)
    out = tmp_path / "report.json"
    only = ["tldr-magrpo/bf16-mixed+gc", "tldr-magrpo/bf16-mixed+gc+lora", "tldr-magrpo/bf16-mixed"]
    assert bench.main(["--out", str(out), "--only", *only, "--budget-s", "120"]) == 0
    report = json.loads(out.read_text())
    assert [r["job"] for r in report["results"]] == [only[0], only[2]]
    assert report["skipped"] == [{"job": only[1], "reason": "failed: CUDA out of memory"}]
    assert bench.main(["--out", str(out), "--only", *only, "--budget-s", "10"]) == 0  # too little time for any job
    report = json.loads(out.read_text())
    assert not report["results"] and all(s["reason"].startswith("budget") for s in report["skipped"])


@pytest.mark.slow
def test_one_toy_job_runs_end_to_end_on_the_cpu(bench, tmp_path):
    out = tmp_path / "report.json"
    assert bench.main(["--scale", "tiny", "--device", "cpu", "--steps", "1", "--out", str(out), "--only",
                       "tldr-magrpo/bf16-mixed+gc+lora"]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["lora_rank"] == 16 and result["step_s"] > 0 and result["generation_tokens"] == 2 * 4 * 8


@pytest.mark.slow
def test_the_143_side_runs_from_the_carried_wheel(bench, tmp_path):
    """The side-by-side row: CoMLRL 1.4.3 unpacked from bench/gpu/wheels (a pure-Python wheel is a zip)."""
    import glob
    import zipfile

    wheels = glob.glob(os.path.join(HERE, "wheels", "comlrl-1.4.3-*.whl"))
    if not wheels:  # not carried: PyPI has it (the only other reason to skip is a missing network)
        import subprocess
        import sys

        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path / "wheels"),
                                  "comlrl==1.4.3"], capture_output=True, text=True, timeout=300)
        wheels = glob.glob(str(tmp_path / "wheels" / "comlrl-1.4.3-*.whl"))
        if not wheels:
            pytest.skip(f"network: bench/gpu/wheels holds no CoMLRL 1.4.3 wheel and pip could not fetch it ({fetched.stderr.strip()[-200:]})")
    (wheel,) = wheels
    zipfile.ZipFile(wheel).extractall(tmp_path / "c143")
    out = tmp_path / "report.json"
    assert bench.main(["--scale", "tiny", "--device", "cpu", "--steps", "1", "--out", str(out), "--only", "tldr-magrpo/1.4.3",
                       "--comlrl143", str(tmp_path / "c143")]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["library"] == "1.4.3" and result["generation_tokens"] == 2 * 4 * 8
