"""``--kvcm-target``: run the contract suites once per manager under test."""

from __future__ import annotations

import pytest

from .adapter_check import check_registered
from .contract import TargetUnavailable
from .registry import BUILTIN_TARGETS, build_target_registry

from ..options import TARGETS_DEFAULT as DEFAULT

TARGETS = pytest.StashKey[dict]()   # name -> target factory: the run's registry (built-in and users' hooks)


def selected_targets(config) -> list[str]:
    """The names ``--kvcm-target`` (else ini ``kvcm_target``) gives, in order, each once; ``all`` anywhere in the
    list is every registered target. Given but empty (``--kvcm-target=``, ``kvcm_target =``) is a usage error, not
    the default."""
    registry = config.stash[TARGETS]
    raw, source = config.getoption("kvcm_target"), "--kvcm-target"
    if raw is None:
        raw, source = config.getini("kvcm_target"), "ini kvcm_target"
    given = [n.strip() for n in raw.split(",")]
    if not any(given):
        raise pytest.UsageError(f"{source}={raw!r}: names no target; give one or more of {', '.join(registry)} "
                                "(comma-separated), or 'all'")
    if "" in given:
        raise pytest.UsageError(f"{source}={raw!r}: an empty name between commas")
    names = list(registry) if "all" in given else list(dict.fromkeys(given))
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise pytest.UsageError(f"{source}={raw!r}: unknown target(s) {', '.join(unknown)}; "
                                f"registered: {', '.join(registry)}")
    return names


def pytest_configure(config):
    config.stash[TARGETS] = build_target_registry(config.pluginmanager)
    # a bad name, or a user's adapter that lacks a method or returns the wrong type, is a usage error before collection
    check_registered(config.stash[TARGETS], selected_targets(config), BUILTIN_TARGETS)


def pytest_generate_tests(metafunc):
    if "kvcm_target" in metafunc.fixturenames:
        names = selected_targets(metafunc.config)
        metafunc.parametrize("kvcm_target_name", names, ids=names, scope="function")


def pytest_report_header(config):
    return f"kvcm targets: {', '.join(selected_targets(config))}"


@pytest.fixture
def kvcm_target_name(request) -> str:
    return request.param


@pytest.fixture
def kvcm_target(request, kvcm_target_name):
    """``kvcm_target(PoolSpec(...))`` builds a fresh manager of this test's target; skips with the install hint
    when the engine is missing."""
    factory = request.config.stash[TARGETS][kvcm_target_name]

    def make(spec):
        try:
            return factory(spec)
        except TargetUnavailable as exc:
            pytest.skip(f"target {kvcm_target_name}: {exc}")

    make.name = kvcm_target_name
    return make
