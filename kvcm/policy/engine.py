"""The engine's scheduler, drafter and reuse hand-over (``kvcm/engine``)."""

from __future__ import annotations

from ._decisions import Decisions, rule, setting


class EngineDecisions(Decisions):
    SUBSYSTEM = "engine"

    preemption_frees_draft = setting(
        True, "whether preempting a request frees its pages in the draft model's cache too, where there is one "
        "(TensorRT-LLM PR #18093: target and draft released together)")

    draft_feeds_every_missing_token = setting(
        True, "whether the draft model's first forward of a step starts at its own history, so it is fed every "
        "committed token it lacks; else at the last token only (vllm-metal PR #716)")

    draft_refill_to_context_end = setting(
        True, "whether the refill of a draft request made after steps without speculation runs to the end of its "
        "context, every token the target committed while the drafter was idle; else it stops at the prompt "
        "(TensorRT-LLM test_min_runtime_draft_len.py: with a draft length of 0 the drafter's KV was not refreshed "
        "while the target committed tokens, and later drafts attended to positions allocated but never written)")

    @rule("whether a step speculates: under the batch cut-off and the acceptance gate still open, a closed gate "
          "winning over the cut-off (TensorRT-LLM PR #7283, whose fixes list 'permanent-disable takes precedence "
          "over dynamic drafting')")
    def speculate_step(under_cutoff: bool, gate_closed: bool) -> bool:
        return under_cutoff and not gate_closed

    @rule("whether a request is retired when its step is committed, before its token is read: when the token "
          "reaches max_new_tokens or max_seq_len (vLLM PR #27922: async scheduling ran one step past max_tokens)")
    def retire_at_commit(num_outputs: int, max_new_tokens: int, num_tokens: int, max_seq_len: int) -> bool:
        return num_outputs >= max_new_tokens or num_tokens >= max_seq_len

    prefill_after_hit = setting(
        "cached_length", "where the prefill of a request admitted with a cached prefix starts: at the prepopulated "
        "prompt length the manager returned ('one_past': a token later, never past the last; 'last_token': at the "
        "prompt's last token whatever was cached). vLLM #5543 / #7845 and TensorRT-LLM #8813 / #15503: an engine "
        "whose computed-token count disagreed with the cached blocks skipped or misplaced prompt tokens and greedy "
        "outputs changed on repeat", choices=("cached_length", "one_past", "last_token"))
