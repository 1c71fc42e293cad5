"""Iterative preference trainers on tiny models: comparator policies, the history lag, centralized
comparator generation, replay modes, the files each round writes, scoring with the learned reward."""

import json
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from tests.helpers.common import length_ratio

from comlrl.rollout.generation import Completions
from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
from comlrl.trainers.preference.iterative import IterativeRounds
from comlrl.trainers.preference.comparators import Comparator
from comlrl.trainers.preference.replay import read_shard
from comlrl.rollout.rewards import set_reward_range

BASE = dict(num_iterations=2, preference_num_candidates=3, max_new_tokens=5, verbose=False, agent_learning_rate=1e-3,
            eval_interval=0, weight_decay=0.0, logging_steps=1)


def ranged_reward():
    return set_reward_range(lambda c1, c2: length_ratio(c1, c2), 0.0, 3.0)


def madpo_iter(paths, dataset, tmp_path, reward=None, **overrides):
    args = MADPOIterConfig(**{**BASE, "preference_replay_dir": str(tmp_path / "replay"), **overrides})
    return MADPOIterTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=reward or length_ratio, train_dataset=dataset, args=args)


@pytest.mark.parametrize("policy, extra", [
    ("current", {}),
    ("current_copy", {}),
    ("history", {"comparator_history_k": 2}),
    ("model", {"comparator_model_name": None}),  # filled with a real directory below
])
def test_each_comparator_policy_trains(tiny_paths, prompts_dataset, tmp_path, policy, extra):
    if policy == "model":
        extra = {"comparator_agents": [tiny_paths["gpt2"], tiny_paths["gpt2"]]}
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, comparator_policy=policy, **extra)
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    assert trainer.progress.round == 2 and trainer.replay.total_pairs > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agents[0].parameters()))
    rows = [r for r in trainer.log_history if "iter/current_iteration" in r]
    assert [r["iter/current_iteration"] for r in rows] == [1.0, 2.0]
    assert rows[-1]["iter/total_preference_pairs"] == trainer.replay.total_pairs


def test_current_comparator_samples_on_its_own_stream(tiny_paths, prompts_dataset, tmp_path):
    """The current policy's candidates are the same whatever the comparator draws."""
    seen = []
    runs = []
    for candidates in (3, 5):
        torch.manual_seed(0)
        trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path / str(candidates), num_iterations=1, comparator_num_candidates=candidates)
        original = trainer.policies[0].generator.generate
        trainer.policies[0].generator.generate = lambda p, k, s, seeds=None, _o=original: seen.append(_o(p, k, s, seeds)) or seen[-1]
        trainer.train()
        runs.append([c.tolist() for c in seen[0].tokens])
        seen.clear()
    assert runs[0] == runs[1]


def test_current_copy_refreshes_resident_copies(tiny_paths, prompts_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(Comparator, "_separate_copies", lambda self: True)  # as if comparator_devices were other GPUs
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, comparator_policy="current_copy")
    copies = list(trainer.comparator.copies)
    used = []
    original = Comparator.prepare_round

    def prepare(self):
        original(self)
        used.append([p.detach().clone() for p in self.copies[0].parameters()][0])

    monkeypatch.setattr(Comparator, "prepare_round", prepare)
    trainer.train()
    assert trainer.comparator.copies == copies  # the same objects every round
    assert not any(p.requires_grad for p in copies[0].parameters())
    assert len(used) == 2
    assert not torch.equal(used[0], used[1])  # round 2's copy is the policy after round 1


def test_history_lag_is_k_rounds(tiny_paths, prompts_dataset, tmp_path, monkeypatch):
    """comparator_history_k=1: round r meets the policy that started round r-1 (the initial policy for r <= 2)."""
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, comparator_policy="history", num_iterations=3)
    starts, used = [], []
    original_collect, original_candidates = IterativeRounds.collection_phase, Comparator.candidates

    def collect(self):
        starts.append(next(iter(self.run.team.agents[0].parameters())).detach().clone())
        original_collect(self)

    def candidates(self, *args):
        if len(used) < len(starts):  # the first batch of the round: the comparator's weights now
            used.append(next(iter(self.generators[0].model.parameters())).detach().clone())
        return original_candidates(self, *args)

    monkeypatch.setattr(IterativeRounds, "collection_phase", collect)
    monkeypatch.setattr(Comparator, "candidates", candidates)
    trainer.train()
    assert len(starts) == 3
    assert torch.equal(used[0], starts[0]) and torch.equal(used[1], starts[0])  # rounds 1, 2: the initial policy
    assert torch.equal(used[2], starts[1]) and not torch.equal(used[2], starts[2])  # round 3: round 2's start
    assert [label for label, _ in trainer.comparator.history] == [2]


class TaggedGenerator:
    """A comparator generator that writes tagged joint answers (and one malformed one)."""

    def __init__(self, device):
        self.device = device
        self.tokenizer = None
        self.prompts = []

    def generate(self, prompts, k, sampling, seeds=None):
        self.prompts.extend(prompts)
        texts = [("<agent_1>brief</agent_1><agent_2>a much longer answer</agent_2>" if j else "no tags") for _ in prompts for j in range(k)]
        return Completions(prompt_ids=[torch.tensor([1])] * len(prompts), tokens=[torch.tensor([1])] * len(texts), texts=texts, num_samples=k)


def test_centralized_comparator_generation(tiny_paths, prompts_dataset, tmp_path):
    calls = []

    def reward(c1, c2):
        calls.append((list(c1), list(c2)))
        return length_ratio(c1, c2)

    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, reward=reward, num_iterations=1, comparator_generation_mode="centralized",
                         collection_batch_size=1)
    generator = TaggedGenerator(trainer.agent_devices[0])
    trainer.comparator.generators[0] = generator
    trainer.train()
    assert "Agent 1 original prompt:" in generator.prompts[0] and "<agent_2>" in generator.prompts[0]
    comparator_calls = calls[1::2]  # per item: the policy's candidates, then the comparator's
    assert comparator_calls[0] == (["", "brief", "brief"], ["", "a much longer answer", "a much longer answer"])
    assert trainer.comparator.unparsed == 4  # one malformed answer per item became empty outputs


@pytest.mark.parametrize("mode, extra, expected", [
    ("nearest_k", {"preference_replay_k": 1, "preference_replay_sample_size": 5}, 5),
    ("all_history", {"preference_replay_sample_size": 7}, 7),
    ("lambda_decay", {"preference_replay_lambda": 0.0}, None),  # None: this round's pair count
])
def test_replay_modes(tiny_paths, prompts_dataset, tmp_path, mode, extra, expected):
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, preference_replay_mode=mode, **extra)
    trainer.train()
    rows = [r for r in trainer.log_history if "iter/train_preference_pairs" in r]
    for row in rows:
        want = expected if expected is not None else row["iter/current_preference_pairs"]
        assert row["iter/train_preference_pairs"] == want
    round_two = trainer.replay.shards[1].pairs
    if mode in ("nearest_k", "lambda_decay"):  # only the newest round is drawn from
        assert all(any(p is q for q in round_two) for p in trainer.preference_pairs)


def test_files_of_a_round(tiny_paths, prompts_dataset, tmp_path):
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, reward=ranged_reward(), log_reward_distribution=True,
                         policy_checkpoint_dir=str(tmp_path / "policies"), output_dir=str(tmp_path / "run"))
    trainer.train()
    shard = json.load(open(tmp_path / "replay" / "iteration_0002.json", encoding="utf-8"))
    assert shard["iteration"] == 2 and shard["num_pairs"] == len(shard["pairs"]) == len(trainer.replay.shards[1].pairs)
    record = shard["pairs"][0]
    assert set(record) == {"prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
                           "candidate_reward_mean", "raw_rewards", "target_raw_reward", "comparator_raw_reward"}
    assert len(record["prompts"]) == 2 and len(record["raw_rewards"]) == 2
    assert read_shard(str(tmp_path / "replay" / "iteration_0001.json"))[0].keys() == record.keys()
    assert sorted(os.listdir(tmp_path / "policies")) == ["initial", "iteration_0001", "iteration_0002"]
    assert sorted(os.listdir(tmp_path / "policies" / "iteration_0001")) == ["agent_0", "agent_1"]
    dist_dir = tmp_path / "run" / "reward_distributions"
    assert sorted(os.listdir(dist_dir)) == ["iteration_0001.json", "iteration_0001.png", "iteration_0002.json", "iteration_0002.png"]
    dist = json.load(open(dist_dir / "iteration_0001.json"))
    assert (dist["reward_min"], dist["reward_max"], dist["num_bins"]) == (0.0, 3.0, 16)
    assert len(dist["bin_edges"]) == 17 and len(dist["bin_centers"]) == 16
    target = dist["candidate"]["target"]
    assert set(target) == {"sample_count", "mean", "counts", "raw_rewards"} and sum(target["counts"]) == target["sample_count"] == 4 * 3
    round_one = json.load(open(tmp_path / "replay" / "iteration_0001.json", encoding="utf-8"))
    assert dist["selected"]["target"]["sample_count"] == round_one["num_pairs"]  # "current" replay: the round's own pairs
    assert sorted(dist["selected"]["target"]["raw_rewards"]) == sorted(p["target_raw_reward"] for p in round_one["pairs"])
    # a second run pointed at the same folders never overwrites them
    again = madpo_iter(tiny_paths, prompts_dataset, tmp_path, num_iterations=1)
    with pytest.warns(UserWarning, match="already holds files"):
        again.train()
    assert json.load(open(tmp_path / "replay" / "iteration_0002.json", encoding="utf-8")) == shard
    assert [n for n in os.listdir(tmp_path / "replay") if n.startswith("run-")]


def test_distribution_needs_a_declared_range(tiny_paths, prompts_dataset, tmp_path):
    with pytest.raises(ValueError, match="reward_range"):
        MADPOIterTrainer(agents=["/not/loaded", "/either"], reward_func=length_ratio, args=MADPOIterConfig(log_reward_distribution=True))


def test_wandb_gets_histograms(tiny_paths, prompts_dataset, tmp_path):
    pytest.importorskip("wandb")
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, reward=ranged_reward(), log_reward_distribution=True, num_iterations=1,
                         output_dir=str(tmp_path / "run"))
    logged = []
    trainer.run.reporting.wandb = SimpleNamespace(run=SimpleNamespace(log=lambda row, step: logged.append(row)))
    trainer.train()
    import wandb

    assert set(logged[0]) == {"iter/reward_distribution/target", "iter/reward_distribution/comparator",
                              "iter/selected_reward_distribution/target", "iter/selected_reward_distribution/comparator"}
    assert all(isinstance(v, wandb.Histogram) for v in logged[0].values())


def test_reward_model_scoring_from_round_two(tiny_paths, prompts_dataset, tmp_path):
    calls = []

    def task(c1, c2):
        calls.append(1)
        return length_ratio(c1, c2)

    trainer = MARLHFIterTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=task, train_dataset=prompts_dataset,
        args=MARLHFIterConfig(**BASE, num_generations=2, num_train_epochs=1, reward_model_device=None, preference_scoring_reward="reward_model",
                              preference_replay_dir=str(tmp_path / "replay")),
    )
    head = trainer.reward_model.reward_head.weight.detach().clone()
    trainer.train()
    assert len(calls) == 2 * 4  # round 1 only: the policy's and the comparator's side of 4 items
    shard = json.load(open(tmp_path / "replay" / "iteration_0002.json", encoding="utf-8"))
    # round 2's rewards are learned scores: raw = processed
    assert all(r["raw_rewards"] == [r["winner_reward"], r["loser_reward"]] for r in shard["pairs"])
    assert not torch.equal(trainer.reward_model.reward_head.weight, head)


def test_marlhf_iter_restarts_reward_learning_and_keeps_the_engine(tiny_paths, prompts_dataset, tmp_path, monkeypatch):
    trainer = MARLHFIterTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, train_dataset=prompts_dataset,
        args=MARLHFIterConfig(**BASE, num_generations=2, num_train_epochs=1, reward_model_device=None, rl_algorithm="maac",
                              reward_freeze_backbone=True, preference_replay_dir=str(tmp_path / "replay")),
    )
    engine, critic, optimizer = trainer.run.step, trainer.critics[0], trainer.critic_set.optimizers[0].optimizer
    initial_head = trainer.reward_model.reward_head.weight.detach().clone()
    heads = []
    original = MARLHFIterTrainer._restart_reward_learning

    def restart(self):
        original(self)
        heads.append(self.reward_model.reward_head.weight.detach().clone())

    monkeypatch.setattr(MARLHFIterTrainer, "_restart_reward_learning", restart)
    trainer.train()
    assert len(heads) == 2 and all(torch.equal(h, initial_head) for h in heads)  # every round starts from the initial head
    assert trainer.run.step is engine and trainer.critics[0] is critic and trainer.critic_set.optimizers[0].optimizer is optimizer
    assert len(optimizer.state) > 0  # the critic's AdamW moments survived the rounds


class FakeCompletionClient:
    instances = []

    def __init__(self, config):
        self.config = config
        self.requests = []

    @classmethod
    def from_config(cls, config):
        client = cls(config)
        cls.instances.append(client)
        return client

    def complete(self, prompt, n, *, max_new_tokens, temperature, top_p, top_k=None, agent_idx=None, batch_item=None):
        self.requests.append((prompt, n, agent_idx))
        return [f"answer {j} " * (j + 1) for j in range(n)]


@pytest.fixture
def fake_api(monkeypatch):
    package = types.ModuleType("comlrl.adapters")
    module = types.ModuleType("comlrl.adapters.completion_api")
    module.CompletionClient = FakeCompletionClient
    package.completion_api = module
    monkeypatch.setitem(sys.modules, "comlrl.adapters", package)
    monkeypatch.setitem(sys.modules, "comlrl.adapters.completion_api", module)
    FakeCompletionClient.instances.clear()
    return FakeCompletionClient


def test_api_comparator_and_its_key_stays_out_of_files(tiny_paths, prompts_dataset, tmp_path, fake_api):
    key = "sk-test-do-not-store-0123"
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, comparator_policy="api", comparator_api_url="http://127.0.0.1:9/v1",
                         comparator_api_key=key, comparator_num_candidates=2, output_dir=str(tmp_path / "run"))
    trainer.train(checkpoint_dir=str(tmp_path / "ckpts"))
    client = fake_api.instances[0]
    assert client.config.comparator_api_key == key  # the client gets it from the config
    assert len(client.requests) == 2 * 4 * 2 and {n for _, n, _ in client.requests} == {2}  # rounds x items x agents, n per request
    for root, _, files in os.walk(tmp_path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                assert key.encode() not in handle.read(), os.path.join(root, name)


def test_output_folder_precedence(tmp_path, monkeypatch):
    from comlrl.trainers.preference.output_paths import OutputDirs, configured_dir

    monkeypatch.chdir(tmp_path)
    wandb = {"output_dir": "/w/out", "config_sections": {"output": {"base_dir": "/w/base"}}, "dir": "/w/dir"}
    assert configured_dir("preference_replay", "~/mine", wandb, "/run") == os.path.expanduser("~/mine")
    assert configured_dir("preference_replay", None, wandb, "/run") == "/w/out/preference_replay"
    assert configured_dir("policy_checkpoints", None, {"config_sections": {"output": {"base_dir": "/w/base"}}, "dir": "/w/dir"}, "/run") == "/w/base/policy_checkpoints"
    assert configured_dir("reward_distributions", None, {"dir": "/w/dir"}, "/run") == "/w/dir/reward_distributions"
    assert configured_dir("reward_distributions", None, None, "/run") == "/run/reward_distributions"
    assert configured_dir("reward_distributions", None, None, None) == str(tmp_path / "reward_distributions")
    outputs = OutputDirs(None, None, {"preference_replay": str(tmp_path / "r")})
    assert outputs.path("preference_replay") == str(tmp_path / "r")  # empty or new: used as it is
    (tmp_path / "r" / "old.json").write_text("{}")
    outputs.reset(resumed=True)
    with pytest.warns(UserWarning, match="already holds files"):
        resumed = outputs.path("preference_replay")
    assert os.path.basename(resumed).startswith("resume-") and os.path.dirname(resumed) == str(tmp_path / "r")


class TaggedClient(FakeCompletionClient):
    def complete(self, prompt, n, **kwargs):
        self.requests.append((prompt, n, kwargs.get("agent_idx")))
        return [f"<agent_1>b</agent_1><agent_2>{'long ' * (j + 1)}</agent_2>" for j in range(n)]


def test_api_comparator_centralized(tiny_paths, prompts_dataset, tmp_path, fake_api, monkeypatch):
    monkeypatch.setattr(sys.modules["comlrl.adapters.completion_api"], "CompletionClient", TaggedClient)
    TaggedClient.instances = []
    trainer = madpo_iter(tiny_paths, prompts_dataset, tmp_path, comparator_policy="api", comparator_api_url="http://127.0.0.1:9",
                         comparator_generation_mode="centralized", num_iterations=1)
    trainer.train()
    client = TaggedClient.instances[0]
    assert len(client.requests) == 4 and all(agent is None for _, _, agent in client.requests)  # one joint request per item
    assert "Agent 2 original prompt:" in client.requests[0][0]
    comparator_sides = [p for p in trainer.replay.shards[0].pairs if "b" in (p.winner_completions[0], p.loser_completions[0])]
    assert comparator_sides and trainer.comparator.unparsed == 0
