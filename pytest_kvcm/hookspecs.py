"""Hooks other plugins (and users' conftest.py files) implement."""

import pytest


@pytest.hookspec
def pytest_kvcm_register_defects(registry):
    """Add historic defects to ``registry`` (a ``pytest_kvcm.defects.DefectRegistry``) with
    ``registry.register(name, story, patch, upstream="...", catchers=(...), replaces={...})``: ``replaces`` names
    the ``kvcm.policy`` decisions it replaces (applied for the run as a policy), ``patch(monkeypatch)`` patches
    what no policy reaches (a user's own adapter) for one run; ``upstream`` names where it was found, ``catchers``
    the tests expected to fail."""


@pytest.hookspec
def pytest_kvcm_register_targets(registry):
    """Add managers under test to ``registry`` (a dict): ``registry["name"] = factory``, where ``factory(spec)``
    takes a ``pytest_kvcm.targets.PoolSpec`` and returns a ``pytest_kvcm.targets.KVCacheTarget``."""
