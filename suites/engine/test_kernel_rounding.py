"""The fused kernels round where Hugging Face's code rounds on the GPU too, not only under the interpreter.

Triton contracts a product and a sum into one fused multiply-add by default when it compiles for a GPU
(``enable_fp_fusion``); its interpreter, which the CPU lanes run the kernels under, never does. An FMA rounds once
where torch's separate multiply and add round twice, so on an H100 (2026-12-07) ``rope_store``'s query came out one
bf16 step off Hugging Face's rotary (0.45508 for 0.45703) and fp32 off in its last bits, while the same test passed
under the interpreter. These checks need no GPU: every kernel that ``fused.py`` and ``fused_layers.py`` launch is
recorded as launched (arguments and options), compiled as launched for sm_90 (Triton compiles for a target it does
not run on), and its PTX must hold no floating-point ``fma``. With contraction on, the same launches compile to
FMAs (the rotary kernels four each at these shapes, the norms one each, SiLU-and-mul none): the check can fail.
"""
from __future__ import annotations

import re

import pytest
import torch

from kvcm.engine import fused, fused_layers, triton_attention
from _ptx import ptx, recording

pytestmark = pytest.mark.skipif(triton_attention.triton is None, reason="Triton is not installed (pip install triton)")

FMA = re.compile(r"^\s*fma\.\w+\.(f32|bf16|f16|bf16x2|f16x2|f64)\b", re.M)


def _kernels():
    return {"rmsnorm": fused._rmsnorm_kernel, "rotary": fused._rotary_kernel, "silu_mul": fused._silu_mul_kernel,
            "add_rmsnorm": fused_layers._add_rmsnorm_kernel, "rope_store": fused_layers._rope_store_kernel}


def _call_every_wrapper(dtype):
    """Each Python entry point of the fused kernels once, on small CPU tensors of ``dtype``."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)
    fused.rmsnorm(r(3, 64), r(64), 1e-5)
    q, k = r(1, 4, 5, 16).transpose(1, 2), r(1, 2, 5, 16).transpose(1, 2)
    fused.rotary(q, k, r(1, 5, 16), r(1, 5, 16))
    fused.silu_mul(r(3, 32), r(3, 32))
    fused_layers.add_rmsnorm(r(3, 64), r(3, 64), r(64), 1e-5)
    kv = r(4, 2, 8, 2, 16)
    slots = torch.tensor([0, 1, 2])
    fused_layers.rope_store(r(3, (4 + 4) * 16), r(3, 16), r(3, 16), kv, slots // 8, slots % 8, 4, 2)


@pytest.fixture
def launches(monkeypatch):
    """(name, kernel, args, kwargs) of every launch while the fixture lives; nothing runs."""
    return recording(monkeypatch, _kernels())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_fused_kernel_is_launched_without_fp_fusion(launches, dtype):
    _call_every_wrapper(dtype)
    assert sorted(n for n, *_ in launches) == sorted(_kernels())
    for name, _, _, kwargs in launches:
        assert kwargs.get("enable_fp_fusion") is False, f"{name} launched with {kwargs}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_no_fused_kernel_compiles_to_a_fused_multiply_add(launches, dtype):
    """Compiled as launched, no kernel has a floating-point FMA; with contraction on, the rotary kernels (whose
    two products and a sum are the failing case) do, which is what this check exists to see."""
    if triton_attention.interpreted():
        pytest.skip("the interpreter's kernels are not compiled")
    _call_every_wrapper(dtype)
    for name, kernel, args, kwargs in launches:
        fmas = FMA.findall(ptx(kernel, args, kwargs))
        assert not fmas, f"{name} ({dtype}) compiles to {len(fmas)} fused multiply-adds"
        if name in ("rotary", "rope_store"):
            contracted = FMA.findall(ptx(kernel, args, dict(kwargs, enable_fp_fusion=True)))
            assert contracted, f"{name} ({dtype}) with contraction on: expected FMAs, the check would be blind"
