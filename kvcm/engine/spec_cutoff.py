"""When a speculative engine speculates: at or below a number of active requests, plain decoding above it.

A verification step computes ``1 + D`` tokens per sequence. At a few rows the GPU is idle most of a step, so
the extra tokens are nearly free and every accepted draft is a token gained; past some batch the GPU is busy and
a verification costs what it computes, so speculation loses (on the H200, SmolLM2-135M bf16, n-gram pool, D = 4:
1.57x plain at batch 1 and 0.40x at batch 64). The engines this one models switch it off above a batch size:

* TensorRT-LLM: ``max_concurrency`` on the speculative config; each iteration the executor asks the drafter
  ``should_use_spec_decode(active_requests, max_batch_size, max_num_tokens, max_draft_len)``
  (``tensorrt_llm/_torch/speculative/drafter.py``), which speculates while ``min(active requests,
  max_batch_size, max_num_tokens // (1 + max_draft_len))`` is at most ``max_concurrency``; None (its default)
  always speculates;
* vLLM (v0): ``speculative_disable_by_batch_size``, the same test on the running requests.

:func:`should_speculate` is TensorRT-LLM's test, run before every step on the requests running and waiting.
Unlike TensorRT-LLM, ``LLM`` does not default to "always": its default, :data:`DEFAULT_SPEC_MAX_CONCURRENCY`,
comes from ``benchmarks/gpu_spec.py --only speed`` (docs/benchmarks.md, "The speculation cut-off"). Run with every timed run
cold, on an H100, batch 8 did not reliably pay: the n-gram pool at D = 4 gave 0.91x-1.04x plain over two runs
and the draft model under the acceptance gate 0.94x-0.95x, while batch 1 gave 1.26x-1.34x with the pool. So
the default is 4, below the batch that lost and the value vLLM's test of its disable-by-batch-size uses
(PR #5000, ``tests/spec_decode/e2e/test_ngram_correctness.py``). ``spec_max_concurrency=None`` gives
TensorRT-LLM's behaviour.

Above the cut-off the engine runs plain steps, overlapped when the engine overlaps (``pipeline.py``); the step
that turns speculation back on first completes the step in flight. The n-gram pool learns what it missed at its
next proposal; a draft model's cache, fed nothing while speculation was off, catches up when it is on again
(``ModelDrafter.begin_decode``). Tokens are plain greedy decoding's either way.
"""
from __future__ import annotations

from .. import validation

#: Active requests at or below which ``LLM`` speculates (see the module docstring for where it comes from).
DEFAULT_SPEC_MAX_CONCURRENCY = 4


def check(value) -> int | None:
    """``spec_max_concurrency``: None (always speculate) or an int >= 0 (0: never)."""
    return None if value is None else validation.count("spec_max_concurrency", value, 0)


def should_speculate(num_active: int, *, max_concurrency: int | None, max_batch_size: int,
                     max_num_tokens: int | None, num_draft: int) -> bool:
    """TensorRT-LLM's ``Drafter.should_use_spec_decode``: the requests a step could verify at once are the
    active ones, at most a batch and at most the token budget's worth of ``1 + D``-token rows."""
    if max_concurrency is None:
        return True
    if num_active <= 0:
        return False
    effective = min(num_active, max_batch_size)
    if max_num_tokens is not None:
        effective = min(effective, max_num_tokens // (1 + num_draft))
    return 0 < effective <= max_concurrency
