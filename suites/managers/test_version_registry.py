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
