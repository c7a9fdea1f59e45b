"""``--kvcm-target``: run the contract suites once per manager under test."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_kvcm.reuse_option import selected_modes

from .adapter_check import check_registered
from .contract import TargetUnavailable
from .differences import in_force, relaxations, summary
from .registry import BUILTIN_TARGETS, build_target_registry

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A relaxed test that fails says which declared keys were in force and what it expected with and without
    them (a bare ``assert 48 == 32`` did not), in a section of its failure."""
    report = yield
    if report.failed and relaxations(item.user_properties):
        report.sections.append(("kvcm declared differences in force", in_force(item.user_properties)))
    return report


_HEADINGS = {"passed": "relaxed and passed: each relaxed check held as the key declares",
             "failed": "relaxed and FAILED: the failure names the keys in force (a key that does not describe the "
                       "manager, or a bug)",
             "skipped": "skipped: the test cannot run at all under the key (the reason after 'skipped')"}


def pytest_terminal_summary(terminalreporter):
    """Every test a declared difference relaxed or skipped, by outcome: a green run says what it did not check."""
    reports = [r for group in terminalreporter.stats.values() for r in group if hasattr(r, "nodeid")]
    groups = summary(reports)
    counts = {kind: len({i for ids in by.values() for i in ids}) for kind, by in groups.items()}
    if not any(counts.values()):
        return
    terminalreporter.section(f"kvcm declared differences: {counts['passed']} test(s) relaxed and passed, "
                             f"{counts['failed']} relaxed and failed, {counts['skipped']} skipped")
    for kind, by in groups.items():
        if not by:
            continue
        terminalreporter.write_line(f"{_HEADINGS[kind]}:")
        for entry, ids in by.items():
            terminalreporter.write_line(f"  {entry} ({len(ids)} test(s))")
            for nodeid in ids:
                terminalreporter.write_line(f"      {nodeid}")


@pytest.fixture
def kvcm_target_name(request) -> str:
    return request.param


@pytest.fixture
def kvcm_target(request, kvcm_target_name, kvcm_reuse):
    """``kvcm_target(PoolSpec(...))`` builds a fresh manager of this test's target; skips with the install hint
    when the engine is missing.

    ``--kvcm-reuse`` applies here as everywhere: with reuse on (the default) a target that has block reuse is
    built with it on for every test, so the allocation contract is checked on a pool that caches, as engines
    run by default; with it off the block-reuse tests skip and every pool is built without reuse; ``both`` runs
    each test twice (ids ``[<target>-reuse]`` / ``[<target>-noreuse]``), the reuse instance only where the target
    has reuse."""
    factory = request.config.stash[TARGETS][kvcm_target_name]

    def build(spec):
        try:
            target = factory(spec)
        except TargetUnavailable as exc:
            pytest.skip(f"target {kvcm_target_name}: {exc}")
        target._kvcm_node = request.node  # where differs() records what a declared difference relaxed
        return target

    def make(spec):
        if spec.reuse and not kvcm_reuse:
            pytest.skip("block reuse is off in this run (--kvcm-reuse=off, or the noreuse instance of both)")
        target = build(spec)
        if kvcm_reuse and not spec.reuse:
            if getattr(target, "supports_reuse", False) is True:
                return build(dataclasses.replace(spec, reuse=True))
            if len(selected_modes(request.config)) > 1:
                pytest.skip(f"target {kvcm_target_name} has no block reuse: its noreuse instance runs this test")
        return target

    make.name = kvcm_target_name
    return make
