"""Evaluation, metrics sinks (memory, JSONL, W&B offline, TensorBoard) and the reference KL."""

import json
import os

import pytest
from tests.helpers.common import PROMPTS, length_ratio, no_signal_expected
from tests.helpers.tolerances import k3_noise, logprob_bound, scored_length

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.telemetry.metrics import MetricsLogger, MemorySink

BASE = dict(num_turns=1, num_generations=2, max_new_tokens=5, num_train_epochs=1, verbose=False, agent_learning_rate=1e-3)


def make(tiny_paths, dataset, eval_dataset=None, reward=length_ratio, transition=None, **overrides):
    return MAGRPOTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward, external_transition=transition,
        args=MAGRPOConfig(**{**BASE, **overrides}), train_dataset=dataset, eval_dataset=eval_dataset,
    )


def test_evaluate_metrics_on_a_deterministic_reward_with_discount(tiny_paths, prompts_dataset):
    logged = {}

    def eval_logger(agent_completions_turns, batch_items, prompts):
        logged.update(completions=agent_completions_turns, items=batch_items, prompts=prompts)
        return [{"chars": float(len(agent_completions_turns[0][i][0]))} for i in range(len(batch_items))]

    def eval_aggregator(per_item, num_turns):
        return {"mean_chars": sum(d["chars"] for d in per_item) / len(per_item), "turns": float(num_turns)}

    trainer = make(tiny_paths, prompts_dataset, prompts_dataset, reward=lambda c1, c2: [0.25] * len(c1),
                   transition=lambda **kw: ["again", "again"], num_turns=2, discount=0.5, eval_num_samples=3,
                   eval_batch_size=2)
    trainer.eval_logger, trainer.eval_aggregator = eval_logger, eval_aggregator
    metrics = trainer.evaluate()
    # constant reward 0.25 per turn: expected return at turn 1 = 0.25 + 0.5 * 0.25
    assert metrics["eval/turn_1/reward_mean"] == pytest.approx(0.25)
    assert metrics["eval/turn_1/expected_return"] == pytest.approx(0.375)
    assert metrics["eval/turn_2/reward_mean"] == pytest.approx(0.25)
    assert metrics["eval/turn_2/expected_return"] == pytest.approx(0.25)
    assert metrics["eval/turns"] == 2.0 and "eval/mean_chars" in metrics
    # completions indexed [agent][item][turn]; 3 items although batches hold 2
    assert len(logged["completions"]) == 2 and len(logged["completions"][0]) == 3
    assert all(len(turns) == 2 for turns in logged["completions"][1])
    assert logged["prompts"] == list(prompts_dataset["prompt"][:3])
    assert trainer.log_history[-1]["eval/turn_1/reward_mean"] == pytest.approx(0.25)


def test_greedy_evaluation_is_reproducible_and_counts(tiny_paths, prompts_dataset):
    seen = []

    def reward(c1, c2):
        seen.append((tuple(c1), tuple(c2)))
        return [float(len(b) - len(a)) for a, b in zip(c1, c2)]

    trainer = make(tiny_paths, prompts_dataset, prompts_dataset, reward=reward)
    first = trainer.evaluate(num_eval_samples=2)
    second = trainer.evaluate(num_eval_samples=2)
    assert first == second and len(seen) == 4  # 2 items x 2 evaluations, one response per agent
    assert trainer.evaluate(num_eval_samples=0) == {}
    assert make(tiny_paths, prompts_dataset).evaluate() == {}  # no eval dataset


def test_eval_interval_schedule(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, prompts_dataset, eval_interval=2, eval_num_samples=1, rollout_buffer_size=1)
    calls = []
    original = trainer.evaluate
    trainer.evaluate = lambda *a, **k: calls.append(trainer.state.position) or original(*a, **k)
    trainer.train()
    assert calls == [0, 2]  # before items 0 and 2 of the epoch
    trainer = make(tiny_paths, prompts_dataset, prompts_dataset, eval_interval=0)
    trainer.evaluate = lambda *a, **k: pytest.fail("eval_interval=0 must not evaluate during training")
    trainer.train()


def test_jsonl_log_rows_are_well_formed_and_increase(tiny_paths, prompts_dataset, tmp_path):
    trainer = make(tiny_paths, prompts_dataset, output_dir=str(tmp_path), logging_steps=1, rollout_buffer_size=1,
                   num_train_epochs=2)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 8  # one per training step: 4 items per epoch, 2 epochs
    steps = [row["env_step"] for row in rows]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    for row in rows:
        for key in ("turn_1/reward_mean", "turn_1/expected_return", "agent_0/loss", "agent_1/grad_norm",
                    "agent_0/entropy", "agent_1/completion_length"):
            assert isinstance(row[key], float)
    assert [{k: v for k, v in r.items() if k != "time"} for r in rows] == trainer.log_history


def test_logging_steps_gate_averages_instead_of_dropping():
    sink = MemorySink()
    logger = MetricsLogger([sink], logging_steps=10)
    logger.record({"x": 1.0})
    assert logger.flush(4) == {"x": 1.0}  # the first row is always written
    logger.record({"x": 2.0})
    assert logger.flush(8) is None  # 8 - 4 < 10: held back
    logger.record({"x": 4.0, "y": 1.0})
    assert logger.flush(14) == {"x": 3.0, "y": 1.0}  # mean of everything since the last row
    assert [r["env_step"] for r in sink.rows] == [4, 14]


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("mode", ["loss", "reward"])
def test_reference_kl_is_zero_before_any_update_and_positive_after(tiny_paths, prompts_dataset, mode):
    trainer = make(tiny_paths, prompts_dataset, reference_kl_enabled=True, reference_kl_coef=0.5, reference_kl_mode=mode,
                   rollout_buffer_size=1, logging_steps=1, num_train_epochs=2, agent_learning_rate=5e-3)
    assert len(trainer.reference_models) == 2
    assert all(not p.requires_grad for ref in trainer.reference_models for p in ref.parameters())
    # the first rollout comes before any update: policy == reference. The policy side is the log-prob
    # recorded while sampling (an incremental forward), the reference side a full forward: float noise
    # only, a token's d = log pi_ref - log pi within delta = 2 logprob_bound. Over T tokens: k3 <= k3_noise,
    # k1 <= T delta, the KL loss's k1^2 / 2 <= delta^2 / 2 per token.
    tokens = BASE["max_new_tokens"]
    delta = max(2 * logprob_bound(agent, scored_length(tok, PROMPTS[:4], tokens)) for agent, tok in zip(trainer.agents, trainer.tokenizers))
    kl_noise = k3_noise(delta, tokens)
    trainer.train()
    kls = [row["turn_1/reference_kl_mean"] for row in trainer.log_history]
    assert kls[0] <= kl_noise
    assert len(set(kls[1:])) == len(kls) - 1 and min(kls[1:]) > kl_noise  # later rollouts measure a moved policy
    # (the values themselves are checked against known log-probs in test_mechanisms_kl_critics.py / test_kl_loss.py)
    if mode == "reward":
        penalties = [row["turn_1/reference_kl_penalty_mean"] for row in trainer.log_history]
        # the penalty is coef * mean(log pi - log ref) (k1, see core.kl.sequence_log_ratio): 0 before any update
        assert abs(penalties[0]) <= 0.5 * tokens * delta and len(penalties) == len(kls)
    else:  # its own loss term: coef * (log pi - log ref)^2 / 2 per token, 0 before any update, then positive
        losses = [row["agent_0/kl_loss"] for row in trainer.log_history]
        assert abs(losses[0]) <= 0.5 * delta**2 / 2 and max(losses[1:]) > 0
        assert all("turn_1/reference_kl_penalty_mean" not in row for row in trainer.log_history)


def test_homogeneous_agents_share_one_frozen_reference(tiny_paths, prompts_dataset):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=MAGRPOConfig(**BASE, reference_kl_enabled=True))
    assert trainer.reference_models[0] is trainer.reference_models[1]
    assert trainer.reference_models[0] is not trainer.agents[0]


def test_wandb_offline_run_logs_and_survives_save_model(tiny_paths, prompts_dataset, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional dependency")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = MAGRPOTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, train_dataset=prompts_dataset,
        args=MAGRPOConfig(**BASE, logging_steps=1),
        wandb_config={"project": "comlrl-test", "name": "offline", "dir": str(tmp_path / "wandb"),
                      "config_sections": {"dataset": {"name": "toy", "type": "prompts"}, "output": {"verbose": False},
                                          "api": {"api_key": "SECRET"}}},
    )
    try:
        assert trainer.wandb_initialized and wandb.run is not None
        assert wandb.run.config["dataset_name"] == "toy" and wandb.run.config["algorithm"] == "MAGRPO"
        assert "api_key" not in dict(wandb.run.config["api"])  # credentials never reach the run config
        trainer.train()
        trainer.save_model(str(tmp_path / "models"))
        assert wandb.run is not None  # save_model does not end the run
        run_dir = wandb.run.dir
    finally:
        trainer.close()
    assert wandb.run is None
    assert os.path.isdir(run_dir)
