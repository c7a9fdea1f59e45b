"""The speculation cut-off (``kvcm/engine/spec_cutoff.py``): above ``spec_max_concurrency`` active requests the
engine runs plain (overlapped) steps, at or below it speculative ones, and switching between the two, in either
direction and many times in one ``generate``, gives exactly plain greedy decoding's tokens.

The decision is TensorRT-LLM's ``Drafter.should_use_spec_decode`` (``tensorrt_llm/_torch/speculative/drafter.py``,
``max_concurrency`` on its speculative config); switching speculation off and on inside a generation and checking
the text against plain decoding is what ``tests/unittest/_torch/speculative/test_dynamic_spec_decode.py`` does
upstream. A draft model's cache, fed nothing while speculation is off, must catch up when it comes back on: the
tests with a draft model check that it did (drafts accepted after plain steps) and gave every page back.
"""

import pytest

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.spec_cutoff import DEFAULT_SPEC_MAX_CONCURRENCY, should_speculate
from kvcm.models import hf_generate, truncated_drafter
from pytest_kvcm.parity import compare_outputs

from _prompts import random_prompts

NEW_TOKENS = 24
PARAMS = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    # ten requests, four at a time (``build``'s batch): above a cut-off of 3 until the last wave of two
    return random_prompts(3, [5, 9, 14, 21, 30, 7, 12, 17, 26, 33])


@pytest.fixture(scope="module")
def reference(target, prompts):
    return hf_generate(target, prompts, NEW_TOKENS, eos_token_id=[])


@pytest.fixture(scope="module")
def staggered(target, prompts, reference):
    """Stop tokens taken from five outputs at positions 3 .. 15, so requests end at different steps and the
    active count falls below the cut-off while requests are part way through their generation (their draft
    caches then lag). Returns the params and Hugging Face's outputs with the same stop tokens."""
    stops = sorted({reference[i].token_ids[3 + 3 * i] for i in range(5)})
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, stop_token_ids=stops)
    return params, hf_generate(target, prompts, NEW_TOKENS, eos_token_id=stops)


def build(target, drafter, cutoff, *, tv="v2", dv="v2", reuse=False, d=3, **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=4096, dtype="float32", enable_block_reuse=reuse)
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("spec_acceptance_window", 0)   # the cut-off alone decides here (the gate: test_spec_gate.py)
    return LLM(target, kvcm_version=tv, kv_cache_config=cfg, max_seq_len=128, max_draft_len=d, drafter=drafter,
               draft_kvcm_version=dv, spec_max_concurrency=cutoff, **kw)


def _pages_back(llm):
    for mgr in (llm.manager, getattr(llm.drafter, "manager", None)):
        if mgr is not None:
            assert not mgr.request_ids, f"requests still held: {mgr.request_ids}"


# ---- the decision: TensorRT-LLM's should_use_spec_decode --------------------------------------------------------
@pytest.mark.parametrize("active,cutoff,batch,tokens,draft,expected", [
    (4, None, 8, None, 4, True),      # no cut-off: always (TensorRT-LLM's default)
    (4, 4, 8, None, 4, True),         # at the cut-off: on
    (5, 4, 8, None, 4, False),        # above it: off
    (64, 8, 8, None, 4, True),        # a step verifies at most max_batch_size requests
    (64, 8, 64, 50, 4, False),        # 50 // (1 + 4) = 10 rows fit the token budget: 10 > 8
    (64, 10, 64, 50, 4, True),        # ... 10 <= 10
    (64, 8, 64, 4, 4, False),         # not one verification row fits the token budget
    (0, 8, 8, None, 4, False),        # nothing active
    (1, 0, 8, None, 4, False),        # 0: never
])
def test_the_cutoff_is_tensorrt_llms_test(active, cutoff, batch, tokens, draft, expected):
    assert should_speculate(active, max_concurrency=cutoff, max_batch_size=batch, max_num_tokens=tokens,
                            num_draft=draft) is expected


# ---- the engine: exact across switches -------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "serial"])
def test_ngram_switches_off_above_the_cutoff_and_back_on(target, prompts, staggered, kvcm_version, overlap,
                                                         greedy_parity):
    params, reference = staggered
    llm = build(target, "ngram", 3, tv=kvcm_version, overlap=overlap)
    outs = llm.generate(prompts, params)
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=("hf", "cutoff-3")), model="tiny-llama-4l")
    st = llm.spec_stats
    assert st.steps_off > 0, "ten requests are above a cut-off of 3: the first steps must run plain"
    assert st.steps > 0, "once three requests are left the engine must speculate again"
    if overlap:
        assert llm.pipeline.num_launched_ahead > 0, "plain steps above the cut-off must overlap"
    _pages_back(llm)


@pytest.mark.parametrize("tv,dv", [("v1", "v2"), ("v2", "v1"), ("v2", "v2")])
@pytest.mark.parametrize("reuse", [False, True], ids=["reuse_off", "reuse_on"])
def test_draft_model_cache_catches_up_after_plain_steps(target, prompts, staggered, tv, dv, reuse, greedy_parity):
    """Speculation off for the first steps, then on: the draft caches of requests part way through lag by the
    plain steps' tokens and are remade up to the target's history; with a perfect drafter (the target itself) a
    lagging draft cache would show as rejected drafts, so acceptance must stay total."""
    params, reference = staggered
    llm = build(target, target, 3, tv=tv, dv=dv, reuse=reuse)
    outs = llm.generate(prompts, params)
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=("hf", "cutoff-3-model")),
                        model="tiny-llama-4l")
    st = llm.spec_stats
    assert st.steps_off > 0 and st.steps > 0
    assert llm.drafter.num_resyncs > 0, "no request went from plain steps to speculative ones"
    assert st.accepted == st.proposed > 0, f"a perfect drafter rejected drafts after the switch: {st.as_dict()}"
    _pages_back(llm)


def test_truncated_draft_switching_with_chunked_prefill(target, prompts, staggered, greedy_parity):
    """A token budget of 24 splits prompts into chunks and caps a verification step at 24 // (1 + 3) = 6 rows:
    the cut-off of 4 is crossed while prefill chunks run beside decodes."""
    params, reference = staggered
    llm = build(target, truncated_drafter(target, 2), 4, max_batch_size=8, max_num_tokens=24)
    outs = llm.generate(prompts, params)
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=("hf", "waves")), model="tiny-llama-4l")
    assert llm.spec_stats.steps_off > 0 and llm.spec_stats.steps > 0 and llm.drafter.num_resyncs > 0
    _pages_back(llm)


def test_zero_never_speculates_and_none_always(target, prompts, reference):
    never = build(target, "ngram", 0)
    assert compare_outputs(reference, never.generate(prompts, PARAMS), prompts).passed
    assert never.spec_stats.steps == 0 and never.spec_stats.steps_off > 0
    always = build(target, "ngram", None)
    assert compare_outputs(reference, always.generate(prompts, PARAMS), prompts).passed
    assert always.spec_stats.steps_off == 0 and always.spec_stats.steps > 0


def test_an_engine_gets_the_measured_default(target):
    llm = LLM(target, max_seq_len=128, max_draft_len=2, drafter="ngram")
    assert llm.spec_max_concurrency == DEFAULT_SPEC_MAX_CONCURRENCY


def test_static_steps_with_the_cutoff(target, prompts, reference, greedy_parity):
    """The graph path run statically on the CPU: plain shapes above the cut-off, verification shapes below,
    both warmed up."""
    llm = build(target, "ngram", 3, cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4, 8, 16])
    outs = llm.generate(prompts, PARAMS)
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=("hf", "static")), model="tiny-llama-4l")
    assert llm.graphs.num_replays > 0 and llm.spec_stats.steps_off > 0
    assert {(4, 1), (4, 4), (2, 4)} <= set(llm.graphs.shapes)


@pytest.mark.parametrize("bad", [-1, 2.5, "16", True])
def test_rejects_a_bad_cutoff(target, bad):
    with pytest.raises(kvcm.ConfigError, match="spec_max_concurrency"):
        build(target, "ngram", bad)
