"""The explorer runs under every catalogued defect (issue 55.5). Before, 38 of the 65 could not reach it: a state is
a pickle of the manager's parts, which hold its policy, and a defect's replacement is often a lambda (``Can't
pickle local object 'chunk_trimmed_by_padded_length.<locals>.<lambda>'`` in every configuration, counted as a catch
by ``kvcm sensitivity``); under ``v4-constraints-ignore-pool-ratio`` a DeepSeek-V4 configuration cannot be built,
and the worker's ``BudgetExceededError`` (several arguments: it cannot be unpickled) left ``Pool.map`` waiting for
ever. Now a worker is sent the defect's name and applies it from the catalogue, states keep the policy by reference,
a configuration the defect makes unbuildable is a failed check (``build``), and a search that cannot run (past its
time) comes back as a broken report, which its test raises in set-up."""

from __future__ import annotations

import pickle

import pytest

import kvcm.policy
from pytest_kvcm.defects import builtin_defects

from .configs import CHUNKED, Config, build
from .conftest import search_all
from .search import Explorer, explain, search

pytestmark = pytest.mark.exhaustive

CHUNKED_CFGS = [Config("v2", CHUNKED, 2, 4, "off", ids=True, max_states=400),
                Config("v2", CHUNKED, 2, 5, "copy", ids=True, draft=1, max_states=400)]


def test_every_catalogued_defect_s_states_can_be_kept():
    """Each defect applied, a configuration of each version and layout is built and its state kept and restored."""
    cfgs = [Config("v1", "full+window", 2, 4, "on", ids=True, host=2), Config("v2", "full", 2, 4, "on", ids=True,
            host=2), Config("v2", CHUNKED, 4, 5, "on", ids=True, window=1, window_offset=2),
            Config("dsv4", "dsv4", 128, 4, "copy", ids=True, draft=1)]
    plain_pickle_fails = set()
    for d in builtin_defects():
        with kvcm.policy.applied(d.policy(kvcm.policy.DEFAULT)):
            for cfg in cfgs:
                try:
                    mgr = build(cfg)
                except Exception:  # noqa: BLE001 - a defect may make a configuration unbuildable: not this test's
                    continue
                explorer = Explorer.__new__(Explorer)
                explorer.template = mgr
                restored = explorer.restore(explorer.snapshot(mgr))
                assert restored.policy is mgr.policy, d.name
                try:
                    pickle.dumps((mgr.pools, mgr._reuse), 5)
                except (AttributeError, pickle.PicklingError):
                    plain_pickle_fails.add(d.name)
    assert len(plain_pickle_fails) >= 30, sorted(plain_pickle_fails)   # what the explorer once tripped on


def test_a_lambda_defect_reaches_the_forked_workers_by_name():
    """Nothing applied in this process: only the name sent to the workers puts the defect there, and the chunked
    configurations find the violation its catcher finds."""
    assert kvcm.policy.active() is kvcm.policy.DEFAULT
    reports = search_all(CHUNKED_CFGS, 1.0, "chunk-trimmed-by-padded-length")
    assert not [r.line() for r in reports if r.broken]
    assert any(r.violations for r in reports), [r.line() for r in reports]
    clean = search_all(CHUNKED_CFGS, 1.0, None)
    assert not any(r.violations or r.broken for r in clean), [r.line() for r in clean]


def test_a_configuration_the_defect_cannot_build_is_a_failed_check_not_a_hang():
    """Under ``v4-constraints-ignore-pool-ratio`` a DeepSeek-V4 configuration that the managers build is refused
    (its pools sized without the ratio, a constraint no longer fits): the check that every configuration builds
    fails, kind ``build``, and its test fails as any catch does, never an error in set-up."""
    cfgs = [Config("dsv4", "dsv4", 128, 4, "off", ids=True, max_states=50), CHUNKED_CFGS[0]]
    reports = search_all(cfgs, 1.0, "v4-constraints-ignore-pool-ratio")
    assert not reports[0].broken and [v.kind for v in reports[0].violations] == ["build"], reports[0].line()
    assert "BudgetExceededError: constraint 'longest_decode'" in reports[0].violations[0].message
    assert not reports[1].broken and not reports[1].violations
    assert "building it raised" in explain(reports[0])


def test_a_search_past_its_time_is_broken():
    report = search(CHUNKED_CFGS[0], 400, seconds=0.0)
    assert report.broken and report.broken.startswith("ran past its time budget") and "BROKEN" in report.line()
