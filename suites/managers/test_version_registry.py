"""The manager versions are declared once (``kvcm/versions.py``); everything that lists or tells them apart reads it.

A version name compared as a string (``if kvcm_version == "v2"``) is how a third version, or a changed trait,
silently takes the wrong branch; the scan below finds every such compare in the library, the plugin and the
benchmarks (the suites may assert a version, as a test of the plugin must).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvcm
from kvcm import versions
from kvcm.factory import create_kv_cache_manager

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("kvcm", "pytest_kvcm", "benchmarks")


def version_compares(source: str) -> list[int]:
    """Lines of ``source`` that compare a value with a version name (``==``, ``!=``, ``in``, ``not in``)."""
    def names_a_version(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in versions.NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_version(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_a_version(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_compare_of_a_version_name():
    found = version_compares('def f(v):\n    if v == "v2":\n        return 1\n    return v in ("v1", "x")\n')
    assert found == [2, 4]
    assert version_compares('for v in ("v1", "v2"):\n    print(v)\nv = "v2"\n') == []


def test_no_version_name_is_compared_outside_the_registry():
    offenders = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "kvcm" / "versions.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in version_compares(path.read_text())]
    assert not offenders, f"ask a trait of kvcm.versions instead of comparing the name: {offenders}"


@pytest.mark.parametrize("name", versions.NAMES)
def test_the_factory_builds_each_declared_version(name):
    spec = kvcm.ModelSpec.uniform(num_layers=2, num_kv_heads=1, head_dim=8)
    mgr = create_kv_cache_manager(name, spec, kvcm.KvCacheConfig(tokens_per_block=4, max_tokens=64),
                                  kvcm.Limits(2, 32, 32, device="meta"))
    assert type(mgr) is versions.get(name).cls and mgr.kvcm_version == name


def test_one_default_and_every_surface_lists_the_registry():
    from pytest_kvcm import dashboard, versions as option
    from kvcm import plan

    assert versions.DEFAULT in versions.NAMES and versions.ENGINE_DEFAULT in versions.NAMES
    assert option.CHOICES[:len(versions.NAMES)] == versions.NAMES
    assert dashboard.VERSIONS == versions.NAMES
    parser = __import__("argparse").ArgumentParser()
    plan.add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "kvcm_version" and a.option_strings[0] ==
                   "--kvcm-version")
    assert list(choices) == [*versions.NAMES, versions.ALL]


def test_an_unknown_version_is_one_clear_error():
    with pytest.raises(kvcm.ConfigError, match="kvcm_version='v9'.*one of"):
        versions.get("v9")


FACTORIES = ("manager", "pool", "reuse_cache", "eviction", "rules", "host_tier", "events")
WIRING = ("_pool_class", "_cache_class", "_host_tier", "_host_tier_refusal", "_eviction_order",
          "_host_eviction_policies")


def _declared_entries():
    for entry in versions.MANAGERS.values():
        yield entry
        if entry.deepseek_v4 is not None:
            yield entry.deepseek_v4


@pytest.mark.parametrize("entry", list(_declared_entries()), ids=lambda e: f"{e.name}:{e.manager}")
def test_an_entry_carries_the_factories_of_what_its_version_builds(entry):
    """Every factory resolves; the manager, pool, reuse cache, host tier, rules and event queue a manager of the entry
    builds are the entry's, and the manager finds its entry by its class."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(entry)}
    assert names == {"name", "summary", "no_host_tier", "deepseek_v4", *FACTORIES}, "a trait field is back"
    spec = kvcm.DeepseekV4Spec(compress_ratios=(4, 128), head_dim=64, index_head_dim=32) \
        if entry.manager.endswith("DeepseekV4CacheManager") else kvcm.ModelSpec.uniform(2, 1, 8)
    tpb = 128 if isinstance(spec, kvcm.DeepseekV4Spec) else 4
    limits = kvcm.Limits(2, 8 * tpb, 4 * tpb, device="meta")
    mgr = entry.cls(spec, kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=64 * tpb), limits)
    assert versions.of(type(mgr)) is entry and mgr.kvcm_version == entry.name
    assert all(type(pool) is entry.pool_class for pool in mgr.pools)
    assert type(mgr._reuse) is entry.reuse_cache_class and type(mgr._reuse_rules) is entry.reuse_rules
    assert all(type(order) is entry.eviction_order for order in mgr._reuse.orders)
    with_events = entry.cls(spec, kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=64 * tpb,
                                                     event_buffer_max_size=4), limits)
    assert type(with_events._events.queue) is entry.event_queue_class
    if entry.host_tier is not None:
        per_block = sum(g.bytes_per_block for g in mgr.layer_groups)
        tiered = entry.cls(spec, kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=64 * tpb,
                                                    host_cache_size=8 * per_block), limits)
        assert type(tiered._reuse) is entry.host_tier_class


def test_a_subclass_of_a_manager_builds_what_its_base_builds():
    from kvcm.manager_v2 import KVCacheManagerV2

    class Instrumented(KVCacheManagerV2):
        pass

    assert versions.of(Instrumented) is versions.get("v2")
    with pytest.raises(TypeError, match="no manager of kvcm.versions"):
        versions.of(object)


def test_no_class_attribute_wires_a_version_and_no_trait_is_a_string():
    """What a version builds comes from its entry, not from class attributes a subclass sets (``_pool_class``,
    ``_cache_class``, ``_host_tier``, ...), and what it does differently is a method or an attribute of what it
    builds, never a string a caller compares (``draft_budget_split == "one-model draft"``, ``host_tier_kind ==
    "host level"``, as ``draft_budget.py`` and ``plan_host_tier.py`` did)."""
    offenders = []
    for path in sorted((ROOT / "kvcm").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in WIRING or \
                    isinstance(node, ast.Name) and node.id in WIRING:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {getattr(node, 'attr', None) or node.id}")
            if isinstance(node, ast.Compare) and any(isinstance(n, ast.Attribute) and n.attr in _OLD_TRAITS
                                                     for n in (node.left, *node.comparators)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} compares a trait")
    assert not offenders, offenders


_OLD_TRAITS = ("draft_budget_split", "host_tier_kind", "host_tier_modelled")
