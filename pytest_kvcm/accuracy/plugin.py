"""Accuracy sub-plugin: ``--kvcm-accuracy={gate,measure,smoke}``, ``--kvcm-gsm8k``, the gate fixtures.

Fixtures:
* ``accuracy_gate(task="gsm8k", model=..., spec={...}, score=..., num_samples=...)``: the verdict, recorded in
  the results store and the JUnit report;
* ``gsm8k(generate_fn, model=..., spec=...)``: runs GSM8K (``--kvcm-gsm8k`` data, else the embedded
  arithmetic set, whose references live in ``gsm8k-arith.yaml``) for the current mode and gates it;
* ``kvcm_accuracy_mode``: the mode string.
Measure mode collects the YAML entries and prints them in the terminal summary (from xdist workers too:
they travel as report properties).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import option_checks
from .gate import MODES, SMOKE_SAMPLES, AccuracyGate
from .gsm8k import EMBEDDED, NUM_FEWSHOT, evaluate_gsm8k, load_gsm8k
from .references import ReferenceError, lookup_reference

MEASURE_PROP = "kvcm:accuracy-entry"
_DATA = pytest.StashKey[dict]()



def accuracy_mode(config: pytest.Config) -> str:
    mode = config.getoption("kvcm_accuracy") or config.getini("kvcm_accuracy") or "gate"
    if mode not in MODES:
        raise pytest.UsageError(f"kvcm_accuracy must be one of {MODES}: got {mode!r}")
    return mode


def reference_dir(config: pytest.Config) -> Path | None:
    opt = config.getoption("kvcm_references")
    if opt:
        return Path(opt)
    local = Path(config.rootpath) / "ci" / "references"
    return local if local.is_dir() else None  # None: the package's checkout (references.default_reference_dir)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    option_checks.check_gsm8k(config)
    option_checks.check_references(config)
    config.stash[_DATA] = {}
    if not hasattr(config, "workerinput"):  # the controller prints; workers only report
        config.pluginmanager.register(_MeasuredEntries(), "kvcm-accuracy-measured")
    accuracy_mode(config)  # fail fast on a bad ini value


@pytest.fixture(scope="session")
def kvcm_accuracy_mode(pytestconfig: pytest.Config) -> str:
    return accuracy_mode(pytestconfig)


@pytest.fixture
def accuracy_gate(request: pytest.FixtureRequest, kvcm_accuracy_mode: str, kvcm_results) -> AccuracyGate:
    node = request.node

    def report(msg: str) -> None:
        node.user_properties.append((MEASURE_PROP, msg))

    return AccuracyGate(kvcm_accuracy_mode, reference_dir=reference_dir(request.config),
                        record=kvcm_results.record, report=report)


class _MeasuredEntries:
    """Collects measure-mode entries from every report (xdist workers' reports included)."""

    def __init__(self) -> None:
        self.entries: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.entries += [value for name, value in report.user_properties if name == MEASURE_PROP]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.entries:
            terminalreporter.section("kvcm accuracy: measured entries to paste")
            for entry in self.entries:
                terminalreporter.write_line(entry)


def _data(config: pytest.Config):
    source = config.getoption("kvcm_gsm8k")
    cache = config.stash[_DATA]
    if source not in cache:
        cache[source] = load_gsm8k(os.path.expanduser(source) if source else None)
    return cache[source]


class GSM8KRunner:
    """``gsm8k(generate_fn, model=..., spec=...)`` -> ``GSM8KResult``, gated in the session's mode."""

    def __init__(self, config: pytest.Config, gate: AccuracyGate):
        self.config, self.gate = config, gate

    @property
    def data(self):
        return _data(self.config)

    @property
    def task(self) -> str:
        return "gsm8k-arith" if self.data.source == EMBEDDED else "gsm8k"

    def num_samples(self, model: str, spec=None) -> int | None:
        """How many questions: smoke 16; else ``--kvcm-gsm8k-limit``, else the reference's num_samples."""
        limit = self.config.getoption("kvcm_gsm8k_limit")
        if self.gate.mode == "smoke":
            return min(SMOKE_SAMPLES, limit) if limit else SMOKE_SAMPLES
        if limit:
            return limit
        try:
            return lookup_reference(self.task, model, spec, reference_dir=self.gate.reference_dir).stats.get(
                "num_samples")
        except ReferenceError:
            return None

    def skip_if_undecidable(self, model: str, spec=None) -> None:
        """Skip before generating when no score on the planned questions could fail the gate: minutes of model
        time would end in "cannot decide" (measure mode still runs: it records the score and the entry)."""
        if self.gate.mode == "measure":
            return
        size = len(self.data.test)
        n = min(self.num_samples(model, spec) or size, size)
        out = self.gate.evaluate(self.task, model=model, score=float("nan"), num_samples=n, spec=spec)  # no score yet
        if not out.decided:
            short = (f"; the data set has {size:,} questions, fewer than the {out.min_samples:,} needed"
                     if out.min_samples and out.min_samples > size else "")
            pytest.skip(f"before running: {out.message()}{short}")

    def __call__(self, generate_fn, *, model: str, spec=None, kvcm_version: str | None = None,
                 num_fewshot: int = NUM_FEWSHOT, batch_size: int = 16, chat_tokenizer=None,
                 max_new_tokens: int = 256):
        __tracebackhide__ = True
        data = self.data
        self.skip_if_undecidable(model, spec)
        result = evaluate_gsm8k(generate_fn, data, num_fewshot=num_fewshot, max_new_tokens=max_new_tokens,
                                limit=self.num_samples(model, spec), batch_size=batch_size,
                                chat_tokenizer=chat_tokenizer)
        self.gate(self.task, model=model, spec=spec, score=result.score, num_samples=result.num_samples,
                  kvcm_version=kvcm_version,
                  extra={"strict": result.strict, "flexible": result.flexible, "num_fewshot": num_fewshot,
                         "dataset": data.source, "chat_template": chat_tokenizer is not None})
        return result


@pytest.fixture
def gsm8k(request: pytest.FixtureRequest, accuracy_gate: AccuracyGate) -> GSM8KRunner:
    return GSM8KRunner(request.config, accuracy_gate)
