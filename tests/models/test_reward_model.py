"""The joint reward model entity: pooling, source and device rules, export and reload, reward learning."""

import os
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from tests.helpers.tolerances import value_bound
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models.reward_model import (
    JointRewardModel,
    joint_text,
    load_reward_model,
    resolve_reward_model_source,
    save_reward_model,
)
from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.preference.reward_learning import (
    LearnedJointReward,
    RewardScorer,
    resolve_reward_device,
    train_bradley_terry,
)
from comlrl.trainers.optim import AgentOptimizer


def optimizer_for(model, lr=1e-2):
    return AgentOptimizer(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=False,
                          max_grad_norm=None, in_backward=True)


@pytest.fixture
def llama(tiny_paths):
    return AutoModelForCausalLM.from_pretrained(tiny_paths["llama"], dtype=torch.float32), AutoTokenizer.from_pretrained(tiny_paths["llama"])


def test_left_and_right_padding_give_the_same_score(llama):
    backbone, tok = llama
    model = JointRewardModel(backbone).eval()
    ids = [torch.tensor(tok("Agent 1 response: a long answer here")["input_ids"]), torch.tensor(tok("short")["input_ids"])]
    width = max(len(i) for i in ids)
    pad = tok.pad_token_id
    right = torch.stack([torch.cat([i, torch.full((width - len(i),), pad)]) for i in ids])
    left = torch.stack([torch.cat([torch.full((width - len(i),), pad), i]) for i in ids])
    right_mask = torch.stack([torch.cat([torch.ones(len(i)), torch.zeros(width - len(i))]) for i in ids]).long()
    left_mask = right_mask.flip(1)
    atol = 2 * value_bound(backbone, model.reward_head, width)  # two float32 forwards, padded to another width
    with torch.no_grad():
        alone = torch.stack([model(i[None], torch.ones(1, len(i), dtype=torch.long))[0] for i in ids])
        assert_close(model(right, right_mask), alone, atol=atol, rtol=0)
        assert_close(model(left, left_mask), alone, atol=atol, rtol=0)
    assert alone.dtype == torch.float32 and model.reward_head.weight.dtype == torch.float32


def test_no_vocabulary_logits_and_float32_head_on_a_bf16_backbone(tiny_paths):
    backbone = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"], dtype=torch.bfloat16)
    model = JointRewardModel(backbone)
    calls = []
    backbone.lm_head.register_forward_hook(lambda *a: calls.append(1))
    score = model(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long))
    assert calls == [] and score.dtype == torch.float32 and model.reward_head.weight.dtype == torch.float32


class HiddenStatesBackbone(nn.Module):
    """A backbone without ``base_model`` that only returns hidden states (the CoMLRL 1.4.3 contract)."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(d_model=4)
        self.embed = nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask, output_hidden_states=True, use_cache=False):
        return SimpleNamespace(hidden_states=(None, self.embed(input_ids)))


def test_custom_backbone_pools_the_last_attended_position():
    model = JointRewardModel(HiddenStatesBackbone())
    ids = torch.tensor([[1, 2, 3, 0], [0, 4, 5, 0]])  # right padding, inner + both-side padding
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]])
    expected = model.reward_head(model.backbone.embed(torch.tensor([3, 5]))).squeeze(-1)
    assert_close(model(ids, mask), expected)
    with pytest.raises(ValueError, match="Could not infer reward model hidden size"):
        JointRewardModel(nn.Linear(2, 2))


def test_frozen_backbone_trains_only_the_head(llama):
    backbone, _ = llama
    model = JointRewardModel(backbone, freeze_backbone=True)
    assert not any(p.requires_grad for p in backbone.parameters())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["reward_head.weight", "reward_head.bias"]
    model(torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)).sum().backward()
    assert model.reward_head.weight.grad is not None


def test_source_rules(tiny_paths, llama):
    backbone, _ = llama
    assert resolve_reward_model_source(None, [tiny_paths["llama"], tiny_paths["gpt2"]]) == tiny_paths["llama"]
    assert resolve_reward_model_source("org/rm", [tiny_paths["llama"]]) == "org/rm"
    # a model object loaded from a directory: its config._name_or_path
    assert resolve_reward_model_source(None, [backbone]) == tiny_paths["llama"]
    built = AutoModelForCausalLM.from_config(backbone.config)  # made in code: _name_or_path is not loadable
    built.config._name_or_path = ""
    with pytest.raises(ValueError, match="reward_model_name must be provided"):
        resolve_reward_model_source(None, [built])
    built.config._name_or_path = "/no/such/dir/anywhere"
    with pytest.raises(ValueError, match="reward_model_name must be provided"):
        resolve_reward_model_source(None, [built])
    built.config._name_or_path = "HuggingFaceTB/SmolLM2-135M"  # a hub id is loadable
    assert resolve_reward_model_source(None, [built]) == "HuggingFaceTB/SmolLM2-135M"


def test_device_rules():
    cpu = torch.device("cpu")
    assert resolve_reward_device(None, cpu) == cpu
    assert resolve_reward_device("cpu", cpu) == cpu
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="not available on this host"):
            assert resolve_reward_device("cuda:0", cpu) == cpu
    with pytest.raises(ValueError):
        resolve_reward_device("npu0", cpu)


def test_save_and_load_back(tmp_path, llama):
    backbone, tok = llama
    model = JointRewardModel(backbone)
    with torch.no_grad():
        model.reward_head.weight.normal_()
    target = str(tmp_path / "reward_model")
    save_reward_model(target, model, tok)
    assert {"config.json", "reward_head.pt", "reward_model.json", "tokenizer.json"} <= set(os.listdir(target))
    AutoModelForCausalLM.from_pretrained(target)  # the backbone is an ordinary causal LM folder
    again = load_reward_model(target)
    ids, mask = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():
        assert_close(again(ids, mask), model(ids, mask))
    with pytest.raises(FileExistsError):
        save_reward_model(target, model, tok)


def test_bradley_terry_raises_the_winner_margin(llama):
    backbone, tok = llama
    torch.manual_seed(0)
    model = JointRewardModel(backbone)
    scorer = RewardScorer(model, tok, torch.device("cpu"))
    winners = [joint_text(["Tell a joke"], ["a funny joke about dinosaurs"]), joint_text(["Describe a city"], ["clouds and towers"])]
    losers = [joint_text(["Tell a joke"], ["no"]), joint_text(["Describe a city"], ["x"])]
    before = torch.tensor(scorer.score_texts(winners)) - torch.tensor(scorer.score_texts(losers))
    rows = []
    metrics = train_bradley_terry(scorer, optimizer_for(model), winners, losers, epochs=5, batch_size=2, record=rows.append)
    after = torch.tensor(scorer.score_texts(winners)) - torch.tensor(scorer.score_texts(losers))
    assert bool((after > before).all()) and metrics["accuracy"] == 1.0
    assert len(rows) == 5 and {"reward_model/loss", "reward_model/accuracy", "reward_model/margin", "reward_model/grad_norm"} <= set(rows[0])
    assert rows[-1]["reward_model/loss"] < rows[0]["reward_model/loss"]


def test_scorer_keeps_the_end_of_long_texts(llama):
    backbone, tok = llama
    scorer = RewardScorer(JointRewardModel(backbone), tok, torch.device("cpu"), max_length=4)
    full = tok("one two three four five six seven")["input_ids"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = scorer.encode(["one two three four five six seven", "one two three four five six seven"])
    assert ids[0].tolist() == full[-4:] and len([w for w in caught if "dropped" in str(w.message)]) == 1


def test_learned_reward_follows_the_calling_convention(llama):
    backbone, tok = llama
    scorer = RewardScorer(JointRewardModel(backbone), tok, torch.device("cpu"))
    reward = RewardFunction(LearnedJointReward(scorer), 2)
    values = reward.score([["a", "bb"], ["c", "dd"]], ["p0", "p1"], {"prompt": "x"})
    expected = scorer.score_texts([joint_text(["p0", "p1"], ["a", "c"]), joint_text(["p0", "p1"], ["bb", "dd"])])
    assert values == expected and len(values) == 2


def test_joint_text_format():
    assert joint_text(["P1", "P2"], ["R1", "R2"]) == (
        "Joint multi-agent response\n\nAgent 1 prompt:\nP1\n\nAgent 1 response:\nR1\n\nAgent 2 prompt:\nP2\n\nAgent 2 response:\nR2"
    )
    assert joint_text(["P1"], []) == "Joint multi-agent response\n\nAgent 1 prompt:\nP1\n\nAgent 1 response:\n"


def test_winners_and_losers_share_one_forward(llama):
    backbone, tok = llama
    model = JointRewardModel(backbone)
    rows = []
    backbone.model.register_forward_hook(lambda module, args, kwargs, out: rows.append((kwargs["input_ids"].shape[0], torch.is_grad_enabled())), with_kwargs=True)
    scorer = RewardScorer(model, tok, torch.device("cpu"))
    winners, losers = ["a b c", "d e", "f"], ["g", "h i", "j k l"]
    train_bradley_terry(scorer, optimizer_for(model), winners, losers, epochs=1, batch_size=2)
    assert rows == [(4, True), (2, True)]  # batches of 2 and 1 pairs: 2B rows per forward, no LM head
