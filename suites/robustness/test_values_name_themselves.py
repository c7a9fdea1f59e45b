"""Values that used to fail far from where they were given, or without naming themselves, now end in one error
naming the field, the value and the limit (issue 52).

Before: a host tier larger than the host memory gave torch's allocator message without the word
``host_cache_size`` (or, between the free memory and the total, was handed out by the kernel and zeroed until the
process was killed); ``ResultsStore.record(run_id=None)`` a raw ``sqlite3.IntegrityError``;
``--kvcm-exhaustive-scale=inf`` passed the start-up check and every explorer test errored at setup.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec
from pytest_kvcm.results import ResultsStore


@pytest.mark.parametrize("kind", ["v1", "v2"])
@pytest.mark.parametrize("host_cache_size", [1 << 50, "available"])
def test_a_host_tier_larger_than_the_host_memory_names_host_cache_size(kind, host_cache_size):
    """Refused before any of it is allocated: 1 PiB (the config's own bound), and one block more than the memory
    available now."""
    if host_cache_size == "available":
        from kvcm.reuse.host_tier import host_memory_available

        host_cache_size = host_memory_available() + (1 << 30)
    with pytest.raises(kvcm.ConfigError, match=r"host_cache_size=\d+ is invalid: needs \d+ bytes of host memory "
                                               r"\(\d+ host blocks\), more than the \d+ bytes this machine has "
                                               r"available") as err:
        kvcm.create_kv_cache_manager(kind, ModelSpec.uniform(2, 1, 16),
                                     KvCacheConfig(max_tokens=64, host_cache_size=host_cache_size),
                                     max_batch_size=1, max_seq_len=64, device="cpu")
    assert err.value.field == "host_cache_size"


def test_a_host_tier_on_meta_is_not_memory():
    """A meta manager (the plan's) allocates nothing, so its host tier may be as large as the config allows."""
    mgr = kvcm.create_kv_cache_manager("v1", ModelSpec.uniform(2, 1, 16),
                                       KvCacheConfig(max_tokens=64, host_cache_size=1 << 50),
                                       max_batch_size=1, max_seq_len=64, device="meta")
    assert mgr.get_host_block_counts().total > 0


@pytest.mark.parametrize("run_id", [None, "", 5])
def test_record_with_a_run_id_that_is_no_run_id(tmp_path, run_id):
    with ResultsStore(tmp_path / "r.sqlite", run_id="run-1") as store:
        with pytest.raises(ValueError, match=r"record\('m'\): run_id=.* must be a non-empty string; leave it out "
                                             r"for this store's run id 'run-1'"):
            store.record("m", 1.0, run_id=run_id)
        assert store.query() == []


@pytest.mark.parametrize("scale", ["inf", "nan", "-inf", "0", "-1", "1e400"])
def test_exhaustive_scale_must_be_a_finite_number_above_zero(pytester, scale):
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p no:randomly\n")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_inprocess(f"--kvcm-exhaustive-scale={scale}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--kvcm-exhaustive-scale=*: must be a finite number > 0*"])
