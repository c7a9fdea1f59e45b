"""Fused Triton kernels for a decoder layer's small ops, swapped in for the engine's forwards on CUDA.

A Llama-family layer in Hugging Face runs about forty kernels, most of them tiny element-wise ops of its
RMSNorms (cast, square, mean, add, rsqrt, multiply, cast, multiply), its rotary embedding (multiply, slice,
negate, concatenate, multiply, add, for q and for k) and its gated MLP (SiLU, multiply). For a small model a
decode step is bound by that kernel count, in a CUDA graph as much as eagerly. Here each of the three is one
kernel that computes what the Hugging Face code computes, rounding where it rounds (so bf16 results match it
bit for bit but for the order of the mean's sum).

``swapped(model)`` replaces them only for the duration of an engine forward (the runner's ``paged()``): the
same model object still runs Hugging Face ``generate`` unchanged. Modules are matched by class name (the
Llama, Mistral, Qwen2 and Qwen3 families) and each call falls back to the original when its input is not the
expected layout, so an unknown variant runs the stock code.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from .triton_attention import _next_pow2, available, tl, triton

#: Launch options of every kernel here (and ``fused_layers.py``'s): no fused multiply-adds. Triton contracts a
#: product and a sum into one FMA by default on the GPU (not in its interpreter), rounding once where torch rounds
#: twice: an H100 gave rotary results one bf16 step off Hugging Face's (0.45508 for 0.45703) and fp32 ones off in
#: the last bits. Compiled for sm_90 with contraction on, the rotary kernels hold FMAs (16 at SmolLM2's heads) and
#: the norms one each; off, none (``suites/engine/test_kernel_rounding.py`` compiles each kernel as launched).
EXACT = {"enable_fp_fusion": False}

RMSNORM_CLASSES = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}
MLP_CLASSES = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"}
ATTENTION_CLASSES = {"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention"}


if triton is not None:

    @triton.jit
    def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n, eps, N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, N)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / n
        normed = (xf * tl.rsqrt(var + eps)).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        out = w.to(tl.float32) * normed.to(tl.float32)
        tl.store(out_ptr + row * n + cols, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, tokens,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_cb, s_ct,
                       HQ: tl.constexpr, HK: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr,
                       HALF_PAD: tl.constexpr):
        pid = tl.program_id(0)                    # one token of one batch row: all its q and k heads
        b = pid // tokens
        t = pid % tokens
        d = tl.arange(0, HALF_PAD)[None, :]
        h = tl.arange(0, H_PAD)[:, None]
        dm = d < HALF
        c1 = tl.load(cos_ptr + b * s_cb + t * s_ct + d, mask=dm, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + b * s_cb + t * s_ct + HALF + d, mask=dm, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + b * s_cb + t * s_ct + d, mask=dm, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + b * s_cb + t * s_ct + HALF + d, mask=dm, other=0.0).to(tl.float32)
        for which in tl.static_range(2):
            if which == 0:
                src, dst, heads, sb, sh, st = q_ptr, qo_ptr, HQ, s_qb, s_qh, s_qt
            else:
                src, dst, heads, sb, sh, st = k_ptr, ko_ptr, HK, s_kb, s_kh, s_kt
            m = (h < heads) & dm
            base = b * sb + h * sh + t * st + d
            x1 = tl.load(src + base, mask=m, other=0.0)
            x2 = tl.load(src + base + HALF, mask=m, other=0.0)
            ty = x1.dtype
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            # q * cos + rotate_half(q) * sin, each product rounded to the dtype as torch does
            o1 = (f1 * c1).to(ty).to(tl.float32) + (-f2 * s1).to(ty).to(tl.float32)
            o2 = (f2 * c2).to(ty).to(tl.float32) + (f1 * s2).to(ty).to(tl.float32)
            obase = ((b * tokens + t) * heads + h) * (2 * HALF) + d
            tl.store(dst + obase, o1.to(ty), mask=m)
            tl.store(dst + obase + HALF, o2.to(ty), mask=m)

    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, s_g, s_u, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + row * s_g + offs, mask=mask, other=0.0)
        u = tl.load(u_ptr + row * s_u + offs, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
        tl.store(out_ptr + row * n + offs, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2) + eps)).to(x.dtype)`` over the last dim (x contiguous)."""
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    rows = x.numel() // n
    if rows:
        _rmsnorm_kernel[(rows,)](x, weight, out, n, float(eps), N=_next_pow2(n), num_warps=4 if n <= 2048 else 8,
                                 **EXACT)
    return out


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Hugging Face's ``apply_rotary_pos_emb(q, k, cos, sin)`` for q/k ``[B, heads, T, D]`` and cos/sin
    ``[B, T, D]``; the results are laid out ``[B, T, heads, D]`` (returned as ``[B, heads, T, D]`` views)."""
    b, hq, t, dim = q.shape
    hk = k.shape[1]
    qo = torch.empty((b, t, hq, dim), dtype=q.dtype, device=q.device)
    ko = torch.empty((b, t, hk, dim), dtype=k.dtype, device=k.device)
    if b * t:
        _rotary_kernel[(b * t,)](q, k, cos, sin, qo, ko, t, q.stride(0), q.stride(1), q.stride(2),
                                 k.stride(0), k.stride(1), k.stride(2), cos.stride(0), cos.stride(1),
                                 HQ=hq, HK=hk, H_PAD=_next_pow2(max(hq, hk)), HALF=dim // 2,
                                 HALF_PAD=_next_pow2(dim // 2), **EXACT)
    return qo.transpose(1, 2), ko.transpose(1, 2)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with the intermediate rounded to the dtype; gate and up of one shape, rows of dense
    columns at any row stride (the two halves of one side-by-side projection too); the result is contiguous."""
    n = gate.shape[-1]
    g2, u2 = gate.reshape(-1, n), up.reshape(-1, n)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if gate.numel():
        _silu_mul_kernel[(g2.shape[0], triton.cdiv(n, 1024))](g2, u2, out, n, g2.stride(0), u2.stride(0), BLOCK=1024,
                                                              **EXACT)
    return out


# ---- swapping them in ----------------------------------------------------------------------------------------
def _rmsnorm_forward(module):
    original = module.forward

    def forward(hidden_states):
        if not hidden_states.is_contiguous() or module.weight.shape != hidden_states.shape[-1:]:
            return original(hidden_states)
        return rmsnorm(hidden_states, module.weight, module.variance_epsilon)
    return forward


def _mlp_forward(module):
    original = module.forward

    def forward(x):
        gate, up = module.gate_proj(x), module.up_proj(x)
        if not (gate.is_contiguous() and up.is_contiguous()):
            return module.down_proj(module.act_fn(gate) * up)
        return module.down_proj(silu_mul(gate, up))
    return forward if getattr(module.config, "hidden_act", None) == "silu" else original


def _rotary_function(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, **kwargs):
        if (kwargs or unsqueeze_dim != 1 or q.dim() != 4 or cos.dim() != 3 or cos.shape[-1] != q.shape[-1]
                or q.shape[-1] % 2 or q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1
                or cos.stride() != sin.stride()):
            return original(q, k, cos, sin, unsqueeze_dim, **kwargs)
        return rotary(q, k, cos, sin)
    return apply_rotary_pos_emb


class FusedOps:
    """The swaps for one model: instance forwards of its RMSNorm and MLP modules, and the rotary function of
    its attention modules' Python modules."""

    def __init__(self, model):
        self.forwards = []          # (module, fused forward)
        for m in model.modules():
            name = type(m).__name__
            if name in RMSNORM_CLASSES and hasattr(m, "variance_epsilon"):
                self.forwards.append((m, _rmsnorm_forward(m)))
            elif name in MLP_CLASSES and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj")):
                self.forwards.append((m, _mlp_forward(m)))
        mods = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__name__ in ATTENTION_CLASSES}
        self.functions = [(mod, mod.apply_rotary_pos_emb) for mod in mods if hasattr(mod, "apply_rotary_pos_emb")]

    @contextlib.contextmanager
    def swapped(self):
        own = [(m, m.__dict__.get("forward")) for m, _ in self.forwards]   # an instance forward (a hook's) is kept
        for m, f in self.forwards:
            m.forward = f
        saved = []
        for mod, original in self.functions:
            saved.append((mod, mod.apply_rotary_pos_emb))
            mod.apply_rotary_pos_emb = _rotary_function(original)
        try:
            yield
        finally:
            for m, f in own:
                if f is None:
                    del m.forward       # back to the class's forward
                else:
                    m.forward = f
            for mod, f in saved:
                mod.apply_rotary_pos_emb = f


def fused_ops(model, device: torch.device) -> FusedOps | None:
    """The swaps where the kernels run (CUDA with Triton, or the Triton interpreter), else None."""
    return FusedOps(model) if available(torch.device(device).type) else None
