"""Decode-step CUDA graphs: shape planning, warmup reports, and the graph-safe static decode path.

On the CPU the static path (fixed shapes, padded block tables, padding rows on the engine's pad page) runs
eagerly; it must give the tokens of the normal path. On a GPU the same path is captured and replayed.
"""
import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.cuda_graph import PAD_REQUEST
from kvcm.models import hf_generate, tiny_model


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def _llm(model, kvcm_version, *, max_tokens=2048, device="cpu", dtype="float32", **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=max_tokens, dtype=dtype)
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("max_seq_len", 96)
    return LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, device=device, **kw)


@pytest.mark.parametrize("draft", [0, 4])
def test_warmup_reports_plan_every_shape_on_both_caches(kvcm_version, draft):
    model, _ = tiny_model("llama", seed=0)
    llm = _llm(model, kvcm_version, cuda_graph=True, max_draft_len=draft)
    est, final = llm.warmup_reports
    assert (est.cache, final.cache) == ("estimation", "final")
    drafts = [draft, 0] if draft else [0]
    expected = [kvcm.WarmupShape(bs, d) for bs in (8, 4, 2, 1) for d in drafts]
    for report in (est, final):
        assert report.planned == expected, str(report)
        assert report.skipped == [] and report.captured == expected, str(report)
    assert sorted(llm.graphs.shapes) == sorted((bs, 1 + d) for bs in (8, 4, 2, 1) for d in drafts)
    assert llm.manager.has_request(PAD_REQUEST)
    llm.close()
    assert not llm.manager.request_ids


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_static_decode_path_gives_eager_tokens(kvcm_version, arch):
    """3 prompts replay on the bs=4 shape: one padding row on the pad page, kv lengths past mistral's window."""
    model, _ = tiny_model(arch, seed=6)
    prompts = _prompts((7, 30, 12), seed=5)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    eager = _llm(model, kvcm_version).generate(prompts, params)
    llm = _llm(model, kvcm_version, cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4])
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0, "decode steps must go through the static shapes"
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]


def test_skipped_shapes_fall_back_to_eager(kvcm_version):
    """A pool too small for the bs=8 shape's dummies skips it with a reason; those batches run eagerly."""
    model, _ = tiny_model("llama", seed=1)
    llm = _llm(model, kvcm_version, max_tokens=48, max_seq_len=40, cuda_graph=True)
    final = llm.warmup_reports[-1]
    skipped = {s.batch_size: reason for s, reason in final.skipped}
    assert 8 in skipped and "do not fit" in skipped[8], str(final)
    assert len(final.planned) == len(final.captured) + len(final.skipped)
    prompts = _prompts((5, 6), seed=2)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    ref = _llm(model, kvcm_version, max_tokens=48, max_seq_len=40).generate(prompts, params)
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in ref]


@pytest.mark.gpu(count=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_graph_replay_matches_eager_on_gpu(kvcm_version, dtype):
    model, _ = tiny_model("qwen3", seed=3, dtype=dtype, device="cuda")
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    prompts = _prompts((5, 17, 33, 9, 40), seed=4)
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    eager = _llm(model, kvcm_version, device="cuda", dtype=name).generate(prompts, params)
    llm = _llm(model, kvcm_version, device="cuda", dtype=name, cuda_graph=True)
    assert all(s.graph is not None for s in llm.graphs.shapes.values())
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]
    if dtype == torch.float32:
        refs = hf_generate(model, prompts, 32, eos_token_id=[])
        assert [o.token_ids for o in outs] == [r.token_ids for r in refs]


def _boundary_llm(model, kvcm_version, draft, device="cpu", dtype="float32"):
    """A cache of 8 blocks of 8 tokens under max_seq_len 96: every long warmup dummy is sized by
    get_num_available_tokens below S, so at least the bs=1 shape sits exactly on a page boundary."""
    return _llm(model, kvcm_version, max_tokens=64, max_seq_len=96, max_batch_size=4, cuda_graph=True,
                max_draft_len=draft, device=device, dtype=dtype, cuda_graph_token_buckets=[])


@pytest.mark.parametrize("draft", [0, 4])
def test_warmup_on_a_page_boundary_captures_every_shape(kvcm_version, draft):
    """The historic one-token-too-large generation dummy needs one block more than the boundary leaves: the
    shape is skipped (and its batches run uncaptured). Every shape must fit, on both caches."""
    model, _ = tiny_model("llama", seed=2)
    llm = _boundary_llm(model, kvcm_version, draft)
    for report in llm.warmup_reports:
        assert report.skipped == [] and report.captured == report.planned, str(report)
    final = llm.warmup_reports[-1]
    one = kvcm.WarmupShape(1, draft)
    assert (final.long_token_nums[one] + draft) % 8 == 0, "the bs=1 long dummy must end on a page boundary"
    prompts = _prompts((6, 11, 3), seed=3)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0
    ref = _llm(model, kvcm_version, max_tokens=64, max_seq_len=96, max_batch_size=4).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_mixed_steps_replay_token_buckets(kvcm_version):
    """More prompts than batch slots: requests finish and new ones are admitted while others decode, so most steps
    mix prefill chunks and decodes. Those steps run on the bulk-padded token buckets and give the eager tokens."""
    model, _ = tiny_model("mistral", seed=4)
    prompts = _prompts((9, 30, 4, 22, 13, 7, 26, 5), seed=8)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    kw = dict(max_batch_size=4, max_num_tokens=32)
    eager = _llm(model, kvcm_version, **kw).generate(prompts, params)
    llm = _llm(model, kvcm_version, cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4],
               cuda_graph_token_buckets=[16, 32], **kw)
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_bucket_replays > 0 and llm.graphs.num_replays > llm.graphs.num_bucket_replays
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]


@pytest.mark.gpu(count=1)
@pytest.mark.parametrize("draft", [0, 4])
def test_warmup_on_a_page_boundary_captures_every_shape_on_gpu(kvcm_version, draft):
    """The same page-boundary warmup on CUDA: every planned shape is a captured graph, and replays give the
    eager tokens (bf16)."""
    model, _ = tiny_model("llama", seed=2, dtype=torch.bfloat16, device="cuda")
    llm = _boundary_llm(model, kvcm_version, draft, device="cuda", dtype="bfloat16")
    for report in llm.warmup_reports:
        assert report.skipped == [] and report.captured == report.planned, str(report)
    assert len(llm.graphs.shapes) == len(llm.warmup_reports[-1].planned)
    assert all(s.graph is not None for s in llm.graphs.shapes.values())
    prompts = _prompts((6, 11, 3), seed=3)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    ref = _llm(model, kvcm_version, max_tokens=64, max_seq_len=96, max_batch_size=4, device="cuda",
               dtype="bfloat16").generate(prompts, params)
    assert llm.graphs.num_replays > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


@pytest.mark.gpu(count=1)
def test_token_bucket_graphs_match_eager_on_gpu(kvcm_version):
    """Mixed steps replay captured token buckets on CUDA: same tokens as eager and as HF generate (fp32)."""
    model, _ = tiny_model("mistral", seed=4, device="cuda")
    prompts = _prompts((9, 30, 4, 22, 13, 7, 26, 5), seed=8)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    kw = dict(max_batch_size=4, max_num_tokens=32, device="cuda")
    eager = _llm(model, kvcm_version, **kw).generate(prompts, params)
    llm = _llm(model, kvcm_version, cuda_graph=True, **kw)
    assert sorted(llm.graphs.buckets) == [16, 32] and all(s.graph is not None for s in llm.graphs.buckets.values())
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_bucket_replays > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager]
    refs = hf_generate(model, prompts, 20, eos_token_id=[])
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]


@pytest.mark.gpu(count=1)
def test_estimation_cache_is_returned_before_the_final_cache_is_sized():
    """The final cache's budget is its fraction of the free memory the engine started with: the estimation
    cache (the same fraction) must be back on the device first, or the final pool comes out near half size."""
    model, _ = tiny_model("llama", seed=0, device="cuda")
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, free_gpu_memory_fraction=0.2)
    llm = LLM(model, kvcm_version="v2", kv_cache_config=cfg, max_batch_size=4, max_seq_len=64, device="cuda",
              cuda_graph=True)
    assert llm.warmup_reports[0].cache == "estimation"
    assert llm.manager.budget_bytes >= 0.2 * free * 0.97, (llm.manager.budget_bytes, free)
    llm.close()
