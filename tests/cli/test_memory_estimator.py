"""The peak-memory estimator (issue 12): exact parameter counts, the activation table against what
autograd really saves, hand-worked resident memory, the CLI, and a measured run within 15 %."""

import importlib.util
import os

import pytest
from tests.helpers.common import REPO_ROOT
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, Qwen2Config, Qwen3Config
from transformers import AutoModelForCausalLM

from comlrl.cli.main import main
from comlrl.trainers.actor_critic import MAACConfig
from comlrl.trainers.reinforce import MAGRPOConfig
from comlrl.cli.memory import Entity, ModelShape, RunShape, estimate_memory, run_shape, with_settings
from comlrl.cli.published import PUBLISHED_MODELS, PUBLISHED_RUNS, published_table

QWEN = {"qwen2.5-1.5b": Qwen2Config, "qwen3-1.7b": Qwen3Config}


def config_of(shape: ModelShape, cls):
    return cls(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
               num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
               head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings)


def count(config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


@pytest.mark.parametrize("name", sorted(QWEN))
def test_parameter_counts_of_published_shapes_are_exact(name):
    shape = PUBLISHED_MODELS[name]
    assert shape.parameters == count(config_of(shape, QWEN[name]))
    assert ModelShape.from_config(config_of(shape, QWEN[name])) .parameters == shape.parameters


def test_parameter_counts_from_configs_on_disk(tiny_paths):
    from transformers import AutoConfig

    for path in tiny_paths.values():
        config = AutoConfig.from_pretrained(path)
        assert ModelShape.from_config(config).parameters == count(config), path
    untied = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=False)
    assert ModelShape.from_config(untied).parameters == count(untied)


def test_lora_parameter_count_matches_peft():
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)
    model = get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=4, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert ModelShape.from_config(config).lora_parameters(4, ["all-linear"]) == trainable


def saved_bytes_per_token_layer(make_config, autocast: bool) -> float:
    """Bytes autograd saves per token and layer (difference of a 2- and a 1-layer model, weight casts excluded)."""
    def saved(layers):
        config = make_config(layers)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        params = {p.data_ptr() for p in model.parameters()}
        shapes = {tuple(p.shape) for p in model.parameters()}
        seen, total = set(), [0]

        def pack(t):
            key = (t.data_ptr(), t.numel(), t.dtype)
            weight_cast = t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
            if t.data_ptr() not in params and key not in seen and not weight_cast:
                seen.add(key)
                total[0] += t.numel() * t.element_size()
            return t

        ids = torch.randint(0, config.vocab_size, (2, 64))
        mask = torch.ones_like(ids)
        mask[0, :5] = 0  # a padded batch, as the trainers score
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
            model.model(input_ids=ids, attention_mask=mask, use_cache=False)
        return total[0]

    return (saved(2) - saved(1)) / (2 * 64)


@pytest.mark.parametrize("cls", [LlamaConfig, Qwen3Config])
@pytest.mark.parametrize("mode", ["fp32", "bf16-mixed"])
def test_activation_table_matches_what_autograd_saves(cls, mode):
    """The per-token, per-layer table is what transformers' decoder layers really keep for backward."""
    def make(layers):
        return cls(vocab_size=500, hidden_size=256, intermediate_size=768, num_hidden_layers=layers, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)

    measured = saved_bytes_per_token_layer(make, autocast=mode == "bf16-mixed")
    predicted = ModelShape.from_config(make(1)).activation_bytes_per_token(mode, "cpu", 64)
    assert predicted == pytest.approx(measured, rel=0.10), (measured, predicted)


def tiny_shape():
    return ModelShape("m", vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16)


def test_resident_memory_by_hand():
    shape = tiny_shape()
    p = shape.parameters  # 1000*64 embedding (tied) + 2 * (4*64*64 + 3*64*128 + 2*64) + 64 = 164_160
    assert p == 64_000 + 2 * (16_384 + 24_576 + 128) + 64
    agents = [Entity(shape, "m"), Entity(shape, "m")]
    fp32 = estimate_memory(RunShape(agents, precision="fp32", reference_kl=True))
    assert fp32.resident["agents: weights"] == 2 * p * 4
    assert fp32.resident["optimizer state"] == 2 * p * 8  # two float32 moments per parameter
    assert fp32.resident["references (frozen)"] == p * 4  # one reference per distinct source
    mixed = estimate_memory(RunShape(agents, precision="bf16-mixed", reference_kl=True))
    assert mixed.resident["references (frozen)"] == p * 2 and mixed.resident["agents: weights"] == 2 * p * 4
    assert mixed.update["autocast weight copy (update)"] == 2 * p
    pure = estimate_memory(RunShape(agents, precision="bf16", optimizer_in_backward=False))
    assert (pure.resident["agents: weights"], pure.resident["optimizer state"]) == (2 * p * 2, 2 * p * 4)
    assert pure.update["gradients"] == p * 2  # one model's full set at a time: its step frees them
    assert mixed.update["gradients"] == 4 * 1000 * 64  # inside backward: the largest tensor's (the embedding)
    eight_bit = estimate_memory(RunShape(agents, precision="bf16-mixed", optimizer="adamw_8bit"))
    assert eight_bit.resident["optimizer state"] == int(2 * p * (2 + 8 / 256))
    lora = estimate_memory(with_settings(RunShape(agents, precision="bf16-mixed", reference_kl=True), lora_rank=4))
    assert lora.resident["LoRA bases (frozen, shared)"] == p * 2  # one bfloat16 base for both agents
    assert lora.resident["references (frozen)"] == 0  # the base with adapters disabled
    adapter = shape.lora_parameters(4, ["all-linear"])
    assert lora.resident["optimizer state"] == 2 * adapter * 8


def test_checkpointing_and_lora_shrink_the_published_runs():
    for run in PUBLISHED_RUNS:
        from comlrl.cli.published import published_estimate

        mixed = published_estimate(run, "bf16-mixed", False, 0)
        checkpointed = published_estimate(run, "bf16-mixed", True, 0)
        lora = published_estimate(run, "bf16-mixed", True, 16)
        def activations(estimate):
            return sum(v for k, v in estimate.update.items() if k.endswith("activations"))

        assert activations(checkpointed) < 0.25 * activations(mixed), run.name
        assert lora.peak < 0.5 * run.reported_gb * 1e9 < mixed.peak
    table = published_table()
    assert table.count("\n") == len(PUBLISHED_RUNS) + 1 and "45 GB" in table


def test_run_shape_follows_the_trainer_batching():
    shape = PUBLISHED_MODELS["qwen3-1.7b"]
    magrpo = run_shape("magrpo", [shape, shape], MAGRPOConfig(num_turns=2, rollout_buffer_size=10, train_batch_size=3,
                                                               external_prompt_passthrough=True))
    # 1 + 4 nodes per tree -> 2 items per step; the widest level holds 2 x 4 nodes; 3 groups x K rows per step
    assert (magrpo.items_per_generate, magrpo.rows_per_update) == (8, 12)
    maac = run_shape("maac", [shape, shape], MAACConfig(num_turns=1, num_generations=2, rollout_buffer_size=4), critic_shapes=[shape],
                     prompt_tokens=100)
    assert (maac.items_per_generate, maac.rows_per_update, maac.critic_input_tokens) == (2, 4, 200)


def test_estimate_command(capsys, tiny_paths):
    assert main(["estimate", "--published"]) == 0
    assert "HouseBuild" in capsys.readouterr().out
    assert main(["estimate", "--model", tiny_paths["llama"], "--device", "cpu", "--set", "gradient_checkpointing=true",
                 "--algorithm", "maac", "--set", "num_generations=2"]) == 0
    out = capsys.readouterr().out
    assert "predicted peak" in out and "critics: weights" in out
    assert main(["estimate", "--model", tiny_paths["llama"], "--set", "num_generation=2"]) == 2
    assert "did you mean 'num_generations'" in capsys.readouterr().err


def test_estimate_of_a_train_config_is_the_run_that_config_starts(capsys, tiny_paths):
    """``comlrl estimate --config`` estimates exactly the trainer config ``comlrl train`` would build."""
    from comlrl.runplan.plan import plan_from_args
    from comlrl.cli.memory import estimate_from_config, published_key

    llama = tiny_paths["llama"]
    overrides = [f"agent_model.name={llama}", f"critic_model.name={llama}", "maac.num_generations=3", "maac.gradient_checkpointing=true"]
    assert main(["estimate", "--config", "maac_tldr_config.yaml", "--device", "cpu", "--override", *overrides]) == 0
    printed = capsys.readouterr().out
    plan = plan_from_args("maac_tldr_config.yaml", overrides)
    assert plan.config.num_generations == 3 and plan.config.gradient_checkpointing
    expected = estimate_from_config("maac", [llama, llama], plan.config, critics=[llama], device="cpu").table()
    assert printed.strip() == expected.strip()
    # the bundled configs' hub ids of the published models resolve offline to their shapes
    assert published_key("Qwen/Qwen3-4B-Instruct-2507") == "qwen3-4b" and published_key("Qwen/Qwen2.5-1.5B-Instruct") == "qwen2.5-1.5b"
    assert published_key("Qwen/Qwen3-8B") is None
    assert main(["estimate", "--config", "magrpo_tldr_config.yaml"]) == 0 and "predicted peak" in capsys.readouterr().out
    # flags that the config already answers, and algorithms the estimator does not model, are refused
    assert main(["estimate", "--config", "magrpo_tldr_config.yaml", "--model", llama]) == 2
    assert "--model cannot be combined with --config" in capsys.readouterr().err
    assert main(["estimate", "--config", "madpo_iter_che_config.yaml"]) == 2
    assert "madpo_iter is not modelled yet" in capsys.readouterr().err
    assert main(["estimate", "--model", llama, "--override", "magrpo.num_generations=2"]) == 2
    assert "--override changes a --config" in capsys.readouterr().err


def build_bench_tiny_llama(root: str) -> str:
    """The benchmarks' tiny-llama shape (hidden 64, 2 layers, SmolLM2's 49,152-row vocabulary), random
    weights, with a small BPE tokenizer (ids it lacks decode to nothing), saved as ``root/tiny-llama``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers.tiny_models import make_tokenizer, save

    tokenizer = make_tokenizer(300, "<eos>", "<pad>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return save(LlamaForCausalLM(config).float(), tokenizer, os.path.join(root, "tiny-llama"))


@pytest.mark.slow
def test_estimate_is_within_15_percent_of_a_measured_run(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "estimator_check", os.path.join(REPO_ROOT, "bench", "gpu", "estimator_check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    build_bench_tiny_llama(str(tmp_path))
    result = check.run_case("tiny MAGRPO fp32", str(tmp_path), 32)
    assert abs(result["error"]) < 0.15, result
