"""Target and draft caches share one memory budget (speculative decoding with a draft model).

The field's bug, TensorRT-LLM PR #12188: with a separate draft KV cache, "both managers independently claim the
full max_gpu_total_bytes budget", twice the memory asked for, and the engine ran out of memory. The fix splits
the byte budget in proportion to each model's KV bytes per token; a token budget means the same for both.
"""
import pytest

import kvcm
from kvcm import draft_budget
from kvcm.draft_budget import total_budget_bytes

GiB = 2**30
TARGET = kvcm.ModelSpec.uniform(num_layers=32, num_kv_heads=8, head_dim=128)
DRAFT = kvcm.ModelSpec.uniform(num_layers=4, num_kv_heads=8, head_dim=128)


def _managers(cfg, kvcm_version, free=80 * GiB):
    t_cfg, d_cfg = draft_budget.split_draft_budget(cfg, TARGET, DRAFT, free_memory_bytes=free)
    kw = dict(max_batch_size=64, max_seq_len=4096, max_draft_len=4, device="meta", free_memory_bytes=free)
    return (kvcm.create_kv_cache_manager(kvcm_version, TARGET, t_cfg, **kw),
            kvcm.create_kv_cache_manager(kvcm_version, DRAFT, d_cfg, **kw))


@pytest.mark.parametrize("cfg", [kvcm.KvCacheConfig(max_gpu_total_bytes=8 * GiB),
                                 kvcm.KvCacheConfig(free_gpu_memory_fraction=0.1),
                                 kvcm.KvCacheConfig(max_gpu_total_bytes=20 * GiB, free_gpu_memory_fraction=0.1)],
                         ids=["total_bytes", "fraction", "smallest_wins"])
def test_target_and_draft_pools_fit_one_budget(cfg, kvcm_version):
    budget = total_budget_bytes(cfg, 80 * GiB)
    target, draft = _managers(cfg, kvcm_version)
    assert target.pool_bytes + draft.pool_bytes <= budget, (
        f"target {target.pool_bytes} + draft {draft.pool_bytes} bytes exceed the one budget of {budget}")
    # proportional to bytes per token: both caches hold about the same number of tokens
    assert abs(target.max_tokens - draft.max_tokens) <= 2 * target.tokens_per_block, (target.max_tokens,
                                                                                       draft.max_tokens)
    assert target.pool_bytes + draft.pool_bytes > 0.95 * budget, "the split should use the budget"


def test_token_budget_is_each_caches_own():
    cfg = kvcm.KvCacheConfig(max_tokens=4096)
    assert draft_budget.split_draft_budget(cfg, TARGET, DRAFT) == (cfg, cfg)


def test_fraction_without_free_memory_names_the_field():
    with pytest.raises(kvcm.ConfigError, match="free_memory_bytes"):
        draft_budget.split_draft_budget(kvcm.KvCacheConfig(free_gpu_memory_fraction=0.5), TARGET, DRAFT)


def test_engine_caches_share_the_budget():
    """The engine's own target and draft managers (a 4-layer tiny model and its 2-layer drafter) together
    stay inside ``max_gpu_total_bytes``."""
    from kvcm.engine import LLM
    from kvcm.models import tiny_model, truncated_drafter
    model = tiny_model("llama", num_hidden_layers=4)[0]
    budget = 1 << 20
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_gpu_total_bytes=budget, dtype="float32")
    llm = LLM(model, kv_cache_config=cfg, max_batch_size=4, max_seq_len=128, max_draft_len=2,
              drafter=truncated_drafter(model, 2))
    used = llm.manager.pool_bytes + llm.drafter.manager.pool_bytes
    assert used <= budget, f"target {llm.manager.pool_bytes} + draft {llm.drafter.manager.pool_bytes} > {budget}"


def test_plan_shows_the_split(capsys):
    """``kvcm plan --draft-model``: Llama-3-8B (131072 bytes a token in bf16) and Qwen3-0.6B (114688) split
    72 GiB (0.9 x 80) in proportion, the draft's share rounded down as TensorRT-LLM's
    ``_compute_draft_budget_shares`` does, and both final caches fit their shares."""
    import json

    import kvcm.cli
    rc = kvcm.cli.main(["plan", "--model", "llama-3-8b", "--draft-model", "qwen3-0.6b", "-D", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    split = out["draft_split"]
    total = int(0.9 * 80 * GiB)
    assert split["total_bytes"] == total
    assert split["draft_bytes"] == total * 114688 // (131072 + 114688)
    assert split["target_bytes"] + split["draft_bytes"] == total
    for m in out["managers"]:
        assert m["final"]["pool_bytes"] + m["draft"]["pool_bytes"] <= total, m["kvcm_version"]
    kvcm.cli.main(["plan", "--model", "llama-3-8b", "--draft-model", "qwen3-0.6b", "-D", "4", "--kvcm-version", "v2"])
    assert "split by KV bytes per token: target 38.4 GiB, draft 33.6 GiB" in capsys.readouterr().out
