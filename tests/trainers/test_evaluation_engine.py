"""The evaluation engine (``comlrl.trainers.evaluation``): sampled episodes, per-agent metrics, the
breakdown, and pass@k on HumanEval's bundled eval split with the real sandbox, with completions a
script writes so every number is known; both families' ``report`` and training's ``evaluate``."""

from __future__ import annotations

import pytest

from comlrl.envs import get_environment
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.evaluation import EvalSettings
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import length_ratio
from tests.helpers.scripted_generation import AUX, K, answer, needs_bwrap, script_team

@pytest.fixture
def code_team(tiny_paths):
    env = get_environment("humaneval", num_turns=2, isolation="bwrap", workers=2)
    items = list(env.load_dataset("eval", offline=True))  # rotate_left, second_largest
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["llama"]], reward_func=env.reward_func, formatters=env.formatters,
                            external_transition=env.external_transition, args=MAGRPOConfig(num_turns=2, max_new_tokens=4, verbose=False))
    script_team(trainer, answer)
    yield env, items, trainer
    trainer.close()


@needs_bwrap
def test_pass_at_k_per_turn_on_humaneval_with_the_sandbox(code_team):
    env, items, trainer = code_team
    assert [row["entry_point"] for row in items] == ["rotate_left", "second_largest"]
    report = trainer.evaluation.report(items, EvalSettings(samples=K, greedy=False, pass_k=(1, 2), per_agent=True, seed=3),
                                       details=env.reward_details)
    m = report.metrics
    # pass@k = 1 - C(n-c, k) / C(n, k) per item, n = 4, averaged over the 2 items:
    # turn 1: rotate_left c=2 -> pass@1 = 2/4, pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6; second_largest c=0 -> 0, 0
    assert m["eval/turn_1/pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["eval/turn_1/pass@2"] == pytest.approx((5 / 6 + 0.0) / 2)
    # turn 2: rotate_left c=4 -> 1, 1; second_largest c=1 -> 1/4, 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert m["eval/turn_2/pass@1"] == pytest.approx((1.0 + 0.25) / 2)
    assert m["eval/turn_2/pass@2"] == pytest.approx((1.0 + 0.5) / 2)
    assert m["eval/pass@1"] == m["eval/turn_2/pass@1"] and m["eval/pass@2"] == m["eval/turn_2/pass@2"]  # the episode's last answer
    # the breakdown per turn: every answer defines main, so every joint response runs the 4 asserts;
    # a wrong rotate_left passes 2 of 4 (the empty list and ['a'] by 0) and a wrong second_largest 2 of 4 (the None cases)
    assert m["eval/turn_1/total_tests"] == 4.0
    assert m["eval/turn_1/passed_tests"] == pytest.approx(((4 + 4 + 2 + 2) + (2 + 2 + 2 + 2)) / 8)
    assert m["eval/turn_2/passed_tests"] == pytest.approx((4 * 4 + 4 + 2 + 2 + 2) / 8)
    # per agent: aux is 4 words, a main answer as many words as its text (+ EOS each)
    assert m["eval/turn_1/agent_0/completion_length"] == len(AUX.split()) + 1
    lengths = [len(t.completions[1].split()) + 1 for e in report.episodes for t in e.turns if t.turn == 0]
    assert m["eval/turn_1/agent_1/completion_length"] == pytest.approx(sum(lengths) / 8)
    # K episodes per item, in order; every turn's breakdown kept with it
    assert [(e.index, e.sample) for e in report.episodes] == [(i, s) for i in range(2) for s in range(K)]
    assert all(len(e.turns) == 2 and all(t.details is not None for t in e.turns) for e in report.episodes)
    assert report.episodes[1].turns[0].details["passed_tests"] == 4.0 and report.episodes[2].turns[0].details["passed_tests"] == 2.0
    # the best of K: per item the best reward of its 4 episodes at that turn
    best = [max(e.turns[0].reward for e in report.episodes if e.index == i) for i in range(2)]
    assert m["eval/turn_1/best_of_4/reward_mean"] == pytest.approx(sum(best) / 2)


@needs_bwrap
def test_the_default_settings_are_trainings_greedy_evaluation(code_team):
    env, items, trainer = code_team
    report = trainer.evaluation.report(items)
    assert set(report.metrics) == {f"eval/turn_{t}/{name}" for t in (1, 2) for name in ("reward_mean", "expected_return")}
    assert [(e.index, e.sample) for e in report.episodes] == [(0, 0), (1, 0)]
    generator = trainer.team.policies[1].generator
    assert all(calls[1:] == (1, False, False) for calls in generator.calls)  # one greedy response per prompt, no seeds
    # greedy: sample 0 of every prompt, i.e. the script's first answer: rotate_left right, second_largest wrong at turn 1
    rewards = [e.turns[0].details for e in report.episodes]
    assert rewards == [None, None]  # no breakdown asked


def test_settings_refuse_what_cannot_be_measured():
    with pytest.raises(ValueError, match="greedy decoding gives one episode per item"):
        EvalSettings(samples=3)
    with pytest.raises(ValueError, match=r"pass@5 needs .* samples per item \(4\)"):
        EvalSettings(samples=4, greedy=False, pass_k=(1, 5))
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        EvalSettings(samples=0)


def make_magrpo(tiny_paths, prompts_dataset, **overrides):
    args = MAGRPOConfig(num_turns=1, max_new_tokens=5, verbose=False, temperature=1.0, top_p=1.0, **overrides)
    return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, args=args,
                         eval_dataset=prompts_dataset)


def test_sampled_episodes_are_seeded_and_do_not_depend_on_the_batch(tiny_paths, prompts_dataset):
    items = list(prompts_dataset)[:3]
    settings = EvalSettings(samples=3, greedy=False, seed=11)

    def texts(trainer, settings):
        return [[t.completions for t in e.turns] for e in trainer.evaluation.report(items, settings).episodes]

    one = make_magrpo(tiny_paths, prompts_dataset, eval_batch_size=1)
    three = make_magrpo(tiny_paths, prompts_dataset, eval_batch_size=3)
    try:
        first = texts(one, settings)
        assert first == texts(three, settings) == texts(one, settings)  # batch size and repetition change nothing
        assert len(first) == 9
        assert len({str(first[s]) for s in range(3)}) > 1  # an item's samples differ
        assert texts(one, EvalSettings(samples=3, greedy=False, seed=12)) != first
    finally:
        one.close()
        three.close()


def test_actor_critic_report_samples_and_keeps_its_own_metrics(tiny_paths, prompts_dataset):
    def per_agent(c1, c2):  # agent 1 gets the length ratio, agent 0 its negation: an N x J table
        ratio = length_ratio(c1, c2)
        return [[-r for r in ratio], ratio]

    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=per_agent, eval_dataset=prompts_dataset,
                         args=IACConfig(num_turns=1, max_new_tokens=5, verbose=False, use_separate_critic=False, num_agents=2))
    try:
        items = list(prompts_dataset)[:2]
        report = trainer.evaluation.report(items, EvalSettings(samples=2, greedy=False, per_agent=True, seed=1))
        m = report.metrics
        ratios = [t.agent_rewards[1] for e in report.episodes for t in e.turns]
        assert len(ratios) == 4 and all(t.agent_rewards[0] == -t.agent_rewards[1] for e in report.episodes for t in e.turns)
        assert m["eval/turn_1/agent_1/reward_mean"] == pytest.approx(sum(ratios) / 4)
        assert m["eval/turn_1/agent_0/reward_mean"] == pytest.approx(-sum(ratios) / 4)
        assert m["eval/turn_1/reward_mean"] == pytest.approx(0.0, abs=1e-6)  # the family's own mean over agents' rewards
        assert set(trainer.evaluate(num_eval_samples=2)) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    finally:
        trainer.close()


def test_training_evaluate_is_the_engines_greedy_report_and_a_bar_counts_items(tiny_paths, prompts_dataset, capsys):
    trainer = make_magrpo(tiny_paths, prompts_dataset, eval_batch_size=2, eval_num_samples=3)
    try:
        logged = trainer.evaluate()
        assert logged == trainer.evaluation.report(list(prompts_dataset)[:3]).metrics  # evaluate() is report() with TRAINING
        assert trainer.log_history[-1] == {"env_step": 0, **logged}
        capsys.readouterr()
        trainer.evaluation.report(list(prompts_dataset)[:3], EvalSettings(progress=True))
        assert "evaluation: 3/3 items in" in capsys.readouterr().err  # off a terminal: one line when done
    finally:
        trainer.close()
