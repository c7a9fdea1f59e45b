"""Greedy parity with block reuse: reuse on == reuse off == Hugging Face ``generate``, exact in fp32, V1 and V2.

Each reuse run is the *second* ``generate`` of one engine (the first fills its cache, or a warm-up prompt list
does), and asserts that it really reused prompt tokens: a gate that never hit the cache would prove nothing.
The cases are the field's reuse bugs (vLLM #5543 / #7845 inconsistent greedy completions with prefix caching,
TensorRT-LLM #8813 tokens from other prompts, #15503 logits that change on repeat): the same prompt twice, shared
prefixes diverging at and around block boundaries, reuse after preemption, speculative decoding (n-gram and a
draft model with its own cache), chunked prefill, the static-graph and non-overlapped loops.
"""

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import hf_generate, tiny_model

from _prompts import random_prompts
from kvcm.versions import NAMES as ALL_VERSIONS

NEW = 16
TPB = 8


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")[0]


@pytest.fixture(scope="module")
def draft_model():
    return tiny_model("llama", seed=1)[0]


def build(model, version, reuse, *, max_tokens=2048, **kw):
    kw.setdefault("spec_acceptance_window", 0)   # a drafter here is about its cache: it speculates, paying or not
    kw.setdefault("spec_max_concurrency", None)  # at every batch, the cut-off's default notwithstanding
    return LLM(model, kvcm_version=version, max_batch_size=kw.pop("max_batch_size", 4), max_seq_len=256,
               enable_block_reuse=reuse, **kw,
               kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=max_tokens, dtype="float32"))


def run(model, version, reuse, prompts, *, warm=None, check_hit=True, **kw):
    """Generate ``warm`` (default: ``prompts``) then ``prompts`` on one engine; the second call's token ids."""
    llm = build(model, version, reuse, **kw)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    llm.generate(warm if warm is not None else prompts, params)
    outs = llm.generate(prompts, params)
    if reuse and check_hit:
        st = llm.reuse_stats
        assert st.reused_tokens > 0 and st.computed_tokens < st.prompt_tokens, f"no reuse happened: {st}"
    return [o.token_ids for o in outs], llm


def hf(model, prompts):
    """HF's tokens, cut after the model's EOS (the engine runs past it: ``ignore_eos``)."""
    return [o.token_ids for o in hf_generate(model, prompts, NEW)]


def assert_same(a, b, what):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"prompt {i}: {what} differ:\n{x}\n{y}"


def triple(model, version, prompts, **kw):
    """Reuse on vs reuse off vs HF on ``prompts``; returns the reuse-on engine."""
    on, llm = run(model, version, True, prompts, **kw)
    off, _ = run(model, version, False, prompts, **kw)
    assert_same(off, on, "reuse off and reuse on")
    ref = hf(model, prompts)
    assert_same(ref, [o[:len(r)] for o, r in zip(on, ref)], "HF generate and reuse on")
    return llm


def shared_prefix_prompts(seed=11):
    """Prompts sharing a prefix of block-boundary lengths (TPB - 1 .. 2 TPB + 1), then diverging."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 256, (40,), generator=g).tolist()
    prompts = []
    for cut in (TPB - 1, TPB, TPB + 1, 2 * TPB - 1, 2 * TPB, 2 * TPB + 1, 3 * TPB):
        tail = torch.randint(3, 256, (5,), generator=g).tolist()
        prompts.append(base[:cut] + tail)
    prompts.append(base[:2 * TPB])      # a prompt that is exactly a cached prefix (its last token recomputed)
    return prompts


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_same_prompt_twice(llama, version):
    p = random_prompts(20, [29])[0]
    llm = triple(llama, version, [p, p])
    assert llm.reuse_stats.token_hit_rate > 0.9


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_shared_prefixes_diverging_at_block_boundaries(llama, version):
    prompts = shared_prefix_prompts()
    triple(llama, version, prompts, warm=prompts[::-1])


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reuse_within_one_batch_and_chunked(llama, version):
    """One ``generate``: later admissions reuse what earlier ones stored; prefill in chunks of 12."""
    prompts = shared_prefix_prompts(12)
    llm = triple(llama, version, prompts, warm=prompts[:1], max_batch_size=2, max_num_tokens=12)
    assert llm.reuse_stats.admissions == len(prompts)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reuse_after_preemption(llama, version):
    """A 12-block pool cannot hold four sequences of 40-50 tokens sharing 3 blocks: preempted ones come back
    and reuse their own and the shared blocks."""
    head = random_prompts(13, [24])[0]
    prompts = [head + tail for tail in random_prompts(14, [10, 14, 18, 22])]
    llm = triple(llama, version, prompts, max_tokens=96)
    assert llm.num_preemptions > 0, "the pool was meant to force preemption"


@pytest.mark.parametrize("loop", ["static_graph", "not_overlapped"])
def test_reuse_on_other_loops(llama, loop):
    kw = dict(cuda_graph=True) if loop == "static_graph" else dict(overlap=False)
    triple(llama, "v2", shared_prefix_prompts(14), **kw)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reuse_with_ngram_speculation(llama, version):
    triple(llama, version, shared_prefix_prompts(15), drafter="ngram", max_draft_len=3)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reuse_with_a_draft_model(llama, draft_model, version):
    """Target and draft caches reuse on their own; the draft computes from its own cached length."""
    cfg = kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=2048, dtype="float32")
    llm = triple(llama, version, shared_prefix_prompts(16), drafter=draft_model, max_draft_len=3,
                 draft_kv_cache_config=cfg)
    assert llm.drafter.reuse and llm.drafter.manager.get_kv_cache_stats().reused_blocks > 0


def test_reuse_stats_and_off_switch(llama):
    p = random_prompts(21, [33])
    _, llm = run(llama, "v2", True, p)
    st = llm.reuse_stats
    assert (st.admissions, st.prompt_tokens, st.reused_tokens, st.computed_tokens) == (1, 33, 32, 1)
    assert st.reused_blocks == 4 and st.missed_blocks == 1 and "32/33 prompt tokens cached" in str(st)
    _, off = run(llama, "v2", False, p)
    assert off.reuse_stats.reused_tokens == 0 and off.reuse_stats.computed_tokens == 33
    with pytest.raises(kvcm.ConfigError, match="enable_block_reuse"):
        LLM(llama, enable_block_reuse=True, max_seq_len=256,
            kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=2048, enable_block_reuse=False))
    with pytest.raises(kvcm.ConfigError, match="enable_block_reuse"):
        LLM(llama, enable_block_reuse="yes", max_seq_len=256)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_prefill_starts_at_the_cached_length(llama, version):
    """Scheduler level: a readmitted prompt's first prefill item starts at the manager's prepopulated length and
    covers every token after it (a partial hit: 21 of 30 tokens cached, mid-block)."""
    from kvcm.engine.scheduler import Scheduler
    from kvcm.engine.sequence import Sequence

    head = random_prompts(22, [21])[0]
    first, second = head + [7, 8, 9], head + random_prompts(23, [9])[0]
    llm = build(llama, version, True)
    llm.generate([first], SamplingParams(max_new_tokens=2))
    sched = Scheduler(llm.manager, llm.limits, reuse=True)
    seq = Sequence(second, SamplingParams(max_new_tokens=2))
    sched.add(seq)
    _, items = sched.schedule()
    cached = llm.manager.get_prepopulated_prompt_len(seq.request_id)
    assert cached == 21
    assert (items[0].start, items[0].token_ids) == (cached, second[cached:])
    assert sched.reuse_stats.reused_tokens == cached and sched.reuse_stats.computed_tokens == len(second) - cached
    llm.manager.free_resources(seq.request_id)


@pytest.mark.parametrize("kw", [dict(), dict(cuda_graph=True), dict(cuda_graph=True, max_draft_len=3)],
                         ids=["eager", "graphs", "graphs-draft-model"])
def test_reset_prefix_cache_starts_the_next_generate_cold(llama, draft_model, kw):
    """``LLM.reset_prefix_cache`` (vLLM's): after it the next ``generate`` finds nothing cached, in the target's
    cache and the draft model's, and gives the same tokens as the first, cold one. A graph engine's pad request
    holds pages for the graphs' lifetime, so the manager alone refuses (vLLM test_reset_prefix_cache: not while a
    request holds pages); the engine moves it out of the way and its padding rows keep working after."""
    if "max_draft_len" in kw:
        kw = dict(kw, drafter=draft_model)
    llm = build(llama, "v2", True, max_batch_size=3, **kw)     # 4 prompts at batch 3: padded decode rows
    prompts = shared_prefix_prompts()         # they share prefixes: a cold run reuses within itself
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    cold = [o.token_ids for o in llm.generate(prompts, params)]
    cold_stats = llm.reuse_stats
    warm = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.reuse_stats.reused_tokens > cold_stats.reused_tokens
    if llm.graphs is not None:
        assert llm.manager.reset_prefix_cache() is False     # the pad request holds pages
    assert llm.reset_prefix_cache() is True
    assert llm.manager.get_num_reusable_blocks() == 0
    draft = getattr(llm.drafter, "manager", None)
    assert draft is None or draft.get_num_reusable_blocks() == 0
    again = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.reuse_stats == cold_stats, f"after the reset {llm.reuse_stats}, cold {cold_stats}"
    assert_same(again, cold, "after the reset vs the first run")
    assert_same(warm, cold, "the reusing run vs the first run")
