"""GPU smoke: the Triton kernels and the fused layers at SmolLM2-135M's shape give Hugging Face's greedy tokens.

Paged attention (decode and prefill in one launch, the K/V store), the fused small ops and the fused layers (the
engine's default body), the split decode (``decode_split_len``) and the wide prefill tile (``prefill_block_m``),
each as token-for-token parity with Hugging Face ``generate`` in fp32 on a random-weight model at the real shape:
what the CPU lanes prove under the Triton interpreter on toy shapes, here on the device and the shapes the field
runs (9 query heads over 3 KV heads of 64: a GQA fold of 3, which the toy models' 2 never tried).
"""
import pytest

from _smoke import MARKS, SCALE, assert_parity, engine, params, prompts, reference, require_kernels

pytestmark = MARKS
VOCAB = 49152


def _prompts(seed: int) -> list[list[int]]:
    """Short and long rows in one batch: page edges and a prompt of several pages."""
    return prompts(seed, [5, SCALE.tpb - 1, SCALE.tpb + 1, 3 * SCALE.tpb + 7], VOCAB)


@pytest.mark.parametrize("fused_layers", [True, False], ids=["fused_layers", "hf_layers"])
def test_kernels_give_hf_tokens(smollm2, fused_layers):
    """Eager steps on the kernels: the fused body (nine launches a layer) and the model's own layers with the fused
    RMSNorm, rotary and SiLU-and-mul; chunked prefill so prefill chunks and decodes share steps."""
    require_kernels()
    ps = _prompts(1)
    llm = engine(smollm2, fused_layers=fused_layers, max_num_tokens=2 * SCALE.tpb, max_batch_size=4)
    assert llm.runner.use_kernel and (llm.runner.layers is not None) == fused_layers
    assert fused_layers or llm.runner.fused is not None
    assert_parity(reference(smollm2, ps), llm.generate(ps, params()), ps, "kernels")


def test_split_decode_and_wide_prefill_tile_give_hf_tokens(smollm2):
    """``decode_split_len``: decode steps read each row's keys in shares of 32 positions, combined by a second
    launch (the longest prompt spans several); ``prefill_block_m=64``: steps with prefill take 64 query rows a
    program. Eager and on CUDA graphs (decode shapes keep the split, token buckets the tile)."""
    require_kernels()
    ps = _prompts(2)
    ref = reference(smollm2, ps)
    kw = dict(decode_split_len=32, prefill_block_m=64, max_num_tokens=4 * SCALE.tpb, max_batch_size=4)
    assert_parity(ref, engine(smollm2, **kw).generate(ps, params()), ps, "split-eager")
    llm = engine(smollm2, cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4], cuda_graph_token_buckets=[4 * SCALE.tpb],
                 **kw)
    assert {s.ctx.split_len for s in llm.graphs.shapes.values()} == {32}
    assert_parity(ref, llm.generate(ps, params()), ps, "split-graphs")
    assert llm.graphs.num_replays > llm.graphs.num_bucket_replays > 0
