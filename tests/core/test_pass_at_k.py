"""pass@k (Chen et al. 2021, eq. 1) against hand-worked binomials."""

from math import comb

import pytest

from comlrl.core.pass_at_k import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 2, 1, 0.5),            # pass@1 = c / n
    (4, 2, 2, 1 - 1 / 6),      # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 1, 2, 0.5),            # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 1, 3, 0.6),            # 1 - C(4,3)/C(5,3) = 1 - 4/10
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
    (4, 0, 3, 0.0),            # nothing correct
    (4, 3, 2, 1.0),            # n - c = 1 < k: every draw of 2 holds a correct one
    (4, 4, 4, 1.0),
])
def test_hand_worked_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_the_product_form_equals_the_binomials_where_they_are_exact():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_large_n_stays_finite():
    # C(1000, 500) overflows a float; the product does not: 1 - prod_{i=991}^{1000} (1 - 500/i)
    value = pass_at_k(1000, 10, 500)
    assert 0.99 < value <= 1.0


def test_mean_over_problems_and_refusals():
    assert mean_pass_at_k([(4, 2), (4, 0)], 2) == pytest.approx((1 - 1 / 6) / 2)
    with pytest.raises(ValueError, match="k=5 needs 1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c cannot exceed n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)
