"""Paged attention over a kvcm manager's page pools, plugged into transformers' attention interface.

The model runs with ``use_cache=False``: this function is the only keeper of KV. A forward is one packed batch
(every scheduled sequence's new tokens in one ``[1, total_tokens]`` row, decodes first); the runner sets an
:class:`AttentionContext` saying, per layer group, where each new token's K/V goes (slot mapping) and which pages
each sequence reads (block tables). Per layer the function

1. writes the new K/V into ``mgr.layer_kv(layer)`` at the slot mapping (block ``p // tpb``, slot ``p % tpb``);
2. decodes (all of the same query length, 1 + drafts) in one batched gather of their block tables into
   ``[B, max_blocks * tpb, kv_heads, dim]`` with a mask (causal, kv length, sliding window, released pages);
   this part uses tensors only, so it is CUDA-graph safe when the context's tensors are static buffers;
3. prefill chunks one by one: only the pages from the first block its window needs to its last one (these are
   never released ones), causal mask within the chunk.

Released (-1) and padding entries of a decode block table are clamped to block 0 for the gather and then
zeroed and masked, so a stale page's content can never reach the output (not even a NaN in a recycled page).
Rotary embeddings and q/k norms (Qwen3) are applied by the model before this is called; GQA folds query heads
onto their kv head instead of repeating K/V.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

NAME = "kvcm_paged"


@dataclass
class GroupMeta:
    """One layer group's view of the step."""
    window: int | None                 # the manager's window for the group (pages it may release)
    slot_block: torch.Tensor           # [T] long: physical block of each new token
    slot_offset: torch.Tensor          # [T] long: slot in that block
    dec_block_table: torch.Tensor | None = None   # [Bd, max_blocks] long, -1 = released or padding
    prefill_blocks: list[torch.Tensor] = field(default_factory=list)  # per chunk: blocks first_block..last
    prefill_first_block: list[int] = field(default_factory=list)


@dataclass
class AttentionContext:
    layer_kv: dict[int, torch.Tensor]  # layer -> [num_blocks, 2, tpb, kv_heads, dim] view into its pool
    group_of_layer: dict[int, int]
    tokens_per_block: int
    groups: list[GroupMeta]
    num_decode: int = 0                # decode sequences, packed first
    decode_q_len: int = 1              # query tokens per decode sequence (1 + drafts)
    dec_kv_lens: torch.Tensor | None = None       # [Bd] long: KV length attention reads per decode sequence
    prefill: list[tuple[int, int, int]] = field(default_factory=list)  # (packed start, num tokens, position)
    cache: dict = field(default_factory=dict)     # masks shared by the layers of a group


_CTX: AttentionContext | None = None


def set_context(ctx: AttentionContext | None) -> None:
    global _CTX
    _CTX = ctx


def get_context() -> AttentionContext | None:
    return _CTX


def _layer_window(module, kwargs) -> int | None:
    w = kwargs.get("sliding_window", None)
    if w is None:
        w = getattr(module, "sliding_window", None)
    return int(w) if w else None


def _gqa_sdpa(q, k, v, mask, scale):
    """q [B, ql, H, D], k/v [B, kvh, L, D], mask [B, ql, L] bool -> [B, ql, H, D].

    Query heads are folded onto their kv head (head h reads kv head h // (H / kvh), as HF's ``repeat_kv``), so
    K/V are never repeated in memory: SDPA sees [B, kvh, rep * ql, D] queries."""
    b, ql, heads, d = q.shape
    kvh = k.shape[1]
    rep = heads // kvh
    qg = q.reshape(b, ql, kvh, rep, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, rep * ql, d)
    m = mask[:, None, None].expand(b, 1, rep, ql, mask.shape[-1]).reshape(b, 1, rep * ql, mask.shape[-1])
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=m, scale=scale)
    return o.reshape(b, kvh, rep, ql, d).permute(0, 3, 1, 2, 4).reshape(b, ql, heads, d)


def _decode_masks(ctx: AttentionContext, g: int, window: int | None):
    key = ("dec", g, window)
    if key not in ctx.cache:
        bt = ctx.groups[g].dec_block_table
        tpb, ql = ctx.tokens_per_block, ctx.decode_q_len
        length = bt.shape[1] * tpb
        j = torch.arange(length, device=bt.device)
        kv_lens = ctx.dec_kv_lens
        qpos = kv_lens[:, None] - ql + torch.arange(ql, device=bt.device)[None]        # [Bd, ql]
        held = (bt >= 0)[:, :, None].expand(bt.shape[0], bt.shape[1], tpb).reshape(bt.shape[0], length)
        keep = held & (j[None] < kv_lens[:, None])                                     # [Bd, L]
        mask = keep[:, None, :] & (j[None, None, :] <= qpos[:, :, None])               # [Bd, ql, L]
        if window is not None:
            mask = mask & (j[None, None, :] > qpos[:, :, None] - window)
        ctx.cache[key] = (keep, mask)
    return ctx.cache[key]


def _prefill_mask(ctx: AttentionContext, g: int, window: int | None, i: int, device):
    key = ("pre", g, window, i)
    if key not in ctx.cache:
        _, n, pos = ctx.prefill[i]
        first = ctx.groups[g].prefill_first_block[i] * ctx.tokens_per_block
        kp = torch.arange(first, pos + n, device=device)
        qp = torch.arange(pos, pos + n, device=device)
        mask = kp[None] <= qp[:, None]
        if window is not None:
            mask = mask & (kp[None] > qp[:, None] - window)
        ctx.cache[key] = mask[None]
    return ctx.cache[key]


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
    window = _layer_window(module, kwargs)
    if window is None:
        # Some transformers versions pass no window to the attention function; the model spec read the same
        # config, so the group's window is the layer's (a wrong spec shows up as a parity failure, not silence).
        window = meta.window
    if meta.window is not None and window > meta.window:
        raise ValueError(f"layer {layer}: the model attends to window {window} but the cache releases pages "
                         f"outside window {meta.window} (layer group {g}); the model spec and the model disagree")
    kv = ctx.layer_kv[layer]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    heads = query.shape[1]
    q = query[0].transpose(0, 1)                   # [T, H, D]
    k_new = key[0].transpose(0, 1).to(kv.dtype)    # [T, kv_heads, D]
    v_new = value[0].transpose(0, 1).to(kv.dtype)
    kv[:, 0].index_put_((meta.slot_block, meta.slot_offset), k_new)
    kv[:, 1].index_put_((meta.slot_block, meta.slot_offset), v_new)

    out = torch.empty_like(q)
    if ctx.num_decode:
        bd, ql = ctx.num_decode, ctx.decode_q_len
        keep, mask = _decode_masks(ctx, g, window)
        bt = meta.dec_block_table
        pages = kv[bt.clamp(min=0)]                                   # [Bd, MB, 2, tpb, kvh, D]
        pages = pages.permute(2, 0, 4, 1, 3, 5).reshape(2, bd, kv.shape[-2], -1, kv.shape[-1])  # [2, Bd, kvh, L, D]
        pages = torch.where(keep[None, :, None, :, None], pages,
                            torch.zeros((), dtype=pages.dtype, device=pages.device)).to(q.dtype)
        qd = q[:bd * ql].reshape(bd, ql, heads, -1)
        out[:bd * ql] = _gqa_sdpa(qd, pages[0], pages[1], mask, scale).reshape(bd * ql, heads, -1)
    for i, (qs, n, pos) in enumerate(ctx.prefill):
        blocks = meta.prefill_blocks[i]
        first = meta.prefill_first_block[i] * ctx.tokens_per_block
        pages = kv[blocks].permute(1, 3, 0, 2, 4).reshape(2, 1, kv.shape[-2], -1, kv.shape[-1])
        pages = pages[:, :, :, :pos + n - first].to(q.dtype)          # [2, 1, kvh, L, D]
        mask = _prefill_mask(ctx, g, window, i, q.device)
        out[qs:qs + n] = _gqa_sdpa(q[qs:qs + n][None], pages[0], pages[1], mask, scale)[0]
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
