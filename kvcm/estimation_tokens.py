"""How many tokens TensorRT-LLM's estimation step gives its temporary cache (docs/semantics.md 10, "estimation
``max_tokens``").

``KvCacheCreator._get_token_num_for_estimation`` (``tensorrt_llm/_torch/pyexecutor/_util.py``) sizes the
estimation cache for the work it will run: the dummy context requests that fill ``max_num_tokens``
(``_create_dummy_context_requests``: requests of ``min(N, S - 1)`` prompt tokens until N tokens are used), each
with room for its generated tokens, and CUDA-graph warmup's longest batch (``ceil((S + 1) / tpb)`` blocks plus one
for each other request of the largest captured batch), at least one block per request of the batch, times the
pool groups a V2 cache divides its quota over and the beam width. With attention data parallelism the dummies are
copied to every rank but each rank runs only its share. kvcm's estimation cache keeps the byte budget instead
(its quota from ``max_tokens`` is another rule); this module restates upstream's count so a plan can show it.
"""

from __future__ import annotations

from .units import ceil_div


def dummy_context_lengths(max_num_tokens: int, max_seq_len: int) -> list[int]:
    """Prompt lengths of the estimation's dummy context requests: ``min(N, S - 1)`` each until N tokens."""
    length, left, out = min(max_num_tokens, max(1, max_seq_len - 1)), max_num_tokens, []
    while left > 0:
        out.append(min(length, left))
        left -= out[-1]
    return out


def extra_tokens_per_request(max_draft_len: int = 0, num_extra_kv_tokens: int = 0, *, speculative: bool = False,
                             overlap_scheduler: bool = True) -> int:
    """One generated token, and with speculation the draft tokens (twice with the overlap scheduler) and extra KV."""
    extra = 1
    if speculative:
        extra += max_draft_len * (2 if overlap_scheduler else 1) + num_extra_kv_tokens
    return extra


def trtllm_estimation_max_tokens(tokens_per_block: int, request_lengths, *, max_seq_len: int, max_batch_size: int,
                                 max_cuda_graph_batch_size: int, extra_tokens: int = 1, num_pool_groups: int = 1,
                                 beam_width: int = 1, attention_dp_size: int = 1) -> int:
    """Tokens of upstream's V2 estimation cache (whole blocks)."""
    tpb = tokens_per_block
    blocks = sum(ceil_div(n + extra_tokens, tpb) for n in request_lengths)
    if attention_dp_size > 1:     # each rank runs one copy of the dummies (the ADP fix upstream tests guard)
        blocks = ceil_div(blocks, attention_dp_size)
    graph = ceil_div(max_seq_len + 1, tpb) + min(max_batch_size, max_cuda_graph_batch_size) - 1
    blocks = max(blocks, graph, max_batch_size)
    return blocks * num_pool_groups * beam_width * tpb


def trtllm_estimation_max_tokens_for(limits, tokens_per_block: int, num_pool_groups: int,
                                     max_cuda_graph_batch_size: int = 128) -> int:
    """Upstream's count for an engine's limits: dummies filling ``max_num_tokens`` (or ``max_seq_len`` when unset),
    a default ``CudaGraphConfig`` (128), speculation when ``max_draft_len`` > 0, the overlap scheduler on."""
    n = limits.max_num_tokens or limits.max_seq_len
    extra = extra_tokens_per_request(limits.max_draft_len, limits.num_extra_kv_tokens,
                                     speculative=limits.max_draft_len > 0)
    return trtllm_estimation_max_tokens(tokens_per_block, dummy_context_lengths(n, limits.max_seq_len),
                                        max_seq_len=limits.max_seq_len, max_batch_size=limits.max_batch_size,
                                        max_cuda_graph_batch_size=max_cuda_graph_batch_size, extra_tokens=extra,
                                        num_pool_groups=num_pool_groups)
