"""CUDA graphs for speculative decoding: the target's verification shapes ``(bs, 1 + D)`` and the draft
model's decode shapes ``(bs, 1)`` and ``(bs, 2)`` (its catch-up after a fully accepted step) are warmed up on
both managers' estimation and final caches, reported per manager, and replayed with plain greedy's tokens.

On the CPU the static path runs eagerly; on a GPU the same shapes are captured graphs.
"""
import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import tiny_model, truncated_drafter
from kvcm.versions import NAMES as ALL_VERSIONS

D = 4


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def _boundary_llm(model, kvcm_version, drafter, device="cpu", dtype="float32", **kw):
    """Caches of 8 blocks of 8 tokens under max_seq_len 96 (the draft's 100): every long warmup dummy is sized
    by get_num_available_tokens below S, so the bs=1 shapes sit exactly on a page boundary, on both caches."""
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=64, dtype=dtype)
    return LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4, max_seq_len=96,
               max_draft_len=D, drafter=drafter, draft_kvcm_version=kvcm_version, device=device, cuda_graph=True,
               cuda_graph_token_buckets=[], spec_acceptance_window=0, **kw)


def _assert_every_shape(llm):
    caches = {"target": llm.warmup_reports, "draft": llm.draft_warmup_reports}
    for name, reports in caches.items():
        assert [r.cache for r in reports] == ["estimation", "final"], name
        for report in reports:
            assert report.skipped == [] and report.captured == report.planned, f"{name} cache: {report}"
    target, draft = llm.warmup_reports[-1], llm.draft_warmup_reports[-1]
    assert {s.draft_len for s in target.planned} == {D, 0}
    assert {s.draft_len for s in draft.planned} == {1, 0}
    # the bs=1 long dummies end exactly on a page boundary: the historic +1 would not fit there
    assert (target.long_token_nums[kvcm.WarmupShape(1, D)] + D) % 8 == 0
    assert (draft.long_token_nums[kvcm.WarmupShape(1, 1)] + 1) % 8 == 0
    assert sorted(llm.drafter.graphs.shapes) == sorted((bs, q) for bs in (4, 2, 1) for q in (1, 2))


def test_spec_warmup_on_a_page_boundary_captures_every_shape(kvcm_version):
    """D = 4, target and draft on the same manager version: every shape fits on both caches (the historic
    one-token-too-large generation dummy, gen-dummy-extra-token, skips them), and replays give plain tokens."""
    model, _ = tiny_model("llama", seed=2, num_hidden_layers=4)
    llm = _boundary_llm(model, kvcm_version, truncated_drafter(model, 2))
    _assert_every_shape(llm)
    prompts = _prompts((6, 11, 3), seed=3)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0 and llm.drafter.graphs.num_replays > 0
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=64, dtype="float32")
    ref = LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4,
              max_seq_len=96).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    llm.close()
    assert not llm.manager.request_ids and not llm.drafter.manager.request_ids


def test_ngram_speculation_replays_verification_shapes(kvcm_version):
    """Prompt lookup needs no draft cache: the target's (bs, 1 + D) shapes serve every verification."""
    model, _ = tiny_model("llama", seed=2, num_hidden_layers=4)
    llm = _boundary_llm(model, kvcm_version, "ngram")
    assert llm.draft_warmup_reports == []
    assert all(r.ok for r in llm.warmup_reports), [str(r) for r in llm.warmup_reports]
    prompts = [p * 3 for p in _prompts((4, 6), seed=5)]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=64, dtype="float32")
    ref = LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4,
              max_seq_len=96).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_draft_prefill_replays_a_token_bucket(kvcm_version):
    """A step of prefill chunks alone feeds the draft model through its token buckets, as the target's prefill
    goes: run eagerly, a launch for each kernel of every layer, the 20-layer SmolLM2 drafter's first prefill took
    an H200 13-17 ms against 0.7 ms for the target's replayed one (docs/benchmarks.md, "The speculation gate")."""
    model, _ = tiny_model("llama", seed=2, num_hidden_layers=4)
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=256, dtype="float32")
    llm = LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4, max_seq_len=96,
              max_draft_len=D, drafter=truncated_drafter(model, 2), draft_kvcm_version=kvcm_version, device="cpu",
              cuda_graph=True, cuda_graph_token_buckets=[32], spec_acceptance_window=0)
    prompts = _prompts((6, 11, 3), seed=3)      # admitted together: the first step is prefill chunks alone
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert llm.drafter.graphs.num_bucket_replays >= 1
    ref = LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4,
              max_seq_len=96).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


@pytest.mark.gpu(count=1)
@pytest.mark.parametrize("tv", ALL_VERSIONS)
def test_spec_warmup_on_a_page_boundary_captures_every_shape_on_gpu(tv):
    """The same on CUDA: every planned shape of both caches is a captured graph, and replays give plain
    greedy's tokens (fp32)."""
    model, _ = tiny_model("llama", seed=2, num_hidden_layers=4, device="cuda")
    llm = _boundary_llm(model, tv, truncated_drafter(model, 2), device="cuda")
    _assert_every_shape(llm)
    assert all(s.graph is not None for s in llm.graphs.shapes.values())
    assert all(s.graph is not None for s in llm.drafter.graphs.shapes.values())
    prompts = _prompts((6, 11, 3), seed=3)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=64, dtype="float32")
    ref = LLM(model, kvcm_version=tv, kv_cache_config=cfg, max_batch_size=4, max_seq_len=96,
              device="cuda").generate(prompts, params)
    assert llm.graphs.num_replays > 0 and llm.drafter.graphs.num_replays > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
