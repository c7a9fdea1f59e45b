"""A ``generate`` whose user code fails (an ``on_finish`` that raises) holds nothing afterwards, and says whose code
failed (issue 52).

Before, the exception came up raw from the middle of the step loop and every request still running kept its pages:
``reset_prefix_cache()`` answered False for good, and the next ``generate`` ran with those pages gone.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.errors import UserCallbackError
from kvcm.models import tiny_model

from _prompts import random_prompts

PROMPTS = random_prompts(11, (5, 23, 37, 9, 14, 30))
PARAMS = SamplingParams(max_new_tokens=12, ignore_eos=True)


def _llm(kvcm_version, **kw):
    model, _ = tiny_model("llama", seed=2)
    cfg = kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=2048, dtype="float32")
    return LLM(model, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=8, max_seq_len=128, **kw)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_on_finish_that_raises_leaves_no_request_held(kvcm_version, overlap):
    llm = _llm(kvcm_version, overlap=overlap)
    want = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    free = llm.manager.get_num_free_blocks()

    def on_finish(i):
        raise RuntimeError(f"the progress bar is closed (prompt {i})")

    with pytest.raises(UserCallbackError, match=r"on_finish raised RuntimeError: the progress bar is closed") \
            as err:
        llm.generate(PROMPTS, PARAMS, on_finish=on_finish)
    assert err.value.callback == "on_finish" and isinstance(err.value.__cause__, RuntimeError)
    assert llm.manager.request_ids == [], "a generate that raised still holds requests"
    assert llm.manager.get_num_free_blocks() == free
    assert llm.reset_prefix_cache()
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == want      # the engine is whole again


def test_any_failure_inside_generate_releases_its_requests(kvcm_version, monkeypatch):
    """Not only the user's callbacks: whatever raises part way (here the model's forward, as a CUDA error would),
    the requests this call made are freed before the error goes up."""
    llm = _llm(kvcm_version, overlap=False)
    calls = []
    run = llm.pipeline.runner.run

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return run(*args, **kwargs)

    monkeypatch.setattr(llm.pipeline.runner, "run", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(PROMPTS, PARAMS)
    assert llm.manager.request_ids == []
    assert llm.reset_prefix_cache()
