"""The engine end to end: greedy tokens equal Hugging Face ``generate`` whatever the scheduling does to the
cache (chunked prefill, preemption by recompute, batch and token limits), on V1 and V2."""
import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import hf_generate, tiny_model


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


_REFS = {}


def _hf_refs(arch, prompts, n, **kw):
    """HF generate once per (arch, prompts, n): the V1/V2 and chunked variants compare against the same run."""
    key = (arch, tuple(map(tuple, prompts)), n, tuple(sorted(kw.items())))
    if key not in _REFS:
        _REFS[key] = hf_generate(tiny_model(arch, seed=1)[0], prompts, n, **kw)
    return _REFS[key]


def _llm(model, kvcm_version, *, max_tokens=2048, tpb=8, **kw):
    cfg = kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=max_tokens, dtype="float32")
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("max_seq_len", 128)
    return LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, trace=True, **kw)


def _assert_same(outs, refs):
    for i, (o, r) in enumerate(zip(outs, refs)):
        if o.token_ids != r.token_ids:
            k = next((j for j, (a, b) in enumerate(zip(o.token_ids, r.token_ids)) if a != b),
                     min(len(o.token_ids), len(r.token_ids)))
            pytest.fail(f"prompt {i}: first difference at generated position {k}: engine "
                        f"{o.token_ids[k:k + 1]} vs HF {r.token_ids[k:k + 1]}, engine margin "
                        f"{o.logits_margins[k] if k < len(o.logits_margins) else None}")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("max_num_tokens", [None, 16], ids=["whole-prefill", "chunked"])
def test_greedy_matches_hf_generate(arch, max_num_tokens, kvcm_version):
    model, _ = tiny_model(arch, seed=1)
    prompts = _prompts((5, 23, 37, 9))           # 37 + 24 tokens: well past mistral's window of 16
    refs = _hf_refs(arch, prompts, 24)
    llm = _llm(model, kvcm_version, max_num_tokens=max_num_tokens)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=24))
    _assert_same(outs, refs)
    assert [o.index for o in outs] == list(range(len(prompts)))
    if max_num_tokens:
        steps = {}
        for r in llm.trace:
            steps[r.step] = steps.get(r.step, 0) + r.num_new_tokens
        assert max(steps.values()) <= max_num_tokens
        assert any(r.phase == "prefill" and r.history > 0 for r in llm.trace), "a prompt must have been chunked"
    assert not llm.manager.request_ids, "finished requests must free their pages"


def test_preemption_by_recompute_keeps_tokens(kvcm_version):
    """A pool of 12 blocks of 8 tokens cannot hold four 20 + 40 token requests at once: the newest running one
    is preempted, recomputed later, and every request still decodes the HF tokens."""
    model, _ = tiny_model("llama", seed=2)
    prompts = _prompts((20, 18, 22, 19), seed=3)
    refs = hf_generate(model, prompts, 40, eos_token_id=[])
    llm = _llm(model, kvcm_version, max_tokens=96)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert llm.num_preemptions > 0, "the pool must be small enough to force preemption"
    assert sum(o.num_preemptions for o in outs) == llm.num_preemptions
    _assert_same(outs, refs)
    assert all(len(o.token_ids) == 40 for o in outs)


def test_batch_size_limit(kvcm_version):
    model, _ = tiny_model("llama", seed=0)
    llm = _llm(model, kvcm_version, max_batch_size=2)
    llm.generate(_prompts((4, 5, 6, 7, 8)), SamplingParams(max_new_tokens=5, ignore_eos=True))
    per_step = {}
    for r in llm.trace:
        per_step[r.step] = per_step.get(r.step, 0) + 1
    assert max(per_step.values()) == 2


def test_stop_conditions():
    model, _ = tiny_model("llama", seed=4)
    prompt = _prompts((6,))[0]
    llm = _llm(model, "v2")
    free = llm.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[5]
    out = llm.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=(stop,)))[0]
    assert out.token_ids == free[:free.index(stop) + 1] and out.finish_reason == "stop_token"
    out = llm.generate([prompt], SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
    assert out.token_ids == free[:3] and out.finish_reason == "length"
    short = _llm(model, "v2", max_seq_len=10)
    out = short.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    assert out.token_ids == free[:4] and out.finish_reason == "max_seq_len"
    with pytest.raises(ValueError, match="max_seq_len=10"):
        short.generate([list(range(3, 13))], SamplingParams())


class _CharTokenizer:
    """Token t decodes to chr(ord('a') + t % 26): enough to test stop strings without a real tokenizer."""
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + t % 26) for t in ids)


def test_stop_string_cuts_text():
    model, _ = tiny_model("llama", seed=4)
    prompt = _prompts((6,))[0]
    tok = _CharTokenizer()
    llm = _llm(model, "v2")
    llm.tokenizer = tok
    free = llm.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    stop = free.text[4:6]
    out = llm.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True, stop_strings=(stop,)))[0]
    assert out.finish_reason == "stop_string"
    assert out.text == free.text[:free.text.index(stop)]
    assert out.token_ids == free.token_ids[:len(out.token_ids)]


def test_pool_too_small_for_one_request_names_the_limit(kvcm_version):
    model, _ = tiny_model("llama", seed=0)
    llm = _llm(model, kvcm_version, max_tokens=16)
    with pytest.raises(RuntimeError, match="enlarge the cache"):
        llm.generate(_prompts((40,)), SamplingParams(max_new_tokens=4))
