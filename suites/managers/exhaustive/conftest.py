"""The explorer's runs: every selected configuration searched once a session, in a pool of processes (one per
core), and one line per configuration in the terminal summary (``... N distinct states ...``)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from .configs import Config
from .search import Explorer, Report

_REPORTS: dict[Config, Report] = {}


def _search(job: tuple[Config, float]) -> Report:
    cfg, scale = job
    return Explorer(cfg).run(max(2, round(cfg.max_states * scale)))


def pytest_collection_modifyitems(config, items):
    """The deep run only when asked for by name: it is tens of minutes on a CPU, too long for the slow set that
    CI runs (``-m slow``)."""
    if config.getoption("kvcm_exhaustive_deep"):
        return
    skip = pytest.mark.skip(reason="the explorer's deep run (tens of minutes on a CPU): --kvcm-exhaustive-deep runs it")
    for item in items:      # every collected item passes here, README code blocks (no ``originalname``) too
        if getattr(item, "originalname", None) == "test_deep_explorer_finds_no_violation":
            item.add_marker(skip)


def _selected(session) -> list[Config]:
    out = []
    for item in session.items:
        if item.get_closest_marker("skip") is not None:     # the deep run without --kvcm-slow or --kvcm-exhaustive-deep
            continue
        callspec = getattr(item, "callspec", None)
        cfg = callspec.params.get("cfg") if callspec else None
        if isinstance(cfg, Config) and cfg not in out:
            out.append(cfg)
    return out


def run_configs(configs: list[Config], scale: float = 1.0) -> dict[Config, Report]:
    """Search the configurations not searched yet this session, at most one process per core (forked, so a
    defect injected by ``--kvcm-inject`` is in every one of them); ``scale`` multiplies their state budgets."""
    todo = [(c, scale) for c in configs if c not in _REPORTS]
    if todo:
        jobs = min(len(todo), os.cpu_count() or 1)
        if jobs > 1:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                reports = pool.map(_search, todo, chunksize=1)
        else:
            reports = [_search(job) for job in todo]
        _REPORTS.update((r.cfg, r) for r in reports)
    return {c: _REPORTS[c] for c in configs}


@pytest.fixture(scope="session")
def exhaustive_reports(request) -> dict[Config, Report]:
    """The reports of every configuration this session selected, searched together on first use."""
    return run_configs(_selected(request.session), request.config.getoption("kvcm_exhaustive_scale"))


def pytest_terminal_summary(terminalreporter):
    if not _REPORTS:
        return
    terminalreporter.section("exhaustive explorer")
    for report in _REPORTS.values():
        terminalreporter.write_line(report.line())
    total = sum(r.states for r in _REPORTS.values())
    seconds = sum(r.seconds for r in _REPORTS.values())
    cpu = sum(r.cpu_seconds for r in _REPORTS.values())
    terminalreporter.write_line(f"exhaustive: {len(_REPORTS)} configurations, {total} distinct states, "
                                f"{sum(len(r.violations) for r in _REPORTS.values())} violations, {seconds:.0f} s "
                                f"of search ({cpu:.0f} s CPU) over {min(len(_REPORTS), os.cpu_count() or 1)} processes")
