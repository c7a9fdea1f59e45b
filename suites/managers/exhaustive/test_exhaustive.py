"""The bounded exhaustive explorer of the managers (issue 39): every sequence of engine calls up to a bound, breadth
first, on tiny configurations of V1, V2 and DeepSeek-V4, checked after every call (``search.py`` says what).

The default run searches each configuration of ``default_configs`` up to its state budget; ``--kvcm-slow --kvcm-exhaustive-deep``
adds the deep run (``deep_configs``: ten times the states, three requests at once). A violation fails its
configuration's test with the shortest sequence that reaches it, written as a plain test to paste.
"""

from __future__ import annotations

import pytest

from pytest_kvcm.markers import exhaustive_scale

from .configs import default_configs, deep_configs
from .search import explain

DEFAULT_STATES = 200_000
"""The default run's distinct states, summed over its configurations, must reach this (issue 39)."""

pytestmark = pytest.mark.exhaustive


def _check(report) -> None:
    assert not report.violations, f"{report.line()}\n\n{explain(report)}"
    assert report.states > 1 and report.sequences > report.states, report.line()


@pytest.mark.parametrize("cfg", default_configs(), ids=lambda c: c.name)
def test_explorer_finds_no_violation(cfg, exhaustive_reports):
    _check(exhaustive_reports[cfg])


@pytest.mark.slow
@pytest.mark.parametrize("cfg", deep_configs(), ids=lambda c: f"deep-{c.name}")
def test_deep_explorer_finds_no_violation(cfg, exhaustive_reports):
    _check(exhaustive_reports[cfg])


def test_default_run_reaches_its_states(exhaustive_reports, request):
    """The default configurations together reach DEFAULT_STATES distinct states (all of them are searched when
    this test is selected alone; a --kvcm-exhaustive-scale below 1 lowers the mark with the budgets)."""
    from .conftest import run_configs

    scale = exhaustive_scale(request.config)
    reports = run_configs(default_configs(), scale)
    total = sum(r.states for r in reports.values())
    want = DEFAULT_STATES * min(1.0, scale)
    assert total >= want, f"{total} distinct states in the default run, below {want:.0f}"
