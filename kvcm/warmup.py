"""CUDA-graph warmup planning on a manager alone (docs/semantics.md 7).

For every planned (batch size, draft length) shape, make the dummies a graph capture would run on: ``bs - 1``
short generation dummies, then one long one sized by the manager's own ``get_num_available_tokens``. A shape
whose dummies do not fit is *skipped*, and a skipped shape is a batch size that later runs uncaptured: this is
how the historic one-token-too-large generation dummy showed up. The report's goal is zero skipped.

``get_num_available_tokens`` sizes an otherwise empty cache in which the ``bs - 1`` others hold one block each
(TensorRT-LLM's ``clamp_max_seq_len_for_mem``). Where the cache holds more than that (short dummies of
``1 + D + E + K`` tokens wider than a block, an engine's padding request), the long dummy is also capped by the
free blocks: a deliberate difference from TensorRT-LLM, whose warmup would fail that shape (docs/semantics.md,
deviations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .policy import Decisions, of as policy_of, resolve, rule
from .units import ceil_div


@dataclass(frozen=True, order=True)
class WarmupShape:
    batch_size: int
    draft_len: int

    def __str__(self):
        return f"(bs={self.batch_size}, draft={self.draft_len})"


@dataclass
class WarmupReport:
    cache: str = "final"
    planned: list[WarmupShape] = field(default_factory=list)
    captured: list[WarmupShape] = field(default_factory=list)
    skipped: list[tuple[WarmupShape, str]] = field(default_factory=list)
    long_token_nums: dict[WarmupShape, int] = field(default_factory=dict)

    @property
    def fitted(self) -> list[WarmupShape]:
        return self.captured

    @property
    def ok(self) -> bool:
        return not self.skipped

    def as_dict(self) -> dict:
        return {"cache": self.cache, "planned": len(self.planned), "captured": len(self.captured),
                "skipped": [{"batch_size": s.batch_size, "draft_len": s.draft_len, "reason": r}
                            for s, r in self.skipped]}

    def __str__(self):
        lines = [f"warmup on {self.cache} cache: {len(self.planned)} planned, {len(self.captured)} captured, "
                 f"{len(self.skipped)} skipped"]
        lines += [f"  skipped {shape}: {reason}" for shape, reason in self.skipped]
        return "\n".join(lines)


def cuda_graph_batch_sizes(max_batch_size: int, *, max_num_tokens: int | None = None, max_draft_len: int = 0,
                           batch_sizes=None) -> list[int]:
    """Given sizes, or 1, 2, 4, ... padded up to B; sizes above ``min(B, N // (1 + D))`` are dropped when N is set."""
    if batch_sizes is None:
        sizes, bs = [], 1
        while bs < max_batch_size:
            sizes.append(bs)
            bs *= 2
        sizes.append(max_batch_size)
    else:
        sizes = sorted(set(int(b) for b in batch_sizes))
    limit = max_batch_size if max_num_tokens is None else min(max_batch_size, max_num_tokens // (1 + max_draft_len))
    return [b for b in sizes if 1 <= b <= limit]


def trtllm_cuda_graph_batch_sizes(max_batch_size: int = 0, enable_padding: bool = False, policy=None) -> list[int]:
    """TensorRT-LLM's default captured batch sizes (``CudaGraphConfig`` with no ``batch_sizes``; ``max_batch_size``
    0 means 128): without padding 1 .. 31, 32, 64, 128 and the powers of two from 256 below the maximum
    (the policy's ``cuda_graph_powers_of_two``; None: the active one); with padding 1, 2, 4, the multiples of 8 to
    128, then steps of 64. Sizes
    above the maximum are dropped and the maximum itself is always captured. kvcm's own default is the powers of
    two (docs/semantics.md 10); pass this list as ``batch_sizes`` to plan upstream's shapes."""
    top = max_batch_size or 128
    if enable_padding:
        sizes = [1, 2, 4] + list(range(8, 129, 8))
        while sizes[-1] + 64 <= top:
            sizes.append(sizes[-1] + 64)
    else:
        sizes = list(range(1, 32)) + [32, 64, 128] + resolve(policy).cuda_graph_powers_of_two(top)
    sizes = sorted(b for b in sizes if b <= top)
    if not sizes or sizes[-1] != top:
        sizes.append(top)
    return sizes


def trtllm_filter_batch_sizes(sizes, max_batch_size: int, max_num_tokens: int, max_draft_len: int = 0,
                              enable_padding: bool = False) -> list[int]:
    """TensorRT-LLM's ``_filter_cuda_graph_batch_sizes``: keep the sorted sizes up to ``min(B, N // (1 + D))``;
    with padding, the first size past that limit is replaced by the limit (batches pad up to it)."""
    limit = min(max_batch_size, max_num_tokens // (1 + max_draft_len))
    if limit < 1:
        return []
    out = []
    for b in sorted(sizes):
        if b <= limit:
            out.append(b)
            continue
        if enable_padding and (not out or out[-1] != limit):
            out.append(limit)
        break
    return out


def warmup_shapes(manager, *, batch_sizes=None, draft_lens=None, two_model: bool = False) -> list[WarmupShape]:
    """Shapes largest first; draft length D (and 0 too for two-model speculation)."""
    d = manager.max_draft_len
    drafts = sorted(set(draft_lens if draft_lens is not None else ([d, 0] if two_model and d else [d])), reverse=True)
    sizes = cuda_graph_batch_sizes(manager.max_batch_size, max_num_tokens=manager.max_num_tokens,
                                   max_draft_len=max(drafts), batch_sizes=batch_sizes)
    return [WarmupShape(bs, dl) for bs in sorted(sizes, reverse=True) for dl in drafts]


def plan_warmup(manager, *, batch_sizes=None, draft_lens=None, two_model: bool = False,
                kv_reserve_draft_tokens: int | None = None, cache: str = "final",
                on_fit: Callable | None = None) -> WarmupReport:
    """Make, optionally use (``on_fit(shape, dummies)``, e.g. a graph capture) and release each shape's dummies."""
    report = WarmupReport(cache=cache)
    policy = policy_of(manager)          # the manager's decisions (the active ones for a manager that keeps none)
    s, e, tpb = manager.max_seq_len, manager.num_extra_kv_tokens, manager.tokens_per_block
    positions = getattr(manager.model, "max_position_embeddings", None)
    for shape in warmup_shapes(manager, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model):
        report.planned.append(shape)
        bs, dl = shape.batch_size, shape.draft_len
        k = policy.warmup_draft_reserve(dl, kv_reserve_draft_tokens)
        ids = [("warmup", cache, bs, dl, i) for i in range(bs)]
        free_before = manager.get_num_free_blocks()
        shorts = manager.add_dummy_requests(ids[:-1], is_gen=True, max_num_draft_tokens=dl,
                                            kv_reserve_draft_tokens=k) if bs > 1 else []
        if shorts is None:
            report.skipped.append((shape, f"{bs - 1} short dummies of {1 + dl + e + k} tokens do not fit in "
                                          f"{free_before} free blocks"))
            continue
        available = manager.get_num_available_tokens(token_num_upper_bound=s, batch_size=bs, max_num_draft_tokens=k)
        free_now = manager.get_num_free_blocks()
        token_num = max(1, min(available, policy.long_dummy_cap(s, e, k, positions), free_now * tpb - e - k))
        longest = manager.add_dummy_requests(ids[-1:], token_nums=[token_num], is_gen=True, max_num_draft_tokens=dl,
                                             kv_reserve_draft_tokens=k)
        try:
            if longest is None:
                capacity = token_num + e + k
                report.skipped.append((shape, f"long dummy token_num={token_num} (capacity {capacity}, "
                                              f"{ceil_div(capacity, tpb)} blocks of {tpb}) does not fit in {free_now} "
                                              f"free blocks; get_num_available_tokens returned {available}"))
                continue
            report.long_token_nums[shape] = token_num
            if on_fit is not None:
                on_fit(shape, shorts + longest)
            report.captured.append(shape)
        finally:
            for rid in ids:
                if manager.has_request(rid):
                    manager.free_resources(rid)
    return report


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class WarmupDecisions(Decisions):
    SUBSYSTEM = "CUDA-graph warmup"

    @rule("the draft slots warmup's dummies reserve: the shape's draft length unless the caller says otherwise "
          "(vLLM PR #50531 / #51438: warmup without the spec-decode lookahead)")
    def warmup_draft_reserve(draft_len: int, kv_reserve_draft_tokens: int | None) -> int:
        return draft_len if kv_reserve_draft_tokens is None else kv_reserve_draft_tokens

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
