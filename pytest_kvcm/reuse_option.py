"""``--kvcm-reuse``: run manager tests with block reuse (prefix caching) on, off, or both.

Block reuse is a run dimension like the version: TensorRT-LLM's ``KvCacheConfig`` turns it on by default, so a
capacity answer that holds with reuse off may not hold once cached blocks sit in the pool, and the reverse.
``on`` (the default, as TensorRT-LLM and kvcm's own ``KvCacheConfig``) and ``off`` run each test once with that
mode, its ids unchanged; ``both`` parametrizes every test that takes the ``kvcm_reuse`` fixture (directly or
through ``kvcm_manager_factory``) twice, with ids ``[v2-reuse]`` / ``[v2-noreuse]`` beside the version. Ids stay
as they were unless ``both`` is asked, so durations, waives and defect catchers keyed by node id keep working.

``kvcm_manager_factory`` builds its managers with the instance's mode: reuse off forces
``enable_block_reuse=False`` into the config; reuse on keeps the config's own choice (its default is on). A test
that parametrizes ``kvcm_reuse`` itself keeps its own list.
"""

from __future__ import annotations

import pytest

from .options import REUSE_CHOICES as CHOICES, REUSE_DEFAULT as DEFAULT, choice, parametrized_by_test

IDS = {"on": "reuse", "off": "noreuse"}


def selected_modes(config) -> list[str]:
    mode = choice(config, "kvcm_reuse", CHOICES, DEFAULT)
    return ["on", "off"] if mode == "both" else [mode]


def pytest_configure(config):
    selected_modes(config)      # a bad ini value is a usage error at start-up, not at the first test


def pytest_generate_tests(metafunc):
    if "kvcm_reuse" not in metafunc.fixturenames or parametrized_by_test(metafunc, "kvcm_reuse"):
        return
    modes = selected_modes(metafunc.config)
    if len(modes) > 1:
        metafunc.parametrize("kvcm_reuse", modes, ids=[IDS[m] for m in modes], indirect=True)


def pytest_report_header(config):
    return f"kvcm reuse: {', '.join(selected_modes(config))}"


@pytest.fixture
def kvcm_reuse(request) -> bool:
    """Whether this test instance runs with block reuse on (True) or off (False)."""
    mode = getattr(request, "param", None) or selected_modes(request.config)[0]
    if isinstance(mode, bool):
        return mode
    if mode not in IDS:
        raise pytest.UsageError(f"kvcm_reuse parameter {mode!r}: use 'on', 'off' or a bool")
    return mode == "on"
