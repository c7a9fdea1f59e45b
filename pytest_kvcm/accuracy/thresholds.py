"""Hypothesis-test thresholds for accuracy gates (docs/semantics.md section 8).

A gate compares a score measured on ``n`` samples with a reference measured the same way. Both are sample
means, so their difference has standard deviation ``s = sqrt(2 * sigma**2 / n)``; a one-tailed test at level
``alpha`` puts the threshold ``z(alpha) * s`` below the reference, and ``theta`` is the smallest drop the gate
catches with probability ``1 - beta``. This is the methodology of TensorRT-LLM's accuracy suite, so thresholds
here agree with the ones its users already read in their logs. The quantile comes from the standard library
(``statistics.NormalDist``): no scipy needed.
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
    return Threshold(threshold, theta, s, float(reference), num_samples, alpha, beta, sigma, higher_is_better)
