"""The explorer's runs: every selected configuration searched once a session, in a pool of processes (one per
core), and one line per configuration in the terminal summary (``... N distinct states ...``).

Under pytest-xdist (``-n 2 --dist loadfile``, as ``.ci/run`` runs the suite) every test of ``test_exhaustive.py``
goes to one worker, which searches every configuration once while the others run the rest of the suite; it hands
its lines to the controller (``workeroutput``), where the root ``conftest.py`` prints them as a plain run does (the
controller collects nothing, so it never loads this file). (``--dist loadgroup`` with
an ``xdist_group`` mark would say the same, but with pytest 9 and xdist 3.8 its tests still spread over workers.)"""

from __future__ import annotations

import contextlib
import multiprocessing
import os

import pytest

import kvcm.policy
from pytest_kvcm.markers import exhaustive_scale

from .configs import QUICK_FLOORS, Config
from .search import Report, search

_REPORTS: dict[Config, Report] = {}
SECONDS_A_STATE = 0.05   # the time budget: 20 times what a state costs on a busy 2-core machine (~2.5 ms)


@contextlib.contextmanager
def _injected(name: str | None):
    """The run's ``--kvcm-inject`` defect, applied again in this process by its name from the catalogue: what a
    worker is sent is the name, never the policy (a defect's replacement is often a lambda). A user's defect,
    not in the built-in catalogue, reaches a forked worker as the parent's active policy."""
    from pytest_kvcm.defects import builtin_defects

    found = next((d for d in builtin_defects() if d.name == name), None) if name else None
    if found is None or not found.replaces:
        yield
        return
    with kvcm.policy.applied(found.policy(kvcm.policy.DEFAULT)):
        yield


def _search(job: tuple[Config, float, str | None]) -> Report:
    """One configuration's search. Whatever it raises comes back as a broken report, never as an exception: a
    worker's exception that cannot be unpickled left ``Pool.map`` waiting for ever (kvcm's errors, before they
    pickled their attributes), and one configuration's error hid every other's result."""
    return searched(*job)


def searched(cfg: Config, scale: float, defect: str | None, first_violation: bool = False) -> Report:
    """``cfg`` searched at ``scale`` of its budget (``budget``) under ``defect`` (a catalogue name, or None), its
    time bounded by ``SECONDS_A_STATE``; ``first_violation`` stops at the first (``catches.py``)."""
    states = budget(cfg, scale)
    with _injected(defect):
        return search(cfg, states, seconds=60 + SECONDS_A_STATE * states, first_violation=first_violation)


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


def injected_name(config) -> str | None:
    """The name of the run's ``--kvcm-inject`` defect, or None."""
    from pytest_kvcm.defects.plugin import INJECTED

    injected = config.stash.get(INJECTED, None)
    return injected[0].name if injected else None


def run_configs(configs: list[Config], scale: float = 1.0, defect: str | None = None) -> dict[Config, Report]:
    """Search the configurations not searched yet this session, at most one process per core, each under
    ``defect`` (a catalogue name, ``injected_name``); ``scale`` multiplies their state budgets."""
    todo = [c for c in configs if c not in _REPORTS]
    if todo:
        _REPORTS.update((r.cfg, r) for r in search_all(todo, scale, defect))
    return {c: _REPORTS[c] for c in configs}


def search_all(configs: list[Config], scale: float = 1.0, defect: str | None = None) -> list[Report]:
    """Each configuration searched once, at most one process per core, none kept for the session's summary."""
    todo = [(c, scale, defect) for c in configs]
    jobs = min(len(todo), os.cpu_count() or 1)
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(_search, todo, chunksize=1)
    return [_search(job) for job in todo]


@pytest.fixture(scope="session")
def exhaustive_reports(request) -> dict[Config, Report]:
    """The reports of every configuration this session selected, searched together on first use."""
    return run_configs(_selected(request.session), exhaustive_scale(request.config),
                       injected_name(request.config))


@pytest.fixture
def default_run_reports(request) -> dict[Config, Report]:
    """Every configuration of the default run searched (those this session did not select too); a broken one
    errors here, in set-up: no count to judge."""
    from .configs import default_configs

    reports = run_configs(default_configs(), exhaustive_scale(request.config),
                          injected_name(request.config))
    broken = [r.line() for r in reports.values() if r.broken]
    if broken:
        raise ExplorerBroken("\n".join(broken))
    return reports


class ExplorerBroken(Exception):
    """A configuration's search could not run (its manager could not be built, or it ran past its time budget)."""


@pytest.fixture
def explorer_report(request, exhaustive_reports) -> Report:
    """This test's configuration's report; a broken search errors here, in set-up, so it is never counted as a
    check that failed (``kvcm sensitivity`` counts failures only)."""
    report = exhaustive_reports[request.node.callspec.params["cfg"]]
    if report.broken:
        raise ExplorerBroken(report.line())
    return report


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
