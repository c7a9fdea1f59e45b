"""Whether speculation has paid so far: a rolling acceptance rate that turns speculation off for good.

The batch cut-off (``spec_cutoff.py``) answers "is the GPU idle enough for a verification to be nearly free";
it cannot answer "does this drafter propose tokens the target keeps". A drafter that is wrong most of the time
loses at every batch: on the H200 the target's first 20 of 30 layers, drafting 4 tokens, kept 0.3 of them a
step and ran at 0.28x plain at batch 1, inside the cut-off. TensorRT-LLM's answer is the speculation gate
(``tensorrt_llm/_torch/speculative/speculation_gate.py``; PR #7283 added it over the acceptance length of
completed requests, PR #12905 moved it to acceptance rates): it records acceptance-rate samples (drafts
accepted / drafts proposed), and the first time the mean of the last ``window`` is below ``threshold`` it
disables speculation permanently. TensorRT-LLM leaves it off by default (``acceptance_rate_window_size`` and
``acceptance_rate_threshold`` unset). Two differences here, both about how soon it can close:

* a sample is one verification (a sequence's step), where upstream's is one iteration's whole batch: the window
  then holds the same evidence, about ``window`` tokens' worth of drafts, at any batch, so at batch 8 a losing
  drafter costs one step rather than ``window``;
* it closes as soon as the rule is certain to close at the end of the first window (:meth:`SpeculationGate.record`).

``LLM`` turns it on, with the threshold the drafter's break-even unless one is given. A verification step with
a drafter whose every draft costs ``c`` target forwards costs about ``1 + D c`` plain steps (at the batches the
cut-off lets through, a verification of ``1 + D`` tokens a row costs about one plain step) and yields
``1 + r D`` tokens a sequence at acceptance rate ``r``: it pays while ``r >= c``. So the default threshold is
the drafter's ``cost_per_draft``: 0 for the n-gram pool (a dictionary lookup; never turned off), the draft
model's share of the target's parameters for a draft model (a decode step reads every weight once, so its time
goes with the parameter count; SmolLM2's 20-layer drafter: 0.74). ``window`` defaults to 8 verifications: that
drafter, keeping about 15% of its drafts, is turned off after 3 (8 (1 - 0.74) = 2.1 slots of the window left to
fill at rate 1 could not lift the mean to 0.74), 3 steps of batch 1 at about 5 plain steps' time each. A longer
window judges a drafter near its break-even on more samples but lets a losing one run longer: with 16 the same
drafter runs 5 verifications. On a 2-core CPU a cold engine's 512 tokens at batch 1 came out at 0.99x plain with
8 and 0.97x with 16; on an H100 at 0.95x and 0.96x in one call (and 0.93x with 16 in another). There the
learning steps were not all of the drafter's cost: its first prefill ran eagerly, 13-17 ms on an H200 against
0.7 ms for the target's replayed one, until it replayed token buckets too (docs/benchmarks.md, "The speculation gate").

The gate lives with the engine across ``generate`` calls (upstream's lives with the executor); a new drafter,
window or threshold, or ``LLM.reset_spec_gate``, starts a new one. Tokens are plain greedy decoding's whether
it is open or closed.
"""
from __future__ import annotations

import logging
import math
from collections import deque

from .. import validation
from ..errors import ConfigError

log = logging.getLogger(__name__)

#: Verifications whose acceptance rates the gate averages (see the module docstring).
DEFAULT_WINDOW = 8


def check_window(value) -> int:
    """``spec_acceptance_window``: an int >= 0 (0: no gate, TensorRT-LLM's default)."""
    return validation.count("spec_acceptance_window", value, 0)


def check_threshold(value) -> float | None:
    """``spec_acceptance_threshold``: None (the drafter's break-even) or an acceptance rate in [0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError("spec_acceptance_threshold", value, "must be None or a number in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise ConfigError("spec_acceptance_threshold", value, "must be in [0, 1] (an acceptance rate: drafts "
                                                              "accepted / drafts proposed)")
    return float(value)


def parameter_share(draft_model, target_model) -> float:
    """A draft model's cost per draft in target forwards: its parameters over the target's (tied weights once
    each), at most 1."""
    def count(m):
        return sum(p.numel() for p in m.parameters())
    return min(1.0, count(draft_model) / max(1, count(target_model)))


class SpeculationGate:
    """A rolling mean of per-verification acceptance rates over ``window`` verifications; closed for good once
    that mean is certain to be below ``threshold`` (see :meth:`record`)."""

    def __init__(self, window: int, threshold: float):
        self.window, self.threshold = window, threshold
        self.rates: deque[float] = deque(maxlen=window)
        self.samples = 0                 # verifications recorded (that proposed a draft)
        self.closed = False
        self.closed_at: int | None = None    # the sample that closed it
        self.mean_at_close: float | None = None   # the mean of the samples in the window then

    @property
    def mean(self) -> float | None:
        return sum(self.rates) / len(self.rates) if self.rates else None

    def record(self, accepted: int, proposed: int) -> bool:
        """One verification: drafts accepted of those proposed. Returns True when it closes the gate.

        Upstream closes when a full window's mean is below the threshold. Counting the slots a first window has
        not filled yet as perfect (rate 1) closes exactly when that rule is certain to close at the window's end,
        and no later: a drafter far below its break-even is turned off after a few verifications instead of a
        window's. Once the window is full the two rules are the same."""
        if self.closed or proposed <= 0:
            return False
        self.rates.append(accepted / proposed)
        self.samples += 1
        if sum(self.rates) + (self.window - len(self.rates)) < self.threshold * self.window:
            self.closed, self.closed_at, self.mean_at_close = True, self.samples, self.mean
            log.info("speculation off for good: acceptance rate %.3f over the last %d verifications is below the "
                     "threshold %.3f (spec_acceptance_window=0 keeps it on)", self.mean, len(self.rates),
                     self.threshold)
            return True
        return False

    def as_dict(self) -> dict:
        return {"window": self.window, "threshold": self.threshold, "samples": self.samples,
                "closed": self.closed, "closed_at": self.closed_at, "mean_at_close": self.mean_at_close}

    def __repr__(self) -> str:
        state = (f"closed at verification {self.closed_at}, mean {self.mean_at_close:.3f}" if self.closed
                 else f"open, {self.samples} verifications")
        return f"SpeculationGate(window={self.window}, threshold={self.threshold:.3f}, {state})"
