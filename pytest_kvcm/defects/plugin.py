"""``--kvcm-inject`` and ``--kvcm-list-defects``: the pytest side of the defect catalogue."""

from __future__ import annotations

import pytest

from . import build_registry


def pytest_addhooks(pluginmanager):
    from .. import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("kvcm")
    group.addoption("--kvcm-inject", metavar="NAME", default=None,
                    help="put one registered historic defect back into kvcm for this run (see --kvcm-list-defects)")
    group.addoption("--kvcm-list-defects", action="store_const", const="text", default=None,
                    help="list the registered defects with their upstream references and exit")
    group.addoption("--kvcm-list-defects-json", dest="kvcm_list_defects", action="store_const", const="json",
                    help="the same as one JSON list (name, story, upstream, catchers), for tools")


def pytest_configure(config):
    registry = build_registry(config.pluginmanager)
    config._kvcm_defects = registry
    name = config.getoption("kvcm_inject")
    if name is not None and not name.strip():  # "--kvcm-inject=" used to run with no defect, silently
        raise pytest.UsageError(f"--kvcm-inject={name!r}: names no defect; give one of the {len(registry)} "
                                "registered (--kvcm-list-defects lists them)")
    if name:
        d = registry[name]
        mp = pytest.MonkeyPatch()
        d.patch(mp)
        config._kvcm_injected = (d, mp)
        config.add_cleanup(mp.undo)


def describe(d) -> str:
    """One line per defect: ``name: story (upstream: ...)``; the name never contains a space."""
    return f"{d.name}: {d.story}" + (f" (upstream: {d.upstream})" if d.upstream else "")


def pytest_cmdline_main(config):
    listing = config.getoption("kvcm_list_defects")
    if listing:
        config._do_configure()
        if listing == "json":
            import json

            print(json.dumps([{"name": d.name, "story": d.story, "upstream": d.upstream, "catchers": list(d.catchers),
                               "targets": list(d.targets)}
                              for d in config._kvcm_defects]))
        else:
            for d in config._kvcm_defects:
                print(describe(d))
        config._ensure_unconfigure()
        return 0
    return None


def pytest_report_header(config):
    injected = getattr(config, "_kvcm_injected", None)
    if injected:
        return f"kvcm: INJECTED DEFECT {describe(injected[0])}"
    return None


@pytest.fixture
def kvcm_injected_defect(request) -> str | None:
    """Name of the defect injected in this run, or None."""
    injected = getattr(request.config, "_kvcm_injected", None)
    return injected[0].name if injected else None
