"""The attention kernel's key loop, compiled for an H100 here: ``pipelined`` makes it a loop the compiler
software-pipelines (its gathers issued as ``cp.async`` a few tiles ahead), the plain loop one it does not.

On the H100 of 2026-12-07 the decode step's attention read its KV at 1,348 GB/s, 40% of the peak, and its key loop
was a ``while`` loop (the Triton interpreter, which the CPU lanes run the kernels under, cannot iterate a ``range``
with loaded bounds), which the compiler does not pipeline: each tile's gather waited for the last. The ``range``
form is off by default: on an H100 (2026-12-08, ``benchmarks/decode_attention.py --variants plain:32:4 pipe:32:4:3``
and ``step_breakdown.py --pipelined-keys``) it left the decode step as it was and slowed the mixed one. This checks,
without a GPU, that it compiles and is pipelined, and that the interpreter never sees it.
"""
from __future__ import annotations

import re

import pytest
import torch

from kvcm.engine import triton_attention
from _ptx import ptx, recording

pytestmark = pytest.mark.skipif(triton_attention.triton is None, reason="Triton is not installed (pip install triton)")

ASYNC = re.compile(r"\bcp\.async\.(ca|cg)\b")


def _decode_launch(monkeypatch, **options):
    """One decode step of SmolLM2's attention shape (9 query heads, 3 KV heads, 64 dims, bf16, pages of 32), the
    kernel's launch recorded, not run."""
    launches = recording(monkeypatch, {"attention": triton_attention._paged_attention_kernel})
    g = torch.Generator().manual_seed(0)
    batch, tpb = 4, 32
    kv = torch.randn(16, 2, tpb, 3, 64, generator=g).to(torch.bfloat16)
    q = torch.randn(batch, 9, 64, generator=g).to(torch.bfloat16)
    triton_attention.paged_attention(q, kv, torch.arange(16).view(batch, 4), torch.tensor([100, 50, 120, 10]),
                                     torch.arange(batch + 1), scale=0.125, window=None, tpb=tpb, **options)
    (launch,) = launches
    return launch


def test_the_pipelined_key_loop_compiles_to_asynchronous_copies(monkeypatch):
    if triton_attention.interpreted():
        pytest.skip("the interpreter's kernels are not compiled")
    _, kernel, args, kwargs = _decode_launch(monkeypatch, pipelined=True)
    assert kwargs["PIPELINED"] is True
    pipelined = len(ASYNC.findall(ptx(kernel, args, kwargs)))
    _, kernel, args, kwargs = _decode_launch(monkeypatch)
    assert kwargs["PIPELINED"] is False
    plain = len(ASYNC.findall(ptx(kernel, args, kwargs)))
    assert pipelined > 0 and plain == 0, f"cp.async: {pipelined} pipelined, {plain} plain"


def test_the_interpreter_always_runs_the_plain_loop(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _, _, _, kwargs = _decode_launch(monkeypatch, pipelined=True)
    assert kwargs["PIPELINED"] is False
