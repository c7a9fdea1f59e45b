"""The engines' internal API the adapters rely on, pinned: when an upgrade moves it, this fails by name first
(instead of a contract check failing for a reason that has nothing to do with KV accounting)."""

import inspect

import pytest

from pytest_kvcm.targets import TargetUnavailable


def test_transformers_paged_cache_api():
    from pytest_kvcm.targets import hf_target

    try:
        _, cb_config, cache, helper, state = hf_target._hf()
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
    assert list(inspect.signature(cache.__init__).parameters)[1:6] == [
        "config", "continuous_batching_config", "device", "distributed_helper", "dtype"]
    assert list(inspect.signature(cache.can_store_request_tokens).parameters)[1:3] == ["state", "request_len"]
    assert "no_cache" in inspect.signature(cache.free_blocks).parameters
    assert list(inspect.signature(helper.__init__).parameters)[1:3] == ["device_mesh", "cpu_group_timeout"]
    fields = {f for f in cb_config.__dataclass_fields__}
    assert {"page_size", "num_blocks", "max_batch_tokens", "allow_block_sharing", "max_memory_percent"} <= fields
    assert {"position_offset", "request_id"} <= set(state.__dataclass_fields__)
    from transformers.generation.continuous_batching.cache_allocators.cache_pool import CachePool

    for name in ("num_free_sectors", "count_free_blocks", "try_to_free_sectors"):
        assert hasattr(CachePool, name), name


def test_vllm_kv_cache_manager_api():
    from pytest_kvcm.targets import vllm_target

    try:
        kvm, utils, iface, *_ = vllm_target._vllm()
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
    params = inspect.signature(kvm.KVCacheManager.__init__).parameters
    assert {"kv_cache_config", "max_model_len", "scheduler_block_size", "hash_block_size", "enable_caching"} <= set(params)
    assert "num_lookahead_tokens" in inspect.signature(kvm.KVCacheManager.allocate_slots).parameters
    assert {"num_blocks", "kv_cache_tensors", "kv_cache_groups"} <= set(iface.KVCacheConfig.__dataclass_fields__)
    assert "sliding_window" in iface.SlidingWindowSpec.__dataclass_fields__
    assert callable(utils.init_none_hash) and callable(utils.get_request_block_hasher)
