"""The capacity trace on a real forward: what the engine reserved and what attention read.

docs/semantics.md 4.1/4.2: a request decoding at history 31 grows 31 -> 32 and attention reads KV length 32; a warmup
generation dummy with history 31 and one input (``token_nums=[32]``) holds 32, and a forward on it reads 32.
The historic defect made the dummy hold 33 (one more block at tpb 32 boundaries).
"""
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import tiny_model
from kvcm.engine.runner import ModelRunner
from kvcm.engine.trace import Tracer


def _cfg(max_tokens=1024):
    return kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=max_tokens, dtype="float32")


def test_decode_at_history_31_reads_kv_length_32(kvcm_version):
    model, _ = tiny_model("llama", seed=0)
    llm = LLM(model, kvcm_version=kvcm_version, kv_cache_config=_cfg(), max_batch_size=4, max_seq_len=256,
              trace=True)
    prompt = list(range(3, 34))                  # 31 tokens
    llm.generate([prompt], SamplingParams(max_new_tokens=3, ignore_eos=True))
    prefill, first, second = llm.trace[:3]
    assert (prefill.phase, prefill.history, prefill.capacity, prefill.kv_len, prefill.num_new_tokens) == \
        ("prefill", 0, 31, 31, 31)
    assert (first.phase, first.history, first.capacity, first.kv_len, first.num_new_tokens) == \
        ("decode", 31, 32, 32, 1)
    assert first.blocks_per_group == (1,)
    assert (second.history, second.capacity, second.kv_len, second.blocks_per_group) == (32, 33, 33, (2,))


def test_generation_dummy_holds_32_and_attention_reads_32(kvcm_version):
    model, _ = tiny_model("llama", seed=0)
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    mgr = kvcm.create_kv_cache_manager(kvcm_version, spec, _cfg(), max_batch_size=4, max_seq_len=256,
                                       device="cpu")
    tracer = Tracer()
    runner = ModelRunner(model, mgr, tracer=tracer)
    dummies = mgr.add_dummy_requests(["warm"], token_nums=[32], is_gen=True)
    assert dummies is not None
    assert (mgr.get_history("warm"), mgr.get_capacity("warm")) == (31, 32)
    logits = runner.run_dummy_decode(dummies)
    assert logits.shape == (1, model.config.vocab_size) and torch.isfinite(logits).all()
    (rec,) = tracer.records
    assert (rec.phase, rec.history, rec.capacity, rec.kv_len, rec.num_new_tokens, rec.blocks_per_group) == \
        ("dummy", 31, 32, 32, 1, (1,))


def test_dummy_with_drafts_reads_history_plus_inputs(kvcm_version):
    """token_num 32 with 4 draft slots: capacity 36, 5 inputs at positions 31..35, KV length 36."""
    model, _ = tiny_model("llama", seed=0)
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    mgr = kvcm.create_kv_cache_manager(kvcm_version, spec, _cfg(), max_batch_size=4, max_seq_len=256,
                                       max_draft_len=4, device="cpu")
    tracer = Tracer()
    runner = ModelRunner(model, mgr, tracer=tracer)
    dummies = mgr.add_dummy_requests(["warm"], token_nums=[32], is_gen=True, max_num_draft_tokens=4)
    runner.run_dummy_decode(dummies)
    (rec,) = tracer.records
    assert (rec.history, rec.capacity, rec.kv_len, rec.num_new_tokens) == (31, 36, 36, 5)
