"""The one update path (``trainers/update.py``) on a tiny model: the reference-KL term is aggregated
with the policy term inside the loss's normaliser for every registered loss, and DAPO's overlong
filtering takes truncated completions out of the loss and out of the token normaliser."""

import pytest
import torch
from tests.helpers.common import seed_all
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.core import get_policy_loss
from comlrl.trainers.agent import PolicyAgent
from comlrl.trainers.update import PolicyRows, UpdateSettings, backward_policy_rows

LOSSES = ("sequence_sum", "grpo", "dr_grpo", "dapo", "bnpo", "gspo")
# float32 forwards and backwards summing a few hundred products: the relative rounding of a gradient
# computed twice along different orders of the same sums
RTOL = 256 * torch.finfo(torch.float32).eps


class Backward:
    """The agent optimizer's ``backward`` alone: gradients accumulate, nothing steps."""

    def backward(self, loss, last):
        loss.backward()


def agent_of(path):
    seed_all(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    agent = PolicyAgent(0, model, AutoTokenizer.from_pretrained(path), torch.device("cpu"))
    agent.optimizer = Backward()
    return agent


def gradient(agent, rows, loss_type, kl_coef=None, max_length=3, **settings):
    """The flat gradient of one ``backward_policy_rows`` over ``rows``."""
    agent.model.zero_grad(set_to_none=True)
    update = UpdateSettings(temperature=1.0, loss=get_policy_loss(loss_type), clip_low=0.2, clip_high=None, micro_batch_size=None,
                            max_length=max_length, kl_coef=kl_coef, **settings)
    result = backward_policy_rows(agent, rows, update, label="test")
    return torch.cat([p.grad.reshape(-1) for p in agent.model.parameters() if p.grad is not None]), result


def rows_of(advantages, completions, reference=True):
    """Rows of fixed prompts and completions; the reference log-probs are fixed numbers."""
    rows = PolicyRows()
    for index, (advantage, completion) in enumerate(zip(advantages, completions)):
        ref = -torch.arange(1, len(completion) + 1, dtype=torch.float32) * (0.5 + index) if reference else None
        rows.add(torch.tensor([5, 6, 7 + index]), torch.tensor(completion), advantage, 1.0 / len(completions), reference=ref)
    return rows


COMPLETIONS = [[11, 12, 13], [14, 15, 16], [17, 18, 19], [20, 21, 22]]  # every row 3 real tokens, no EOS


@pytest.mark.parametrize("loss_type", LOSSES)
def test_kl_and_policy_gradients_scale_together_for_every_loss(tiny_paths, loss_type):
    """Rows of 3 tokens and max_length 3: every normaliser but sequence_sum's is 3, so the loss's
    policy gradient and its KL gradient are both sequence_sum's / 3 (before, the KL part stayed
    sequence_sum's: x 1 where the policy part was x 1/3), and their ratio is the same for every loss."""
    agent = agent_of(tiny_paths["llama"])
    advantages, zero = [1.0, -1.0, 0.5, -0.5], [0.0] * 4
    policy, _ = gradient(agent, rows_of(advantages, COMPLETIONS), loss_type)
    kl, result = gradient(agent, rows_of(zero, COMPLETIONS), loss_type, kl_coef=0.1)
    policy_sum, _ = gradient(agent, rows_of(advantages, COMPLETIONS), "sequence_sum")
    kl_sum, result_sum = gradient(agent, rows_of(zero, COMPLETIONS), "sequence_sum", kl_coef=0.1)
    scale = 1.0 if loss_type == "sequence_sum" else 3.0
    torch.testing.assert_close(policy, policy_sum / scale, rtol=RTOL, atol=RTOL * float(policy_sum.abs().max()))
    torch.testing.assert_close(kl, kl_sum / scale, rtol=RTOL, atol=RTOL * float(kl_sum.abs().max()))
    assert float(kl.norm() / policy.norm()) == pytest.approx(float(kl_sum.norm() / policy_sum.norm()), rel=RTOL)
    assert result.kl_loss == pytest.approx(result_sum.kl_loss / scale, rel=RTOL)


def test_mask_truncated_marks_completions_that_hit_the_limit_without_eos():
    rows = rows_of([1.0] * 4, [[11, 12, 2], [11, 12, 13], [11, 2], [11]], reference=False)
    rows.mask_truncated(3, eos_ids=[2])
    # length 3 ending in EOS: finished; length 3 without: truncated; shorter rows: finished
    assert rows.masked == [False, True, False, False]
    assert rows.tokens() == 3 + 2 + 1


def test_overlong_filtering_takes_truncated_rows_out_of_the_loss_and_the_normaliser(tiny_paths):
    agent = agent_of(tiny_paths["llama"])
    eos = agent.eos_ids[0]
    completions = [[11, 12, 13], [14, eos], [17, 18, 19], [20, 21, eos]]  # rows 0 and 2 truncated at max_length 3
    advantages = [1.0, -1.0, 0.5, -0.5]
    filtered, result = gradient(agent, rows_of(advantages, completions), "sequence_sum", kl_coef=0.1, overlong_filtering=True)
    # the same as the finished rows alone at their own weights (1/4 each): a masked row is a zero term
    every, finished_only = rows_of(advantages, completions), PolicyRows()
    for i in (1, 3):
        finished_only.add(every.prompts[i], every.completions[i], advantages[i], 0.25, reference=every.reference_logprobs[i])
    expected, _ = gradient(agent, finished_only, "sequence_sum", kl_coef=0.1)
    torch.testing.assert_close(filtered, expected, rtol=RTOL, atol=RTOL * float(expected.abs().max()))
    assert result.overlong_filtered_fraction == 0.5
    # DAPO's normaliser counts only the finished rows' tokens over all 4 rows: T = (2 + 3) / 4 = 1.25
    dapo, _ = gradient(agent, rows_of(advantages, completions), "dapo", kl_coef=0.1, overlong_filtering=True)
    torch.testing.assert_close(dapo, expected / 1.25, rtol=RTOL, atol=RTOL * float(expected.abs().max()))


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo", "sequence_sum"])
def test_a_step_whose_every_completion_is_truncated_updates_nothing(tiny_paths, loss_type):
    """Overlong filtering with every completion at the limit without EOS (DAPO on TLDR met it at 48
    new tokens): no token counts, so the loss, the KL term and the gradient are 0, and nothing raises."""
    agent = agent_of(tiny_paths["llama"])
    filtered, result = gradient(agent, rows_of([1.0, -1.0, 0.5, -0.5], COMPLETIONS), loss_type, kl_coef=0.1, overlong_filtering=True)
    assert result.overlong_filtered_fraction == 1.0
    assert filtered.numel() == 0 or bool((filtered == 0).all())
