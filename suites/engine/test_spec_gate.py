"""The speculation gate (``kvcm/engine/spec_gate.py``): once the acceptance rate over the last ``window``
speculating steps falls below the drafter's break-even, the engine stops speculating for good, whatever the
batch cut-off says, and the tokens stay plain greedy decoding's.

The gate is TensorRT-LLM's ``SpeculationGate`` (``tensorrt_llm/_torch/speculative/speculation_gate.py``, PR #12905:
acceptance-rate samples, a rolling mean over a window, a permanent disable; here a sample is a verification and
the first window closes as soon as its outcome is certain); ``tests/unittest/_torch/speculative/test_spec_gate.py``
upstream checks the same three things: when the gate may close, that it closes on the rolling (not the
cumulative) mean, and that generation stays correct after it closes.
"""

import pytest

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.ngram import NgramDrafter
from kvcm.engine.spec_gate import DEFAULT_WINDOW, SpeculationGate, parameter_share
from kvcm.models import hf_generate, tiny_model
from pytest_kvcm.parity import compare_outputs

from _prompts import random_prompts
from kvcm.versions import NAMES as ALL_VERSIONS

NEW_TOKENS = 24
PARAMS = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def loser():
    """A draft model of other random weights: it almost never proposes the target's token."""
    return tiny_model("llama", num_hidden_layers=1, seed=7)[0]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(5, [6, 11, 17])


@pytest.fixture(scope="module")
def reference(target, prompts):
    return hf_generate(target, prompts, NEW_TOKENS, eos_token_id=[])


def build(target, drafter, *, kvcm_version="v2", d=3, **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=2048, dtype="float32")
    return LLM(target, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=1, max_seq_len=128,
               max_draft_len=d, drafter=drafter, draft_kvcm_version=kvcm_version, spec_max_concurrency=None, **kw)


# ---- the gate alone ----------------------------------------------------------------------------------------------
def test_it_closes_once_the_first_window_is_certain_to_fail():
    """Window 4, threshold 0.5 (a window sum of 2 needed): after a perfect sample and two empty ones the last
    slot, even perfect, leaves the sum at 2: not below, open; a third empty one makes it 1: closed, a slot early."""
    gate = SpeculationGate(4, 0.5)
    assert [gate.record(a, 2) for a in (2, 0, 0)] == [False, False, False]
    assert not gate.closed
    assert gate.record(0, 2) and gate.closed_at == 4
    early = SpeculationGate(4, 0.5)
    assert [early.record(a, 2) for a in (0, 0, 0)] == [False, False, True], "0 + 1 slot left < 2: certain"
    assert early.closed_at == 3 and early.mean_at_close == 0.0


def test_it_closes_on_the_rolling_mean_not_the_cumulative_one():
    """Three perfect verifications then empty ones, window 3, threshold 0.5: the cumulative mean is still 3/5 at
    the fifth, the mean of the last three is 1/3."""
    gate = SpeculationGate(3, 0.5)
    closed = [gate.record(a, 2) for a in (2, 2, 2, 0, 0, 0)]
    assert closed == [False, False, False, False, True, False]
    assert gate.closed_at == 5 and gate.mean_at_close == pytest.approx(1 / 3)


def test_verifications_without_drafts_and_a_mean_at_the_threshold_leave_it_open():
    gate = SpeculationGate(2, 0.5)
    for _ in range(5):
        gate.record(0, 0)                 # nothing proposed: nothing to judge
    assert gate.samples == 0
    gate.record(1, 2)
    gate.record(1, 2)
    assert not gate.closed, "a mean equal to the threshold breaks even: it stays open"
    gate.record(0, 2)
    assert gate.closed and gate.record(0, 0) is False and gate.samples == 3, "closed for good, nothing recorded"


def _closes_after(threshold, window=DEFAULT_WINDOW):
    """Verifications of rate 0 after which the gate is certain to close: the first k with window - k < t w."""
    return next(k for k in range(1, window + 1) if window - k < threshold * window)


# ---- in the engine -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_a_losing_draft_model_is_turned_off_after_the_window(target, loser, prompts, reference, kvcm_version,
                                                             greedy_parity, caplog):
    """Speculation stays off once the gate closes, though the cut-off (None: always) would speculate, and the
    log says why; the tokens are plain decoding's, and the draft cache gives every page back."""
    llm = build(target, loser, kvcm_version=kvcm_version)
    with caplog.at_level("INFO", logger="kvcm.engine.spec_gate"):
        outs = llm.generate(prompts, PARAMS)
    assert [r.message for r in caplog.records if "speculation off for good" in r.message], caplog.text
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=("hf", "gated")), model="tiny-llama-4l")
    gate, st = llm.spec_gate, llm.spec_stats
    assert gate.threshold == pytest.approx(parameter_share(loser, target)) and gate.threshold > 0.1
    assert st.accepted == 0, "the loser's drafts should all be rejected (the arithmetic below assumes it)"
    k = _closes_after(gate.threshold)
    assert gate.closed and gate.closed_at == k < DEFAULT_WINDOW, f"{gate!r}; {st.as_dict()}"
    assert st.steps == k, "one verification a step at batch 1: k of them, then none"
    # the first prompt's prefill step ran in speculative mode (nothing to verify), then the k verifications
    assert st.steps_gated == st.steps_off > 0 and st.steps_on == 1 + k
    assert not llm.drafter.manager.request_ids and not llm.manager.request_ids
    again = llm.generate(prompts, PARAMS)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]
    assert llm.spec_stats.steps_on == 0, "closed for good: the next generate must not speculate"


def test_a_new_window_or_drafter_starts_a_new_gate(target, loser, prompts):
    llm = build(target, loser)
    llm.generate(prompts, PARAMS)
    closed = llm.spec_gate
    assert closed.closed
    llm.spec_acceptance_window = 20
    assert llm.spec_gate is not closed and not llm.spec_gate.closed and llm.spec_gate.window == 20
    llm.generate(prompts[:1], PARAMS)
    assert llm.spec_stats.steps == _closes_after(llm.spec_gate.threshold, 20) and llm.spec_gate.closed
    llm.reset_spec_gate()
    assert not llm.spec_gate.closed and llm.spec_gate.samples == 0
    llm.spec_acceptance_window = 0
    assert llm.spec_gate is None
    llm.generate(prompts[:1], PARAMS)
    assert llm.spec_stats.steps_gated == 0 and llm.spec_stats.steps_off == 0, "a window of 0: no gate"


def test_a_drafter_that_pays_keeps_speculating(target, prompts, reference):
    """The target as its own draft: every draft is accepted, a rate of 1 is above any threshold."""
    llm = build(target, target, spec_acceptance_threshold=0.9)
    outs = llm.generate(prompts, PARAMS)
    assert compare_outputs(reference, outs, prompts).passed
    assert not llm.spec_gate.closed and llm.spec_gate.samples > DEFAULT_WINDOW
    assert llm.spec_stats.accepted == llm.spec_stats.proposed
    assert llm.spec_stats.steps_off == 0


def test_the_ngram_pool_costs_nothing_so_is_never_turned_off(target, prompts, reference):
    """Random prompts on a random model: the pool is wrong nearly every time, and still free, so its break-even
    is a rate of 0 and the gate never closes on it; an explicit threshold does close it."""
    free = build(target, "ngram")
    assert compare_outputs(reference, free.generate(prompts, PARAMS), prompts).passed
    assert free.spec_gate.threshold == 0.0 and NgramDrafter.cost_per_draft == 0.0
    assert not free.spec_gate.closed and free.spec_stats.steps_gated == 0
    strict = build(target, "ngram", spec_acceptance_threshold=0.99)
    assert compare_outputs(reference, strict.generate(prompts, PARAMS), prompts).passed
    assert strict.spec_gate.closed and strict.spec_stats.steps_gated > 0


def test_a_draft_models_break_even_is_its_share_of_the_parameters(target):
    """The target as its own draft costs a whole target forward a draft (break-even only if every draft is
    kept); keeping 2 of 4 layers costs more than half, the embedding and the LM head read in full each time."""
    from kvcm.models import truncated_drafter
    assert parameter_share(target, target) == 1.0
    layer = sum(p.numel() for p in target.model.layers[0].parameters())
    total = sum(p.numel() for p in target.parameters())
    assert parameter_share(truncated_drafter(target, 2), target) == pytest.approx((total - 2 * layer) / total)
    assert build(target, target).spec_gate.threshold == 1.0


def test_plain_graph_steps_after_the_gate_closes(target, loser, prompts, reference):
    """With graphs (run statically on the CPU: the same buffers and shapes as a CUDA replay), the steps after the
    gate closes replay the plain decode shapes the warmup captured beside the verification ones."""
    llm = build(target, loser, cuda_graph=True)
    outs = llm.generate(prompts, PARAMS)
    assert compare_outputs(reference, outs, prompts).passed
    assert llm.spec_gate.closed and llm.spec_stats.steps_gated > 0
    assert llm.graphs is not None and not any(r.skipped for r in llm.warmup_reports)
    assert llm.pipeline.num_launched_ahead > 0, "the plain steps after the gate closed must overlap"
