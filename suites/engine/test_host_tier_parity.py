"""Greedy parity with the host tier (``LLM(host_cache_size=...)``, V1's secondary pool and V2's host level): tier
on == tier off == Hugging Face
``generate``, exact in fp32, on prompts whose shared prefixes do not fit the GPU pool together but fit the host
tier; the tier must really bring blocks back (onboarded > 0) and compute fewer prefill tokens than without it
(TensorRT-LLM #8813: with host_cache_size, hits returned other prompts' tokens)."""

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import hf_generate, tiny_model

NEW = 8
TPB = 8
PREFIX = 48                       # six blocks a prefix


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")[0]


def block_bytes(model) -> int:
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    probe = kvcm.create_kv_cache_manager("v1", spec, kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=TPB,
                                                                        dtype="float32"),
                                         max_batch_size=1, max_seq_len=256, device="meta")
    return sum(g.bytes_per_block for g in probe.layer_groups)


def prompts(seed: int, rounds: int = 2):
    """Four prefixes of 48 tokens, each with a fresh 5-token suffix per round: round r asks every prefix again."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [torch.randint(3, 256, (PREFIX,), generator=g).tolist() for _ in range(4)]
    return [[p + torch.randint(3, 256, (5,), generator=g).tolist() for p in prefixes] for _ in range(rounds)]


def run(model, host_blocks: int, version: str = "v1"):
    """Round 1 caches the four prefixes (they need 28 blocks; the GPU pool has 16), round 2 asks them again."""
    llm = LLM(model, kvcm_version=version, max_batch_size=1, max_seq_len=256, enable_block_reuse=True,
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=16 * TPB, dtype="float32"),
              host_cache_size=host_blocks * block_bytes(model) if host_blocks else None)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    first, second = prompts(5)
    llm.generate(first, params)
    outs = llm.generate(second, params)
    return [o.token_ids for o in outs], llm, second


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_host_tier_on_equals_off_equals_hf(llama, version):
    on, llm_on, second = run(llama, host_blocks=32, version=version)
    off, llm_off, _ = run(llama, host_blocks=0, version=version)
    assert on == off
    ref = [o.token_ids for o in hf_generate(llama, second, NEW)]
    assert [o[:len(r)] for o, r in zip(on, ref)] == ref
    stats = llm_on.manager.get_kv_cache_stats()
    assert stats.offloaded_blocks > 0 and stats.onboarded_blocks > 0
    assert llm_on.reuse_stats.computed_tokens < llm_off.reuse_stats.computed_tokens


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_lower_tier_only_equals_hf_with_every_hit_from_the_host(llama, version):
    """``KvCacheConfig(lower_tier_only=True)`` (docs/semantics.md 11.8): every block a finished request leaves
    cached goes to the host tier at once, so every block the second round reuses is copied back from host memory;
    greedy output is still Hugging Face's."""
    llm = LLM(llama, kvcm_version=version, max_batch_size=1, max_seq_len=256, enable_block_reuse=True,
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=16 * TPB, dtype="float32",
                                                 lower_tier_only=True),
              host_cache_size=32 * block_bytes(llama))
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    first, second = prompts(5)
    llm.generate(first, params)
    outs = [o.token_ids for o in llm.generate(second, params)]
    ref = [o.token_ids for o in hf_generate(llama, second, NEW)]
    assert [o[:len(r)] for o, r in zip(outs, ref)] == ref
    stats = llm.manager.get_kv_cache_stats()
    assert stats.reused_blocks > 0 and stats.reused_host_blocks == stats.reused_blocks, \
        f"{stats.reused_host_blocks} of {stats.reused_blocks} reused blocks came back from the host"


def test_the_engine_refuses_async_onboard(llama):
    """The engine brings host hits back within the step; a cache that leaves them in flight is one ConfigError."""
    with pytest.raises(kvcm.ConfigError, match="kv_cache_config.async_onboard.*True.*complete_transfers"):
        LLM(llama, kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=16 * TPB, async_onboard=True,
                                                      host_cache_size=1 << 20))
