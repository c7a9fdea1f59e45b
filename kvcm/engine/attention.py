"""Paged attention over a kvcm manager's page pools, plugged into transformers' attention interface.

The model runs with ``use_cache=False``: this function is the only keeper of KV. A forward is one packed batch
(every scheduled sequence's new tokens in one ``[1, total_tokens]`` row, decodes first); the runner sets an
:class:`AttentionContext` built from the step's buffers (``batch.py``): per layer group where each new token's
K/V goes (slot mapping) and each sequence's block table, plus the KV length and query offsets of each sequence.
Per layer the function

1. writes the new K/V into ``mgr.layer_kv(layer)`` at the slot mapping (block ``p // tpb``, slot ``p % tpb``);
2. attends: sequence ``s`` has queries at positions ``seq_lens[s] - q_len .. seq_lens[s] - 1`` and reads keys
   up to each query's position, from the layer's attention type's ``mask_floor`` (the last ``window`` of them for
   a sliding layer, the query's own chunk for a chunked-local one) through its block table.

On CUDA both steps are one Triton launch each (``triton_attention.py``: no gather, no padding, graph-safe for
any mix of decodes and prefill chunks). Elsewhere the torch reference below does the same arithmetic: the
leading rows that share one query length (decodes, or a graph's decode shape) in one batched gather of their
block tables, padded to the longest and masked; the other rows (prefill chunks) one by one over the pages
their queries can see. Released (-1) and padding entries are clamped to block 0 for the gather and masked, and
non-finite values gathered are zeroed, so a stale page's content can never reach the output (not even a NaN in
a recycled page).
Rotary embeddings and q/k norms (Qwen3) are applied by the model before this is called; GQA folds query heads
onto their kv head instead of repeating K/V.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..attention_types import AttentionType
from . import query_scale, triton_attention

NAME = "kvcm_paged"


@dataclass(frozen=True)
class KernelOptions:
    """How the Triton kernel tiles a step, one bundle from ``LLM`` to every cache's runner (the torch reference
    ignores it): ``decode_split_len`` splits a decode-only step's keys into shares of that many positions (0:
    whole), ``prefill_block_m`` is the query rows a program on every other step (None: the least tile);
    ``fused_layers`` runs a Llama-family body in nine launches a layer (``fused_layers.py``) where it applies;
    ``pipelined_keys`` runs the kernel's key loop software-pipelined, ``decode_rows_by_index`` has a decode step's
    programs take their rows by index and ``step_row_map`` the other steps' read them from a map made once a step
    (``triton_attention.paged_attention``'s ``pipelined``, ``uniform_q_len``, ``program_maps``)."""
    decode_split_len: int = 0
    prefill_block_m: int | None = None
    fused_layers: bool = True
    pipelined_keys: bool = False
    decode_rows_by_index: bool = True
    step_row_map: bool = False


@dataclass
class GroupMeta:
    """One layer group's view of the step."""
    attention: AttentionType           # the group's attention type (which pages the manager may release)
    slot_block: torch.Tensor           # [T] long: physical block of each new token
    slot_offset: torch.Tensor          # [T] long: slot in that block
    block_table: torch.Tensor          # [S, W] long: physical block of each logical block, -1 = none


@dataclass
class AttentionContext:
    layer_kv: dict[int, torch.Tensor]  # layer -> [num_blocks, 2, tpb, kv_heads, dim] view into its pool
    group_of_layer: dict[int, int]
    tokens_per_block: int
    groups: list[GroupMeta]
    seq_lens: torch.Tensor             # [S] long: KV length each sequence reads after this step
    query_start: torch.Tensor          # [S + 1] long: packed offsets of each sequence's queries
    host_seq_lens: np.ndarray          # the same two on the host (the torch reference loops over rows)
    host_query_start: np.ndarray
    num_uniform: int = 0               # leading rows of ``uniform_q_len`` queries each, attended in one batch
    uniform_q_len: int = 1
    use_kernel: bool = False           # Triton kernels (CUDA) rather than the torch reference
    split_len: int = 0                 # the kernel reads each query block's keys in shares of this many (0: whole)
    block_m: int | None = None         # the kernel's query rows a program (None: its least tile)
    pipelined: bool = False            # the kernel's key loop software-pipelined (triton_attention.paged_attention)
    decode_q_len: int = 0              # a decode step's queries a row, promised to the kernel (0: none promised)
    program_maps: dict | None = None   # the kernel's program -> sequence maps, emptied at every forward (None: off)
    positions: torch.Tensor | None = None    # [T] long: each packed token's position (Llama 4's query scale)
    cache: dict = field(default_factory=dict)     # masks shared by the layers of a group


_CTX: AttentionContext | None = None


def set_context(ctx: AttentionContext | None) -> None:
    global _CTX
    _CTX = ctx


def _layer_window(module, kwargs) -> int | None:
    w = kwargs.get("sliding_window", None)
    if w is None:
        w = getattr(module, "sliding_window", None)
    return int(w) if w else None


def _layer_attention(module, kwargs, group: AttentionType, layer: int, g: int) -> AttentionType:
    """The layer's attention as the model runs it: the sliding window transformers passes (or the module holds),
    else the group's type. Some transformers versions pass no window, and no model passes its attention chunk
    (Llama 4 builds a chunked mask the paged path does not read); the model spec read the same config, so the
    group's type is the layer's there (a wrong spec shows up as a parity failure, not silence)."""
    w = _layer_window(module, kwargs)
    if not w or w == group.window:
        return group
    narrowed = group.with_window(w)
    if narrowed is None:
        raise ValueError(f"layer {layer}: the model attends to window {w} but the cache releases pages as "
                         f"{group.label()} (layer group {g}); the model spec and the model disagree")
    return narrowed


def _gqa_sdpa(q, k, v, bias, scale):
    """q [B, ql, H, D], k/v [B, kvh, L, D], bias [B, 1, rep * ql, L] (0 or -inf) -> [B, ql, H, D].

    Query heads are folded onto their kv head (head h reads kv head h // (H / kvh), as HF's ``repeat_kv``), so
    K/V are never repeated in memory: SDPA sees [B, kvh, rep * ql, D] queries."""
    b, ql, heads, d = q.shape
    kvh = k.shape[1]
    rep = heads // kvh
    qg = q.reshape(b, ql, kvh, rep, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, rep * ql, d)
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias, scale=scale)
    return o.reshape(b, kvh, rep, ql, d).permute(0, 3, 1, 2, 4).reshape(b, ql, heads, d)


def _held(bt, kv_lens, tpb):
    """Block tables ``bt`` [B, MB] -> [B, MB * tpb]: the position's page is held and below the KV length."""
    b, mb = bt.shape
    j = torch.arange(mb * tpb, device=bt.device)
    held = (bt >= 0)[:, :, None].expand(b, mb, tpb).reshape(b, mb * tpb)
    return held & (j[None] < kv_lens[:, None])


def _pages(kv, bt, dtype):
    """K, V [B, kvh, MB * tpb, D] of block tables ``bt`` (-1 entries read block 0, which the mask drops).

    Masked positions must contribute exactly nothing, and a -inf score only does that for finite K/V: so every
    non-finite value gathered (a NaN in a recycled or foreign page) is zeroed first."""
    b = bt.shape[0]
    idx = bt.reshape(-1).clamp(min=0)
    return [kv[:, f].index_select(0, idx).nan_to_num_(0.0, 0.0, 0.0).to(dtype)     # a fresh copy per factor
            .view(b, -1, kv.shape[-2], kv.shape[-1]).transpose(1, 2) for f in (0, 1)]


def _bias(keep, qpos, attention: AttentionType, rep: int, dtype, first: int = 0):
    """keep [B, L] (key j is position first + j), qpos [B, ql] -> SDPA bias [B, 1, rep * ql, L]: 0 where the
    query may read the key (held, causal, at or above the type's mask floor), -inf elsewhere; rows repeat per
    folded head."""
    j = first + torch.arange(keep.shape[-1], device=keep.device)
    q = qpos[:, :, None]
    mask = keep[:, None, :] & (j[None, None, :] <= q) & (j[None, None, :] >= attention.mask_floor(q))
    b, ql, length = mask.shape
    mask = mask[:, None, None].expand(b, 1, rep, ql, length).reshape(b, 1, rep * ql, length)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _row_plans(ctx: AttentionContext, g: int, attention: AttentionType, rep: int, dtype):
    """Per group and attention type, what the layers share: (packed rows, block table, SDPA bias) per attention
    call."""
    key = (g, attention, rep, dtype)
    if key in ctx.cache:
        return ctx.cache[key]
    meta, tpb, dev = ctx.groups[g], ctx.tokens_per_block, ctx.seq_lens.device
    plans = []
    nu, ql = ctx.num_uniform, ctx.uniform_q_len
    if nu:
        kv_lens = ctx.seq_lens[:nu]
        bt = meta.block_table[:nu]
        qpos = kv_lens[:, None] - ql + torch.arange(ql, device=dev)[None]
        plans.append(((0, nu * ql, nu, ql), bt, _bias(_held(bt, kv_lens, tpb), qpos, attention, rep, dtype)))
    qs, lens = ctx.host_query_start, ctx.host_seq_lens
    for s in range(nu, len(lens)):
        a, b, kv_len = int(qs[s]), int(qs[s + 1]), int(lens[s])
        if b == a or kv_len <= 0:
            continue
        pos0 = kv_len - (b - a)
        first = max(0, attention.mask_floor(pos0) // tpb)      # the floor grows with the position
        bt = meta.block_table[s:s + 1, first:(kv_len - 1) // tpb + 1]
        keep = _held(bt, ctx.seq_lens[s:s + 1] - first * tpb, tpb)
        qpos = torch.arange(pos0, kv_len, device=dev)[None]
        plans.append(((a, b, 1, b - a), bt, _bias(keep, qpos, attention, rep, dtype, first * tpb)))
    ctx.cache[key] = plans
    return plans


def _torch_attention(ctx: AttentionContext, g: int, attention: AttentionType, q, kv, scale):
    """The reference: q [T, H, D] -> [T, H, D] (rows of no sequence, or of KV length 0, stay 0)."""
    heads = q.shape[1]
    plans = _row_plans(ctx, g, attention, heads // kv.shape[-2], q.dtype)
    covered = sum(b - a for (a, b, _, _), *_ in plans)
    out = torch.empty_like(q) if covered == q.shape[0] else torch.zeros_like(q)
    for (a, b, rows, ql), bt, bias in plans:
        k, v = _pages(kv, bt, q.dtype)
        out[a:b] = _gqa_sdpa(q[a:b].reshape(rows, ql, heads, -1), k, v, bias, scale).reshape(b - a, heads, -1)
    return out


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface entry: q [1, H, T, D], k/v [1, kv_heads, T, D] -> ([1, T, H, D], None)."""
    ctx = _CTX
    if ctx is None:
        raise RuntimeError("kvcm_paged attention called outside a kvcm engine forward (no AttentionContext set)")
    if kwargs.get("softcap") or getattr(module, "sinks", None) is not None:
        raise NotImplementedError("kvcm_paged attention does not support logit softcapping or attention sinks")
    layer = module.layer_idx
    g = ctx.group_of_layer[layer]
    meta = ctx.groups[g]
    attention = _layer_attention(module, kwargs, meta.attention, layer, g)
    kv = ctx.layer_kv[layer]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)                   # [T, H, D]
    if ctx.positions is not None and query_scale.tuned(module):
        q = query_scale.retune(module, q, ctx.positions)
    k_new = key[0].transpose(0, 1)                 # [T, kv_heads, D]
    v_new = value[0].transpose(0, 1)
    if ctx.use_kernel:
        triton_attention.store_kv(kv, k_new, v_new, meta.slot_block, meta.slot_offset)
        out = triton_attention.paged_attention(q, kv, meta.block_table, ctx.seq_lens, ctx.query_start,
                                               scale=scale, window=attention.window, chunk=attention.chunk_tokens,
                                               tpb=ctx.tokens_per_block,
                                               split_len=ctx.split_len, block_m=ctx.block_m,
                                               pipelined=ctx.pipelined, uniform_q_len=ctx.decode_q_len,
                                               program_maps=ctx.program_maps)
    else:
        kv[:, 0].index_put_((meta.slot_block, meta.slot_offset), k_new.to(kv.dtype))
        kv[:, 1].index_put_((meta.slot_block, meta.slot_offset), v_new.to(kv.dtype))
        out = _torch_attention(ctx, g, attention, q, kv, scale)
    return out[None], None


_registered = False


def register() -> str:
    """Register the function with transformers (idempotent); returns its implementation name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        AttentionInterface.register(NAME, paged_attention)
        _registered = True
    return NAME
