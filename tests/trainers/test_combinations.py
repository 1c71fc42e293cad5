"""The feature combination matrix (issue 20, point 10; the matrix and its refusals are listed in
docs/testing.md). Every pair of features (``combination_matrix.pairs()``) either trains the maths of
its reference run (the pair without its maths-neutral feature: bit-identical for ``mp``, allclose for
gradient checkpointing, micro-batches and 2-rank data parallelism), or, for two features that both
define the maths, trains finitely; or it is refused before any model loads, with its message."""

import pytest
import transformers
from tests.helpers.combination_matrix import FEATURES, REFUSED, assert_same, assert_trained, build, pairs, reference_of, run
from tests.helpers.combination_scenarios import dp2_cells
from tests.parallel.test_data_parallel import torchrun

from comlrl.parallel.data_parallel import DataParallel

SINGLE_PROCESS = [pair for pair in pairs() if "dp2" not in pair]
REFUSED_DP2 = [pair for pair in pairs() if "dp2" in pair and frozenset(pair) in REFUSED]


@pytest.fixture(scope="module")
def cells(tiny_paths):
    """Trained cells by feature tuple (sorted), each run once for the whole module."""
    cache = {}

    def get(features):
        key = tuple(sorted(features))
        if key not in cache:
            cache[key] = run(tiny_paths, key)
        return cache[key]

    return get


def _refused_before_loading(paths, pair, monkeypatch, built=None):
    loads = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loads.append(a) or pytest.fail("a model loaded"))
    with pytest.raises((ValueError, TypeError), match=REFUSED[frozenset(pair)]):
        build(paths, pair if built is None else built)
    assert loads == []


@pytest.mark.parametrize("pair", SINGLE_PROCESS, ids=["+".join(p) for p in SINGLE_PROCESS])
def test_a_pair_trains_its_reference_maths_or_is_refused(tiny_paths, cells, pair, monkeypatch):
    if frozenset(pair) in REFUSED:
        _refused_before_loading(tiny_paths, pair, monkeypatch)
        return
    got = cells(pair)
    assert_trained(got, "+".join(pair))
    reference, exactness = reference_of(pair)
    if exactness is not None:
        assert_same(got, cells(reference), exactness, f"{'+'.join(pair)} vs {'+'.join(reference) or 'base'}")


@pytest.mark.parametrize("pair", REFUSED_DP2, ids=["+".join(p) for p in REFUSED_DP2])
def test_a_data_parallel_pair_is_refused_before_loading(tiny_paths, pair, monkeypatch):
    monkeypatch.setattr(DataParallel, "current", classmethod(lambda cls: DataParallel(rank=0, world_size=2, local_rank=0)))
    _refused_before_loading(tiny_paths, pair, monkeypatch, built=tuple(f for f in pair if f != "dp2"))


@pytest.mark.slow
def test_data_parallel_pairs_train_their_reference_maths(tiny_paths, cells, tmp_path):
    """One 2-rank launch runs dp2 alone and with every accepted feature; each equals (allclose) the
    one-process run of its other feature (the base for dp2 alone)."""
    results = torchrun("matrix_dp2", tiny_paths, tmp_path, module="tests.helpers.combination_scenarios")
    assert sorted(results) == sorted("+".join(cell) or "base" for cell in dp2_cells())
    for cell in dp2_cells():
        got = results["+".join(cell) or "base"]
        assert_trained(got, f"dp2+{'+'.join(cell)}")
        reference, _ = reference_of(tuple(cell))
        assert_same(got, cells(reference), "close", f"dp2+{'+'.join(cell)} vs {'+'.join(reference) or 'base'}")


def test_the_matrix_covers_every_axis_and_names_its_refusals():
    axes = set(FEATURES.values())
    assert {"trainer", "lora", "precision", "checkpointing", "threads", "micro", "kl", "ratio", "data_parallel"} == axes
    assert all(len(pair) == 2 and pair in pairs() or tuple(reversed(pair)) in pairs() for pair in map(tuple, REFUSED))
