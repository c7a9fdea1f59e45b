"""The engines' internal API the adapters rely on, pinned: when an upgrade moves it, this fails by name first
(instead of a contract check failing for a reason that has nothing to do with KV accounting)."""

import inspect

import pytest

from pytest_kvcm.targets import TargetUnavailable


def test_transformers_paged_cache_api():
    """5.18 and later: the sector pool ``hf_target.py`` drives."""
    from pytest_kvcm.targets import hf_target

    if hf_target._hf_blocks() is not None:
        pytest.skip("transformers 5.17's block pool is installed: test_transformers_block_pool_api pins it")
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


def test_transformers_block_pool_api():
    """5.17: the shared block pool and the scheduler's block count ``hf_blocks_target.py`` drives."""
    from pytest_kvcm.targets import hf_target

    found = hf_target._hf_blocks()
    if found is None:
        pytest.skip("not transformers 5.17's block pool (5.18 and later: test_transformers_paged_cache_api)")
    _, cb_config, cache, helper, state, scheduler = found
    assert list(inspect.signature(cache.__init__).parameters)[1:7] == [
        "config", "continuous_batching_config", "device", "distributed_helper", "tp_plan", "dtype"]
    assert list(inspect.signature(cache.allocate_blocks).parameters)[1:4] == [
        "n_blocks", "request_id", "allocated_blocks"]
    assert list(inspect.signature(cache.free_blocks).parameters)[1:] == ["request_id"]
    assert callable(cache.get_num_free_blocks)
    assert list(inspect.signature(scheduler.__init__).parameters)[1:4] == [
        "cache", "safety_margin", "max_requests_per_batch"]
    assert list(inspect.signature(scheduler._allocate_blocks_if_needed).parameters)[1:3] == [
        "state", "len_next_tokens"]
    assert list(inspect.signature(helper.__init__).parameters)[1:3] == ["device_mesh", "cpu_group_timeout"]
    assert {"block_size", "num_blocks", "max_batch_tokens", "allow_block_sharing", "max_memory_percent"} <= set(
        cb_config.__dataclass_fields__)
    assert {"position_offset", "request_id", "allocated_blocks"} <= set(state.__dataclass_fields__)


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
    # the events: a manager built with them, its BlockPool's queue, its hash map's keys as the events name them
    assert "enable_kv_cache_events" in params and callable(kvm.KVCacheManager.take_events)
    from vllm.distributed import kv_events
    from vllm.v1.core.block_pool import BlockHashToBlockMap

    assert {"block_hashes", "parent_block_hash", "medium", "group_idx"} <= set(kv_events.BlockStored.__struct_fields__)
    assert {"block_hashes", "medium", "group_idx"} <= set(kv_events.BlockRemoved.__struct_fields__)
    assert isinstance(BlockHashToBlockMap()._cache, dict) and callable(kv_events.AllBlocksCleared)
    for name in ("get_group_id", "get_block_hash", "maybe_convert_block_hash"):
        assert callable(getattr(utils, name, None)), name


def test_sglang_pool_and_cache_api():
    """What sglang_target.py, sglang_reuse.py and sglang_startup.py call, by name and argument (the pinned SGLang release)."""
    from pytest_kvcm.targets import sglang_target

    try:
        common, pools, swa_pools, paged, swa, component = sglang_target._sglang()
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
    from sglang.srt.mem_cache import base_prefix_cache, radix_cache
    from sglang.srt.model_executor import pool_configurator

    def args(fn):
        return list(inspect.signature(fn).parameters)

    assert args(paged.alloc_extend)[1:7] == ["prefix_lens", "prefix_lens_cpu", "seq_lens", "seq_lens_cpu", "last_loc",
                                            "extend_num_tokens"]
    assert args(swa.__init__)[1:8] == ["size", "size_swa", "page_size", "dtype", "device", "kvcache", "need_sort"]
    for name in ("free_swa_segment", "full_available_size", "swa_available_size", "free_segments", "free_full_segments"):
        assert callable(getattr(swa, name, None)), name
    assert {"sliding_window_size", "page_size", "req_to_token_pool", "token_to_kv_pool_allocator",
            "supports_prefix_sharing"} <= set(args(common.free_swa_out_of_window_slots))
    assert {"swa_evicted_seqlen", "swa_dead_lo"} <= set(args(common.free_kv_row_segments))
    assert args(pools.ReqToTokenPool.__init__)[1:5] == ["size", "max_context_len", "device", "enable_memory_saver"]
    assert component.SWA
    for name in ("match_prefix", "insert", "checkpoint", "evict", "inc_lock_ref", "dec_lock_ref", "lock", "unlock",
                 "evictable_size", "path_device_indices", "reset"):
        assert callable(getattr(radix_cache.RadixCache, name, None)), name
    assert {"key"} <= set(base_prefix_cache.MatchPrefixParams.__dataclass_fields__)
    # the events (sglang/srt/mem_cache/events.py): the recorder the tree holds, and how it hashes a node's pages
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.events import KVCacheEventRecorder

    assert "enable_kv_cache_events" in CacheInitParams.__dataclass_fields__
    for name in ("take", "record_store", "record_remove", "_node_event_hash_values", "_namespace_seed"):
        assert callable(getattr(KVCacheEventRecorder, name, None)), name
    assert {"num_tokens"} <= set(base_prefix_cache.EvictParams.__dataclass_fields__)
    assert args(pool_configurator.MemoryPoolConfigurator.validate_swa_pool_size) == [
        "swa_tokens", "sliding_window_size", "page_size"]
    for cls in (pool_configurator.DefaultPoolConfigurator, pool_configurator.HybridSWAPoolConfigurator):
        assert args(cls.calculate_pool_sizes_from_max_tokens)[1:] == ["max_total_num_tokens", "page_size"]
