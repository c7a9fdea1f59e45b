"""Speculative decoding is exact: the tokens of target-only greedy decoding, for every draft length and every
V1/V2 pairing of the target's and the draft's managers; and its acceptance length does not silently collapse."""

import pytest
import torch

import kvcm
from kvcm.models import chat_prompt_ids, hf_generate, require_smollm2, tiny_model, truncated_drafter
from kvcm.engine.speculative import SpeculativeLLM
from pytest_kvcm.parity import compare_outputs

from _prompts import random_prompts

NEW_TOKENS = 32
PAIRS = [("v1", "v1"), ("v1", "v2"), ("v2", "v1"), ("v2", "v2")]






@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", num_hidden_layers=4)[0]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(0, [5, 12, 21, 38])


@pytest.fixture(scope="module")
def reference(target, prompts):
    return hf_generate(target, prompts, NEW_TOKENS, eos_token_id=[])


def spec(target, draft, d, tv="v2", dv="v2", max_tokens=2048, tpb=8, **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=max_tokens, dtype="float32")
    return SpeculativeLLM(target, draft, num_draft=d, target_version=tv, draft_version=dv,
                          target_kv_cache_config=cfg, draft_kv_cache_config=cfg, eos_token_ids=(), **kw)


def _check(greedy_parity, reference, outs, prompts, names):
    greedy_parity.check(compare_outputs(reference, outs, prompts, names=names), model="tiny-llama-4l")


@pytest.mark.parametrize("d", [1, 2, 4])
@pytest.mark.parametrize("tv,dv", PAIRS, ids=[f"target_{a}-draft_{b}" for a, b in PAIRS])
def test_truncated_drafter_gives_target_tokens(target, prompts, reference, d, tv, dv, greedy_parity):
    llm = spec(target, truncated_drafter(target, 3), d, tv, dv)
    _check(greedy_parity, reference, llm.generate(prompts, NEW_TOKENS), prompts, ("target", f"spec_d{d}"))
    assert llm.stats.accepted > 0
    for mgr in (llm.target_mgr, llm.draft_mgr):  # every page back in the pool
        assert not mgr.request_ids


@pytest.mark.gpu(count=1)
@pytest.mark.parametrize("d", [1, 2, 4])
@pytest.mark.parametrize("tv,dv", PAIRS, ids=[f"target_{a}-draft_{b}" for a, b in PAIRS])
def test_truncated_drafter_gives_target_tokens_on_gpu(prompts, d, tv, dv, greedy_parity):
    """The same exactness on CUDA, where both models run the Triton paged kernels (fp32)."""
    target = tiny_model("llama", num_hidden_layers=4, device="cuda")[0]
    reference = hf_generate(target, prompts, NEW_TOKENS, eos_token_id=[])
    llm = spec(target, truncated_drafter(target, 3), d, tv, dv, device="cuda")
    _check(greedy_parity, reference, llm.generate(prompts, NEW_TOKENS), prompts, ("target", f"spec_d{d}"))
    assert llm.stats.accepted > 0


@pytest.mark.parametrize("d", [1, 4])
def test_other_model_as_drafter_gives_target_tokens(target, prompts, reference, d, greedy_parity):
    """A drafter that is nearly always wrong exercises the rewind of every rejected slot."""
    llm = spec(target, tiny_model("llama", seed=7)[0], d, "v2", "v1")
    _check(greedy_parity, reference, llm.generate(prompts, NEW_TOKENS), prompts, ("target", f"other_d{d}"))


@pytest.mark.parametrize("tv,dv", [("v1", "v2"), ("v2", "v1")])
def test_perfect_drafter_accepts_everything(target, prompts, reference, tv, dv, greedy_parity):
    """Draft = target: every proposal accepted, so the draft's cache lags by one token each step (the last
    proposal is never fed to it) and must catch up with a two-token forward."""
    d = 4
    llm = spec(target, truncated_drafter(target, 4), d, tv, dv)
    _check(greedy_parity, reference, llm.generate(prompts, NEW_TOKENS), prompts, ("target", "self_draft"))
    assert llm.stats.acceptance_rate == 1.0
    assert llm.stats.mean_acceptance_length == d + 1


@pytest.mark.parametrize("tv,dv", [("v1", "v1"), ("v2", "v2")])
def test_preemption_under_a_small_pool(target, prompts, reference, tv, dv, greedy_parity):
    llm = spec(target, truncated_drafter(target, 2), 4, tv, dv, max_tokens=120)
    _check(greedy_parity, reference, llm.generate(prompts, NEW_TOKENS), prompts, ("target", "spec_small_pool"))
    assert llm.stats.preemptions > 0, "the pool was meant to force preemption"


def test_sliding_window_target(greedy_parity):
    model = tiny_model("mistral", num_hidden_layers=3)[0]
    ps = random_prompts(1, [10, 30])
    ref = hf_generate(model, ps, NEW_TOKENS, eos_token_id=[])
    llm = spec(model, truncated_drafter(model, 2), 4, "v2", "v2")
    greedy_parity.check(compare_outputs(ref, llm.generate(ps, NEW_TOKENS), ps, names=("target", "spec")))


def test_stops_at_eos_and_max_new_tokens(target, prompts, reference):
    eos = reference[2].token_ids[6]
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=2048, dtype="float32")
    llm = SpeculativeLLM(target, truncated_drafter(target, 3), num_draft=4, target_kv_cache_config=cfg,
                         draft_kv_cache_config=cfg, eos_token_ids=(eos,))
    outs = llm.generate(prompts, 10)
    for o, ref in zip(outs, reference):
        toks = ref.token_ids[:10]
        if eos in toks:
            toks = toks[:toks.index(eos) + 1]
        assert o.token_ids == toks
    assert outs[2].finish_reason == "eos" and len(outs[2].token_ids) == 7


def test_rejects_bad_arguments(target):
    with pytest.raises(ValueError, match="num_draft=0"):
        SpeculativeLLM(target, target, num_draft=0)
    with pytest.raises(ValueError, match="vocab_size=300"):
        SpeculativeLLM(target, tiny_model("llama", vocab_size=300)[0], num_draft=2)
    llm = spec(target, truncated_drafter(target, 1), 4, max_seq_len=64)
    with pytest.raises(ValueError, match="exceeds max_seq_len=64"):
        llm.generate([[3] * 40], 24)


# ---- acceptance-length tripwire ------------------------------------------------------------------------------

# Measured on this seeded 4-layer model, D = 4, 4 prompts x 32 tokens: 3-layer drafter 1.73 tokens a step,
# unrelated model 1.0. The floor sits between: a change that breaks drafting (wrong positions, stale draft KV
# after a rewind) drops the truncated drafter to the unrelated model's level and trips it.
ACCEPTANCE_FLOOR = 1.4
NOT_HELPING = 1.1


def test_acceptance_length_tripwire(target, prompts, kvcm_results):
    good = spec(target, truncated_drafter(target, 3), 4)
    good.generate(prompts, NEW_TOKENS)
    bad = spec(target, tiny_model("llama", seed=7)[0], 4)
    bad.generate(prompts, NEW_TOKENS)
    kvcm_results.record(metric="spec.mean_acceptance_length", value=good.stats.mean_acceptance_length,
                        threshold=ACCEPTANCE_FLOOR, passed=good.stats.mean_acceptance_length >= ACCEPTANCE_FLOOR,
                        model="tiny-llama-4l", extra={"drafter": "truncated-3", "num_draft": 4})
    assert good.stats.mean_acceptance_length >= ACCEPTANCE_FLOOR, good.stats
    assert bad.stats.mean_acceptance_length < NOT_HELPING, f"an unrelated drafter should not help: {bad.stats}"


# ---- SmolLM2 -------------------------------------------------------------------------------------------------

def test_smollm2_truncated_drafter(greedy_parity, kvcm_results):
    model, tok = require_smollm2()
    prompts = [chat_prompt_ids(tok, q) for q in ("What is 12 times 7?", "Name three colors.")]
    ref = hf_generate(model, prompts, 16, eos_token_id=tok.eos_token_id)
    cfg = kvcm.KvCacheConfig(tokens_per_block=16, max_tokens=512, dtype="float32")
    llm = SpeculativeLLM(model, truncated_drafter(model, 10), num_draft=3, target_version="v2", draft_version="v1",
                         target_kv_cache_config=cfg, draft_kv_cache_config=cfg, eos_token_ids=(tok.eos_token_id,))
    outs = llm.generate(prompts, 16)
    greedy_parity.check(compare_outputs(ref, outs, prompts, names=("hf", "spec"), tokenizer=tok,
                                        margin_tolerance=1e-3), model="SmolLM2-135M")
    kvcm_results.record(metric="spec.mean_acceptance_length", value=llm.stats.mean_acceptance_length,
                        model="SmolLM2-135M", extra={"drafter": "truncated-10", "num_draft": 3})
    assert llm.stats.mean_acceptance_length > 1.0
