"""NucleusFilter keeps exactly the tokens Hugging Face's temperature/top-k/top-p warpers keep."""

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from comlrl.rollout.sampling import NucleusFilter


def hf_filter(scores, temperature, top_k, top_p):
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers(None, scores.clone())


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.6, 50, 0.6), (0.6, None, 0.6), (1.0, None, 0.95), (0.7, 5, 1.0), (1.3, None, 0.3)])
@pytest.mark.parametrize("probe", [8, 1024])
def test_same_kept_set_and_values_as_hugging_face(temperature, top_k, top_p, probe):
    torch.manual_seed(0)
    scores = torch.randn(6, 3000) * 3  # a long tail; with probe=8 the fallback (full sort) is exercised
    scores[0, :10] += 20  # a peaked row
    ours = NucleusFilter(temperature, top_k, top_p, probe=probe)(None, scores.clone())
    theirs = hf_filter(scores, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(theirs)
    torch.testing.assert_close(ours[kept], theirs[kept])
    assert bool((~torch.isinf(ours)).any(dim=-1).all())  # every row keeps at least its top token


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        NucleusFilter(temperature=0.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        NucleusFilter(top_p=1.5)
