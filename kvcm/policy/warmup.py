"""Dummy requests and CUDA-graph warmup (``add_dummy_requests``, ``kvcm/warmup.py``)."""

from __future__ import annotations

import math

from .. import validation
from ._decisions import Decisions, rule, setting

RELEASED = ("all", "last", "none")   # which of a failed dummy call's dummies it releases: made, made[-1:], []


class WarmupDecisions(Decisions):
    SUBSYSTEM = "dummies and warmup"

    @rule("a dummy call checked whole before anything is placed: (request_ids, token_nums, is_gen, drafts, "
          "reserve) as lists and counts, or a ConfigError naming the field (kvcm before 4044276 checked each dummy "
          "while placing it: add_dummy_requests('abc') made three dummies)")
    def checked_dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
                           max_seq_len: int) -> tuple:
        return validation.dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
                                     max_seq_len)

    dummies_released_when_refused = setting(
        "all", "the dummies a call releases when one does not fit: every one it made ('last': only the one that "
        "failed, TensorRT-LLM PR #17162 leaked those before it and estimation hung)", choices=RELEASED)

    dummies_released_when_raised = setting(
        "all", "the dummies a call releases when placing one raises: every one it made ('none': kvcm before "
        "4044276 kept them held, the pool smaller; 'last' as TensorRT-LLM PR #17162)", choices=RELEASED)

    gen_dummy_extra_slots = setting(
        0, "the slots a generation dummy holds beyond token_num + E + the draft reservation: none (TensorRT-LLM PR "
        "#19213: generation dummies one token too large skipped page-boundary shapes)")

    @rule("the draft slots warmup's dummies reserve: the shape's draft length unless the caller says otherwise "
          "(vLLM PR #50531 / #51438: warmup without the spec-decode lookahead)")
    def warmup_draft_reserve(draft_len: int, kv_reserve_draft_tokens: int | None) -> int:
        return draft_len if kv_reserve_draft_tokens is None else kv_reserve_draft_tokens

    dummy_batch_checked_first = setting(
        True, "whether a warmup batch that cannot fit is refused before its first dummy is placed when placing "
        "would evict cached blocks: an eviction is not undone by releasing the dummies, so placing first left a "
        "refused add_dummy_requests with fewer cached blocks than before (found by the exhaustive explorer, issue "
        "39)")

    @rule("the most tokens the long warmup dummy may hold before the free blocks are counted: max_seq_len - 1 - E - "
          "K, and never past the model's positions less the K reserved draft slots (TensorRT-LLM model_engine.py "
          "_create_cuda_graph_warmup_request: min(token_num, max_position_embeddings - max_draft_loop_tokens)); "
          "without it a max_seq_len beyond the model's positions warmed up positions no request can reach")
    def long_dummy_cap(max_seq_len: int, extra_kv_tokens: int, reserve: int,
                       max_position_embeddings: int | None) -> int:
        cap = max_seq_len - 1 - extra_kv_tokens - reserve
        if max_position_embeddings is not None:
            cap = min(cap, max_position_embeddings - reserve)
        return cap

    @rule("the powers of two TensorRT-LLM adds to its default CUDA-graph batch sizes: 256, 512, ... below the "
          "maximum (llm_args.py _generate_cuda_graph_batch_sizes, range(8, ceil(log2(max)))); the floor that range "
          "once used dropped the last power below a maximum that is not one (512 for a maximum of 600)")
    def cuda_graph_powers_of_two(max_batch_size: int) -> list[int]:
        return [2**i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]


def released(made: list, which: str) -> list:
    """The dummies of ``made`` that ``which`` (one of ``RELEASED``) names."""
    return made if which == "all" else made[-1:] if which == "last" else []
