"""Actor-critic maths with hand-worked numbers: TD targets, value clipping, advantage normalisation,
the per-agent reward convention, and the value read from an actor's own forward."""

import pytest
import torch
from torch.testing import assert_close

from comlrl.core.value_loss import value_loss
from comlrl.core.returns import td_targets
from comlrl.models.value_head import CausalLMWithValueHead, ValueHead
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import CompletionScores
from comlrl.trainers.actor_critic.rewards import agent_reward_table
from comlrl.trainers.actor_critic.samples import NodeSamples, RolloutSample, assign_td_targets, flat_samples
from comlrl.trainers.actor_critic.updates import SharedValueLoss, normalized_advantages, unique_sequences


def sample(old_value=0.0, advantage=None, target=None, turn=0, agent=0):
    ids = torch.tensor([1, 2, 3])
    return RolloutSample(
        agent_idx=agent, prompt="p", completion="c", full_input_ids=ids, attention_mask=torch.ones(3),
        prompt_len=2, response_len=1, old_logprob=None, old_value=torch.tensor(old_value), reward=torch.tensor(0.0),
        returns=torch.tensor(0.0), advantage=None if advantage is None else torch.tensor(advantage),
        metadata={"turn_idx": turn}, value_target=None if target is None else torch.tensor(target),
    )


def test_td_targets_bootstrap_only_before_the_last_turn():
    # r = [1, 0, 2], V(h_{t+1}) = [0.4, 0.3, (unused)], gamma = 0.9, last turn terminal:
    # y_0 = 1 + 0.9 * 0.4 = 1.36 ; y_1 = 0 + 0.9 * 0.3 = 0.27 ; y_2 = 2 (no bootstrap)
    targets = td_targets(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.4, 0.3, 5.0]), torch.tensor([False, False, True]), 0.9)
    assert_close(targets, torch.tensor([1.36, 0.27, 2.0]))


def chain(values, rewards):
    """A K = 1 episode as a chain of nodes (one sample each) from old values and shaped rewards."""
    node = None
    for value, reward in reversed(list(zip(values, rewards))):
        parent = NodeSamples([sample(value)], [reward])
        if node is not None:
            parent.children[0] = node
        node = parent
    return node


def test_episode_targets_advantages_and_returns():
    # shaped rewards r = [1, 0, 2], old values V = [0.5, 0.4, 0.3], gamma = 0.9
    # targets  y = [1 + 0.9*0.4, 0 + 0.9*0.3, 2] = [1.36, 0.27, 2.0]
    # TD error A = y - V = [0.86, -0.13, 1.7]
    # returns  G_2 = 2, G_1 = 0 + 0.9*2 = 1.8, G_0 = 1 + 0.9*1.8 = 2.62
    episode = chain([0.5, 0.4, 0.3], [1.0, 0.0, 2.0])
    assign_td_targets(episode, 0.9)
    samples = flat_samples(episode)
    assert_close(torch.stack([s.value_target for s in samples]), torch.tensor([1.36, 0.27, 2.0]))
    assert_close(torch.stack([s.advantage for s in samples]), torch.tensor([0.86, -0.13, 1.7]))
    assert_close(torch.stack([s.returns for s in samples]), torch.tensor([2.62, 1.8, 2.0]))


def test_early_stopped_episode_has_no_bootstrap_after_its_last_turn():
    # Two collected turns of a 3-turn horizon (stopped early): y_1 = r_1 = 0.5, y_0 = 1 + 1.0 * 0.2 = 1.2
    episode = chain([0.1, 0.2], [1.0, 0.5])
    assign_td_targets(episode, 1.0)
    samples = flat_samples(episode)
    assert_close(torch.stack([s.value_target for s in samples]), torch.tensor([1.2, 0.5]))
    assert_close(torch.stack([s.advantage for s in samples]), torch.tensor([1.1, 0.3]))


def test_tree_targets_bootstrap_from_the_mean_of_each_childs_samples():
    # K = 2, two turns. Root samples j=0,1 with V(root) = 0.5 (a V critic: same value for both),
    # rewards r = [1, 0]. Child 0 holds two samples with values [0.2, 0.2] (V of that history) and
    # rewards [1, 3]; child 1 values [0.6, 0.6], rewards [0, 0]. gamma = 0.5.
    # root targets: y_0 = 1 + 0.5 * mean(0.2, 0.2) = 1.1 ; y_1 = 0 + 0.5 * 0.6 = 0.3
    # leaf targets = their rewards; advantages y - V: root [0.6, -0.2], child 0 [0.8, 2.8], child 1 [-0.6, -0.6]
    # returns: child 0 G = [1, 3] (mean 2), child 1 [0, 0]; root G_0 = 1 + 0.5*2 = 2, G_1 = 0 + 0.5*0 = 0
    root = NodeSamples([sample(0.5), sample(0.5)], [1.0, 0.0])
    root.children[0] = NodeSamples([sample(0.2), sample(0.2)], [1.0, 3.0])
    root.children[1] = NodeSamples([sample(0.6), sample(0.6)], [0.0, 0.0])
    returns = assign_td_targets(root, 0.5)
    samples = flat_samples(root)  # pre-order: root j0, j1, child 0's two, child 1's two
    assert_close(torch.stack([s.value_target for s in samples]), torch.tensor([1.1, 0.3, 1.0, 3.0, 0.0, 0.0]))
    assert_close(torch.stack([s.advantage for s in samples]), torch.tensor([0.6, -0.2, 0.8, 2.8, -0.6, -0.6]))
    assert returns == [2.0, 0.0]


def test_q_critic_advantage_is_q_minus_the_other_samples_mean_q():
    # A two-action bandit (one turn, K = 2) whose Q critic is exact: Q(a_0) = 1 (its reward), Q(a_1) = 0.
    # The TD error r + 0 - Q would give both actions 0; the leave-one-out baseline (the other
    # sample's Q) gives 1 - 0 = +1 and 0 - 1 = -1 (K / (K - 1) = 2 times Q - mean Q).
    node = NodeSamples([sample(1.0), sample(0.0)], [1.0, 0.0])
    assign_td_targets(node, 1.0, critic_type="q")
    assert_close(torch.stack([s.advantage for s in node.samples]), torch.tensor([1.0, -1.0]))
    assert_close(torch.stack([s.value_target for s in node.samples]), torch.tensor([1.0, 0.0]))  # the critic's targets


def test_q_critic_with_one_sample_is_centred_on_the_others_of_its_group():
    # K = 1: each node stores its raw Q; the update uses A_i = Q_i - mean_{k != i} Q_k.
    # Q = [1, 0, 2]: A = [1 - 1, 0 - 1.5, 2 - 0.5] = [0, -1.5, 1.5]
    samples = [sample(advantage=q) for q in (1.0, 0.0, 2.0)]
    assert_close(normalized_advantages(samples, False, center_leave_one_out=True), torch.tensor([0.0, -1.5, 1.5]))
    assert_close(normalized_advantages(samples[:1], False, center_leave_one_out=True), torch.tensor([0.0]))


def test_value_clipping_takes_the_larger_error():
    values, old, targets = torch.tensor([1.5, 0.2]), torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])
    # unclipped errors: (2 - 1.5)^2 = 0.25, (0 - 0.2)^2 = 0.04 -> mean 0.145
    assert_close(value_loss(values, targets), torch.tensor(0.145))
    # V_clip = V_old + clip(V - V_old, +-0.2) = [1.2, 0.2]; clipped errors (2 - 1.2)^2 = 0.64, 0.04
    # max per sample: [0.64, 0.04] -> mean 0.34
    assert_close(value_loss(values, targets, old, 0.2), torch.tensor(0.34))


def test_advantage_normalisation_per_group():
    samples = [sample(advantage=a) for a in (1.0, 2.0, 3.0, 6.0)]
    # mean 3; population std sqrt((4 + 1 + 0 + 9) / 4) = sqrt(3.5) = 1.870829
    expected = torch.tensor([-2.0, -1.0, 0.0, 3.0]) / 3.5**0.5
    assert_close(normalized_advantages(samples, True), expected)
    assert_close(normalized_advantages(samples, False), torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert_close(normalized_advantages(samples[:1], True), torch.tensor([1.0]))  # one sample: unchanged


def test_reward_conventions():
    # K = 3 joint responses, N = 2 agents
    assert agent_reward_table([1.0, 2.0, 3.0], 2, 3, max) == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]  # one per response
    assert agent_reward_table(0.5, 2, 3, max) == [[0.5] * 3, [0.5] * 3]  # broadcast
    assert agent_reward_table([1.0, 2.0], 2, 3, max) == [[1.0] * 3, [2.0] * 3]  # one per agent
    table = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert agent_reward_table(table, 2, 3, max) == table.tolist()  # per agent and response
    # K == N == 2: a flat list means one value per joint response; per-agent needs the table
    assert agent_reward_table([1.0, 2.0], 2, 2, max) == [[1.0, 2.0], [1.0, 2.0]]
    assert agent_reward_table([[1.0, 1.0], [2.0, 2.0]], 2, 2, max) == [[1.0, 1.0], [2.0, 2.0]]
    with pytest.raises(ValueError, match="1 value, num_generations values, or num_agents values"):
        agent_reward_table([1.0, 2.0, 3.0, 4.0], 2, 3, max)
    with pytest.raises(ValueError, match="2 x 3"):
        agent_reward_table([[1.0, 2.0], [3.0, 4.0]], 2, 3, max)


def test_unique_sequences_computes_each_input_once():
    a, b = torch.tensor([1, 2]), torch.tensor([3])
    unique, inverse = unique_sequences([a, b, a.clone(), b])
    assert len(unique) == 2 and inverse.tolist() == [0, 1, 0, 1]


def test_value_head_keys_and_initial_values():
    head = ValueHead(8, 4)
    assert sorted(head.state_dict()) == [
        "pre_projection.0.bias", "pre_projection.0.weight", "value_projection.bias", "value_projection.weight"
    ]
    assert sorted(ValueHead(8).state_dict()) == ["value_projection.bias", "value_projection.weight"]
    assert ValueHead(8, 0).pre_projection is None
    assert float(ValueHead(8).value_projection.bias.detach()) == 0.0


def test_shared_value_loss_reads_prompt_and_final_states():
    # Hidden states [R=2, W=4, H=1] where the state at column c of row r is 10*r + c; the head is identity.
    head = ValueHead(1)
    with torch.no_grad():
        head.value_projection.weight.fill_(1.0)
    hidden = torch.tensor([[0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]]).unsqueeze(-1)
    batch = build_sequence_batch([torch.tensor([5, 6]), torch.tensor([7])], [torch.tensor([1, 2]), torch.tensor([3, 4, 9])], 0, "cpu", final_state=True)
    assert batch.completion_width == 4 and batch.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    scores = CompletionScores(logprobs=torch.zeros(2, 4), hidden_states=hidden)
    samples = [sample(old_value=0.0, target=1.0), sample(old_value=0.0, target=2.0)]
    # V critic: column 0 (last prompt position): values [0, 10]; errors (1-0)^2, (2-10)^2 -> mean 32.5
    v = SharedValueLoss(head, samples, coef=0.5, clip_range=None, final_state=False)
    loss, metrics = v(scores, batch, slice(0, 2))
    assert_close(loss, torch.tensor(0.5 * 32.5))
    # Q critic: column len(completion) = [2, 3]: values [2, 13]; errors 1, 121 -> mean 61
    q = SharedValueLoss(head, samples, coef=1.0, clip_range=None, final_state=True)
    loss, metrics = q(scores, batch, slice(0, 2))
    assert_close(loss, torch.tensor(61.0))
    assert metrics["value_mean"] == pytest.approx(7.5)  # mean of [2, 13]
    assert metrics["value_loss"] == pytest.approx(61.0)  # the error before the coefficient


def test_value_wrapper_forward_and_last_token_values(tiny_paths):
    from transformers import AutoModelForCausalLM

    backbone = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    model = CausalLMWithValueHead(backbone, value_head_hidden_dim=4)
    ids = torch.tensor([[5, 6, 7, 8]])
    out = model(input_ids=ids)
    assert out.values.shape == (1, 4) and out.past_key_values is None
    # the transformer-only path gives the value of the last position of the full forward
    last = model.last_token_values(ids, torch.ones_like(ids))
    assert_close(last, out.values[:, -1].float())
    assert model(input_ids=ids, output_values=False).values is None
