"""The memory estimator covers the preference trainers (issue 20, point 5): MADPO's collection and
pair updates, MARLHF's RL backend plus its reward model."""

from comlrl.cli.memory import estimate_memory, run_shape
from comlrl.cli.published import PUBLISHED_MODELS
from comlrl.trainers.preference import MADPOConfig, MARLHFConfig
from comlrl.trainers.reinforce import MAGRPOConfig


def test_madpo_collects_candidates_and_scores_pairs():
    shape = PUBLISHED_MODELS["qwen3-1.7b"]
    madpo = run_shape("madpo", [shape, shape], MADPOConfig(preference_num_candidates=8, collection_batch_size=3, train_batch_size=5,
                                                           update_micro_batch_size=2))
    # 3 items x 8 candidates per generate call; 5 pairs = 10 rows per step, micro-batches of 2 pairs = 4 rows
    assert (madpo.collection_rows, madpo.rows_per_update, madpo.micro_batch_rows) == (24, 10, 4)
    assert not madpo.reference_kl and madpo.reward_model is None
    estimate = estimate_memory(madpo)
    assert "references (frozen)" not in estimate.resident and estimate.peak > 0


def test_marlhf_is_its_backend_plus_the_reward_model():
    shape = PUBLISHED_MODELS["qwen3-1.7b"]
    config = MARLHFConfig(rl_algorithm="magrpo", num_generations=4, rollout_buffer_size=2, preference_num_candidates=4,
                          reference_kl_enabled=True)
    marlhf = run_shape("marlhf", [shape, shape], config)
    backend = run_shape("magrpo", [shape, shape], MAGRPOConfig(num_turns=1, num_generations=4, rollout_buffer_size=2,
                                                                 train_batch_size=2, reference_kl_enabled=True))
    assert (marlhf.rows_per_update, marlhf.reference_kl) == (backend.rows_per_update, True)
    with_rm, without = estimate_memory(marlhf), estimate_memory(backend)
    # bf16-mixed (the CUDA default) trains float32 weights, the reward model's included
    assert with_rm.resident["reward model (weights)"] == shape.parameters * 4
    assert with_rm.peak >= without.peak + shape.parameters * 4
