"""Engine defaults sized to a reference run: a small KV pool off CUDA, and an LLM that says what it reserved.

When the work outgrows the pool the scheduler preempts (suites/engine/test_scheduler.py). The old default reserved a full batch of full-length requests (64 x 2048 tokens: 5.6 GiB of zeros for
SmolLM2-135M in fp32) to answer one 11-token prompt.
"""

from __future__ import annotations

import logging

import pytest

from kvcm.engine import LLM
from kvcm.engine.llm import CPU_DEFAULT_MAX_TOKENS
from kvcm.models import tiny_model
from kvcm.units import human_bytes


@pytest.fixture(scope="module")
def llama():
    # positions for the 16384-token case (LLM refuses a max_seq_len past the model's max_position_embeddings)
    return tiny_model("llama", max_position_embeddings=16384)[0]


def test_default_cpu_pool_is_small_and_repr_says_what_it_reserved(llama, caplog):
    with caplog.at_level(logging.INFO, logger="kvcm.engine"):
        llm = LLM(llama, max_batch_size=64, max_seq_len=2048)
    assert llm.manager.max_tokens == CPU_DEFAULT_MAX_TOKENS == 8192  # not 64 x 2048 = 131,072
    per_token = llm.manager.pool_bytes // llm.manager.max_tokens
    text = repr(llm)
    assert f"KV cache {human_bytes(per_token * 8192)} on cpu = 8,192 tokens (v2, 32 tokens a block)" in text
    assert "max_batch_size=64, max_seq_len=2048" in text
    assert text in caplog.text  # logged once built


@pytest.mark.parametrize("batch, seq_len, num_tokens, expected", [
    (4, 512, None, 2048),        # a full batch of full-length requests is below the cap: exactly that
    (1, 16384, None, 16384),     # one request of max_seq_len always fits
    (64, 2048, 12288, 12288),    # so does one step of max_num_tokens
])
def test_default_cpu_pool_floor_and_cap(llama, batch, seq_len, num_tokens, expected):
    llm = LLM(llama, max_batch_size=batch, max_seq_len=seq_len, max_num_tokens=num_tokens)
    assert llm.manager.max_tokens == expected

