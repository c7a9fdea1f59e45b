"""Gemma 3's layout at toy size, on both attention paths: five sliding layers (window 16) then a global one, one
KV head of width 256, two RoPE bases, random weights. Cheap enough to cross the window dozens of times, so the
window is checked in the torch reference (CPU), in the Triton kernel (CUDA, or the CPU under
``TRITON_INTERPRET=1``, which ``test_tiny_gemma3_under_the_triton_interpreter`` runs in a subprocess).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams, triton_attention
from kvcm.models import hf_generate

from _prompts import random_prompts
from kvcm import versions
from kvcm.versions import NAMES as ALL_VERSIONS

WINDOW = 16


def tiny_gemma3(seed: int = 0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=256, sliding_window=WINDOW,
                           layer_types=["sliding_attention"] * 5 + ["full_attention"], max_position_embeddings=512,
                           query_pre_attn_scalar=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy choices sit far above rounding
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_gemma3()


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("chunk", [None, 12], ids=["whole_prefill", "chunked"])
def test_tiny_gemma3_v1_v2_hf(model, chunk):
    device = _device()
    model.to(device)
    prompts = random_prompts(7, [5, 15, 16, 17, 40, 70])
    ref = hf_generate(model, prompts, max_new_tokens=24, eos_token_id=[])
    margins = {}
    for version in ALL_VERSIONS:
        llm = LLM(model, kvcm_version=version, max_batch_size=8, max_seq_len=128, max_num_tokens=chunk, device=device,
                  kv_cache_config=kvcm.KvCacheConfig(max_tokens=1024, tokens_per_block=4, dtype="float32"))
        outs = llm.generate(prompts, SamplingParams(max_new_tokens=24, ignore_eos=True))
        assert [o.token_ids for o in outs] == [r.token_ids for r in ref], version
        margins[version] = [m for o in outs for m in o.logits_margins]
        sliding = llm.page_usage[0]
        assert sliding.window == WINDOW
        assert (sliding.released_stale > 0) == versions.get(version).cls.releases_window_pages
    assert max(abs(a - b) for a, b in zip(margins["v1"], margins["v2"])) <= 1e-4
    model.to("cpu")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_tiny_gemma3_reuses_a_prefix_longer_than_the_window(model, version):
    """A second request sharing 60 tokens (almost four windows) with the first: block reuse on gives the tokens
    of reuse off, and the cached length reaches past the window (V1 the whole prefix; V2 what its sliding group
    still holds in window at the final length, docs/semantics.md 11.2)."""
    device = _device()
    model.to(device)
    shared = random_prompts(7, [60])[0]
    first, second = shared + random_prompts(8, [10])[0], shared + random_prompts(9, [12])[0]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    runs = {}
    for reuse in (False, True):
        llm = LLM(model, kvcm_version=version, max_batch_size=4, max_seq_len=256, device=device,
                  enable_block_reuse=reuse,
                  kv_cache_config=kvcm.KvCacheConfig(max_tokens=1024, tokens_per_block=4, dtype="float32"))
        runs[reuse] = [llm.generate([p], params)[0].token_ids for p in (first, second)]
        if reuse:
            assert llm.reuse_stats.reused_tokens > WINDOW, str(llm.reuse_stats)
    model.to("cpu")
    assert runs[True] == runs[False]


@pytest.mark.cpu_only
@pytest.mark.slow
def test_tiny_gemma3_under_the_triton_interpreter():
    """The same gates through the Triton kernels, executed by the interpreter on this CPU."""
    if torch.cuda.is_available() or triton_attention.triton is None or triton_attention.interpreted():
        pytest.skip("the kernels run directly here, or Triton is absent")
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-x",
                          "-k", "v1_v2_hf"], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
