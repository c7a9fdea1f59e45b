"""Chunked local attention's bugs (Llama 4's ``attention_chunk_size``), reproduced in kvcm's chunked-local type."""

from __future__ import annotations

from kvcm.units import ceil_div

from ._registry import defect


@defect("chunk-trimmed-by-padded-length", upstream="mlx-lm PR #1673 (Llama 4's ChunkedKVCache.maybe_trim_front "
        "compared its padded buffer length, not the tokens written, with chunk_size: it trimmed the current "
        "chunk's live keys, and every decode step after diverged from a full forward); the rule it broke: vLLM "
        "ChunkedLocalAttentionManager.get_num_skipped_tokens",
        story="the chunk a chunked-local query reads was taken from the length its pages cover (rounded up to a "
              "whole page, the in-flight token included), not from the in-flight token: near the end of a chunk "
              "V2 released the chunk's pages while its last tokens still read them",
        catchers=("suites/conformance/test_chunked_local.py::test_the_tokens_before_the_query_chunk_are_skipped",
                  "suites/conformance/test_chunked_local.py::test_a_cache_hit_skips_the_blocks_before_the_last_chunk",
                  "suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"
                  "[v2-full+chunked-tpb2-b4-reuse_off-ids-r2]",
                  "suites/engine/test_llama4_chunked.py::test_tiny_llama4_matches_hf",
                  "suites/engine/test_llama4_chunked.py::test_v2_gives_back_the_pages_of_each_chunk_left"))
def chunk_trimmed_by_padded_length():
    return {"chunk_first_token":
            lambda history, chunk, tokens_per_block:
            ceil_div(history + 1, tokens_per_block) * tokens_per_block // chunk * chunk}
