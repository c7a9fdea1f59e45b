"""``--kvcm-version``: run every manager test once per KV cache manager version.

A test that asks for the ``kvcm_version`` fixture (directly or through ``kvcm_manager_factory``) is
parametrized with ids ``[v1]`` / ``[v2]`` under ``both``. ``@pytest.mark.kvcm_versions("v2")`` narrows a test;
when the run excludes every version a test allows, the test is deselected (with the reason in the summary),
not failed. ``auto`` runs each test once with the version the model declares (V1 where none is declared):
``kvcm_manager_factory`` asks kvcm per model, and the ``kvcm_version`` fixture is always a concrete version
(``v1``/``v2``), the one ``auto`` picks for a model with no preference, so no test maps ``auto`` itself.
A test that parametrizes ``kvcm_version`` itself (``@pytest.mark.parametrize("kvcm_version", kvcm.versions.NAMES)``:
a comparison that needs both whatever the run) keeps its own list.
"""

from __future__ import annotations

import pytest

from kvcm import versions as registry
from kvcm.deprecation import renamed_attribute

from .options import VERSION_CHOICES as CHOICES, VERSION_DEFAULT, choice, parametrized_by_test

_EXCLUDED = "excluded"
# (summary line, [(node id, versions it allows)]) of the tests this run's versions deselected
DESELECTED = pytest.StashKey[tuple]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    selected_versions(config)   # a bad --kvcm-version / ini value stops the run when pytest starts


def selected_versions(config) -> list[str]:
    return registry.selected(choice(config, "kvcm_version", CHOICES, VERSION_DEFAULT))


def _allowed(metafunc_or_item) -> list[str] | None:
    marker = metafunc_or_item.get_closest_marker("kvcm_versions") if hasattr(
        metafunc_or_item, "get_closest_marker") else metafunc_or_item.definition.get_closest_marker("kvcm_versions")
    return None if marker is None else list(marker.args)


def pytest_generate_tests(metafunc):
    if "kvcm_version" not in metafunc.fixturenames or parametrized_by_test(metafunc, "kvcm_version"):
        return
    run = selected_versions(metafunc.config)
    allowed = _allowed(metafunc)
    if allowed is None:
        versions = run
    elif run == [registry.AUTO]:
        versions = allowed
    else:
        versions = [v for v in run if v in allowed]
    if not versions:
        metafunc.parametrize("kvcm_version", [_EXCLUDED], ids=[_EXCLUDED], indirect=True)
        return
    metafunc.parametrize("kvcm_version", versions, ids=versions, indirect=True)


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is not None and spec.params.get("kvcm_version") == _EXCLUDED:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        run = ", ".join(selected_versions(config))
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        config.stash[DESELECTED] = (f"{len(drop)} test(s) need a kvcm version this run ({run}) excludes",
                                    [(i.nodeid.removesuffix(f"[{_EXCLUDED}]"), _allowed(i)) for i in drop])


def pytest_report_header(config):
    return f"kvcm versions: {', '.join(selected_versions(config))}"


def pytest_terminal_summary(terminalreporter, config):
    if DESELECTED in config.stash:
        reason, deselected = config.stash[DESELECTED]
        terminalreporter.write_line(f"kvcm: deselected {reason}:")
        for nodeid, allowed in deselected:
            terminalreporter.write_line(f"  {nodeid} runs only on {', '.join(allowed)}")


def _requested(request) -> str:
    return getattr(request, "param", None) or selected_versions(request.config)[0]


@pytest.fixture
def kvcm_version(request) -> str:
    """The manager version this test instance runs with: 'v1' or 'v2' (``auto`` resolved as kvcm resolves it
    for a model that declares no preference)."""
    requested = _requested(request)
    return registry.DEFAULT if requested == registry.AUTO else requested


class ManagerFactory:
    """Builds managers of the test's version; ``managers`` keeps every one made, for assertions after the fact.
    Under ``auto`` each manager gets the version its model declares (``requested`` stays ``auto``)."""

    version = renamed_attribute("kvcm_version")

    def __init__(self, kvcm_version: str, requested: str | None = None, reuse: bool = True):
        self.kvcm_version = kvcm_version
        self.requested = requested or kvcm_version
        self.reuse = reuse
        self.managers = []

    def __call__(self, model, kv_cache_config=None, limits=None, **kwargs):
        import kvcm

        if not self.reuse:      # --kvcm-reuse: off forces reuse off; on keeps the config's own choice
            kv_cache_config = (kv_cache_config or _default_config(model)).replace(enable_block_reuse=False)
        manager = kvcm.create_kv_cache_manager(self.requested, model, kv_cache_config, limits, **kwargs)
        self.managers.append(manager)
        return manager


def _default_config(model):
    """The config a manager builds when given none (DeepSeek-V4's pages are 128 tokens)."""
    from kvcm import KvCacheConfig
    from kvcm.deepseek_v4 import DeepseekV4Spec

    return KvCacheConfig(tokens_per_block=128) if isinstance(model, DeepseekV4Spec) else KvCacheConfig()


@pytest.fixture
def kvcm_manager_factory(request, kvcm_version, kvcm_reuse) -> ManagerFactory:
    """``kvcm_manager_factory(model_spec, kv_cache_config, limits)`` (or the limits as keywords:
    ``max_batch_size=..., max_seq_len=..., ...``); reuse as the run's ``--kvcm-reuse`` says."""
    auto = selected_versions(request.config) == [registry.AUTO] and _allowed(request.node) is None
    return ManagerFactory(kvcm_version, registry.AUTO if auto else kvcm_version, kvcm_reuse)
