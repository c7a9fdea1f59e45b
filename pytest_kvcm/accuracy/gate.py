"""The accuracy gate: reference lookup + threshold + verdict + a row in the results store.

Three modes, one code path, so a smoke run exercises exactly what a full gate does:
* ``gate`` (default): the score must reach the threshold computed for the samples actually run;
* ``smoke``: the same, on a few samples (16), with the (wide) threshold computed for that n;
* ``measure``: no verdict; the YAML entry to paste into ``ci/references/<task>.yaml`` is reported.

A gate whose threshold lies below every possible score (too few samples for the reference and the confidence
asked) *cannot decide*: ``passed`` is None, the message names the smallest n at which it could fail, and by
default the test is skipped with that message (``undecided="skip"``), never reported as a pass;
``undecided="record"`` records it and warns (``GateUndecidedWarning``), for a test whose own assertions (V1 == V2, say) stand apart.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .references import Reference, ReferenceError, entry_yaml, lookup_reference, normalize_spec
from .thresholds import Threshold, compute_threshold, min_samples_to_fail

from ..options import ACCURACY_MODES as MODES  # noqa: E402  (declared with --kvcm-accuracy)
UNDECIDED = ("skip", "record")
CANNOT_DECIDE = "cannot decide"
SMOKE_SAMPLES = 16
DEFAULTS = {"alpha": 0.05, "beta": 0.2, "sigma": 50.0}


class AccuracyGateError(AssertionError):
    """A gate that did not pass; the message carries everything needed to judge it."""


class GateUndecidedWarning(UserWarning):
    """A gate recorded with ``undecided="record"`` that could not decide (pytest lists it among the warnings)."""


@dataclass
class GateOutcome:
    task: str
    model: str
    mode: str
    score: float
    num_samples: int
    spec: dict[str, Any]
    reference: Reference | None = None
    threshold: Threshold | None = None
    passed: bool | None = None  # None in measure mode, and when the gate cannot decide
    entry: str = ""  # measure mode: YAML to paste
    extra: dict[str, Any] = field(default_factory=dict)
    min_samples: int | None = None  # the smallest n at which this gate can fail (None: at no n)

    @property
    def decided(self) -> bool:
        """False in measure mode and when no possible score could fail the threshold."""
        return self.threshold is not None and self.threshold.can_fail

    def message(self) -> str:
        if self.threshold is None:
            return (f"{self.task} measured for {self.model}: score {self.score:.3f} on n={self.num_samples} "
                    f"samples, spec {self.spec}. Entry to paste into ci/references/{self.task}.yaml:\n{self.entry}")
        t, ref = self.threshold, self.reference
        if not t.can_fail:
            where = "below the lowest" if t.higher_is_better else "above the highest"
            scored = f"score {self.score:.3f}, " if self.score == self.score else ""  # NaN: checked before a run
            need = (f"the smallest n at which this gate can fail is {self.min_samples:,}" if self.min_samples
                    else "it can fail at no n: the reference is the worst score there is")
            return (f"{self.task} accuracy gate {CANNOT_DECIDE} for {self.model} ({self.mode} mode): threshold "
                    f"{t.threshold:.3f} at n={t.num_samples} is {where} possible score {t.worst_score:g}, so no score "
                    f"could fail it ({scored}reference {t.reference:.3f}, alpha={t.alpha}, "
                    f"sigma={t.sigma}); {need}; reference selected by spec {ref.spec} (entry {ref.index} of "
                    f"{ref.model!r} in {ref.path})")
        verdict = "passed" if self.passed else "FAILED"
        rel = f"{'>=' if t.higher_is_better else '<='}" if self.passed else f"{'<' if t.higher_is_better else '>'}"
        return (
            f"{self.task} accuracy gate {verdict} for {self.model} ({self.mode} mode): "
            f"score {self.score:.3f} {rel} threshold {t.threshold:.3f} "
            f"(reference {t.reference:.3f}, theta {t.theta:.3f}, n={t.num_samples}, alpha={t.alpha}, "
            f"beta={t.beta}, sigma={t.sigma}); reference selected by spec {ref.spec} "
            f"(entry {ref.index} of {ref.model!r} in {ref.path})"
        )


class AccuracyGate:
    """``gate(task="gsm8k", model=..., spec={...}, score=..., num_samples=...)``.

    ``record`` is called with the result row (the ``kvcm_results`` recorder in tests); ``report`` with the
    measure-mode message. Fails with ``AccuracyGateError`` (an ``AssertionError``, so pytest shows it as a
    failure), and with ``ReferenceError`` when no reference matches outside measure mode.
    """

    def __init__(self, mode: str = "gate", *, reference_dir=None, record: Callable[..., Any] | None = None,
                 report: Callable[[str], Any] | None = None, kvcm_version: str | None = None,
                 undecided: str = "skip"):
        if mode not in MODES:
            raise ValueError(f"accuracy mode must be one of {MODES}: got {mode!r}")
        if undecided not in UNDECIDED:
            raise ValueError(f"undecided must be one of {UNDECIDED}: got {undecided!r}")
        self.undecided = undecided
        self.mode, self.reference_dir, self._record, self._report = mode, reference_dir, record, report
        self.kvcm_version = kvcm_version
        self.outcomes: list[GateOutcome] = []

    def evaluate(self, task: str = "gsm8k", *, model: str, score: float, num_samples: int,
                 spec: Mapping[str, Any] | None = None, higher_is_better: bool | None = None,
                 extra: Mapping[str, Any] | None = None) -> GateOutcome:
        """The verdict without raising (and without recording)."""
        full = normalize_spec(spec)
        out = GateOutcome(task, model, self.mode, float(score), int(num_samples), full, extra=dict(extra or {}))
        if self.mode == "measure":
            try:
                out.reference = lookup_reference(task, model, full, reference_dir=self.reference_dir)
            except ReferenceError:
                out.reference = None
            out.entry = entry_yaml(model, score, full, num_samples=int(num_samples))
            return out
        ref = lookup_reference(task, model, full, reference_dir=self.reference_dir)
        stats = {**DEFAULTS, **{k: v for k, v in ref.stats.items() if k in DEFAULTS}}
        hib = ref.stats.get("higher_is_better", True) if higher_is_better is None else higher_is_better
        out.reference = ref
        kw = dict(alpha=stats["alpha"], beta=stats["beta"], sigma=stats["sigma"], higher_is_better=hib)
        out.threshold = compute_threshold(ref.accuracy, int(num_samples), **kw)
        out.min_samples = min_samples_to_fail(ref.accuracy, **kw)
        out.passed = out.threshold.passes(float(score)) if out.threshold.can_fail else None
        return out

    def __call__(self, task: str = "gsm8k", *, model: str, score: float, num_samples: int,
                 spec: Mapping[str, Any] | None = None, higher_is_better: bool | None = None,
                 kvcm_version: str | None = None, extra: Mapping[str, Any] | None = None) -> GateOutcome:
        __tracebackhide__ = True  # a failure shows the caller's line and the verdict, not this method
        out = self.evaluate(task, model=model, score=score, num_samples=num_samples, spec=spec,
                            higher_is_better=higher_is_better, extra=extra)
        self.outcomes.append(out)
        if self._record is not None:
            t = out.threshold
            self._record(
                metric=f"accuracy.{task}", value=out.score, model=model,
                kvcm_version=kvcm_version or self.kvcm_version, threshold=None if t is None else t.threshold,
                n=out.num_samples, passed=out.passed,
                extra={"mode": self.mode, "spec": out.spec, **out.extra,
                       **({} if t is None else {"reference": t.reference, "theta": t.theta, "s": t.s,
                                                 "alpha": t.alpha, "beta": t.beta, "sigma": t.sigma,
                                                 "min_samples": out.min_samples}),
                       **({"verdict": CANNOT_DECIDE} if t is not None and not t.can_fail else {})})
        if self.mode == "measure":
            if self._report is not None:
                self._report(out.message())
        elif not out.decided:
            if self.undecided == "skip":
                import pytest

                pytest.skip(out.message())
            warnings.warn(out.message(), GateUndecidedWarning, stacklevel=2)
        elif not out.passed:
            raise AccuracyGateError(out.message())
        return out
