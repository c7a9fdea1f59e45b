"""--kvcm-inject: each registered defect really changes kvcm for the run, and users can register their own
(the catalogue lives in pytest_kvcm/defects/, one module per source)."""

import pytest

pytestmark = pytest.mark.cpu_only

PROBE = """
import kvcm

def make(e=0):
    return kvcm.KVCacheManagerV2(kvcm.ModelSpec.uniform(2, 2, 8), kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=256),
                                 max_batch_size=4, max_seq_len=128, max_num_tokens=128, num_extra_kv_tokens=e)

def test_dummy_capacity():
    m = make()
    m.add_dummy_requests(["d"], token_nums=[32], is_gen=True)
    assert m.get_capacity("d") == 32

def test_no_generic_longest_decode():
    assert [c for c in make().constraint_names] == ["context"]

def test_available_tokens_counts_drafts():
    assert make().get_num_available_tokens(token_num_upper_bound=10**6, max_num_draft_tokens=4) == 256 - 4

def test_context_constraint_counts_extra():
    assert make(e=3).constraints[0].kv_caches[0].capacity == 131

def test_v4_ratio_means_no_constraints():
    m = kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(compress_ratios=(4, 128)),
        kvcm.KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=1 << 30, pool_ratio=(1, 1, 1)),
        max_batch_size=2, max_seq_len=1024, max_num_tokens=256)
    assert m.constraints == []

def test_stale_range():
    g = make().layer_groups[0]
    from kvcm.attention_types import SlidingWindow
    from kvcm.layer_groups import LayerGroup
    w = LayerGroup(0, (0,), SlidingWindow(64, tokens_per_block=32), 1)
    assert w.stale_range(94) == (0, 0) and w.stale_range(95) == (0, 1)
"""

EXPECTED_FAILURE = {
    "gen-dummy-extra-token": "test_dummy_capacity",
    "generic-longest-decode": "test_no_generic_longest_decode",
    "available-tokens-ignore-draft": "test_available_tokens_counts_drafts",
    "context-constraint-ignores-extra": "test_context_constraint_counts_extra",
    "v4-constraints-ignore-pool-ratio": "test_v4_ratio_means_no_constraints",
    "stale-window-early-release": "test_stale_range",
}


def test_clean_run_passes(pytester):
    pytester.makepyfile(test_probe=PROBE)
    pytester.runpytest_inprocess().assert_outcomes(passed=len(EXPECTED_FAILURE))


@pytest.mark.parametrize("defect", sorted(EXPECTED_FAILURE))
def test_each_defect_breaks_exactly_its_probe(pytester, defect):
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_inprocess(f"--kvcm-inject={defect}")
    result.assert_outcomes(passed=len(EXPECTED_FAILURE) - 1, failed=1)
    result.stdout.fnmatch_lines([f"*INJECTED DEFECT {defect}*", f"FAILED*{EXPECTED_FAILURE[defect]}*"])


def test_injection_is_undone_after_the_run(pytester):
    import kvcm

    pytester.makepyfile(test_probe=PROBE)
    pytester.runpytest_inprocess("--kvcm-inject=gen-dummy-extra-token")
    m = kvcm.KVCacheManagerV1(kvcm.ModelSpec.uniform(1, 1, 8), kvcm.KvCacheConfig(max_tokens=64),
                              max_batch_size=1, max_seq_len=64)
    m.add_dummy_requests(["d"], token_nums=[32], is_gen=True)
    assert m.get_capacity("d") == 32


def test_unknown_defect_suggests_names(pytester):
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_inprocess("--kvcm-inject=gen-dummy-extra-tokens")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*not a registered defect*did you mean gen-dummy-extra-token*"])


def test_user_registered_defect(pytester):
    pytester.makeconftest("""
import kvcm.manager_v2

def pytest_kvcm_register_defects(registry):
    def patch(mp):
        mp.setattr(kvcm.manager_v2.KVCacheManagerV2, "get_num_free_blocks", lambda self: 0)
    registry.register("free-blocks-zero", "free blocks always reported as zero", patch, upstream="my tracker #7")
""")
    pytester.makepyfile(test_user="""
import kvcm
def test_free():
    m = kvcm.KVCacheManagerV2(kvcm.ModelSpec.uniform(1, 1, 8), kvcm.KvCacheConfig(max_tokens=64), max_batch_size=1, max_seq_len=64)
    assert m.get_num_free_blocks() == 2
""")
    listed = pytester.runpytest_inprocess("--kvcm-list-defects")
    listed.stdout.fnmatch_lines(["free-blocks-zero: free blocks always reported as zero (upstream: my tracker #7)"])
    pytester.runpytest_inprocess().assert_outcomes(passed=1)
    pytester.runpytest_inprocess("--kvcm-inject=free-blocks-zero").assert_outcomes(failed=1)


def test_every_builtin_defect_names_its_upstream_and_catchers_are_listed_in_order():
    from pytest_kvcm.defects import builtin_defects

    defects = builtin_defects()
    assert [d.name for d in defects[:6]] == ["gen-dummy-extra-token", "generic-longest-decode",
                                             "v4-constraints-ignore-pool-ratio", "available-tokens-ignore-draft",
                                             "context-constraint-ignores-extra", "stale-window-early-release"]
    missing = [d.name for d in defects if not d.upstream]
    assert not missing, f"defects without an upstream reference: {missing}"
    assert len({d.name for d in defects}) == len(defects)


def test_list_defects_shows_upstream(pytester):
    result = pytester.runpytest_inprocess("--kvcm-list-defects")
    result.stdout.fnmatch_lines(["gen-dummy-extra-token: *(upstream: TensorRT-LLM PR #19213*"])
