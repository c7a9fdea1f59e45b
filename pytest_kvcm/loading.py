"""The plugin reaches every pytest it starts, however it was loaded itself.

Installed, pytest finds the plugin through its ``pytest11`` entry point, in this process and in every inner one
(a ``pytester`` run, an ISOLATION child, a ``sensitivity`` lane run). Only on ``PYTHONPATH`` it comes from
``-p pytest_kvcm.plugin`` (or ``PYTEST_PLUGINS``), which an inner pytest does not see: so then the session
exports ``PYTEST_PLUGINS=pytest_kvcm.plugin`` (pytest reads it in every process) until it ends. The entry point
is named after the module, so ``-p pytest_kvcm.plugin`` on an installed project registers the plugin once.
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest

PLUGIN = "pytest_kvcm.plugin"
ENV = "PYTEST_PLUGINS"
_EXPORTED = pytest.StashKey[tuple]()  # (previous value of PYTEST_PLUGINS,) when this session set it


def installed() -> bool:
    """True when pytest loads the plugin by itself: an installed distribution declares it as a ``pytest11`` entry
    point and ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does not turn entry points off."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == PLUGIN for ep in metadata.entry_points(group="pytest11"))


def plugin_args() -> list[str]:
    """What a pytest command line needs to load the plugin: nothing when installed, else ``-p`` and its name."""
    return [] if installed() else ["-p", PLUGIN]


def _names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def pytest_configure(config: pytest.Config) -> None:
    if installed():
        return
    previous = os.environ.get(ENV)
    if PLUGIN not in _names(previous):
        os.environ[ENV] = ",".join([*_names(previous), PLUGIN])
        config.stash[_EXPORTED] = (previous,)


def pytest_unconfigure(config: pytest.Config) -> None:
    exported = config.stash.get(_EXPORTED, None)
    if exported is None:
        return
    if exported[0] is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = exported[0]
