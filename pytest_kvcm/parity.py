"""Greedy parity: the same prompts through two configurations must give identical tokens.

Two engines that read the same weights and differ only in how they keep KV (V1 vs V2, speculative vs plain,
paged vs Hugging Face ``generate``) compute the same logits up to fp32 rounding, so greedy decoding must agree
token for token. When it does not, the report says where: per differing prompt the first differing position,
both tokens (ids and text) and the top1 - top2 logit margin there. A tiny margin means a near tie that rounding
may legitimately flip; ``margin_tolerance`` lets those through (counted, recorded), a large margin is a defect.

``compare_greedy`` is the plain function (benchmarks, scripts); the ``greedy_parity`` fixture runs it, records
the result in the results store when the ``kvcm_results`` fixture is available, and fails the test on mismatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pytest

END = None  # token stand-in for "this side had stopped already"


@dataclass
class Mismatch:
    prompt_index: int
    position: int                       # index into the generated tokens (0 = first new token)
    token_a: int | None                 # None: side a had ended (EOS / length) before this position
    token_b: int | None
    margin_a: float | None              # top1 - top2 logit of side a at that position, when a reported margins
    margin_b: float | None
    prompt: Any = None
    near_tie: bool = False

    @property
    def margin(self) -> float | None:
        """The smaller known margin: a near tie on either side is enough for rounding to flip the choice."""
        known = [m for m in (self.margin_a, self.margin_b) if m is not None]
        return min(known) if known else None


@dataclass
class ParityReport:
    names: tuple[str, str]
    num_prompts: int
    num_tokens: int                     # tokens compared (side a's count, up to the first difference)
    mismatches: list[Mismatch] = field(default_factory=list)
    margin_tolerance: float | None = None
    tokenizer: Any = None

    @property
    def near_ties(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.near_tie]

    @property
    def failures(self) -> list[Mismatch]:
        return [m for m in self.mismatches if not m.near_tie]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def match_rate(self) -> float:
        return 1.0 - len(self.mismatches) / self.num_prompts if self.num_prompts else 1.0

    def _tok(self, t: int | None) -> str:
        if t is END:
            return "<end>"
        if self.tokenizer is None:
            return str(t)
        return f"{t} {self.tokenizer.decode([t])!r}"

    def _prompt(self, p) -> str:
        if p is None:
            return "?"
        if self.tokenizer is not None and isinstance(p, (list, tuple)):
            text = self.tokenizer.decode(list(p))
        else:
            text = str(p)
        return text if len(text) <= 160 else text[:70] + " ... " + text[-80:]

    def format(self) -> str:
        a, b = self.names
        head = (f"greedy parity {a} vs {b}: {self.num_prompts - len(self.mismatches)}/{self.num_prompts} prompts "
                f"identical, {len(self.failures)} mismatched, {len(self.near_ties)} near ties"
                + (f" (margin < {self.margin_tolerance})" if self.margin_tolerance is not None else ""))
        lines = [head]
        for m in self.mismatches:
            margin = "unknown" if m.margin is None else f"{m.margin:.6g}"
            kind = "near tie" if m.near_tie else "MISMATCH"
            lines.append(f"  [{kind}] prompt {m.prompt_index}: {self._prompt(m.prompt)}")
            lines.append(f"      first differing position {m.position}: {a}={self._tok(m.token_a)} "
                         f"{b}={self._tok(m.token_b)}; logit margin {margin} "
                         f"({a}: {_fmt(m.margin_a)}, {b}: {_fmt(m.margin_b)})")
        return "\n".join(lines)

    __str__ = format


def _fmt(x):
    return "-" if x is None else f"{x:.6g}"


def _normalize(out) -> tuple[list[int], list[float] | None]:
    """Accept a token list, a (tokens, margins) pair, or an object with ``token_ids`` / ``logits_margins``."""
    if hasattr(out, "token_ids"):
        margins = getattr(out, "logits_margins", None)
        return [int(t) for t in out.token_ids], (list(margins) if margins else None)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], (list, tuple)):
        return [int(t) for t in out[0]], (list(out[1]) if out[1] is not None else None)
    return [int(t) for t in out], None


def _at(margins, i):
    return float(margins[i]) if margins is not None and i < len(margins) else None


def compare_outputs(outs_a: Sequence, outs_b: Sequence, prompts: Sequence | None = None, *,
                    names=("a", "b"), tokenizer=None, margin_tolerance: float | None = None) -> ParityReport:
    """Compare two lists of greedy outputs (one per prompt, same order)."""
    if len(outs_a) != len(outs_b):
        raise ValueError(f"parity: {names[0]} returned {len(outs_a)} outputs but {names[1]} returned "
                         f"{len(outs_b)}; both must return one per prompt")
    if margin_tolerance is not None and not (margin_tolerance >= 0 and math.isfinite(margin_tolerance)):
        raise ValueError(f"parity: margin_tolerance={margin_tolerance!r} must be a finite number >= 0")
    report = ParityReport(tuple(names), len(outs_a), 0, margin_tolerance=margin_tolerance, tokenizer=tokenizer)
    for i, (oa, ob) in enumerate(zip(outs_a, outs_b)):
        ta, ma = _normalize(oa)
        tb, mb = _normalize(ob)
        n = min(len(ta), len(tb))
        pos = next((j for j in range(n) if ta[j] != tb[j]), n if len(ta) != len(tb) else None)
        report.num_tokens += len(ta) if pos is None else pos
        if pos is None:
            continue
        m = Mismatch(i, pos, ta[pos] if pos < len(ta) else END, tb[pos] if pos < len(tb) else END,
                     _at(ma, pos), _at(mb, pos), prompts[i] if prompts is not None else None)
        m.near_tie = (margin_tolerance is not None and m.margin is not None and m.margin < margin_tolerance)
        report.mismatches.append(m)
    return report


def compare_greedy(run_a: Callable, run_b: Callable, prompts: Sequence, *, names=("a", "b"), tokenizer=None,
                   margin_tolerance: float | None = None) -> ParityReport:
    """Run both configurations on ``prompts`` (``run_x(prompts) -> list of outputs``) and compare them."""
    prompts = list(prompts)
    return compare_outputs(run_a(prompts), run_b(prompts), prompts, names=names, tokenizer=tokenizer,
                           margin_tolerance=margin_tolerance)


def record_parity(report: ParityReport, recorder, *, model: str | None = None, kvcm_version: str | None = None) -> None:
    """Write one results-store row for a parity result (metric ``greedy_parity``, value = identical fraction)."""
    recorder.record(metric="greedy_parity", value=report.match_rate, passed=report.passed, model=model,
                    kvcm_version=kvcm_version, n=report.num_prompts,
                    extra={"names": list(report.names), "tokens_compared": report.num_tokens,
                           "mismatches": len(report.failures), "near_ties": len(report.near_ties),
                           "margin_tolerance": report.margin_tolerance,
                           "first_positions": [m.position for m in report.mismatches][:16],
                           "margins": [m.margin for m in report.mismatches][:16]})


class GreedyParity:
    """The ``greedy_parity`` fixture's value: call it like ``compare_greedy``; it fails the test on a mismatch
    (near ties under ``margin_tolerance`` excepted) and returns the report otherwise."""

    def __init__(self, request: pytest.FixtureRequest):
        self._request = request
        self.reports: list[ParityReport] = []

    def _recorder(self):
        try:
            return self._request.getfixturevalue("kvcm_results")
        except pytest.FixtureLookupError:
            return None

    def __call__(self, run_a: Callable, run_b: Callable, prompts: Sequence, *, names=("a", "b"), tokenizer=None,
                 margin_tolerance: float | None = None, model: str | None = None,
                 kvcm_version: str | None = None, record: bool = True) -> ParityReport:
        report = compare_greedy(run_a, run_b, prompts, names=names, tokenizer=tokenizer,
                                margin_tolerance=margin_tolerance)
        self.check(report, model=model, kvcm_version=kvcm_version, record=record)
        return report

    def check(self, report: ParityReport, *, model: str | None = None, kvcm_version: str | None = None,
              record: bool = True):
        """Record and assert an already computed report (from ``compare_outputs``). ``record=False`` for a test
        that provokes a mismatch on purpose (a planted bug, to see the fixture fail): the results store holds what
        engines did, and a planted failure there read as a red FAIL row on the dashboard of a green run."""
        self.reports.append(report)
        recorder = self._recorder() if record else None
        if recorder is not None:
            record_parity(report, recorder, model=model, kvcm_version=kvcm_version)
        if report.near_ties:
            self._request.node.user_properties.append(("kvcm:parity_near_ties", len(report.near_ties)))
        if not report.passed:
            pytest.fail(report.format(), pytrace=False)
        return report


@pytest.fixture
def greedy_parity(request: pytest.FixtureRequest) -> GreedyParity:
    """``greedy_parity(run_a, run_b, prompts, names=("v1", "v2"), tokenizer=tok, margin_tolerance=None)``."""
    return GreedyParity(request)
