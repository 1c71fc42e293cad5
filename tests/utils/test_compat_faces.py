"""The helpers of CoMLRL 1.4.x's public ``comlrl.utils`` / ``comlrl.schedulers`` faces."""

import copy
import functools

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.tolerances import k3_noise, logprob_bound, rounding_bound

from comlrl.schedulers import DeviceScheduler, normalize_parallel_training
from comlrl.trainers.reinforce import MAGRPOConfig
from comlrl.utils import (
    apply_tokenizer_specials,
    build_formatters,
    clone_reference_models,
    local_context,
    normalize_reward_lengths,
    reference_kl_for_sequence,
    resolve_reference_devices,
    resolve_reward_range,
    set_reward_range,
    unwrap_model,
    validate_reference_kl_config,
)
from comlrl.utils.wandb_utils import verbose_from_wandb_config, wandb_init_kwargs


def test_reference_kl_for_sequence_zero_for_identical_and_positive_after_a_change(tiny_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    reference = clone_reference_models([model], devices=[torch.device("cpu")])[0]
    assert all(not p.requires_grad for p in reference.parameters())
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    assert float(reference_kl_for_sequence(model, reference, ids, mask, prompt_len=3, response_len=3)) == 0.0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # the k3 sum over the 3 response tokens (positions 2..4 predict tokens 8, 9, 10), from plain forwards
    with torch.no_grad():
        pol = torch.log_softmax(model(input_ids=ids).logits[0, 2:5].float(), -1).gather(-1, ids[0, 3:6, None])[:, 0]
        ref = torch.log_softmax(reference(input_ids=ids).logits[0, 2:5].float(), -1).gather(-1, ids[0, 3:6, None])[:, 0]
    d = ref - pol
    expected = float((torch.expm1(d) - d).sum())
    assert expected > 1e-4  # the perturbation really changed the distribution
    got = float(reference_kl_for_sequence(model, reference, ids, mask, prompt_len=3, response_len=3))
    # the face's forwards and these are float32 computations of the same log-probs: d moves by at most
    # delta = 2 (logprob_bound of each model), so each token's k3 = expm1(d) - d by |expm1(d)| delta + its rounding
    delta = 2 * (logprob_bound(model, 6) + logprob_bound(reference, 6))
    tol = float(torch.expm1(d).abs().sum()) * delta + k3_noise(delta, 3) + rounding_bound(3, expected)
    assert got == pytest.approx(expected, rel=0, abs=tol)


def test_reward_range_helpers():
    def reward(c1, c2):
        return [0.0] * len(c1)

    assert resolve_reward_range(reward) is None
    set_reward_range(reward, 0, 3)
    assert resolve_reward_range(reward) == (0.0, 3.0)
    assert resolve_reward_range(functools.partial(reward)) == (0.0, 3.0)
    with pytest.raises(ValueError, match="min < max"):
        set_reward_range(reward, 2, 1)


def test_normalize_reward_lengths():
    assert normalize_reward_lengths([1.0], num_agents=2, num_generations=4, algorithm="IAC") == [1.0]
    assert normalize_reward_lengths([1.0, 2.0], num_agents=2, num_generations=4, algorithm="IAC") == [1.0, 2.0]
    with pytest.raises(ValueError, match="got 3"):
        normalize_reward_lengths([1.0, 2.0, 3.0], num_agents=2, num_generations=4, algorithm="MAAC")


def test_reference_kl_config_helpers():
    with pytest.raises(ValueError, match="reference_kl_coef must be >= 0"):
        MAGRPOConfig(reference_kl_coef=-1.0)
    args = MAGRPOConfig(reference_kl_enabled=True, reference_devices=["cpu", "cpu", "cpu"])
    with pytest.raises(ValueError, match=r"reference_devices length \(3\) must be 1 or 2"):
        validate_reference_kl_config(args, 2)
    devices = resolve_reference_devices(MAGRPOConfig(reference_kl_enabled=True), [torch.device("cpu")] * 2, 2)
    assert devices == [torch.device("cpu")] * 2


def test_device_scheduler_and_parallel_mode():
    assert normalize_parallel_training(" MP ") == "mp" and normalize_parallel_training(None) == "none"
    with pytest.raises(ValueError, match="parallel_training only supports: none, mp"):
        normalize_parallel_training("auto")
    assert DeviceScheduler.resolve_devices("cpu", 3) == [torch.device("cpu")] * 3
    agents, critics = DeviceScheduler.assign_devices(2, "cpu", None, use_separate_critic=True)
    assert critics == agents
    assert DeviceScheduler.assign_shared_critic_device(agents, None) == torch.device("cpu")
    with pytest.raises(ValueError, match="agent_devices"):
        MAGRPOConfig(parallel_training="mp")


def test_apply_tokenizer_specials_writes_ids_into_configs(tiny_paths):
    tok = AutoTokenizer.from_pretrained(tiny_paths["gpt2"])
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    model.config.pad_token_id = None
    apply_tokenizer_specials(tok, [model])
    assert model.config.pad_token_id == tok.pad_token_id and model.config.eos_token_id == tok.eos_token_id


def test_wandb_init_kwargs_keeps_every_section_and_verbose():
    run_config = {"algorithm": "MAGRPO"}
    config = {"project": "p", "entity": "e", "run_name": "r", "tags": ["a"],
              "config_sections": {"dataset": {"name": "tldr", "type": "writing"}, "output": {"verbose": False}, "extra": {"x": 1}}}
    kwargs = wandb_init_kwargs(config, run_config)
    assert kwargs["project"] == "p" and kwargs["name"] == "r" and kwargs["tags"] == ["a"]
    assert kwargs["config"] is run_config and run_config["extra"] == {"x": 1} and run_config["dataset_name"] == "tldr"
    assert verbose_from_wandb_config(config) is False and verbose_from_wandb_config(None) is True


def test_local_context_and_unwrap():
    context = local_context()
    assert context.is_main and context.device == torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    assert unwrap_model(torch.nn.DataParallel(model)) is model and unwrap_model(model) is model


def test_build_formatters_default_and_external_prompts():
    formatters = build_formatters(None, 2)
    assert formatters[0]({"prompt": "x"}) == "x" and formatters[1]({"prompt": "x"}, external_prompts="y") == "y"

    def with_external(item, external_prompts=None):
        return f"{item['prompt']}|{external_prompts}"

    strict = build_formatters(with_external, 1, pass_none_external_prompts=False)
    assert strict[0]({"prompt": "x"}) == "x|None" and strict[0]({"prompt": "x"}, "e") == "x|e"
    assert copy.copy(strict[0]).original is with_external


def test_wandb_run_config_drops_credentials_but_keeps_token_counts():
    from comlrl.utils.wandb_utils import wandb_init_kwargs

    run_config = {}
    sections = {"magrpo": {"max_new_tokens": 64, "api_key": "sk-live", "tokenizer": "t"},
                "output": {"hf_token": "hf_x", "pad_token": "<pad>"}}
    wandb_init_kwargs({"project": "p", "config_sections": sections}, run_config)
    assert run_config["magrpo"] == {"max_new_tokens": 64, "tokenizer": "t"}
    assert run_config["output"] == {"pad_token": "<pad>"}
    assert "sk-live" not in repr(run_config) and "hf_x" not in repr(run_config)
