"""The explorer's runs: every selected configuration searched once a session, in a pool of processes (one per
core), and one line per configuration in the terminal summary (``... N distinct states ...``).

Under pytest-xdist (``-n 2 --dist loadfile``, as ``.ci/run`` runs the suite) every test of ``test_exhaustive.py``
goes to one worker, which searches every configuration once while the others run the rest of the suite; it hands
its lines to the controller (``workeroutput``), where the root ``conftest.py`` prints them as a plain run does (the
controller collects nothing, so it never loads this file). (``--dist loadgroup`` with
an ``xdist_group`` mark would say the same, but with pytest 9 and xdist 3.8 its tests still spread over workers.)"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from pytest_kvcm.markers import exhaustive_scale

from .configs import QUICK_FLOORS, Config
from .search import Explorer, Report

_REPORTS: dict[Config, Report] = {}


def _search(job: tuple[Config, float]) -> Report:
    cfg, scale = job
    return Explorer(cfg).run(budget(cfg, scale))


def budget(cfg: Config, scale: float) -> int:
    """The states a configuration's search may reach: its budget times ``scale``, but below scale 1 (the pre-merge
    quick form) never fewer than the floor that reaches the registered defects it is named to catch
    (``configs.QUICK_FLOORS``), so ``kvcm sensitivity`` sees them caught at any scale."""
    states = max(2, round(cfg.max_states * scale))
    if scale < 1:
        states = max(states, min(QUICK_FLOORS.get(cfg.name, 0), cfg.max_states))
    return states


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
    return run_configs(_selected(request.session), exhaustive_scale(request.config))


def _lines() -> list[str]:
    reports = list(_REPORTS.values())
    if not reports:
        return []
    return [r.line() for r in reports] + [
        f"exhaustive: {len(reports)} configurations, {sum(r.states for r in reports)} distinct states, "
        f"{sum(len(r.violations) for r in reports)} violations, {sum(r.seconds for r in reports):.0f} s of search "
        f"({sum(r.cpu_seconds for r in reports):.0f} s CPU) over {min(len(reports), os.cpu_count() or 1)} processes"]


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)      # set on an xdist worker only
    if workeroutput is not None and _REPORTS:      # the root conftest prints it on the controller
        workeroutput.setdefault("kvcm_sections", {})["exhaustive explorer"] = _lines()


def pytest_terminal_summary(terminalreporter):
    lines = _lines()
    if lines:
        terminalreporter.section("exhaustive explorer")
        for line in lines:
            terminalreporter.write_line(line)
