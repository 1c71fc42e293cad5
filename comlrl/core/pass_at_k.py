"""pass@k: the chance that at least one of k samples solves a problem, estimated from n >= k samples.

Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1): with n samples of a
problem of which c are correct, the unbiased estimator of pass@k is

    pass@k = 1 - C(n - c, k) / C(n, k)

(the chance that k samples drawn without replacement from the n are all wrong, subtracted from 1).
It is computed as the product ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which equals the ratio of
binomials and stays exact in floating point for large n (the binomials overflow).
"""

from __future__ import annotations

from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` correct among ``n`` samples (``1 <= k <= n``)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"pass_at_k: {name} must be a non-negative integer, got {value!r}.")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} needs 1 <= k <= n (n={n} samples); draw at least k samples per problem.")
    if c > n:
        raise ValueError(f"pass_at_k: c={c} correct samples out of n={n}; c cannot exceed n.")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def mean_pass_at_k(counts: Sequence[tuple], k: int) -> float:
    """The mean pass@k over problems given as ``(n, c)`` pairs (the benchmark's pass@k)."""
    if not counts:
        raise ValueError("mean_pass_at_k: no problems to average over.")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
