"""GPU smoke: Gemma 3 270M's and Llama 4's layouts give Hugging Face's greedy tokens on the engine, V1 and V2.

* Gemma 3 (sliding windows of 512 on five layers of six, one KV head of 256, two RoPE bases, 262,144 ids) on
  CUDA graphs, prompts across the window and one chunked across it; V2 gives back the pages that left the window,
  V1 keeps them; and a prefix longer than the window reused from the cache.
* Llama 4 (chunked-local attention in chunks of 8,192 on three layers of four, the fourth global without RoPE,
  L2-normed queries and keys, attention temperature tuning past 8,192 positions, a mixture of experts on every
  other layer; ``kvcm.models.shapes.llama4_shape``): prompts past the first chunk, whole and in prefill chunks
  that straddle its edge; V2 gives back the pages of the chunk a request has left.

Hugging Face runs one prompt at a time here: Llama 4 counts the temperature's positions from its cache, left
padding included, and one prompt a batch keeps the reference free of padding for Gemma too.
"""
import pytest

from kvcm.versions import NAMES as ALL_VERSIONS

from _smoke import MARKS, ON_GPU, SCALE, assert_parity, engine, params, prompts, reference

pytestmark = MARKS
GEMMA_VOCAB, LLAMA4_VOCAB = 262144, 2048


def _gemma_window(model) -> int:
    return model.config.sliding_window


def test_gemma3_gives_hf_tokens_past_the_window_on_graphs(gemma3):
    """A prompt inside the window, one past it, one chunked across it: V1 = V2 = HF on graphs."""
    w = _gemma_window(gemma3)
    ps = prompts(9, [w // 2 + 3, w + 5, 2 * w + 9], GEMMA_VOCAB)
    ref = reference(gemma3, ps, batch_size=1)
    for version in ALL_VERSIONS:
        llm = engine(gemma3, version, max_seq_len=4 * w, max_tokens=16 * w, max_batch_size=4, max_num_tokens=w,
                     cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4], cuda_graph_token_buckets=[w])
        assert_parity(ref, llm.generate(ps, params()), ps, f"gemma3-{version}")
        assert llm.graphs.num_replays > 0
        sliding = next(g for g in llm.page_usage if g.window == w)
        assert (sliding.released_stale > 0) == (version == "v2"), str(sliding)
        llm.close()


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_gemma3_reuses_a_prefix_longer_than_the_window(gemma3, version):
    """A second request sharing a prefix of a window and a half with the first: reuse on = reuse off = HF."""
    w = _gemma_window(gemma3)
    shared = prompts(10, [w + w // 2], GEMMA_VOCAB)[0]
    first, second = (shared + tail for tail in prompts(11, [7, 9], GEMMA_VOCAB))
    runs = {}
    for reuse in (False, True):
        llm = engine(gemma3, version, enable_block_reuse=reuse, max_seq_len=4 * w, max_tokens=16 * w,
                     max_batch_size=2, cuda_graph=True, cuda_graph_batch_sizes=[1], cuda_graph_token_buckets=[])
        runs[reuse] = [llm.generate([p], params())[0] for p in (first, second)]
        if reuse:
            assert llm.reuse_stats.reused_tokens > 0, str(llm.reuse_stats)
        llm.close()
    assert_parity(runs[False], runs[True], [first, second], f"gemma3-reuse-{version}")
    assert_parity(reference(gemma3, [first, second], batch_size=1), runs[True], [first, second],
                  f"gemma3-reuse-{version}")


def test_llama4_chunked_local_attention_gives_hf_tokens(llama4):
    """Prompts ending just before, on and past the first chunk's edge (up to its length plus three pages), whole
    prefill and prefill in chunks of a quarter chunk plus a page (so one straddles the edge); V1 and V2."""
    chunk, tpb = llama4.config.attention_chunk_size, SCALE.tpb
    assert chunk == (8192 if ON_GPU else SCALE.llama4_chunk)
    ps = prompts(12, [chunk - 1, chunk + 1, chunk + 3 * tpb + 5, 5], LLAMA4_VOCAB)
    ref = reference(llama4, ps, batch_size=1)
    for version in ALL_VERSIONS:
        for max_num_tokens in (None, chunk // 4 + tpb):
            llm = engine(llama4, version, max_seq_len=chunk + 8 * tpb, max_tokens=4 * (chunk + 8 * tpb),
                         max_batch_size=4, max_num_tokens=max_num_tokens or chunk + 8 * tpb)
            assert_parity(ref, llm.generate(ps, params()), ps, f"llama4-{version}-chunks{max_num_tokens}")
            local, full = llm.page_usage
            assert (local.name, full.name) == (f"chunk{chunk}", "full")
            assert (local.released_stale > 0) == (version == "v2") and full.released_stale == 0, str(local)
            llm.close()
