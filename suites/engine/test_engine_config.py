"""``EngineConfig``: LLM's options as one frozen value, checked before any page is allocated.

Before, ``LLM.__init__`` took 26 keywords checked in three styles, and a drafter's draft length had to be given
twice (``max_draft_len`` beside ``NgramDrafter(4)``), a mismatch found only after the target cache was built.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvcm import ConfigError
from kvcm.engine import LLM
from kvcm.engine.config import EngineConfig
from kvcm.engine.drafters import NgramDrafter
from kvcm.models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")[0]


def test_the_config_is_frozen_and_holds_the_limits():
    cfg = EngineConfig(max_batch_size=4, max_seq_len=128, max_draft_len=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_batch_size = 8
    assert (cfg.limits.max_batch_size, cfg.limits.max_seq_len, cfg.limits.max_draft_len) == (4, 128, 2)
    assert cfg.replace(max_batch_size=8).limits.max_batch_size == 8


@pytest.mark.parametrize("field, value, message", [
    ("overlap", 1, "overlap=1"), ("max_batch_size", 0, "max_batch_size=0"),
    ("decode_split_len", 33, "multiple of"), ("spec_acceptance_threshold", 2.0, "in \\[0, 1\\]"),
    ("enable_block_reuse", "yes", "True, False or None"), ("cuda_graph_batch_sizes", [0], "cuda_graph_batch_sizes"),
    ("pipelined_keys", "on", "pipelined_keys='on'"), ("decode_rows_by_index", None, "decode_rows_by_index=None"),
    ("step_row_map", 1, "step_row_map=1"),
])
def test_a_bad_field_is_one_config_error_naming_it(field, value, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**{field: value})


def test_llm_takes_the_keywords_or_one_config_not_both(model):
    llm = LLM(model, config=EngineConfig(max_batch_size=2, max_seq_len=64))
    assert llm.config.max_batch_size == llm.max_batch_size == 2
    assert LLM(model, max_batch_size=2, max_seq_len=64).config == llm.config
    with pytest.raises(ConfigError, match="not both"):
        LLM(model, config=EngineConfig(), max_batch_size=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_batch'"):
        LLM(model, max_batch=2)


def test_the_draft_length_is_given_once(model):
    llm = LLM(model, max_batch_size=2, max_seq_len=64, drafter=NgramDrafter(3))
    assert llm.max_draft_len == llm.limits.max_draft_len == 3 and llm.drafter.num_draft == 3
    assert LLM(model, max_batch_size=2, max_seq_len=64, drafter=NgramDrafter(3), max_draft_len=3).max_draft_len == 3
    with pytest.raises(ConfigError, match="must equal the drafter's num_draft=3"):
        LLM(model, max_batch_size=2, max_seq_len=64, drafter=NgramDrafter(3), max_draft_len=2)
    with pytest.raises(ConfigError, match="needs max_draft_len >= 1"):
        LLM(model, max_batch_size=2, max_seq_len=64, drafter="ngram")
