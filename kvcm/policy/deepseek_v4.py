"""DeepSeek-V4's cached layers and their bytes (``kvcm/deepseek_v4.py``; TensorRT-LLM's
``deepseek_v4/cache_manager.py``)."""

from __future__ import annotations

from ._decisions import Decisions, rule


class DeepseekV4Decisions(Decisions):
    SUBSYSTEM = "DeepSeek-V4 bytes"

    @rule("how many MTP layers DeepSeek-V4 caches beside its own: max_draft_len - 1, repeating the last layer's "
          "ratio (DeepseekV4CacheManager.__init__)")
    def v4_mtp_layers(max_draft_len: int) -> int:
        return max(0, max_draft_len - 1)

    @rule("how much wider a compressor's fp32 states are than its head: twice for the overlapping ratio-4 one "
          "(get_attn_dim: state_factor 2 for is_overlap_compressor)")
    def v4_state_factor(ratio: int) -> int:
        return 2 if ratio == 4 else 1

    @rule("the bytes of one compressed indexer key: fp8 values and an fp32 scale per 128 (fp4: packed E2M1 values "
          "and a byte per 32), get_token_bytes for INDEXER_COMPRESS")
    def v4_indexer_entry_bytes(index_head_dim: int, indexer_k_dtype: str) -> int:
        ihd = index_head_dim
        return ihd + ihd // 128 * 4 if indexer_k_dtype == "fp8" else ihd // 2 + ihd // 32
