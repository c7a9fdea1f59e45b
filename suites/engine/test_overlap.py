"""The overlapped step loop (``kvcm/engine/pipeline.py``) gives the non-overlapped loop's greedy outputs.

Overlapped, step n + 1 is scheduled and launched before step n's tokens are read: its decodes carry
placeholders that the runner swaps for step n's tokens, and a sequence whose token stops it runs one step too
many. So the cases that matter are sequences stopping at different steps on a token (not only on a length),
preemption by recompute while a token is on the way, chunked prefill, and the static (graph) path. A length
limit needs no token, so no request may run a step past it (vLLM PR #27922;
``--kvcm-inject=async-scheduling-past-max-tokens`` puts that defect back).
"""
import pytest

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import tiny_model
from kvcm.engine.runner import placeholder

from _prompts import random_prompts


def _llm(model, kvcm_version, *, overlap, max_tokens=2048, **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=max_tokens, dtype="float32")
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("max_seq_len", 128)
    return LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, overlap=overlap, **kw)


def _stop_tokens(model, kvcm_version, prompts, n):
    """Tokens that the model emits part way through several outputs: stopping on them ends requests at
    different steps, which is what the overlapped loop learns a step late."""
    outs = _llm(model, kvcm_version, overlap=False).generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
    counts = {}
    for o in outs:
        for t in set(o.token_ids[2:n - 4]):
            counts[t] = counts.get(t, 0) + 1
    return tuple(sorted(counts, key=lambda t: -counts[t])[:2])


def _same(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.token_ids == y.token_ids, f"prompt {i}: overlapped {x.token_ids} vs not {y.token_ids}"
        assert x.finish_reason == y.finish_reason, f"prompt {i}"
        # a stopped sequence's extra step changes the batch beside the others, so fp32 sums may round apart
        assert x.logits_margins == pytest.approx(y.logits_margins, abs=1e-4), f"prompt {i}"
    assert len(a) == len(b)


CASES = {
    "plain": dict(),
    "chunked": dict(max_num_tokens=16),
    "preempting": dict(max_tokens=96, max_batch_size=6),
    "static-path": dict(cuda_graph=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_loop_gives_the_same_outputs(kvcm_version, case):
    model, _ = tiny_model("llama", seed=2)
    prompts = random_prompts(11, (5, 23, 37, 9, 14, 30, 3, 18, 26, 11))
    stops = _stop_tokens(model, kvcm_version, prompts, 24)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=stops)
    kw = CASES[case]
    ref_llm = _llm(model, kvcm_version, overlap=False, **kw)
    ref = ref_llm.generate(prompts, params)
    llm = _llm(model, kvcm_version, overlap=True, **kw)
    outs = llm.generate(prompts, params)
    _same(outs, ref)
    reasons = {o.finish_reason for o in ref}
    assert {"stop_token", "length"} <= reasons, f"the prompts must stop both ways: {reasons}"
    assert llm.pipeline.num_launched_ahead > 0 and ref_llm.pipeline.num_launched_ahead == 0
    if case == "preempting":
        assert llm.num_preemptions > 0, "the pool must be small enough to force preemption"
    if case == "static-path":
        assert llm.graphs.num_replays > 0
    llm.close()
    assert not llm.manager.request_ids, "every request (and the graph pad) must give its pages back"


def test_placeholders_are_resolved_on_the_device_side():
    """The runner swaps a placeholder for the token the last step sampled at that logit row."""
    import torch
    model, _ = tiny_model("llama", seed=2)
    llm = _llm(model, "v2", overlap=True)
    llm.runner.last_tokens[:3] = torch.tensor([17, 42, 99])
    ids = torch.tensor([5, placeholder(1), 7, placeholder(0), placeholder(2)])
    assert llm.runner.resolve_placeholders(ids).tolist() == [5, 42, 7, 17, 99]


@pytest.mark.parametrize("cutoff,overlapped", [(None, False), (0, True)], ids=["always_speculating", "never"])
def test_speculative_steps_never_overlap_and_plain_ones_do(cutoff, overlapped):
    """A verification's tokens decide the next step's drafts, so speculative steps run serially; with a drafter
    but speculation off (``spec_max_concurrency``) the steps are plain and overlap."""
    model, _ = tiny_model("llama", seed=2)
    llm = _llm(model, "v2", overlap=True, max_draft_len=2, drafter="ngram", spec_max_concurrency=cutoff)
    llm.generate(random_prompts(13, (6, 11, 17)), SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert (llm.pipeline.num_launched_ahead > 0) is overlapped


@pytest.mark.parametrize("case", ["plain", "static-path"])
def test_no_step_past_a_length_limit(kvcm_version, case):
    """Every request stops on its length limit: each runs exactly max_new_tokens - 1 decodes (the first token
    comes from its prefill), overlapped as serial; one more is a step scheduled past max_tokens."""
    model, _ = tiny_model("llama", seed=2)
    prompts = random_prompts(12, (5, 23, 9, 14, 30, 3))
    n = 10
    llm = _llm(model, kvcm_version, overlap=True, trace=True, **CASES[case])
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
    assert all(len(o.token_ids) == n and o.finish_reason == "length" for o in outs)
    decodes = sum(r.phase == "decode" for r in llm.trace)
    assert decodes == len(prompts) * (n - 1), (
        f"{decodes} decode forwards for {len(prompts)} requests of {n} tokens: "
        f"{decodes - len(prompts) * (n - 1)} past the length limit")


@pytest.mark.parametrize("overlap", [False, True])
def test_on_finish_is_called_once_per_request_as_it_finishes(overlap):
    """``generate(on_finish=...)`` (progress bars per question): once per request, at the step it finishes, on
    both loops, with requests stopping on a token, on a length (retired at commit, then again at completion)
    and after preemption."""
    model, _ = tiny_model("llama", seed=2)
    prompts = random_prompts(11, (5, 23, 37, 9, 14, 30, 3, 18, 26, 11))
    params = SamplingParams(max_new_tokens=24, stop_token_ids=_stop_tokens(model, "v2", prompts, 24))
    llm = _llm(model, "v2", overlap=overlap, trace=True, **CASES["preempting"])
    done, steps = [], []

    def on_finish(i):
        done.append(i)
        steps.append(len(llm.trace))        # forwards run so far

    outs = llm.generate(prompts, params, on_finish=on_finish)
    assert sorted(done) == list(range(len(prompts)))
    assert steps == sorted(steps) and steps[0] < steps[-1], steps  # each one as it left, not all at the end
    assert {o.finish_reason for o in outs} >= {"stop_token", "length"}
    assert llm.num_preemptions > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_the_timeline_records_every_launch_on_the_host_clock(overlap):
    """``StepPipeline.timeline`` (what ``benchmarks/host_step.py`` and ``step_profile.py`` read instead of
    wrapping the pipeline): one launch a forward, in order on the host's clock, each with its rows and the static
    step that ran it (None when eager), and no CUDA events off CUDA; nothing is recorded once it is unset."""
    model, _ = tiny_model("llama", seed=2)
    llm = _llm(model, "v2", overlap=overlap, trace=True, cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4, 8],
               max_num_tokens=16)
    prompts = random_prompts(13, (5, 23, 9, 14, 30))
    before = {r.step for r in llm.trace}          # the warm-up's dummy forwards
    llm.pipeline.timeline = timeline = []
    llm.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert len(timeline) == len({r.step for r in llm.trace} - before) > 0
    assert [t.host for t in timeline] == sorted(t.host for t in timeline)
    assert all(t.start is None and t.done is None for t in timeline)
    decodes = [t for t in timeline if t.static is not None and t.static.q_len == 1]
    assert decodes and all(t.rows <= t.static.buf.num_seqs for t in decodes)
    assert any(t.static is None for t in timeline)       # prefill chunks run eagerly off the Triton kernels
    llm.pipeline.timeline = None
    llm.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert llm.pipeline.timeline is None and len(timeline) == len({r.step for r in llm.trace} - before) - 2
