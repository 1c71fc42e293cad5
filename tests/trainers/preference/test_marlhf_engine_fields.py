"""MARLHF's actor-critic engine takes its settings from the whole MARLHFConfig by field name: every
field either reaches the engine with its value, is set by the trainer for a stated reason, or is
preference-only. Fields the chosen backend never reads are refused when set explicitly."""


import pytest

from comlrl.trainers.actor_critic import IACConfig, MAACConfig
from comlrl.trainers.preference import MARLHFConfig
from comlrl.trainers.preference.config import IAC_BACKEND_FIELDS
from comlrl.trainers.preference.marlhf import ENGINE_SET_FIELDS, PREFERENCE_ONLY_FIELDS, actor_critic_config, engine_fields

# settings of round 2 that the hand-kept list used to drop, with non-default values
ROUND_TWO = dict(precision="bf16-mixed", gradient_checkpointing=True, optimizer="adamw_8bit", generation_backend="vllm",
                 vllm_gpu_memory_utilization=0.45, reference_kl_mode="reward", update_micro_batch_size=3,
                 loss_type="dapo", epsilon_high=0.28)  # the policy loss is every backend's (issue 28)


@pytest.mark.parametrize("algorithm,engine_cls", [("iac", IACConfig), ("maac", MAACConfig)])
def test_every_field_reaches_the_engine_or_is_accounted_for(algorithm, engine_cls):
    names = set(MARLHFConfig.field_names())
    passed = set(engine_fields(engine_cls))
    not_read = set(IAC_BACKEND_FIELDS) if algorithm == "maac" else set()
    assert passed | ENGINE_SET_FIELDS | PREFERENCE_ONLY_FIELDS | not_read == names
    assert not passed & PREFERENCE_ONLY_FIELDS and not ENGINE_SET_FIELDS - set(engine_cls.field_names())

    args = MARLHFConfig(rl_algorithm=algorithm, num_agents=2, critic_learning_rate=3e-4, max_new_tokens=7, **ROUND_TWO)
    record, engine_args = actor_critic_config(args, 2, args.precision)
    assert record.config_class() is engine_cls and type(engine_args) is engine_cls
    for name in passed:
        assert getattr(engine_args, name) == getattr(args, name), name
    for name, value in ROUND_TWO.items():
        assert getattr(engine_args, name) == value, name
    assert engine_args.critic_learning_rate == 3e-4 and engine_args.num_agents == 2
    assert engine_args.output_dir is None and engine_args.verbose is False  # the trainer writes the run's files


@pytest.mark.parametrize("algorithm,field,value", [
    ("iac", "joint_mode", "cross"), ("maac", "buffers_per_generation", 2), ("iac", "advantage_mode", "rloo"),
    ("maac", "use_separate_critic", False), ("maac", "value_clip_range", 0.1), ("magrpo", "critic_type", "q"),
    ("marloo", "update_epochs", 2), ("magrpo", "critic_learning_rate", 1e-4),
])
def test_a_field_the_backend_never_reads_is_refused(algorithm, field, value):
    with pytest.raises(ValueError, match=rf"{field}=.* is not used by rl_algorithm='{algorithm}'"):
        MARLHFConfig(rl_algorithm=algorithm, **{field: value})
