"""A gate that cannot fail says so (issue 28.1): at small n the threshold ``ref + z(alpha) * sqrt(2 sigma^2 / n)``
drops below 0, so a score of 0 would pass; such a gate reports "cannot decide" with the smallest n at which it
can fail, and at that n a zero score fails.

The two SmolLM2 references in ``ci/references`` are the cases: the arithmetic set's 14.583 needs n >= 64 of its 48
questions, real GSM8K's 1.478 needs n >= 6,193 of its 1,319 (sigma 50, alpha 0.05, TensorRT-LLM's defaults).
"""

from pathlib import Path

import pytest

from pytest_kvcm.accuracy import AccuracyGate, AccuracyGateError, compute_threshold, min_samples_to_fail
from pytest_kvcm.accuracy.gate import GateUndecidedWarning
from pytest_kvcm.dashboard import render_html

REFS = Path(__file__).resolve().parents[2] / "ci" / "references"
MODEL, SPEC = "HuggingFaceTB/SmolLM2-135M-Instruct", {"dtype": "float32", "quant_algo": "Q4_1"}
SMOLLM2 = [("gsm8k-arith", 14.583, 64), ("gsm8k", 1.478, 6193)]


@pytest.mark.parametrize("task,reference,n_min", SMOLLM2)
def test_smallest_n_at_which_each_smollm2_gate_can_fail(task, reference, n_min):
    assert min_samples_to_fail(reference) == n_min
    assert not compute_threshold(reference, n_min - 1).can_fail  # threshold <= 0: a zero score would pass
    assert compute_threshold(reference, n_min).can_fail
    assert not compute_threshold(reference, n_min).passes(0.0)


def test_smallest_n_in_general():
    assert min_samples_to_fail(74.20) == 3  # TensorRT-LLM's Llama-3.1-8B GSM8K reference
    assert min_samples_to_fail(0.0) is None  # a reference at the worst score: no n can fail it
    assert min_samples_to_fail(90.0, higher_is_better=False) == 136  # an error rate gated from above: at most 100
    assert min_samples_to_fail(5.0, higher_is_better=False, highest=None) == 1  # unbounded: any n can fail
    for ref in (0.5, 3.0, 14.583, 40.0, 99.0):  # the formula is exact at the edge, never one off
        n = min_samples_to_fail(ref)
        assert compute_threshold(ref, n).can_fail and (n == 1 or not compute_threshold(ref, n - 1).can_fail)


@pytest.mark.parametrize("task,reference,n_min", SMOLLM2)
@pytest.mark.parametrize("mode", ["gate", "smoke"])
def test_gate_below_its_smallest_n_skips_with_cannot_decide_and_zero_fails_at_it(task, reference, n_min, mode):
    rows = []
    gate = AccuracyGate(mode, reference_dir=REFS, record=lambda **row: rows.append(row))
    with pytest.raises(pytest.skip.Exception) as skipped:
        gate(task, model=MODEL, spec=SPEC, score=0.0, num_samples=8)
    msg = str(skipped.value)
    assert f"{task} accuracy gate cannot decide for {MODEL} ({mode} mode)" in msg, msg
    assert "is below the lowest possible score 0, so no score could fail it" in msg
    assert f"the smallest n at which this gate can fail is {n_min:,}" in msg
    assert rows[-1]["passed"] is None and rows[-1]["extra"]["verdict"] == "cannot decide"
    assert rows[-1]["extra"]["min_samples"] == n_min
    with pytest.raises(pytest.skip.Exception):
        gate(task, model=MODEL, spec=SPEC, score=0.0, num_samples=n_min - 1)
    with pytest.raises(AccuracyGateError, match=f"FAILED .* score 0.000 < threshold .*n={n_min},"):
        gate(task, model=MODEL, spec=SPEC, score=0.0, num_samples=n_min)
    assert rows[-1]["passed"] is False and "verdict" not in rows[-1]["extra"]


def test_record_mode_warns_and_returns_no_verdict():
    gate = AccuracyGate("smoke", reference_dir=REFS, undecided="record")
    with pytest.warns(GateUndecidedWarning, match="cannot decide"):
        out = gate("gsm8k-arith", model=MODEL, spec=SPEC, score=100.0, num_samples=8)
    assert out.passed is None and not out.decided and out.min_samples == 64
    with pytest.raises(ValueError, match="undecided must be one of"):
        AccuracyGate("gate", undecided="pass")


def test_dashboard_shows_cannot_decide_not_pass():
    row = dict(id=1, run_id="r", time=0.0, test_id="t::x", metric="accuracy.gsm8k", value=0.0, threshold=-26.538,
               n=8, passed=None, model=MODEL, kvcm_version="v2",
               extra={"spec": SPEC, "verdict": "cannot decide", "min_samples": 6193}, git_commit=None, lane=None,
               machine=None)
    html = render_html([row])
    assert "cannot decide" in html and "fails from n=6,193" in html
    assert "<b>0/1</b>gate results passing" in html
