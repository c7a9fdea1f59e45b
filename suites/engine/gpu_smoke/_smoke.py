"""What the GPU smoke tests share: the device they run on, the scale of their models and prompts, the engine they
build and the parity check they make.

The device is CUDA unless ``KVCM_SMOKE_DEVICE=cpu``: then the same tests run on the CPU at a smaller scale (fewer
layers, shorter windows and chunks, fewer tokens), marked ``post_merge`` instead of ``gpu``; with
``TRITON_INTERPRET=1`` beside it the Triton kernels run there too, under the interpreter
(``suites/engine/test_gpu_smoke_on_cpu.py`` runs it so).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams, triton_attention
from kvcm.models import hf_generate
from pytest_kvcm.parity import compare_outputs

DEVICE_ENV = "KVCM_SMOKE_DEVICE"
DEVICE = os.environ.get(DEVICE_ENV) or "cuda"
if DEVICE not in ("cuda", "cpu"):
    raise ValueError(f"{DEVICE_ENV}={DEVICE!r}: must be 'cuda' (the default) or 'cpu'")
ON_GPU = DEVICE == "cuda"
MARKS = [pytest.mark.gpu(count=1)] if ON_GPU else [pytest.mark.post_merge]


@dataclass(frozen=True)
class Scale:
    """How big one form of the tests is. On CUDA the models have their real shapes (Llama 4: per layer); on the
    CPU they keep their widths and heads but not their depth, windows or chunks, so prompts can cross them."""
    tpb: int                     # tokens a KV page
    new_tokens: int              # greedy tokens a prompt
    smollm2_layers: int          # of 30
    drafter_layers: int          # the truncated drafter's
    gemma3_layers: int           # of 18 (six keep one global layer after five sliding ones)
    gemma3_window: int | None    # None: the config's 512
    llama4_chunk: int            # Scout's 8,192
    llama4_mlp: int | None       # None: Scout's MLP widths (8,192 an expert, 16,384 dense)


GPU_SCALE = Scale(tpb=32, new_tokens=16, smollm2_layers=30, drafter_layers=4, gemma3_layers=18, gemma3_window=None,
                  llama4_chunk=8192, llama4_mlp=None)
CPU_SCALE = Scale(tpb=8, new_tokens=6, smollm2_layers=2, drafter_layers=1, gemma3_layers=6, gemma3_window=16,
                  llama4_chunk=16, llama4_mlp=256)
SCALE = GPU_SCALE if ON_GPU else CPU_SCALE


def kernels_run() -> bool:
    """Whether the engine takes the Triton kernels here (always on CUDA; on the CPU only under the interpreter)."""
    return triton_attention.available(torch.device(DEVICE).type)


def require_kernels() -> None:
    if not kernels_run():
        pytest.skip("the Triton kernels do not run here: on the CPU, set TRITON_INTERPRET=1 (Triton installed)")


def prompts(seed: int, lengths, vocab: int) -> list[list[int]]:
    """Seeded random prompts of ``lengths`` over ids 3 .. vocab - 1 (clear of the pad, BOS and EOS ids)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def around_pages(tpb: int) -> list[int]:
    """Prompt lengths at the edges of the first two pages: a page less one, a page, a page and one."""
    return [tpb - 1, tpb, tpb + 1, 2 * tpb - 1, 2 * tpb, 2 * tpb + 1]


def engine(model, version: str = "v2", *, max_tokens: int = 4096, max_seq_len: int = 512, max_batch_size: int = 8,
           **kw) -> LLM:
    """The engine on ``DEVICE`` in fp32, ``SCALE.tpb`` tokens a page, a pool of ``max_tokens``."""
    cfg = kvcm.KvCacheConfig(tokens_per_block=SCALE.tpb, max_tokens=max_tokens, dtype="float32")
    return LLM(model, kvcm_version=version, max_batch_size=max_batch_size, max_seq_len=max_seq_len, device=DEVICE,
               kv_cache_config=cfg, **kw)


def params(new_tokens: int | None = None) -> SamplingParams:
    return SamplingParams(max_new_tokens=new_tokens or SCALE.new_tokens, ignore_eos=True)


def reference(model, ps, new_tokens: int | None = None, **kw):
    """Hugging Face ``generate``'s greedy tokens, fp32, never stopping early (the engine ignores EOS)."""
    return hf_generate(model, ps, new_tokens or SCALE.new_tokens, eos_token_id=[], **kw)


#: Logit margins below this are near ties fp32 rounding may flip: a GEMM of another shape (the fused q/k/v
#: projection against three, a prefill chunk of other length) sums in another order, and 30 layers carry it to
#: the logits at ~1e-5. A first difference at a larger margin fails.
NEAR_TIE = 1e-4


def assert_parity(ref, outs, ps, what: str) -> None:
    """Token for token; a failure names the prompt, the first differing position and its logit margin."""
    report = compare_outputs(ref, outs, ps, names=("hf", what), margin_tolerance=NEAR_TIE)
    assert report.passed, report.format()
