"""--kvcm-target: the README's adapter passes the contract suites, a leaking one fails them, bad names are a
usage error, and a target whose engine is missing skips with its install hint."""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[2]


def readme_adapter() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("from pytest_kvcm.targets import KVCacheTarget\n\n\nclass MyTarget")
    return text[start:text.index("```", start)]


README_ADAPTER_LEAK = '''

def pytest_kvcm_register_defects(registry):
    def leak(mp):
        mp.setattr(MyTarget, "_free", lambda self, rid: self.tables.pop(rid))  # pages never return

    registry.register("my-leak", "freed pages never return to the free list", leak, upstream="README adapter",
                      catchers=("pytest_kvcm.contract.test_target_lifecycle",), targets=("mine",))
'''
"""A maintainer's defect for the README adapter, appended to its conftest: freed pages never come back."""


def _suites(*names):
    """The shipped contract modules, named as a user names them (``--pyargs``), not copied."""
    return ["--pyargs", *(f"pytest_kvcm.contract.{name.removesuffix('.py')}" for name in names)]


def test_readme_adapter_passes_the_contract_suites(pytester):
    pytester.makeconftest(readme_adapter())
    suites = _suites("test_target_page_boundary.py", "test_target_lifecycle.py", "test_target_max_model_len.py",
                     "test_target_sliding_window.py", "test_target_state_machine.py")
    result = pytester.runpytest_subprocess("--kvcm-target=mine", "-p", "no:randomly", *suites)
    result.assert_outcomes(passed=13, skipped=2)


def test_a_leaking_adapter_fails_the_leak_and_batch_checks(pytester):
    pytester.makeconftest(readme_adapter().replace("self.free_ids += self.tables.pop(rid)",
                                                   "self.tables.pop(rid)  # pages never return"))
    result = pytester.runpytest_subprocess("--kvcm-target=mine", "-p", "no:randomly", *_suites("test_target_lifecycle.py"))
    result.stdout.fnmatch_lines(["*pages leaked*", "*pages left behind by the batch*"])
    result.assert_outcomes(failed=2, passed=1)
    assert result.ret != 0


def test_unknown_target_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x(kvcm_target): pass")
    result = pytester.runpytest_subprocess("--kvcm-target=kvcm-v2,vlm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown target(s) vlm; registered: kvcm-v1, kvcm-v2*"])


def test_missing_engine_skips_with_its_install_hint(pytester):
    pytester.makeconftest("""
from pytest_kvcm.targets import TargetUnavailable

def pytest_kvcm_register_targets(registry):
    def absent(spec):
        raise TargetUnavailable("pip install absent-engine")
    registry["absent"] = absent
""")
    pytester.makepyfile("""
from pytest_kvcm.targets import PoolSpec

def test_x(kvcm_target):
    kvcm_target(PoolSpec(num_pages=4))
""")
    result = pytester.runpytest_subprocess("--kvcm-target=absent", "-ra")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*target absent: pip install absent-engine*"])


def test_pool_for_max_model_len_counts_reserved_pages():
    """vLLM PR #47272: a pool of exactly ceil(max_model_len / block_size) blocks passed the startup check and
    hung, one block short: the null block is not a page any request gets."""
    from pytest_kvcm.targets import contract

    assert contract.pages_for_max_model_len(5 * 16 + 3, 16, reserved_pages=0) == 6
    assert contract.pages_for_max_model_len(5 * 16 + 3, 16, reserved_pages=1) == 7
    assert contract.pages_for_max_model_len(6 * 16, 16, reserved_pages=1) == 7


def test_hf_target_with_neither_allocator_api_is_unavailable_naming_the_version(monkeypatch):
    """The ``hf`` target drives 5.17's block pool or the sector pool of 5.18 and later; a release with neither
    (here: the sector pool's module hidden, and 5.17's scheduler method absent from this release) is a skip that
    names the version installed and the one needed, not a TypeError from the first constructor call."""
    transformers = pytest.importorskip("transformers")
    from pytest_kvcm.targets import PoolSpec, TargetUnavailable
    from pytest_kvcm.targets.hf_target import hf_paged_target

    monkeypatch.setitem(sys.modules, "transformers.generation.continuous_batching.cache_allocators.cache_pool", None)
    monkeypatch.setitem(sys.modules, "transformers.generation.continuous_batching.scheduler", None)
    with pytest.raises(TargetUnavailable) as caught:
        hf_paged_target(PoolSpec(num_pages=4))
    assert "transformers 5.17 or later" in str(caught.value)
    assert f"transformers {transformers.__version__} is installed" in str(caught.value)