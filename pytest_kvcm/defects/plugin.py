"""``--kvcm-inject`` and ``--kvcm-list-defects``: the pytest side of the defect catalogue (options: options.py).

``--kvcm-inject=NAME`` enters ``kvcm.policy.applied(defect.policy())`` for the run, so every manager, cache and
engine built with ``policy=None`` takes the defect's decisions (a forked process, as the exhaustive explorer's, too);
a user's defect with a ``patch(monkeypatch)`` is patched as well. Both are undone in a config cleanup. The run's
catalogue and the injected defect live in ``config.stash`` under this module's keys."""

from __future__ import annotations

import pytest

import kvcm.policy

from . import build_registry

DEFECTS = pytest.StashKey["DefectRegistry"]()   # name -> Defect, the run's catalogue (built-in and users' hooks)
INJECTED = pytest.StashKey[tuple]()              # (Defect, MonkeyPatch or None) of --kvcm-inject


def pytest_addhooks(pluginmanager):
    from .. import hookspecs

    pluginmanager.add_hookspecs(hookspecs)



def pytest_configure(config):
    registry = build_registry(config.pluginmanager)
    config.stash[DEFECTS] = registry
    name = config.getoption("kvcm_inject")
    if name is not None and not name.strip():  # "--kvcm-inject=" used to run with no defect, silently
        raise pytest.UsageError(f"--kvcm-inject={name!r}: names no defect; give one of the {len(registry)} "
                                "registered (--kvcm-list-defects lists them)")
    if name:
        d = registry[name]
        mp = None
        if d.replaces:
            applied = kvcm.policy.applied(d.policy())
            applied.__enter__()
            config.add_cleanup(lambda: applied.__exit__(None, None, None))
        if d.patch is not None:
            mp = pytest.MonkeyPatch()
            config.add_cleanup(mp.undo)
            try:
                d.patch(mp)
            except Exception as exc:       # a user's code: named, and what it patched is undone at cleanup
                raise pytest.UsageError(f"--kvcm-inject={name}: the defect's patch raised {type(exc).__name__}: "
                                        f"{exc}") from exc
        config.stash[INJECTED] = (d, mp)


def describe(d) -> str:
    """One line per defect: ``name: story (upstream: ...)``; the name never contains a space."""
    return f"{d.name}: {d.story}" + (f" (upstream: {d.upstream})" if d.upstream else "")


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    """``--kvcm-list-defects``: the run is configured (every option checked, users' hooks registered), so the
    listing replaces collection and nothing runs; the terminal writer, not ``print``, since collection's output
    is captured."""
    listing = session.config.getoption("kvcm_list_defects")
    if not listing:
        return None
    registry, write = session.config.stash[DEFECTS], session.config.get_terminal_writer().line
    if listing == "json":
        import json

        write(json.dumps([{"name": d.name, "story": d.story, "upstream": d.upstream, "catchers": list(d.catchers),
                           "targets": list(d.targets)} for d in registry]))
    else:
        for d in registry:
            write(describe(d))
    return True


def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("kvcm_list_defects") and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK     # a listing is a success, not an empty run


def pytest_report_header(config):
    injected = config.stash.get(INJECTED, None)
    if injected:
        return f"kvcm: INJECTED DEFECT {describe(injected[0])}"
    return None


@pytest.fixture
def kvcm_injected_defect(request) -> str | None:
    """Name of the defect injected in this run, or None."""
    injected = request.config.stash.get(INJECTED, None)
    return injected[0].name if injected else None
