"""Precision settings (issue 12): resolution and contradictions before loading, bf16 mixed precision
(float32 master weights and AdamW state, bfloat16 compute) on the CPU, pure bf16, 8-bit AdamW wiring."""

import sys
import types

import pytest
import torch
from tests.helpers.common import length_ratio, no_signal_expected
from tests.models.test_precision import bf16_dir, moved_fraction  # noqa: F401  (bf16_dir is a fixture)
from transformers import AutoModelForCausalLM

from comlrl.models.precision import Precision, resolve_precision
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

CPU = [torch.device("cpu")]


def test_precision_resolution():
    assert resolve_precision(None, {}, CPU) == Precision("fp32", torch.float32)  # the CPU default
    assert resolve_precision("BF16_mixed", {}, CPU).name == "bf16-mixed"
    mixed = resolve_precision("bf16-mixed", {"dtype": "float32"}, CPU)
    assert (mixed.weights, mixed.frozen, mixed.compute) == (torch.float32, torch.bfloat16, torch.bfloat16)
    pure = resolve_precision(None, {"torch_dtype": "bf16"}, CPU)  # CoMLRL 1.4.x's way: pure bf16
    assert (pure.name, pure.weights, pure.compute) == ("bf16", torch.bfloat16, None)
    assert resolve_precision("bf16", {"model_kwargs": {"dtype": "bfloat16"}}, CPU).name == "bf16"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("int8", {}, CPU)


@pytest.mark.parametrize(
    "precision, model_config, match",
    [
        ("bf16-mixed", {"dtype": "bfloat16"}, "keeps trainable weights in float32 .*precision='bf16' for bfloat16"),
        ("fp32", {"critic_model_kwargs": {"dtype": "float16"}}, r"model_config\['critic_model_kwargs'\]"),
        ("bf16", {"dtype": "float32"}, "precision='fp32' or 'bf16-mixed'"),
        ("fp32", {"dtype": "auto"}, "asks for 'auto'"),
    ],
)
def test_contradictions_are_refused_before_loading(precision, model_config, match):
    with pytest.raises(ValueError, match=match):
        MAGRPOTrainer(agent_model="/nonexistent/model", num_agents=2, reward_func=length_ratio, model_config=model_config,
                      args=MAGRPOConfig(num_turns=1, precision=precision))


def test_explicit_precision_refuses_a_model_object_of_another_dtype(tiny_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]).to(torch.bfloat16)
    with pytest.raises(ValueError, match="holds bfloat16 weights but precision='bf16-mixed' trains float32"):
        MAGRPOTrainer(agents=[model], tokenizer=tiny_paths["llama"], reward_func=lambda c: [0.0] * len(c),
                      args=MAGRPOConfig(num_turns=1, precision="bf16-mixed"))


def linear_output_dtypes(model):
    seen = []
    handles = [m.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
               for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return seen, handles


def test_bf16_mixed_keeps_float32_masters_and_computes_in_bfloat16(bf16_dir, prompts_dataset):  # noqa: F811
    trainer = MAGRPOTrainer(
        agent_model=bf16_dir, num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
        train_dataset=prompts_dataset.select(range(1)),
        args=MAGRPOConfig(num_turns=1, num_generations=4, max_new_tokens=6, num_train_epochs=1, verbose=False,
                          rollout_buffer_size=1, agent_learning_rate=5e-6, top_k=None, top_p=1.0, temperature=1.0,
                          precision="bf16-mixed", reference_kl_enabled=True),
    )
    agent = trainer.agents[0]
    assert trainer.args.precision == "bf16-mixed"
    assert {p.dtype for p in agent.parameters()} == {torch.float32}  # master weights
    assert {p.dtype for p in trainer.reference_models[0].parameters()} == {torch.bfloat16}  # frozen: no master copy
    before = [p.detach().clone() for p in agent.parameters()]
    seen, handles = linear_output_dtypes(agent)
    trainer.train()
    for handle in handles:
        handle.remove()
    assert seen and set(seen) == {torch.bfloat16}  # generation and scoring matmuls ran in bfloat16
    states = trainer.optimizers[0].state.values()
    assert {s["exp_avg"].dtype for s in states} == {torch.float32}
    # the same run in pure bf16 moves < 50 % of the weights (test_precision); float32 masters keep every update
    assert moved_fraction(before, agent) > 0.95
    ratio = trainer.log_history[-1]["agent_0/ratio"]
    assert abs(ratio - 1.0) < 0.05  # bf16 sampling and bf16 scoring agree closely on fresh rows


def test_fp32_default_on_cpu_runs_no_autocast(tiny_paths, prompts_dataset):
    trainer = MAGRPOTrainer(
        agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
        train_dataset=prompts_dataset.select(range(1)),
        args=MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False, rollout_buffer_size=1),
    )
    assert trainer.args.precision == "fp32"
    seen, handles = linear_output_dtypes(trainer.agents[0])
    trainer.train()
    assert set(seen) == {torch.float32}


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_bf16_mixed_actor_critic_value_heads_stay_float32(tiny_paths, prompts_dataset):
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
        train_dataset=prompts_dataset.select(range(2)),
        args=IACConfig(num_turns=1, num_agents=2, max_new_tokens=3, num_train_epochs=1, rollout_buffer_size=2, verbose=False,
                       precision="bf16-mixed"),
    )
    critic = trainer.critics[0]
    head_inputs = []
    hook = critic.value_head.value_projection.register_forward_hook(lambda m, i, o: head_inputs.append((i[0].dtype, o.dtype)))
    trainer.train()
    hook.remove()
    assert head_inputs and set(head_inputs) == {(torch.float32, torch.float32)}
    assert {p.dtype for p in critic.parameters()} == {torch.float32}


def test_adamw_8bit_needs_bitsandbytes(monkeypatch, tiny_paths):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[bnb\]'"):
        MAGRPOTrainer(agent_model="/nonexistent/model", reward_func=length_ratio, args=MAGRPOConfig(num_turns=1, optimizer="adamw_8bit"))


def test_adamw_8bit_is_built_from_bitsandbytes(monkeypatch, tiny_paths):
    """bitsandbytes' 8-bit kernels need CUDA, so this checks the wiring with a stand-in class: the
    optimizer comes from ``bnb.optim.AdamW8bit`` with the config's hyper-parameters, one group per
    parameter for the in-backward schedule, and it steps."""
    built = []

    class FakeAdamW8bit(torch.optim.AdamW):
        def __init__(self, groups, **hyper):
            built.append(hyper)
            super().__init__(groups, **hyper)

    fake = types.ModuleType("bitsandbytes")
    fake.optim = types.SimpleNamespace(AdamW8bit=FakeAdamW8bit)
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes" else real(name, *a))
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            args=MAGRPOConfig(num_turns=1, optimizer="adamw_8bit", agent_learning_rate=1e-3, weight_decay=0.0))
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, FakeAdamW8bit)
    assert built[0] == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    assert len(optimizer.param_groups) == len(list(trainer.agents[0].parameters()))


@pytest.mark.parametrize("kl", [False, True])
def test_precision_may_change_on_resume_where_the_stored_dtypes_agree(tiny_paths, prompts_dataset, tmp_path, kl):
    from comlrl.checkpoint.files import CheckpointError

    def make(precision):
        return MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [0.0] * len(c),
                             train_dataset=prompts_dataset, args=MAGRPOConfig(num_turns=1, precision=precision, reference_kl_enabled=kl))

    saved = make("fp32").save_checkpoint(str(tmp_path / "ckpt"))
    resumed = make("bf16-mixed")
    if not kl:  # float32 weights and AdamW state either way
        assert resumed.load_checkpoint(saved)["global_step"] == 0
    else:  # the bf16-mixed reference is stored in bfloat16: named and refused
        with pytest.raises(CheckpointError, match=r"reference_models\.0.*float32.*bfloat16"):
            resumed.load_checkpoint(saved)
