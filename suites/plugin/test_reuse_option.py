"""--kvcm-reuse: reuse on and off as a run dimension (ids, fixture, ini, the factory's managers), and the
page-boundary check with a cached prefix held."""

import pytest

import kvcm
import kvcm.policy
from kvcm.config import KvCacheConfig
from pytest_kvcm.page_boundary import check_page_boundary
from kvcm.versions import NAMES as ALL_VERSIONS

pytestmark = pytest.mark.cpu_only

TESTS = """
import kvcm
import kvcm.policy

def test_mode(kvcm_reuse):
    assert kvcm_reuse in (True, False)

def test_factory(kvcm_manager_factory, kvcm_reuse):
    m = kvcm_manager_factory(kvcm.ModelSpec.uniform(2, 2, 8), kvcm.KvCacheConfig(max_tokens=64),
                             max_batch_size=2, max_seq_len=64)
    assert m.enable_block_reuse is kvcm_reuse

def test_factory_without_config(kvcm_manager_factory, kvcm_reuse):
    m = kvcm_manager_factory(kvcm.ModelSpec.uniform(2, 2, 8), max_batch_size=2, max_seq_len=64,
                             free_memory_bytes=1 << 20, device="meta")
    assert m.enable_block_reuse is kvcm_reuse

def test_plain():
    pass
"""


def collected(pytester, *args):
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess("--collect-only", "-q", *args)
    return [line for line in result.outlines if "::" in line], result


def test_both_gives_reuse_and_noreuse_ids_beside_the_version(pytester):
    ids, _ = collected(pytester, "--kvcm-reuse=both", "--kvcm-version=both")
    for v in ALL_VERSIONS:
        assert f"test_user.py::test_factory[{v}-reuse]" in ids and f"test_user.py::test_factory[{v}-noreuse]" in ids
    assert "test_user.py::test_mode[reuse]" in ids and "test_user.py::test_mode[noreuse]" in ids
    assert "test_user.py::test_plain" in ids


def test_one_mode_keeps_the_ids(pytester):
    ids, _ = collected(pytester, "--kvcm-reuse=off", "--kvcm-version=v2")
    assert "test_user.py::test_factory[v2]" in ids and "test_user.py::test_mode" in ids


@pytest.mark.parametrize("mode", ["on", "off", "both"])
def test_every_mode_runs_green_with_the_factory_honouring_it(pytester, mode):
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess(f"--kvcm-reuse={mode}", "--kvcm-version=both")
    per = 2 if mode == "both" else 1
    result.assert_outcomes(passed=per + 2 * 2 * per + 1)
    result.stdout.fnmatch_lines([f"kvcm reuse: {'on, off' if mode == 'both' else mode}"])


def test_ini_default_and_bad_value(pytester):
    pytester.makeini("[pytest]\nkvcm_reuse = off\n")
    pytester.makepyfile(test_user=TESTS + "\ndef test_off(kvcm_reuse):\n    assert kvcm_reuse is False\n")
    pytester.runpytest_inprocess("-q").assert_outcomes(passed=5)
    pytester.makeini("[pytest]\nkvcm_reuse = sometimes\n")
    result = pytester.runpytest_inprocess("-q")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*kvcm_reuse='sometimes' is invalid*on, off, both*"])


def test_default_is_on_as_tensorrt_llm(pytester):
    pytester.makepyfile(test_user="def test_on(kvcm_reuse):\n    assert kvcm_reuse is True\n")
    pytester.runpytest_inprocess("-q").assert_outcomes(passed=1)


# ---- the page-boundary check with a cached prefix held ---------------------------------------------------------
def _spec():
    return kvcm.ModelSpec.uniform(2, 2, 8)


@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize("warm_blocks", [3, 12])
def test_page_boundary_with_a_cached_prefix(version, warm_blocks):
    """32 blocks of 32 tokens; a warm request leaves ``warm_blocks`` (V2: plus its one-token partial block) cached:
    the boundary is still the whole pool less the shorts, and the long dummy evicts every cached block."""
    def make(draft_len):
        return kvcm.create_kv_cache_manager(version, _spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4,
                                            max_seq_len=8192, max_draft_len=draft_len, device="meta")

    results = check_page_boundary(make, draft_lens=(0, 4), batch_sizes=(1, 2, 3), cached_prefix_blocks=warm_blocks)
    for r in results:
        assert r.cached_before >= warm_blocks and r.cached_after == 0
        assert r.boundary == (32 - (r.batch_size - 1)) * 32 and r.capacity_held == r.boundary


def test_page_boundary_with_a_cached_prefix_catches_cached_blocks_counted_twice():
    """The check fails when cached blocks are counted as free twice (SGLang #35270's shape): the boundary it
    is told is past the pool, and the long dummy does not fit."""
    class CountsCachedTwice(kvcm.KVCacheManagerV2):
        def get_num_free_blocks(self):
            return min(p.num_free + 2 * p.num_reusable for p in self.pools)

    def make(draft_len):
        return CountsCachedTwice(_spec(), KvCacheConfig(max_tokens=1024), max_batch_size=4, max_seq_len=8192,
                                 max_draft_len=draft_len, device="meta")

    with pytest.raises(AssertionError, match="cached blocks"):
        check_page_boundary(make, draft_lens=(0,), batch_sizes=(1,), cached_prefix_blocks=3)
    check_page_boundary(make, draft_lens=(0,), batch_sizes=(1,))     # without a cached prefix it cannot see it


def test_page_boundary_with_a_cached_prefix_needs_reuse_on():
    def make(draft_len):
        return kvcm.KVCacheManagerV2(_spec(), KvCacheConfig(max_tokens=1024, enable_block_reuse=False),
                                     max_batch_size=4, max_seq_len=8192, device="meta")

    with pytest.raises(AssertionError, match="no block reuse"):
        check_page_boundary(make, draft_lens=(0,), batch_sizes=(1,), cached_prefix_blocks=2)
