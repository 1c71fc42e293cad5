"""The real vLLM engine (``comlrl.rollout.vllm_engine``) on the CPU: what building and using one does
to the process, weight pushes read back tensor for tensor, engines' independence, their devices and
the multiprocess engine. Marked ``vllm``: run in CI's vLLM job (``.ci/run``), deselected elsewhere."""

import gc
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.rollout.vllm_backend import RowRequest
from comlrl.rollout.vllm_engine import DEVICE_INDEX_KEY, VLLMEngine, engine_options
from tests.helpers.vllm_models import assert_engine_holds

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600), pytest.mark.usefixtures("real_engines")]

PROMPT = [5, 9, 17, 33]
CPU = torch.device("cpu")


def sampled(seeds, temperature=1.0, max_tokens=6, eos=0):
    return [RowRequest(PROMPT, max_tokens, temperature, 1.0, 0, seed, [eos]) for seed in seeds]


def perturbed(path, scale=0.5, seed=3):
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return model


def process_state():
    return (random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state().clone(), torch.get_num_threads(),
            torch.set_num_threads, gc.get_freeze_count())


def test_building_and_using_an_engine_leaves_the_process_state_alone(vllm_paths):
    """vLLM's worker seeds Python / NumPy / torch with 0, sets torch's threads, replaces
    ``torch.set_num_threads`` and freezes the garbage collector; none of it may reach the user."""
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = process_state()
    engine = VLLMEngine(vllm_paths["llama"], CPU, 0.3)
    engine.generate(sampled([1, 2]))
    engine.load_weights(perturbed(vllm_paths["llama"]).state_dict().items())
    engine.generate(sampled([None], temperature=0.0))
    engine.close()
    after = process_state()
    assert after[0] == before[0], "Python's random state changed"
    assert np.array_equal(after[1], before[1]), "NumPy's random state changed"
    assert torch.equal(after[2], before[2]), "torch's random state changed"
    assert after[3:] == before[3:], "torch threads, torch.set_num_threads or gc freeze changed"


def test_vllm_itself_resets_the_seed_so_the_guard_above_is_needed(vllm_paths, monkeypatch):
    """The control of the test above: a bare ``vllm.LLM`` in this process does reset torch's stream."""
    from vllm import LLM

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    torch.manual_seed(1)
    state = torch.random.get_rng_state().clone()
    llm = LLM(**engine_options(vllm_paths["llama"], CPU, 0.3))
    changed = not torch.equal(state, torch.random.get_rng_state())
    llm.llm_engine.engine_core.shutdown()
    del llm
    assert changed


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # dense nn.Linear, GPT-2's transposed Conv1D
def test_pushed_weights_read_back_tensor_for_tensor(vllm_paths, kind):
    engine = VLLMEngine(vllm_paths[kind], CPU, 0.3)
    model = perturbed(vllm_paths[kind])
    with pytest.raises(AssertionError):  # the files' weights, not yet the pushed ones
        assert_engine_holds(engine, kind, model.state_dict())
    engine.load_weights(model.state_dict().items())
    assert_engine_holds(engine, kind, model.state_dict())
    # and it samples from them: the engine's log-probs at T=1 (no top-k / top-p) are the model's own
    rows = engine.generate(sampled([7, 8, 9]))
    for row in rows:
        ids = torch.tensor([PROMPT + row.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].float(), -1)
        own = logprobs.gather(1, torch.tensor(row.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(row.logprobs), own, atol=1e-4, rtol=0.0)
    engine.close()


def test_a_push_naming_no_weight_of_the_model_fails_loudly(vllm_paths):
    engine = VLLMEngine(vllm_paths["llama"], CPU, 0.3)
    with pytest.raises(Exception, match="no module or parameter named 'nope'"):
        engine.load_weights([("nope.weight", torch.zeros(3))])
    engine.close()


def test_one_engine_closing_leaves_the_others_working(vllm_paths):
    """In-process engines share vLLM's distributed state; an engine's shutdown used to destroy it
    ("pipeline model parallel group is not initialized" in every other engine)."""
    import torch.distributed as dist

    first = VLLMEngine(vllm_paths["llama"], CPU, 0.3)
    second = VLLMEngine(vllm_paths["gpt2"], CPU, 0.3)
    expected = second.generate(sampled([4, 5]))
    first.close()
    del first
    gc.collect()
    assert [r.token_ids for r in second.generate(sampled([4, 5]))] == [r.token_ids for r in expected]
    model = perturbed(vllm_paths["gpt2"])
    second.load_weights(model.state_dict().items())
    assert_engine_holds(second, "gpt2", model.state_dict())
    third = VLLMEngine(vllm_paths["llama"], CPU, 0.3)  # a new engine beside a survivor
    assert len(third.generate(sampled([1]))[0].token_ids) > 0
    second.close()
    with pytest.raises(RuntimeError, match="this vLLM engine was closed"):
        second.generate(sampled([1]))
    assert len(third.generate(sampled([1]))[0].token_ids) > 0
    third.close()
    third.close()  # idempotent
    assert not dist.is_initialized()  # the last engine out tears vLLM's process group down


def test_engines_sit_on_their_agents_device(vllm_paths):
    """The CPU mode's options, a CUDA agent's device index handed to the executor, and the executor
    putting the worker there (vLLM's own read the index from a device without one: always cuda:0)."""
    from comlrl.rollout.vllm_worker import DeviceExecutor

    cpu = engine_options("m", CPU, 0.3)
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["enable_sleep_mode"]) == ("float32", True, False)
    assert "additional_config" not in cpu
    cuda = engine_options("m", torch.device("cuda", 1), 0.3)
    assert (cuda["dtype"], cuda["enable_sleep_mode"], cuda["additional_config"]) == ("bfloat16", True, {DEVICE_INDEX_KEY: 1})
    executor = DeviceExecutor.__new__(DeviceExecutor)
    for extra, rank in (({DEVICE_INDEX_KEY: 1}, 1), ({DEVICE_INDEX_KEY: 3}, 3), ({}, 0)):
        executor.vllm_config = SimpleNamespace(additional_config=extra, device_config=SimpleNamespace(device=torch.device("cuda")))
        assert executor._distributed_args()[2] == rank
    engine = VLLMEngine(vllm_paths["llama"], CPU, 0.3)
    assert not engine.can_sleep
    assert engine.llm.apply_model(lambda m: {p.device.type for p in m.parameters()})[0] == {"cpu"}
    engine.close()
    with pytest.raises(ValueError, match="runs on CUDA devices or the CPU; this agent is on meta"):
        VLLMEngine(vllm_paths["llama"], torch.device("meta"), 0.3)


def test_a_multiprocess_engine_syncs_weights(vllm_paths, monkeypatch):
    """``VLLM_ENABLE_V1_MULTIPROCESSING=1`` exported: the engine runs in its own process, pushes travel
    as one safetensors payload, and greedy decoding afterwards is the pushed model's."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    torch.manual_seed(1)
    state = torch.random.get_rng_state().clone()
    engine = VLLMEngine(vllm_paths["llama"], CPU, 0.3)
    assert not engine.in_process
    model = perturbed(vllm_paths["llama"], scale=2.0)
    with torch.no_grad():
        greedy = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=0, pad_token_id=0)
    want = greedy[0, len(PROMPT):].tolist()
    assert engine.generate(sampled([None], temperature=0.0))[0].token_ids != want  # the files' model differs
    engine.load_weights(model.state_dict().items())
    assert engine.generate(sampled([None], temperature=0.0))[0].token_ids == want
    engine.close()
    assert torch.equal(state, torch.random.get_rng_state())


def test_an_unreadable_multiprocessing_setting_is_refused_before_loading(monkeypatch):
    from tests.helpers.common import length_ratio

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "yes")
    with pytest.raises(ValueError, match=r"VLLM_ENABLE_V1_MULTIPROCESSING='yes': vLLM reads it as an integer"):
        MAGRPOTrainer(agent_model="/nonexistent/model", reward_func=length_ratio, args=MAGRPOConfig(num_turns=1, generation_backend="vllm"))


def test_an_engine_in_a_torchrun_job_leaves_the_jobs_process_group_alone(vllm_paths, tmp_path):
    """torch.distributed was initialised before the engine (a data-parallel job's group): the engine
    runs beside it and its shutdown leaves it working (vLLM's teardown would destroy it)."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers.common import REPO_ROOT
    from tests.parallel.test_data_parallel import free_port

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
               os.path.join(REPO_ROOT, "tests", "helpers", "vllm_dp_worker.py"), vllm_paths["llama"], str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["group_alive"] and r["all_reduce"] == 3.0 and len(r["tokens"]) == 4 for r in results), results
    assert results[0]["tokens"] == results[1]["tokens"]  # the same files, greedy
