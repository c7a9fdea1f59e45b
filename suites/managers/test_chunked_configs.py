"""Chunked-local configs read as transformers reads them, or refused naming the field (issue 52).

Before: a layer given both a window and a chunk kept the chunk and dropped the window without a word;
``attention_chunk_size=0`` was read as "no chunk", where transformers reads 0 as set (the layers are chunked, and
its mask then divides by 0); a Llama 4 ``config.json`` without ``layer_types`` was read as all full attention, where
transformers derives the chunked layers from ``no_rope_layers`` (``Llama4TextConfig.__post_init__``: a RoPE layer,
1, is chunked; a NoPE layer, 0, is full; none given: every ``no_rope_layer_interval``-th layer is NoPE; no
``attention_chunk_size`` key: 8192).
"""

from __future__ import annotations

import pytest

from kvcm.errors import ConfigError
from kvcm.model_spec import LayerSpec, ModelSpec


def chunks(cfg: dict) -> list:
    return [layer.attention_chunk for layer in ModelSpec.from_hf_config(cfg).layers]


def llama4(**fields) -> dict:
    """A Llama 4 text config.json as a checkpoint ships it: no ``layer_types`` unless given."""
    return {"model_type": "llama4_text", "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "hidden_size": 64} | fields


@pytest.mark.parametrize("spec", [
    lambda: LayerSpec(1, 16, sliding_window=8, attention_chunk=8),
    lambda: ModelSpec.uniform(2, 1, 16, sliding_window=8, attention_chunk=16),
])
def test_a_layer_with_a_window_and_a_chunk_is_refused(spec):
    """transformers gives each layer one type (``sliding_attention`` or ``chunked_attention``, never both)."""
    with pytest.raises(ConfigError, match=r"attention_chunk=\d+ is invalid: a layer is sliding-window or "
                                          r"chunked-local, not both \(sliding_window=8 was given too"):
        spec()


@pytest.mark.parametrize("chunk", [0, -4])
def test_an_attention_chunk_size_of_zero_is_set_as_transformers_reads_it(chunk):
    cfg = llama4(layer_types=["chunked_attention", "full_attention"] * 4, attention_chunk_size=chunk)
    with pytest.raises(ConfigError, match=rf"attention_chunk_size={chunk} is invalid: must be >= 1"):
        ModelSpec.from_hf_config(cfg)


def test_chunked_layers_need_a_chunk_size():
    """Outside Llama 4 there is no default to fall back on (transformers' mask raises "Could not find an
    ``attention_chunk_size``")."""
    cfg = llama4(model_type="mymodel", layer_types=["chunked_attention", "full_attention"] * 4)
    with pytest.raises(ConfigError, match=r"attention_chunk_size=None is invalid: .*chunked_attention"):
        ModelSpec.from_hf_config(cfg)


CASES = {
    "no_rope_layers": dict(no_rope_layers=[1, 0, 1, 0, 1, 1, 1, 0], attention_chunk_size=16),
    "the default interval": dict(attention_chunk_size=16),
    "an empty no_rope_layers": dict(no_rope_layers=[], attention_chunk_size=16),
    "another interval": dict(no_rope_layer_interval=3, attention_chunk_size=16),
    "no attention_chunk_size key": dict(no_rope_layers=[1, 1, 0, 0, 1, 1, 0, 0]),
    "attention_chunk_size null": dict(attention_chunk_size=None),
    "layer_types without a chunk size": dict(layer_types=["chunked_attention", "full_attention"] * 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_llama4_config_reads_as_transformers_reads_it(case):
    """Each case through transformers' own ``Llama4TextConfig`` and through ``from_hf_config`` on the raw dict."""
    transformers = pytest.importorskip("transformers")
    cfg = llama4(**CASES[case])
    hf = transformers.Llama4TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    want = [hf.attention_chunk_size if t == "chunked_attention" else None for t in hf.layer_types]
    assert chunks(cfg) == want
    assert chunks(hf) == want                        # the config object reads the same


def test_the_issue_case_is_chunked_where_it_was_all_full():
    assert chunks(llama4(attention_chunk_size=8192)) == [8192, 8192, 8192, None] * 2
