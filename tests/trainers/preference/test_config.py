"""Preference configs: CoMLRL 1.4.3 defaults, aliases and every validation rule (before any model loads)."""

import pytest

from comlrl.trainers.preference import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
from comlrl.checkpoint.state import config_record


def test_defaults():
    c = MADPOConfig()
    assert (c.num_train_epochs, c.agent_learning_rate, c.logging_steps, c.num_agents) == (20, 5e-6, 50, 2)
    assert (c.max_new_tokens, c.temperature, c.top_p, c.top_k, c.num_turns) == (256, 0.6, 0.6, 50, 1)
    assert (c.eval_interval, c.eval_num_samples, c.eval_batch_size, c.rollout_buffer_size, c.train_batch_size) == (16, 4, 1, 2, 2)
    assert (c.preference_num_candidates, c.preference_pairs_per_sample, c.pair_selection, c.dpo_beta) == (80, 16, "reward_gap", 0.1)
    assert (c.use_environment_step, c.environment_steps_per_pair, c.collaboration_mode, c.early_termination_threshold) == (True, 2, "decentralized", None)
    m = MARLHFConfig()
    assert (m.rl_algorithm, m.num_generations, m.reward_model_device, m.reward_learning_rate) == ("magrpo", 4, "cuda:0", 1e-5)
    assert (m.reward_num_train_epochs, m.reward_train_batch_size, m.reward_max_length, m.reward_freeze_backbone) == (1, 1, None, False)
    assert (m.critic_type, m.value_loss_coef, m.value_clip_range, m.use_separate_critic) == ("v", 0.6, 0.2, True)
    i = MADPOIterConfig()
    assert (i.num_iterations, i.num_train_epochs, i.preference_num_candidates, i.preference_pairs_per_sample, i.pair_selection) == (6, 1, 20, 4, "comparator_reward")
    assert (i.comparator_policy, i.comparator_generation_mode, i.preference_replay_mode, i.comparator_api_timeout) == ("current", "decentralized", "current", 120.0)
    j = MARLHFIterConfig()
    assert (j.num_train_epochs, j.reward_num_train_epochs, j.preference_scoring_reward) == (2, 2, "task")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(collaboration_mode="solo"), "collaboration_mode"),
        (dict(num_turns=2), "num_turns=1"),
        (dict(preference_num_candidates=1), "preference_num_candidates"),
        (dict(preference_pairs_per_sample=0), "preference_pairs_per_sample"),
        (dict(dpo_beta=0), "dpo_beta"),
        (dict(environment_steps_per_pair=0), "environment_steps_per_pair"),
        (dict(pair_selection="best"), "pair_selection"),
        (dict(pair_selection="all"), "preference_pairs_per_sample must be None"),
        (dict(pair_selection="comparator_reward"), "pair_selection"),
        (dict(joint_mode="cross"), "joint_mode"),
        (dict(parallel_training="mp"), "agent_devices"),
        (dict(reference_kl_coef=-1.0), "reference_kl_coef"),
        (dict(train_batch_size=0), "train_batch_size"),
        (dict(eval_interval=-1), "eval_interval"),
    ],
)
def test_madpo_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MADPOConfig(**kwargs)


def test_madpo_normalisation():
    c = MADPOConfig(pair_selection=" Random ", collaboration_mode="Centralized", joint_mode="align", parallel_training="null")
    assert (c.pair_selection, c.collaboration_mode, c.joint_mode, c.parallel_training) == ("random", "centralized", "aligned", "none")
    assert MADPOConfig(pair_selection=None).pair_selection == "reward_gap"
    assert MADPOConfig(pair_selection="all", preference_pairs_per_sample=None).preference_pairs_per_sample is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rl_algorithm="ppo"), "rl_algorithm"),
        (dict(num_generations=1), "num_generations must be >= 2"),
        (dict(rl_algorithm="iac", num_generations=0), "num_generations must be >= 1"),
        (dict(reward_learning_rate=0), "reward_learning_rate"),
        (dict(reward_num_train_epochs=0), "reward_num_train_epochs"),
        (dict(reward_train_batch_size=0), "reward_train_batch_size"),
        (dict(reward_max_length=0), "reward_max_length"),
        (dict(reward_model_device="gpu please"), "reward_model_device"),
        (dict(critic_learning_rate=0), "critic_learning_rate"),
        (dict(critic_type="z"), "critic_type"),
        (dict(value_loss_coef=0), "value_loss_coef"),
        (dict(value_clip_range=0), "value_clip_range"),
        (dict(advantage_mode="max"), "conflicts with rl_algorithm"),
        (dict(reward_model_name=""), "reward_model_name"),
    ],
)
def test_marlhf_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MARLHFConfig(**kwargs)


def test_marlhf_algorithm_sets_the_baseline():
    assert MARLHFConfig(rl_algorithm="mareforce").rl_algorithm == "mareinforce"
    for algorithm, mode in (("magrpo", "mean"), ("mareinforce", "raw"), ("maremax", "max"), ("marloo", "rloo")):
        assert MARLHFConfig(rl_algorithm=algorithm).advantage_mode == mode
    assert MARLHFConfig(rl_algorithm="maremax", advantage_mode="max").advantage_mode == "max"
    assert MARLHFConfig(rl_algorithm="MAAC", num_generations=1).uses_actor_critic
    assert MARLHFConfig(reward_model_device=None).reward_model_device is None


def test_iterative_aliases():
    assert MADPOIterConfig(comparator_policy="self").comparator_policy == "current"
    assert MADPOIterConfig(comparator_policy="online_copy").comparator_policy == "current_copy"
    assert MADPOIterConfig(comparator_policy="ref", comparator_model_name="m").comparator_policy == "model"
    c = MADPOIterConfig(comparator_policy="previous_iteration")
    assert (c.comparator_policy, c.comparator_history_k) == ("history", 1)
    assert MADPOIterConfig(comparator_policy="http", comparator_api_url="http://x").comparator_policy == "api"
    assert MADPOIterConfig(comparator_generation_mode="single-agent").comparator_generation_mode == "centralized"
    assert MADPOIterConfig(preference_replay_mode="td-lambda", preference_replay_lambda=0.5).preference_replay_mode == "lambda_decay"
    assert MADPOIterConfig(preference_replay_mode="last_k", preference_replay_k=2).preference_replay_mode == "nearest_k"
    assert MADPOIterConfig(comparator_api_format="chat").comparator_api_format == "openai"
    assert MARLHFIterConfig(preference_scoring_reward="learned").preference_scoring_reward == "reward_model"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_iterations=0), "num_iterations"),
        (dict(preference_replay_mode="forever"), "preference_replay_mode"),
        (dict(preference_replay_k=2), "only valid when"),
        (dict(preference_replay_lambda=0.5), "only valid when"),
        (dict(preference_replay_sample_size=3), "only valid when"),
        (dict(preference_replay_mode="nearest_k"), "is required when"),
        (dict(preference_replay_mode="lambda_decay"), "is required when"),
        (dict(preference_replay_mode="lambda_decay", preference_replay_lambda=1.5), "preference_replay_lambda"),
        (dict(preference_replay_mode="all_history", preference_replay_k=1), "only valid when"),
        (dict(comparator_policy="model"), "comparator_model_name"),
        (dict(comparator_model_name="m"), "only used by comparator_policy='model'"),
        (dict(comparator_history_k=2), "only valid when"),
        (dict(comparator_policy="history", comparator_history_k=0), "comparator_history_k"),
        (dict(comparator_policy="api"), "comparator_api_url"),
        (dict(comparator_api_format="opanai"), "comparator_api_format"),
        (dict(comparator_generation_mode="centralized", comparator_centralized_agent_index=2), "comparator_centralized_agent_index"),
        (dict(comparator_num_candidates=0), "comparator_num_candidates"),
        (dict(collaboration_mode="centralized", comparator_centralized_agent_index=1), "actor index 0"),
        (dict(comparator_policy="model", comparator_agents="one"), "comparator_agents"),
    ],
)
def test_iterative_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MADPOIterConfig(**kwargs)


def test_centralized_team_forces_a_centralized_comparator():
    c = MADPOIterConfig(collaboration_mode="centralized", num_agents=3)
    assert c.comparator_generation_mode == "centralized"


def test_api_key_never_reaches_records_or_repr():
    c = MARLHFIterConfig(comparator_policy="api", comparator_api_url="http://127.0.0.1:1", comparator_api_key="sk-secret-123")
    assert "sk-secret-123" not in repr(c)
    assert "comparator_api_key" not in c.to_dict()
    assert "sk-secret-123" not in str(config_record(c))


@pytest.mark.parametrize("cls", [MADPOIterConfig, MARLHFIterConfig])
def test_repr_masks_credentials_in_headers_and_url(cls):
    """A key pasted into a header or the URL (not only comparator_api_key) stays out of the repr,
    while the rest of the repr still shows what was configured."""
    c = cls(comparator_policy="api", comparator_api_url="https://user:pw-98765@api.example/v1?key=qk-24680&model=m",
            comparator_api_headers={"Authorization": "Bearer hd-13579", "X-Api-Key": "xk-11223", "Accept": "application/json"})
    text = repr(c)
    for secret in ("pw-98765", "qk-24680", "hd-13579", "xk-11223"):
        assert secret not in text
    assert text.startswith(f"{cls.__name__}(")
    assert "api.example/v1" in text and "model=m" in text and "'Accept': 'application/json'" in text
    assert "comparator_policy='api'" in text and "num_iterations=" in text
    assert c.comparator_api_headers["Authorization"] == "Bearer hd-13579"  # the config itself keeps the value it sends


def test_public_names():
    import comlrl.trainers as trainers
    import comlrl.trainers.preference as preference

    assert set(preference.__all__) == {
        "MADPOConfig", "MADPOTrainer", "CentralizedComparatorAdapter", "CentralizedComparatorParseError",
        "TaggedCentralizedComparatorAdapter", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFConfig", "MARLHFTrainer",
        "MARLHFIterConfig", "MARLHFIterTrainer", "JointRewardModel",
    }
    for name in ("MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel"):
        assert getattr(trainers, name) is getattr(preference, name)
    assert not hasattr(trainers, "MADPOIterTrainer")
    from comlrl.trainers.preference import centralized, checkpointing, collaboration, iterative, madpo, marlhf  # noqa: F401
    from comlrl.trainers.trainer import Trainer

    assert madpo.PreferencePair and madpo.AgentPreferenceTensors and collaboration.CentralizedCollaboration
    # composed, not a tower (docs/differences.md): the iterative trainers extend their base trainer only
    assert [c.__name__ for c in preference.MARLHFIterTrainer.__mro__] == ["MARLHFIterTrainer", "MARLHFTrainer", "Trainer", "object"]
    assert [c.__name__ for c in preference.MADPOIterTrainer.__mro__] == ["MADPOIterTrainer", "MADPOTrainer", "Trainer", "object"]
    assert issubclass(preference.MADPOTrainer, Trainer) and issubclass(preference.MARLHFTrainer, Trainer)
    assert [c.algorithm_name for c in (preference.MADPOTrainer, preference.MARLHFTrainer, preference.MADPOIterTrainer, preference.MARLHFIterTrainer)] == [
        "MADPO", "MARLHF", "MADPOIter", "MARLHFIter"]
    assert issubclass(preference.MARLHFConfig, preference.MADPOConfig) and issubclass(preference.MARLHFIterConfig, preference.MARLHFConfig)


@pytest.mark.parametrize("name", ["MADPO", "MARLHF", "MADPOIter", "MARLHFIter"])
def test_torchrun_is_refused_before_any_model_loads(name, tiny_paths, prompts_dataset, monkeypatch):
    import transformers

    import comlrl.trainers.preference as preference
    from comlrl.parallel.data_parallel import DataParallel

    monkeypatch.setattr(DataParallel, "current", classmethod(lambda cls: cls(0, 2, 0, "gloo")))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("a model was loaded before the refusal"))
    trainer_cls, config_cls = getattr(preference, f"{name}Trainer"), getattr(preference, f"{name}Config")
    with pytest.raises(ValueError, match=rf"{name}Trainer does not run under torchrun yet .*rank 0 of 2.*parallel_training='mp'"):
        trainer_cls(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [0.0] * len(a),
                    train_dataset=prompts_dataset, args=config_cls(reward_model_device=None) if "RLHF" in name else config_cls())
