"""Block reuse in the engine: where a prefill starts once the manager has found a cached prefix.

The manager's reuse decisions have their own defects; these break the engine's side of the hand-over, the
prefill start (the policy's ``prefill_after_hit``). Both change greedy tokens, so the reuse parity gates must fail.
"""

from __future__ import annotations

from ._registry import defect

_GATES = "suites/engine/test_reuse_parity.py::"


@defect("reuse-prefill-skips-a-token", upstream="vLLM #5543 / #7845 (inconsistent greedy completions with prefix "
        "caching: the computed-token count and the cached blocks disagreed)",
        story="a request admitted with a cached prefix started its prefill one token past the cached length: "
              "that token's KV was never written and the completion changed on the second run",
        catchers=(_GATES + "test_prefill_starts_at_the_cached_length",
                  _GATES + "test_shared_prefixes_diverging_at_block_boundaries"))
def reuse_prefill_skips_a_token():
    return {"prefill_after_hit": "one_past"}


@defect("reuse-prefill-trusts-any-hit", upstream="TensorRT-LLM #8813 (tokens from other prompts after reuse) / "
        "#15503 (logits that change on repeat)",
        story="any cached prefix was taken for the whole prompt: the prefill computed only the last token and "
              "attention read pages never written for this prompt",
        catchers=(_GATES + "test_prefill_starts_at_the_cached_length",
                  _GATES + "test_shared_prefixes_diverging_at_block_boundaries",
                  _GATES + "test_reuse_after_preemption",
                  "suites/engine/test_reuse_gsm8k.py::test_fewshot_parity_tiny"))
def reuse_prefill_trusts_any_hit():
    return {"prefill_after_hit": "last_token"}
