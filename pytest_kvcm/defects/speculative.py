"""Speculative decoding with a draft model: the target's and the draft's caches kept in step.

Two managers serve one request, so every capacity decision happens twice: the budget is split, a preempted
request leaves both caches, and the draft's cache must hold every committed token before it proposes.
"""

from __future__ import annotations


from ._registry import defect

_ENGINE = "suites/engine/test_speculative.py::"
_BUDGET = "suites/managers/test_draft_budget.py::"


@defect("draft-budget-claimed-twice", upstream="TensorRT-LLM PR #12188 (target and draft KV cache managers each "
        "claimed the full max_gpu_total_bytes)",
        story="the draft's KV cache took the whole memory budget beside the target's: twice the memory asked "
              "for, out of memory at the first large batch",
        catchers=(_BUDGET + "test_target_and_draft_pools_fit_one_budget",
                  _BUDGET + "test_engine_caches_share_the_budget"))
def draft_budget_claimed_twice():
    return {"draft_budget_shares": lambda total, target_bytes, draft_bytes: (total, total)}


@defect("spec-preempt-keeps-draft", upstream="TensorRT-LLM PR #18093 (target and draft reservations rolled back "
        "and released together on suspension)",
        story="a preempted request's pages were freed on the target's cache only: the draft's cache kept them "
              "and the request's stale draft history, and its re-prefill failed",
        catchers=(_ENGINE + "test_preemption_with_drafts_in_flight",
                  _ENGINE + "test_preemption_when_the_draft_cache_runs_out"))
def spec_preempt_keeps_draft():
    return {"preemption_frees_draft": False}


@defect("draft-skips-committed-token", upstream="vllm-project/vllm-metal PR #716 (committed tokens not fed to the "
        "draft model's KV cache)",
        story="after a step that accepted every draft, the last proposal was never fed to the draft's cache: "
              "the drafter proposed from a hole in its context and acceptance fell, tokens still right",
        catchers=(_ENGINE + "test_perfect_drafter_accepts_everything[v1-v2]",
                  _ENGINE + "test_perfect_drafter_accepts_everything[v2-v1]"))
def draft_skips_committed_token():
    return {"draft_feeds_every_missing_token": False}


_CUTOFF = "suites/engine/test_spec_cutoff.py::"


@defect("draft-cache-stale-after-plain-steps", upstream="NVIDIA/TensorRT-LLM tests/unittest/_torch/speculative/"
        "hw_agnostic/test_min_runtime_draft_len.py (a draft length of 0 stopped refreshing the drafter's KV)",
        story="above the speculation cut-off the draft model was fed nothing; when speculation came back the "
              "draft's request held every position but computed only the prompt, so drafts read the positions "
              "of the tokens generated meanwhile, allocated but never written, and acceptance fell, tokens "
              "still right",
        catchers=(_CUTOFF + "test_draft_model_cache_catches_up_after_plain_steps[reuse_off-v1-v2]",
                  _CUTOFF + "test_draft_model_cache_catches_up_after_plain_steps[reuse_off-v2-v1]"))
def draft_cache_stale_after_plain_steps():
    return {"draft_refill_to_context_end": False}


_GATE = "suites/engine/test_spec_gate.py::"


@defect("spec-gate-overridden-by-cutoff", upstream="NVIDIA/TensorRT-LLM PR #7283 (the speculation gate; its fixes "
        "list 'permanent-disable takes precedence over dynamic drafting')",
        story="the acceptance gate closed on a drafter that was losing, and the batch cut-off, asked after it, "
              "turned speculation back on the next step: a drafter at a quarter of plain speed kept drafting",
        catchers=(_GATE + "test_a_losing_draft_model_is_turned_off_after_the_window[v1]",
                  _GATE + "test_a_losing_draft_model_is_turned_off_after_the_window[v2]"))
def spec_gate_overridden_by_cutoff():
    return {"speculate_step": lambda under_cutoff, gate_closed: under_cutoff}
