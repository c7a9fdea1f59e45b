"""Paged attention against Hugging Face eager attention on the same input.

The engine's logits come from KV that went through the page pool (written at the slot mapping, read back
through block tables); eager attention recomputes everything from the full sequence. fp32 agreement to 1e-5
says the pages hold exactly the right K/V at the right positions.
"""
import pytest
import torch

import kvcm
from kvcm.models import tiny_model
from kvcm.engine.runner import ModelRunner, StepItem

# fp32: summation order differs between a paged gather and one eager matmul (logits here are of order 1-10,
# so fp32 rounding alone reaches ~1e-5); a wrong position, page or mask moves logits by far more (~0.1 to 1).
TOL = dict(atol=3e-5, rtol=1e-4)


def _manager(model, kvcm_version, tpb=8, max_tokens=1024, dtype="float32"):
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    cfg = kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=max_tokens, dtype=dtype)
    return kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, max_batch_size=8, max_seq_len=256, device="cpu")


@torch.no_grad()
def _eager_logits(model, ids: list[int]) -> torch.Tensor:
    saved = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()
    finally:
        model.config._attn_implementation = saved


def _prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=g).tolist()


def _prefill_then_decode(runner, mgr, rid, ids, chunk, steps_tokens):
    """Prefill ``ids`` in chunks, then decode the given tokens one by one; yields logits per sampled step."""
    out = []
    start = 0
    while start < len(ids):
        n = min(chunk, len(ids) - start)
        mgr.begin_context_chunk(rid, start, n, len(ids))
        logits = runner.run([StepItem(rid, ids[start:start + n], start, decode=False)])
        mgr.end_context_chunk(rid, start + n)
        start += n
    out.append(logits[0])
    seq = list(ids)
    for tok in steps_tokens:
        seq.append(tok)
        mgr.begin_generation(rid)
        logits = runner.run([StepItem(rid, [tok], len(seq) - 1, decode=True)])
        mgr.end_generation(rid, len(seq) + 1)
        out.append(logits[0])
    return out, seq


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("chunk", [1000, 7])
def test_paged_logits_match_eager(arch, chunk, kvcm_version):
    model, _ = tiny_model(arch, seed=3)
    mgr = _manager(model, kvcm_version)
    runner = ModelRunner(model, mgr)
    ids = _prompt(29, seed=1)
    extra = _prompt(12, seed=2)              # 29 + 12 = 41 tokens: past mistral's window of 16
    got, seq = _prefill_then_decode(runner, mgr, "r", ids, chunk, extra)
    ref = _eager_logits(model, seq)
    for i, logits in enumerate(got):
        pos = len(ids) - 1 + i
        torch.testing.assert_close(logits.float(), ref[pos], **TOL, msg=f"position {pos}")


def test_packed_batch_of_decodes_and_prefills_matches_eager(kvcm_version):
    """Decodes of different lengths and two prefill chunks in one forward, each equal to its own eager run."""
    model, _ = tiny_model("llama", seed=5)
    mgr = _manager(model, kvcm_version)
    runner = ModelRunner(model, mgr)
    decode_prompts = {f"d{i}": _prompt(n, seed=10 + i) for i, n in enumerate((3, 8, 17))}
    for rid, ids in decode_prompts.items():
        mgr.begin_context_chunk(rid, 0, len(ids), len(ids))
        runner.run([StepItem(rid, ids, 0, decode=False)])
        mgr.end_context_chunk(rid, len(ids))
    items, seqs = [], {}
    for rid, ids in decode_prompts.items():
        tok = (len(ids) * 7) % 250 + 3
        seqs[rid] = ids + [tok]
        mgr.begin_generation(rid)
        items.append(StepItem(rid, [tok], len(ids), decode=True))
    for rid, n in (("p0", 11), ("p1", 26)):
        ids = _prompt(n, seed=hash(rid) % 100)
        seqs[rid] = ids
        mgr.begin_context_chunk(rid, 0, n, n)
        items.append(StepItem(rid, ids, 0, decode=False))
    logits = runner.run(items)
    for row, it in zip(logits, items):
        ref = _eager_logits(model, seqs[it.request_id])[-1]
        torch.testing.assert_close(row.float(), ref, **TOL, msg=f"request {it.request_id}")


def test_sliding_window_never_reads_released_pages():
    """V2 releases stale pages of the sliding group (-1 in the block table). Poison every page the request does
    not hold with NaN before each step: a single read of a released or foreign page would show in the logits."""
    model, _ = tiny_model("mistral", seed=7)          # window 16
    mgr = _manager(model, "v2", tpb=4)
    runner = ModelRunner(model, mgr)
    ids = _prompt(10, seed=4)
    seq = list(ids)

    def poison():
        for layer in range(model.config.num_hidden_layers):
            kv = mgr.layer_kv(layer)
            held = [b for b in mgr.block_table("r")[mgr.group_of_layer(layer)] if b >= 0]
            free = torch.ones(kv.shape[0], dtype=torch.bool)
            free[held] = False
            kv[free] = float("nan")

    mgr.begin_context_chunk("r", 0, len(ids), len(ids))
    poison()
    got = [runner.run([StepItem("r", ids, 0, decode=False)])[0]]
    mgr.end_context_chunk("r", len(ids))
    released = 0
    for i in range(30):
        tok = int(got[-1].argmax())
        seq.append(tok)
        mgr.begin_generation("r")
        poison()
        got.append(runner.run([StepItem("r", [tok], len(seq) - 1, decode=True)])[0])
        mgr.end_generation("r", len(seq) + 1)
        released = max(released, sum(b < 0 for table in mgr.block_table("r") for b in table))
    assert released > 0, "the test must run past the window so that V2 releases pages"
    ref = _eager_logits(model, seq)
    for i, logits in enumerate(got):
        assert torch.isfinite(logits).all(), f"step {i} read a poisoned page"
        torch.testing.assert_close(logits.float(), ref[len(ids) - 1 + i], **TOL)


def test_bf16_pages_close_to_eager():
    model, _ = tiny_model("qwen3", seed=2, dtype=torch.bfloat16)
    mgr = _manager(model, "v2", dtype="bfloat16")
    assert mgr.layer_kv(0).dtype == torch.bfloat16
    runner = ModelRunner(model, mgr)
    ids = _prompt(20, seed=9)
    got, seq = _prefill_then_decode(runner, mgr, "r", ids, 8, _prompt(4, seed=8))
    ref = _eager_logits(model, seq)
    for i, logits in enumerate(got):
        torch.testing.assert_close(logits.float(), ref[len(ids) - 1 + i], atol=0.1, rtol=0.05)


def test_attention_outside_engine_forward_is_an_error():
    """The model keeps its own attention outside the runner; calling the paged function bare names the cause."""
    from kvcm.engine import attention
    model, _ = tiny_model("llama", seed=0)
    attention.register()
    model.config._attn_implementation = attention.NAME
    with pytest.raises(RuntimeError, match="outside a kvcm engine forward"):
        model(torch.tensor([[5, 6, 7]]), use_cache=False)
