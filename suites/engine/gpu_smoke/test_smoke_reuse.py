"""GPU smoke: block reuse and the host tier at SmolLM2-135M's shape, on CUDA graphs, V1 and V2.

* Block reuse: prompts sharing prefixes that end a page less one, on, and a page past an edge; the second
  ``generate`` of one engine reuses what the first cached (and some reuse happens within one batch): reuse on ==
  reuse off == Hugging Face (vLLM #5543 / #7845, TensorRT-LLM #8813 / #15503 were wrong tokens from a cache hit).
* The host tier (``LLM(host_cache_size=...)``: V1's secondary pool, V2's host level): prefixes that do not fit
  the GPU pool together but fit the host tier; the second round brings blocks back from pinned host memory
  (onboarded > 0) and computes fewer prefill tokens than without the tier, with the same tokens as without it and
  as Hugging Face (TensorRT-LLM #8813: with host_cache_size, hits returned other prompts' tokens).
"""
import pytest

import kvcm
from kvcm.versions import NAMES as ALL_VERSIONS

from _smoke import MARKS, SCALE, assert_parity, engine, params, prompts, reference

pytestmark = MARKS
VOCAB = 49152


def _shared_prefix_prompts(seed: int) -> list[list[int]]:
    base, tails = prompts(seed, [3 * SCALE.tpb], VOCAB)[0], prompts(seed + 1, [5] * 6, VOCAB)
    cuts = [SCALE.tpb - 1, SCALE.tpb, SCALE.tpb + 1, 2 * SCALE.tpb, 3 * SCALE.tpb]
    return [base[:c] + t for c, t in zip(cuts, tails)] + [base[:2 * SCALE.tpb]]   # the last: a whole cached prefix


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_block_reuse_gives_hf_tokens_on_graphs(smollm2, version):
    ps = _shared_prefix_prompts(6)
    ref = reference(smollm2, ps)
    runs = {}
    for reuse in (False, True):
        llm = engine(smollm2, version, enable_block_reuse=reuse, max_batch_size=4, max_num_tokens=4 * SCALE.tpb,
                     cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4], cuda_graph_token_buckets=[4 * SCALE.tpb])
        llm.generate(ps[::-1], params())
        runs[reuse] = llm.generate(ps, params())
        st = llm.reuse_stats
        if reuse:
            assert st.reused_tokens > 0 and st.computed_tokens < st.prompt_tokens, f"no reuse happened: {st}"
        else:
            assert st.reused_tokens == 0
        llm.close()
    assert_parity(runs[False], runs[True], ps, f"reuse-{version}")
    assert_parity(ref, runs[True], ps, f"reuse-{version}")


def _block_bytes(model) -> int:
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    probe = kvcm.create_kv_cache_manager("v1", spec, kvcm.KvCacheConfig(tokens_per_block=SCALE.tpb,
                                                                        max_tokens=SCALE.tpb, dtype="float32"),
                                         max_batch_size=1, max_seq_len=1024, device="meta")
    return sum(g.bytes_per_block for g in probe.layer_groups)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_host_tier_gives_hf_tokens(smollm2, version):
    """Six prefixes of three pages (18 pages, more with their suffixes) through a GPU pool of 10: round 1 caches
    them, evicting to the host tier (24 pages) or dropping; round 2 asks each again with a new suffix."""
    prefixes = prompts(7, [3 * SCALE.tpb] * 6, VOCAB)
    rounds = [[p + s for p, s in zip(prefixes, prompts(8 + r, [5] * 6, VOCAB))] for r in range(2)]
    outs, stats = {}, {}
    for host_blocks in (24, 0):
        llm = engine(smollm2, version, enable_block_reuse=True, max_tokens=10 * SCALE.tpb, max_batch_size=1,
                     cuda_graph=True, cuda_graph_batch_sizes=[1], cuda_graph_token_buckets=[4 * SCALE.tpb],
                     max_num_tokens=4 * SCALE.tpb, host_cache_size=host_blocks * _block_bytes(smollm2) or None)
        llm.generate(rounds[0], params())
        outs[host_blocks] = llm.generate(rounds[1], params())
        stats[host_blocks] = llm.manager.get_kv_cache_stats(), llm.reuse_stats
        llm.close()
    tier, reuse = stats[24]
    assert tier.offloaded_blocks > 0 and tier.onboarded_blocks > 0, str(tier)
    assert reuse.computed_tokens < stats[0][1].computed_tokens, (str(reuse), str(stats[0][1]))
    assert_parity(outs[0], outs[24], rounds[1], f"host-tier-{version}")
    assert_parity(reference(smollm2, rounds[1]), outs[24], rounds[1], f"host-tier-{version}")
