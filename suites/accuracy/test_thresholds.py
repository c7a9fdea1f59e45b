"""Thresholds reproduce TensorRT-LLM's published hypothesis-test numbers.

Published in TensorRT-LLM ``tests/integration/defs/accuracy/README.md`` (section "Add New Tasks"): the output
of ``scripts/compute_theta_and_thresholds.py --sigma 50 --alpha 0.05 --beta 0.2`` lists, per sample count,
theta and threshold-minus-reference: n=32 -> 31.080936 / -20.560670, n=1024 -> 5.494385 / -3.634647,
n=4096 -> 2.747193 / -1.817324, n=14042 -> 1.483729 / -0.981517 ("the tests will use a threshold lower than
reference accuracy by 1.82 points" for MMLU's n=4096). Their GSM8K task runs the full 1319-question test split
with the same alpha/beta/sigma, and ``references/gsm8k.yaml`` registers meta-llama/Llama-3.1-8B-Instruct at
74.20 (FP8: 74.30, FP8 + FP8 KV: 72.85), so its gate threshold is 70.997.
"""

import math
from statistics import NormalDist

import pytest

from pytest_kvcm.accuracy import compute_threshold

PUBLISHED = [  # n, theta, threshold - reference
    (32, 31.080936, -20.560670),
    (64, 21.977540, -14.538589),
    (128, 15.540468, -10.280335),
    (256, 10.988770, -7.269295),
    (512, 7.770234, -5.140168),
    (1024, 5.494385, -3.634647),
    (2048, 3.885117, -2.570084),
    (4096, 2.747193, -1.817324),
    (8192, 1.942558, -1.285042),
    (14042, 1.483729, -0.981517),
]


@pytest.mark.parametrize("n,theta,delta", PUBLISHED)
def test_published_table(n, theta, delta):
    t = compute_threshold(68.17, n)
    assert t.theta == pytest.approx(theta, abs=5e-6)
    assert t.threshold - 68.17 == pytest.approx(delta, abs=5e-6)


@pytest.mark.parametrize("reference,threshold", [(74.20, 70.997), (74.30, 71.097), (72.85, 69.647),
                                                 (83.78, 80.577)])
def test_gsm8k_full_split_thresholds(reference, threshold):
    t = compute_threshold(reference, 1319)
    assert round(t.threshold, 3) == threshold
    assert round(t.theta, 3) == 4.841
    assert t.passes(threshold + 1e-3) and not t.passes(threshold - 1e-3)


def test_formula_and_defaults():
    t = compute_threshold(50.0, 200)
    s = math.sqrt(2 * 50.0**2 / 200)
    assert t.s == pytest.approx(s)
    assert t.threshold == pytest.approx(50.0 + NormalDist().inv_cdf(0.05) * s)
    assert (t.alpha, t.beta, t.sigma, t.higher_is_better) == (0.05, 0.2, 50.0, True)
    assert NormalDist().inv_cdf(0.05) == pytest.approx(-1.6448536, abs=1e-7)


def test_lower_is_better_mirrors():
    hi = compute_threshold(10.0, 100, sigma=4.48, alpha=0.01)
    lo = compute_threshold(10.0, 100, sigma=4.48, alpha=0.01, higher_is_better=False)
    assert lo.threshold - 10.0 == pytest.approx(10.0 - hi.threshold)
    assert lo.theta == pytest.approx(hi.theta)
    assert lo.passes(10.5) and not lo.passes(lo.threshold + 0.01)


def test_smoke_threshold_is_wide():
    """16 samples: s = 17.68, the gate only catches a collapse (theta ~ 44 points)."""
    t = compute_threshold(40.0, 16)
    assert t.s == pytest.approx(17.677670, abs=1e-6)
    assert round(t.threshold, 3) == 10.923
    assert round(t.theta, 3) == 43.955


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_samples=0), "num_samples"), (dict(num_samples=1.5), "num_samples"),
    (dict(num_samples=10, alpha=0.0), "probability"), (dict(num_samples=10, beta=1.0), "probability"),
    (dict(num_samples=10, sigma=-1.0), "sigma"),
])
def test_bad_inputs_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_threshold(50.0, **kwargs)
