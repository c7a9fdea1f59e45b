"""Hypothesis-test thresholds for accuracy gates (docs/semantics.md section 8).

A gate compares a score measured on ``n`` samples with a reference measured the same way. Both are sample
means, so their difference has standard deviation ``s = sqrt(2 * sigma**2 / n)``; a one-tailed test at level
``alpha`` puts the threshold ``z(alpha) * s`` below the reference, and ``theta`` is the smallest drop the gate
catches with probability ``1 - beta``. This is the methodology of TensorRT-LLM's accuracy suite, so thresholds
here agree with the ones its users already read in their logs. The quantile comes from the standard library
(``statistics.NormalDist``): no scipy needed.

At small ``n`` the threshold can fall below the lowest score there is (0 for an accuracy): then no score fails
the gate, and a pass would say nothing. ``Threshold.can_fail`` tells, and ``min_samples_to_fail`` gives the
smallest ``n`` at which a gate on that reference can fail at all (e.g. 64 for a reference of 14.583 at sigma 50,
6,193 for 1.478): below it a gate reports that it cannot decide, never a pass.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

_NORMAL = NormalDist()


class Threshold(NamedTuple):
    """The numbers that decide one gate; all on the score's own scale (0-100 for accuracies)."""

    threshold: float
    theta: float  # minimum detectable effect
    s: float  # standard deviation of the difference of two sample means
    reference: float
    num_samples: int
    alpha: float
    beta: float
    sigma: float
    higher_is_better: bool
    lowest: float = 0.0  # the range a score can take (0-100 for accuracies); None: unbounded on that side
    highest: float | None = 100.0

    @property
    def can_fail(self) -> bool:
        """Whether some possible score fails: False when the threshold lies beyond the worst score there is."""
        if self.higher_is_better:
            return self.lowest is None or self.threshold > self.lowest
        return self.highest is None or self.threshold < self.highest

    @property
    def worst_score(self) -> float | None:
        return self.lowest if self.higher_is_better else self.highest

    def passes(self, score: float) -> bool:
        return score >= self.threshold if self.higher_is_better else score <= self.threshold

    @property
    def op(self) -> str:
        return ">=" if self.higher_is_better else "<="


def z(p: float) -> float:
    """Standard normal quantile; ``z(0.05)`` is about -1.645."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a probability must be in (0, 1): got {p!r}")
    return _NORMAL.inv_cdf(p)


def compute_threshold(
    reference: float,
    num_samples: int,
    *,
    alpha: float = 0.05,
    beta: float = 0.2,
    sigma: float = 50.0,
    higher_is_better: bool = True,
    lowest: float | None = 0.0,
    highest: float | None = 100.0,
) -> Threshold:
    """Threshold and minimum detectable effect for a gate on ``num_samples`` samples.

    Lower-is-better scores (error rates, perplexity) mirror the threshold above the reference.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer: got {num_samples!r}")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0: got {sigma!r}")
    s = math.sqrt(2.0 * sigma**2 / num_samples)
    za, zb = z(alpha), z(beta)
    theta = -(za + zb) * s
    threshold = reference + za * s if higher_is_better else reference - za * s
    return Threshold(threshold, theta, s, float(reference), num_samples, alpha, beta, sigma, higher_is_better,
                     lowest, highest)


def min_samples_to_fail(reference: float, *, alpha: float = 0.05, beta: float = 0.2, sigma: float = 50.0,
                        higher_is_better: bool = True, lowest: float | None = 0.0,
                        highest: float | None = 100.0) -> int | None:
    """The smallest ``n`` at which the worst possible score fails the gate; None when none does at any ``n``
    (a reference at the worst score itself).

    Higher is better: the threshold ``ref + z(alpha) * sigma * sqrt(2 / n)`` must exceed ``lowest``, so
    ``n > 2 sigma^2 z(alpha)^2 / (ref - lowest)^2``; the formula's answer is checked against ``compute_threshold``
    so rounding never puts it one off.
    """
    kw = dict(alpha=alpha, beta=beta, sigma=sigma, higher_is_better=higher_is_better, lowest=lowest, highest=highest)
    worst = lowest if higher_is_better else highest
    if worst is None or compute_threshold(reference, 1, **kw).can_fail:
        return 1
    gap = (reference - worst) if higher_is_better else (worst - reference)
    if gap <= 0:
        return None
    n = max(1, math.floor(2.0 * sigma**2 * z(alpha) ** 2 / gap**2))
    while not compute_threshold(reference, n, **kw).can_fail:
        n += 1
    while n > 1 and compute_threshold(reference, n - 1, **kw).can_fail:
        n -= 1
    return n
