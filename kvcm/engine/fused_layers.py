"""A Llama-family decoder body in nine launches a layer, where Hugging Face's code with ``fused.py``'s swaps runs
fifteen: for a small model a decode step is bound by the number of kernels, not by the bytes they move
(``benchmarks/step_breakdown.py`` counts both).

Per layer, with the residual stream ``x`` and the MLP output ``m`` of the layer before:

1. ``x += m`` and ``h = rmsnorm(x)`` in one kernel (the first layer: the norm alone);
2. one matrix product for q, k and v (their weights side by side in one tensor);
3. one kernel applies the rotary embedding to q and k, writes k and v into the KV pages at the step's slots and
   q where the attention kernel reads it (what ``rotary`` then ``store_kv`` did, in two launches);
4. the paged attention kernel (``triton_attention.py``), and 5. ``o_proj``;
6. ``x += o`` and ``h = rmsnorm(x)`` in one kernel;
7. one matrix product for gate and up (side by side), 8. SiLU(gate) * up, 9. ``down_proj``: the next layer's (or the
   final norm's) ``m``.

Every step rounds where Hugging Face's code rounds (the residual sum to the model's dtype, the norm as
``LlamaRMSNorm``, each rotary product), so what can differ is the order of a matrix product's sums, as with any
other GEMM kernel choice. The projections' weights are moved into the side-by-side tensors and the modules' own
weights become views of them: no memory is duplicated, Hugging Face ``generate`` on the same model reads the same
values, and an in-place update of a weight is seen by both (a weight replaced by another tensor is noticed and the
side-by-side tensor rebuilt).

Only layers whose structure is exactly this are taken (Llama, Mistral, Qwen2: no per-head q/k norm, SiLU gating,
RMSNorm); any other model runs Hugging Face's body with the swaps.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F

from . import fused, triton_attention
from .triton_attention import _next_pow2, tl, triton

LAYER_CLASSES = {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"}
RANGE_PREFIX = "kvcm_step::"            # the step breakdown's class ranges (benchmarks/_kernel_table.py)


if triton is not None:

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, y_ptr, w_ptr, out_ptr, n, eps, N: tl.constexpr):
        """x <- x + y (rounded to x's dtype, as torch adds), out <- rmsnorm(x) * w (as ``_rmsnorm_kernel``)."""
        row = tl.program_id(0)
        cols = tl.arange(0, N)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        y = tl.load(y_ptr + row * n + cols, mask=mask, other=0.0)
        s = (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype)
        tl.store(x_ptr + row * n + cols, s, mask=mask)
        sf = s.to(tl.float32)
        var = tl.sum(sf * sf, 0) / n
        normed = (sf * tl.rsqrt(var + eps)).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * n + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, q_out_ptr, kv_ptr, blk_ptr, off_ptr, s_row, s_cos,
                           s_pb, s_pf, s_pt, s_ph,
                           HQ: tl.constexpr, HK: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr,
                           HALF_PAD: tl.constexpr):
        """One token: q and k rotated (each product rounded as ``fused._rotary_kernel`` does), q to ``q_out``
        ``[T, HQ, D]``, k and v into the pages at the token's (block, offset)."""
        t = tl.program_id(0)
        d = tl.arange(0, HALF_PAD)[None, :]
        h = tl.arange(0, H_PAD)[:, None]
        dm = d < HALF
        c1 = tl.load(cos_ptr + t * s_cos + d, mask=dm, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + t * s_cos + HALF + d, mask=dm, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + t * s_cos + d, mask=dm, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + t * s_cos + HALF + d, mask=dm, other=0.0).to(tl.float32)
        blk = tl.load(blk_ptr + t)
        off = tl.load(off_ptr + t)
        page = kv_ptr + blk * s_pb + off * s_pt + h * s_ph + d
        row = qkv_ptr + t * s_row
        for which in tl.static_range(2):
            if which == 0:
                heads = HQ
            else:
                heads = HK
            m = (h < heads) & dm
            src = row + (which * HQ + h) * (2 * HALF) + d
            x1 = tl.load(src, mask=m, other=0.0)
            x2 = tl.load(src + HALF, mask=m, other=0.0)
            ty = x1.dtype
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            o1 = ((f1 * c1).to(ty).to(tl.float32) + (-f2 * s1).to(ty).to(tl.float32)).to(ty)
            o2 = ((f2 * c2).to(ty).to(tl.float32) + (f1 * s2).to(ty).to(tl.float32)).to(ty)
            if which == 0:
                dst = q_out_ptr + (t * HQ + h) * (2 * HALF) + d
                tl.store(dst, o1, mask=m)
                tl.store(dst + HALF, o2, mask=m)
            else:
                tl.store(page, o1.to(kv_ptr.dtype.element_ty), mask=m)
                tl.store(page + HALF, o2.to(kv_ptr.dtype.element_ty), mask=m)
        m = (h < HK) & dm
        src = row + ((HQ + HK) + h) * (2 * HALF) + d
        tl.store(page + s_pf, tl.load(src, mask=m, other=0.0).to(kv_ptr.dtype.element_ty), mask=m)
        tl.store(page + s_pf + HALF, tl.load(src + HALF, mask=m, other=0.0).to(kv_ptr.dtype.element_ty), mask=m)


def add_rmsnorm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x += y`` in place (x, y ``[T, n]`` contiguous), then ``weight * rmsnorm(x)`` as ``fused.rmsnorm``."""
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if x.numel():
        _add_rmsnorm_kernel[(x.numel() // n,)](x, y, weight, out, n, float(eps), N=_next_pow2(n),
                                               num_warps=4 if n <= 2048 else 8, **fused.EXACT)
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, slot_block: torch.Tensor,
               slot_offset: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """``qkv`` ``[T, (heads + 2 kv_heads) * D]`` (rows dense), cos/sin ``[T, D]`` -> rotated q ``[T, heads, D]``;
    rotated k and v written into ``kv`` (``store_kv``'s layout) at (block, offset) per token."""
    t = qkv.shape[0]
    d = kv.shape[-1]
    q = torch.empty((t, heads, d), dtype=qkv.dtype, device=qkv.device)
    if t:
        _rope_store_kernel[(t,)](qkv, cos, sin, q, kv, slot_block, slot_offset, qkv.stride(0), cos.stride(0),
                                 kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), HQ=heads, HK=kv_heads,
                                 H_PAD=_next_pow2(max(heads, kv_heads)), HALF=d // 2, HALF_PAD=_next_pow2(d // 2),
                                 **fused.EXACT)
    return q


def _side_by_side(modules) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) tensor for ``modules`` stacked on their output dim; each module's weight (and bias)
    becomes a view of it."""
    weight = torch.cat([m.weight.detach() for m in modules])
    has_bias = [m.bias is not None for m in modules]
    bias = torch.cat([m.bias.detach() for m in modules]) if all(has_bias) else None
    if any(has_bias) and bias is None:
        raise ValueError("some of the projections have a bias and some not")
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[start:start + rows], requires_grad=m.weight.requires_grad)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[start:start + rows], requires_grad=m.bias.requires_grad)
        start += rows
    return weight, bias


class _Stack:
    """Side-by-side projections of one layer (q|k|v or gate|up), rebuilt if a module's weight stops viewing it.
    One per set of modules (``stack_of``): a drafter that shares the target's layers shares its stacks too, rather
    than each re-stacking the weights away from the other."""

    def __init__(self, modules):
        self.modules = modules
        self.weight, self.bias = _side_by_side(modules)

    def current(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        ptr = self.weight.data_ptr()
        step = self.weight.shape[1] * self.weight.element_size()
        for m in self.modules:
            if m.weight.data_ptr() != ptr or m.weight.shape[1] != self.weight.shape[1]:
                self.weight, self.bias = _side_by_side(self.modules)
                break
            ptr += m.weight.shape[0] * step
        return self.weight, self.bias


_STACKS: "weakref.WeakKeyDictionary[torch.nn.Module, _Stack]" = weakref.WeakKeyDictionary()


def stack_of(modules) -> _Stack:
    """The stack of ``modules`` (made once, kept as long as the first module lives)."""
    stack = _STACKS.get(modules[0])
    if stack is None or any(a is not b for a, b in zip(stack.modules, modules)) or len(stack.modules) != len(modules):
        stack = _STACKS[modules[0]] = _Stack(modules)
    return stack


def _eligible(model) -> bool:
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "norm", "layers")):
        return False
    if getattr(model.config, "hidden_act", None) != "silu" or type(base.norm).__name__ not in fused.RMSNORM_CLASSES:
        return False
    for layer in base.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if (type(layer).__name__ not in LAYER_CLASSES or type(attn).__name__ not in fused.ATTENTION_CLASSES
                or type(mlp).__name__ not in fused.MLP_CLASSES or hasattr(attn, "q_norm")
                or type(layer.input_layernorm).__name__ not in fused.RMSNORM_CLASSES
                or type(layer.post_attention_layernorm).__name__ not in fused.RMSNORM_CLASSES):
            return False
    return True


class FusedLayers:
    """The decoder body of one model, as above; ``forward(ids, positions, ctx)`` -> final hidden states."""

    def __init__(self, model):
        self.base = getattr(model, model.base_model_prefix)
        cfg = model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        layers = self.base.layers
        self.qkv = [stack_of([la.self_attn.q_proj, la.self_attn.k_proj, la.self_attn.v_proj]) for la in layers]
        self.gate_up = [stack_of([la.mlp.gate_proj, la.mlp.up_proj]) for la in layers]
        self.ranges = False          # set by the step breakdown: name each stage for the profiler

    def _range(self, name: str):
        return torch.profiler.record_function(RANGE_PREFIX + name) if self.ranges else contextlib.nullcontext()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        base = self.base
        with self._range("embedding"):
            x = base.embed_tokens(input_ids)                      # [T, H], the residual stream
        with self._range("rotary"):
            cos, sin = base.rotary_emb(x[None], positions[None])
        cos, sin = cos[0], sin[0]
        pending = None
        for li, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            norm = layer.input_layernorm
            with self._range("rmsnorm"):
                h = (fused.rmsnorm(x, norm.weight, norm.variance_epsilon) if pending is None
                     else add_rmsnorm(x, pending, norm.weight, norm.variance_epsilon))
            with self._range("qkv_proj"):
                qkv = F.linear(h, *self.qkv[li].current())
            g = ctx.group_of_layer[li]
            meta, kv = ctx.groups[g], ctx.layer_kv[li]
            with self._range("kv_write"):
                q = rope_store(qkv, cos, sin, kv, meta.slot_block, meta.slot_offset, self.heads, self.kv_heads)
            with self._range("attention"):
                o = triton_attention.paged_attention(q, kv, meta.block_table, ctx.seq_lens, ctx.query_start,
                                                     scale=attn.scaling, window=meta.attention.window,
                                                     chunk=meta.attention.chunk_tokens,
                                                     tpb=ctx.tokens_per_block, split_len=ctx.split_len,
                                                     block_m=ctx.block_m, pipelined=ctx.pipelined,
                                                     uniform_q_len=ctx.decode_q_len,
                                                     program_maps=ctx.program_maps)
            with self._range("o_proj"):
                a = attn.o_proj(o.view(o.shape[0], -1))
            norm = layer.post_attention_layernorm
            with self._range("rmsnorm"):
                h = add_rmsnorm(x, a, norm.weight, norm.variance_epsilon)
            with self._range("gate_up_proj"):
                gu = F.linear(h, *self.gate_up[li].current())
            with self._range("silu_mul"):
                inner = gu.shape[1] // 2
                act = fused.silu_mul(gu[:, :inner], gu[:, inner:])
            with self._range("down_proj"):
                pending = mlp.down_proj(act)
        norm = base.norm
        with self._range("rmsnorm"):
            return add_rmsnorm(x, pending, norm.weight, norm.variance_epsilon)


def fused_layers(model, device: torch.device) -> FusedLayers | None:
    """The fused body where the kernels run and the model's layers are all of the supported structure."""
    if not triton_attention.available(torch.device(device).type) or not _eligible(model):
        return None
    return FusedLayers(model)
