"""Q critics (issue 20, point 8): the baseline of a node with K > 1 samples leaves the sample itself
out, and a configuration whose (actor, turn) groups hold one sample (advantage exactly 0) is refused
before anything loads; a group of one that still happens (an epoch's leftover) is warned about."""

import pytest
import torch
from tests.helpers.common import no_signal_expected, prompt_dataset
from torch.testing import assert_close

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig
from comlrl.trainers.actor_critic.samples import NodeSamples, RolloutSample, assign_td_targets
from comlrl.trainers.preference import MARLHFConfig


def _sample(q):
    ids = torch.tensor([1, 2, 3])
    return RolloutSample(agent_idx=0, prompt="p", completion="c", full_input_ids=ids, attention_mask=torch.ones(3), prompt_len=2,
                         response_len=1, old_logprob=None, old_value=torch.tensor(q), reward=torch.tensor(0.0),
                         returns=torch.tensor(0.0), advantage=None, metadata={"turn_idx": 0})


def test_the_q_baseline_of_a_node_leaves_the_sample_out():
    # Q = [1, 2, 6]: A_j = Q_j - mean of the other two = [1 - 4, 2 - 3.5, 6 - 1.5] = [-3, -1.5, 4.5]
    # (= 3/2 * (Q - mean Q) with mean Q = 3: [-3, -1.5, 4.5]); the old mean-with-itself gave [-2, -1, 3]
    node = NodeSamples([_sample(q) for q in (1.0, 2.0, 6.0)], [0.0, 0.0, 0.0])
    assign_td_targets(node, 1.0, critic_type="q")
    assert_close(torch.stack([s.advantage for s in node.samples]), torch.tensor([-3.0, -1.5, 4.5]))


@pytest.mark.parametrize("make", [
    lambda: IACConfig(critic_type="q", num_turns=1, rollout_buffer_size=1),
    lambda: MAACConfig(critic_type="q", num_turns=2, rollout_buffer_size=3),
    lambda: MARLHFConfig(rl_algorithm="iac", critic_type="q", num_generations=1, rollout_buffer_size=1),
], ids=["iac", "maac_two_turns", "marlhf_iac"])
def test_groups_of_one_q_sample_are_refused(make):
    with pytest.raises(ValueError, match=r"critic_type='q' with num_generations=1 and rollout_buffer_size=\d.*exactly 0.*"
                                         r"Set num_generations >= 2 or rollout_buffer_size >= \d"):
        make()


def test_enough_samples_or_generations_are_accepted():
    IACConfig(critic_type="q", num_turns=1, rollout_buffer_size=2)
    IACConfig(critic_type="q", num_turns=2, rollout_buffer_size=1, num_generations=2)


# a group of one sample: its rewards cannot differ, and the trainer says so
@no_signal_expected
def test_a_leftover_group_of_one_is_warned_about(tiny_paths):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=lambda c: [float(len(x)) for x in c],
                         train_dataset=prompt_dataset(3),
                         args=IACConfig(num_turns=1, num_agents=1, critic_type="q", rollout_buffer_size=2, max_new_tokens=2,
                                        num_train_epochs=1, verbose=False, eval_interval=0, use_separate_critic=False))
    with pytest.warns(UserWarning, match=r"one sample of turn 1.*exactly 0"):
        trainer.train()
