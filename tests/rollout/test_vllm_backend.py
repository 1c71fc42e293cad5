"""The vLLM rollout backend's contract with the trainer (issue 12), on the CPU with a scripted engine.

The engine stands in for a colocated ``vllm.LLM``: it holds its own copy of the weights (loaded from
the agent's files, then only what the generator pushes), samples each request with the request's own
seed and settings, and returns the sampling log-probs. The tests check that the engine always samples
from the trainer's current weights, that prompts, seeds and sampling settings arrive unchanged, that
the trainer uses the engine's log-probs, and that the engine sleeps while the trainer updates.
"""

import copy
import gc
import weakref

import pytest
import torch
from tests.helpers.common import PROMPTS, length_ratio
from tests.helpers.tolerances import logprob_bound, ratio_bound, scored_length
from peft import LoraConfig
from transformers import AutoModelForCausalLM, LogitsProcessorList

from comlrl.rollout import vllm_backend
from comlrl.rollout.batch import left_pad
from comlrl.rollout.generation import HFGenerator, SamplingParams
from comlrl.rollout.sampling import TokenSampler
from comlrl.rollout.vllm_backend import RowOutput, VLLMGenerator
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


class ScriptedEngine:
    """A rollout engine on its own copy of the model's weights (see the module docstring)."""

    can_sleep = True

    def __init__(self, model, logprob_offset=0.0):
        self.model = copy.deepcopy(model.shared.base if hasattr(model, "shared") else model).eval()
        if hasattr(model, "shared"):  # a LoRA agent: the engine loaded the base model's files, no adapter
            self.model = AutoModelForCausalLM.from_pretrained(model.shared.source).eval()
        self.live = model
        self.offset = logprob_offset
        self.requests, self.events, self.in_sync = [], [], []

    def load_weights(self, weights):
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                assert name in state, f"unknown weight {name}"
                state[name].copy_(tensor)
        self.events.append("load")

    def sleep(self):
        self.events.append("sleep")

    def wake_up(self):
        self.events.append("wake")

    def generate(self, requests):
        self.events.append("generate")
        self.requests.append(list(requests))
        self.in_sync.append(self._matches_live())
        first = requests[0]
        input_ids, mask = left_pad([torch.tensor(r.prompt_ids) for r in requests], 0)
        processors = []
        sampler = None
        if first.temperature > 0:
            sampler = TokenSampler(first.temperature, first.top_k or None, first.top_p, [r.seed for r in requests], first.max_tokens)
            processors.append(sampler)
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=first.max_tokens, do_sample=False,
                                      eos_token_id=first.stop_token_ids, pad_token_id=first.stop_token_ids[0],
                                      logits_processor=LogitsProcessorList(processors))
        new = out[:, input_ids.shape[1]:]
        table = sampler.logprobs() if sampler is not None else None
        outputs = []
        for row in range(new.shape[0]):
            ids = new[row].tolist()
            stops = [i for i, t in enumerate(ids) if t in first.stop_token_ids]
            ids = ids[: stops[0] + 1] if stops else ids
            logprobs = None if table is None else [float(v) + self.offset for v in table[row, : len(ids)]]
            outputs.append(RowOutput(ids, logprobs))
        return outputs

    def _matches_live(self):
        probe = torch.tensor([[5, 9, 17, 33]])
        with torch.no_grad():
            return torch.allclose(self.model(input_ids=probe).logits, self.live(input_ids=probe).logits, atol=1e-5)


@pytest.fixture
def engines(monkeypatch):
    made = []

    def factory(model, device, gpu_memory_utilization, offset=0.0):
        engine = ScriptedEngine(model, offset)
        engine.utilization = gpu_memory_utilization
        made.append(engine)
        return engine

    monkeypatch.setattr(vllm_backend, "ENGINE_FACTORY", factory)
    return made


def vllm_args(**overrides):
    base = dict(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=2,
                agent_learning_rate=1e-3, temperature=0.7, top_p=0.9, top_k=20, generation_backend="vllm",
                vllm_gpu_memory_utilization=0.25, logging_steps=1)
    return MAGRPOConfig(**{**base, **overrides})


def test_engine_samples_the_current_weights_with_the_trainers_settings(tiny_paths, prompts_dataset, engines):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=vllm_args())
    trainer.train()
    assert len(engines) == 2 and all(e.utilization == 0.25 for e in engines)
    for engine, policy in zip(engines, trainer.policies):
        assert len(engine.requests) == 2  # 4 prompts, 2 per step: one engine call per agent and step
        assert all(engine.in_sync)  # every generation saw the weights of every optimizer step so far
        # pushed before the first generation (the files may differ from the agent) and after each step
        assert engine.events == ["load", "generate", "sleep", "wake", "load", "generate", "sleep"]
        rows = [r for call in engine.requests for r in call]
        assert {(r.temperature, r.top_p, r.top_k, r.max_tokens) for r in rows} == {(0.7, 0.9, 20, 4)}
        assert len({r.seed for r in rows}) == len(rows)  # one seed per row
        hf = HFGenerator(policy.model, policy.tokenizer, policy.device)
        assert rows[0].prompt_ids == hf.encode(["Describe a city"])[0].tolist()  # the HF backend's prompt ids
        assert rows[0].stop_token_ids == [trainer.tokenizers[0].eos_token_id]


def test_trainer_records_its_own_logprobs_not_the_engines(tiny_paths, prompts_dataset, monkeypatch):
    """Engine log-probs shifted by -0.5 (as truncation and renormalisation shift vLLM's processed ones)
    never reach the update: the recorded log-probs are the trainer's own forward, so the fresh rows'
    mismatch is float noise and their ratio 1; the generator reports the engine's gap."""
    engines = []

    def factory(model, device, utilization):
        engines.append(ScriptedEngine(model, logprob_offset=-0.5))
        return engines[-1]

    monkeypatch.setattr(vllm_backend, "ENGINE_FACTORY", factory)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            train_dataset=prompts_dataset.select(range(2)), args=vllm_args(top_k=None, top_p=1.0))
    trainer.train()
    row = next(r for r in trainer.log_history if "agent_0/logprob_mismatch" in r)
    # recorded (the trainer's forward at sampling) and scored log-probs are two float32 forwards of the
    # same weights: at most 2 logprob_bound apart per token, so a ratio is within ratio_bound of 1; the
    # engine's copy is a third forward, shifted by the scripted 0.5
    length = scored_length(trainer.tokenizers[0], PROMPTS[:4], 4)
    noise = 2 * logprob_bound(trainer.agents[0], length, 0.7)
    assert row["agent_0/logprob_mismatch"] == pytest.approx(0.0, abs=noise)
    assert row["agent_0/ratio"] == pytest.approx(1.0, abs=ratio_bound(trainer.agents[0], length, 0.7))
    assert trainer.policies[0].generator.engine_gap == pytest.approx(0.5, abs=noise)


def test_explicit_seeds_and_greedy_requests(tiny_paths, engines):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [0.0] * len(c), args=vllm_args())
    generator = trainer.policies[0].generator
    assert isinstance(generator, VLLMGenerator)
    sampled = generator.generate(["Tell a joke", "Invent a fruit"], 2, SamplingParams(4, 0.7, 0.9, 20), seeds=[11, 12, 13, 14])
    assert [r.seed for r in engines[0].requests[-1]] == [11, 12, 13, 14]
    assert len(sampled.tokens) == 4 and all(len(lp) == len(t) for lp, t in zip(sampled.logprobs, sampled.tokens))
    # the same seeds give the same samples (each row's stream is its own)
    again = generator.generate(["Tell a joke", "Invent a fruit"], 2, SamplingParams(4, 0.7, 0.9, 20), seeds=[11, 12, 13, 14])
    assert all(torch.equal(a, b) for a, b in zip(sampled.tokens, again.tokens))
    greedy = generator.generate(["Tell a joke"], 1, SamplingParams(4, do_sample=False))
    assert engines[0].requests[-1][0].temperature == 0.0 and greedy.logprobs is None
    with pytest.raises(ValueError, match="does not forward train"):
        generator.generate(["Tell a joke"], 1, SamplingParams(4, extra={"repetition_penalty": 1.2}))


def test_lora_agents_push_the_base_with_their_layers_merged(tiny_paths, prompts_dataset, engines, monkeypatch):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=vllm_args(agent_learning_rate=2e-2), peft_config=config)
    pushed = []
    original = ScriptedEngine.load_weights

    def record(self, weights):
        weights = list(weights)
        pushed.append(sorted(name for name, _ in weights))
        original(self, weights)

    monkeypatch.setattr(ScriptedEngine, "load_weights", record)
    trainer.train()
    # the whole model by the base's own names (vLLM reloads whole layers), no adapter tensor
    assert pushed[0] == sorted(AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]).state_dict())
    assert all(all(e.in_sync) for e in engines)  # base + merged layers sample exactly like the adapter


def test_the_real_engine_needs_vllm():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[vllm\]'"):
        MAGRPOTrainer(agent_model="/nonexistent/model", reward_func=length_ratio, args=MAGRPOConfig(num_turns=1, generation_backend="vllm"))


def test_vllm_with_fsdp_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"generation_backend='vllm' keeps a full copy .* fsdp=True"):
        MAGRPOConfig(num_turns=1, generation_backend="vllm", fsdp=True)


def test_a_dropped_trainer_frees_its_engines_at_once(tiny_paths, prompts_dataset, monkeypatch):
    """The agent owns its generator, which reaches the agent back only weakly: without a cycle, ``del
    trainer`` shuts the engines (on a GPU, their memory) down by reference counting, collector off."""
    engines = []

    def factory(model, device, gpu_memory_utilization, offset=0.0):
        engine = ScriptedEngine(model, offset)
        engines.append(weakref.ref(engine))
        return engine

    monkeypatch.setattr(vllm_backend, "ENGINE_FACTORY", factory)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=vllm_args())
    trainer.train()
    assert len(engines) == 2 and all(ref() is not None for ref in engines)
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert all(ref() is None for ref in engines)
    finally:
        gc.enable()
