"""The Triton kernels (``triton_attention``, ``fused``) against a plain reference and inside the engine.

On a CUDA machine they run natively. On the CPU, ``test_kernels_under_the_triton_interpreter`` re-runs this file
in a subprocess with ``TRITON_INTERPRET=1`` (the interpreter executes the same kernels on CPU tensors), so the
CPU lane checks the exact code the GPU runs.
"""
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams, triton_attention
from kvcm.models import hf_generate, tiny_model

from _prompts import random_prompts
from _attention_cases import case as _case

pytestmark = pytest.mark.skipif(triton_attention.triton is None, reason="Triton is not installed "
                                "(pip install triton; on CPU its interpreter runs these checks)")


@pytest.fixture
def device():
    if torch.cuda.is_available():
        return "cuda"
    if triton_attention.interpreted():
        return "cpu"
    pytest.skip("no CUDA here: test_kernels_under_the_triton_interpreter runs this under the interpreter")


@pytest.mark.cpu_only
@pytest.mark.slow
def test_kernels_under_the_triton_interpreter(kvcm_progress):
    """About 80 s on a 2-core CPU: a progress bar moves as each test of the inner run ends (read from its ``-v``
    lines as they come)."""
    if torch.cuda.is_available() or triton_attention.interpreted():
        pytest.skip("the kernels run directly here")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pytest", __file__, "-v", "-p", "no:cacheprovider", "-x", "--kvcm-version=v2"]
    lines, bar = [], None
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        timer = threading.Timer(900, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                collected = re.search(r"collected (\d+) items?", line)  # -v: "collecting ... collected 11 items"
                if collected:
                    bar = kvcm_progress(total=int(collected.group(1)), desc="Triton interpreter", unit="test")
                elif bar is not None and re.search(r" (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", line):
                    bar.update(1)
        finally:
            timer.cancel()
    out = "".join(lines)
    assert proc.returncode == 0, out[-6000:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed)", lines[-1])}
    assert counts.get("passed", 0) >= 7 and counts.get("skipped", 0) <= 1, out[-2000:]  # only this test skips


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,window", [(9, 3, 64, 32, None), (4, 2, 16, 8, 16), (9, 3, 64, 8, 20),
                                                           (2, 2, 32, 16, None)])
def test_attention_kernel_matches_the_reference(device, heads, kv_heads, dim, tpb, window):
    (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, window)
    out = triton_attention.paged_attention(q.to(device), kv.to(device), table.to(device), lens.to(device),
                                           starts.to(device), scale=scale, window=window, tpb=tpb).cpu()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)
    out16 = triton_attention.paged_attention(q.bfloat16().to(device), kv.bfloat16().to(device), table.to(device),
                                             lens.to(device), starts.to(device), scale=scale, window=window,
                                             tpb=tpb).cpu()
    torch.testing.assert_close(out16.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,window,chunk", [(9, 3, 64, 32, None, None), (9, 3, 64, 8, 20, None),
                                                                (4, 2, 16, 8, None, 16)])
def test_the_pipelined_key_loop_gives_the_plain_loop_s_output_bit_for_bit(device, heads, kv_heads, dim, tpb, window,
                                                                         chunk):
    """``pipelined`` (the key loop the compiler software-pipelines, ``test_kernel_pipelining.py``) reads the same
    tiles in the same order: on a GPU its output equals the plain loop's exactly, whole keys and split, fp32 and
    bf16. Under the interpreter both are the plain loop."""
    (q, kv, table, lens, starts, scale), _ = _case(heads, kv_heads, dim, tpb, window, chunk)
    for dtype in (torch.float32, torch.bfloat16):
        args = (q.to(device, dtype), kv.to(device, dtype), table.to(device), lens.to(device), starts.to(device))
        for options in ({}, {"split_len": 32}):
            plain, piped = (triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, chunk=chunk,
                                                             pipelined=p, **options).cpu() for p in (False, True))
            assert torch.equal(plain, piped), (dtype, options)


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_rows_taken_by_index_give_the_searched_output_bit_for_bit(device, q_len):
    """``uniform_q_len``: on a decode step (every row ``q_len`` queries: a decode, a speculative verification of
    2 drafts, a graph's padding row at KV length ``q_len``) each program takes its sequence by index instead of
    searching ``query_start``; the same tiles in the same order, so the same output exactly, whole and split, and
    the reference's. A promise the rows do not keep is refused."""
    rows = [(q_len, 37), (q_len, 21), (q_len, 50), (q_len, 3 + q_len), (q_len, q_len)]
    for heads, kv_heads, dim, tpb, window in [(9, 3, 64, 32, None), (4, 2, 16, 8, 16)]:
        (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, window, rows=rows)
        args = (q.to(device), kv.to(device), table.to(device), lens.to(device), starts.to(device))
        for options in ({}, {"split_len": 32}):
            searched, direct = (triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb,
                                                                 uniform_q_len=u, **options).cpu() for u in (0, q_len))
            assert torch.equal(searched, direct), options
            torch.testing.assert_close(direct.double(), ref, atol=2e-5, rtol=1e-4)
        with pytest.raises(ValueError, match=f"uniform_q_len={q_len + 1} must be 0 or the {len(rows) * q_len} query"):
            triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, uniform_q_len=q_len + 1)


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,window,block_m", [(9, 3, 64, 32, None, None), (4, 2, 16, 8, 16, 32)])
def test_rows_mapped_once_a_step_give_the_searched_output_bit_for_bit(device, heads, kv_heads, dim, tpb, window,
                                                                      block_m):
    """``program_maps``: the rows of a step of every kind (a decode, a verification, prefill chunks, padding) are
    searched once into a map of each program's sequence (-1: spare), which every layer's launch then reads; the
    same tiles in the same order as the search, so the same output exactly, whole and split."""
    (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, window)
    args = (q.to(device), kv.to(device), table.to(device), lens.to(device), starts.to(device))
    block_q = triton_attention.tile_shape(heads, kv_heads, block_m)[1]
    programs = triton_attention.num_programs(q.shape[0], table.shape[0], block_q)
    expected = [-1] * programs
    for s in range(table.shape[0]):
        q_len = int(starts[s + 1] - starts[s])
        for j in range(-(-q_len // block_q)):
            expected[int(starts[s]) // block_q + s + j] = s
    assert triton_attention.program_seqs(args[4], table.shape[0], block_q, programs).tolist() == expected
    for options in ({}, {"split_len": 32}):
        maps = {}
        searched = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, block_m=block_m,
                                                    **options).cpu()
        for _ in range(2):         # the second launch (another layer) reads the map the first one wrote
            mapped = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, block_m=block_m,
                                                      program_maps=maps, **options).cpu()
            assert torch.equal(searched, mapped), options
        assert len(maps) == 1
        torch.testing.assert_close(mapped.double(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,chunk", [(4, 2, 16, 8, 16), (9, 3, 64, 8, 12), (2, 2, 32, 16, 40)])
def test_attention_kernel_masks_a_chunk(device, heads, kv_heads, dim, tpb, chunk):
    """Chunked-local attention (Llama 4): each query reads its own chunk only, chunks of whole pages, of one and
    a half, and longer than the tile; split keys and a larger query tile give the same."""
    (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, None, chunk)
    args = (q.to(device), kv.to(device), table.to(device), lens.to(device), starts.to(device))
    for options in ({}, {"split_len": 32}, {"block_m": 64}):
        out = triton_attention.paged_attention(*args, scale=scale, window=None, tpb=tpb, chunk=chunk,
                                               **options).cpu()
        assert torch.isfinite(out).all(), options
        torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4, msg=str(options))


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,window,split_len", [(9, 3, 64, 32, None, 32), (9, 3, 64, 8, 20, 32),
                                                                     (4, 2, 16, 16, 16, 64)])
def test_split_keys_give_the_unsplit_attention(device, heads, kv_heads, dim, tpb, window, split_len):
    """Flash-decoding (``split_len``): every row's keys in shares of ``split_len``, their softmaxes combined.
    The same rows as above, so shares that hold no key of a row (short rows, the window, the padding row) and
    rows whose keys span several shares are both there."""
    (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, window)
    assert triton_attention.num_splits(table.shape[1], tpb, split_len) > 1
    args = (q.to(device), kv.to(device), table.to(device), lens.to(device), starts.to(device))
    whole = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb).cpu()
    split = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, split_len=split_len).cpu()
    assert torch.isfinite(split).all()
    torch.testing.assert_close(split.double(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(split, whole, atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="split_len=20 must be 0 or a positive multiple of 32"):
        triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, split_len=20)


@pytest.mark.parametrize("heads,kv_heads,dim,tpb,window,block_m", [(9, 3, 64, 32, None, 32), (9, 3, 64, 8, 20, 64),
                                                                    (4, 2, 16, 8, 16, 128)])
def test_a_larger_query_tile_gives_the_same_attention(device, heads, kv_heads, dim, tpb, window, block_m):
    """``block_m``: more of a prefill chunk's query tokens a program (10, 21 or 64 here, against 5 or 8). The
    chunks of 13 and 7 queries then fit one program, and the decode rows leave most of their tile empty."""
    (q, kv, table, lens, starts, scale), ref = _case(heads, kv_heads, dim, tpb, window)
    args = (q.to(device), kv.to(device), table.to(device), lens.to(device), starts.to(device))
    whole = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb).cpu()
    wide = triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, block_m=block_m).cpu()
    torch.testing.assert_close(wide.double(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(wide, whole, atol=2e-6, rtol=1e-5)
    for bad in (8, 48, 256):
        with pytest.raises(ValueError, match=f"block_m={bad} must be a power of two from 16 .* to 128"):
            triton_attention.paged_attention(*args, scale=scale, window=window, tpb=tpb, block_m=bad)


def test_store_kv_writes_each_token_at_its_slot(device):
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(10, 2, 8, 3, 64, generator=g)
    key = torch.randn(3, 11, 64, generator=g).transpose(0, 1)             # [T, kv_heads, D], strided
    value = torch.randn(3, 11, 64, generator=g).transpose(0, 1)
    flat = torch.randperm(80, generator=g)[:11]
    ref = kv.clone()
    ref[:, 0].index_put_((flat // 8, flat % 8), key)
    ref[:, 1].index_put_((flat // 8, flat % 8), value)
    got = kv.to(device)
    triton_attention.store_kv(got, key.to(device), value.to(device), (flat // 8).to(device), (flat % 8).to(device))
    assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_engine_on_the_kernels_matches_hf_generate(device, arch, kvcm_version):
    """The engine with the kernels (eager, then its static steps: decode shapes and token buckets) gives HF
    generate's tokens; mistral runs past its window with V2 releasing pages. Llama, Mistral and Qwen2 (q/k/v
    biases) run the fused layers, Qwen3 (per-head q/k norms) its own layers with the fused small ops."""
    model, _ = tiny_model(arch, seed=5, device=device)
    prompts = random_prompts(11, [5, 21, 9])
    params = SamplingParams(max_new_tokens=14, ignore_eos=True)
    ref = [r.token_ids for r in hf_generate(model, prompts, 14, eos_token_id=[])]
    kw = dict(kvcm_version=kvcm_version, max_batch_size=2, max_seq_len=64, max_num_tokens=16, device=device,
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=512, dtype="float32"))
    eager = LLM(model, **kw)
    assert eager.runner.use_kernel
    assert (eager.runner.layers is not None) == (arch != "qwen3")
    assert [o.token_ids for o in eager.generate(prompts, params)] == ref
    static = LLM(model, cuda_graph=True, cuda_graph_batch_sizes=[1, 2], cuda_graph_token_buckets=[16], **kw)
    assert [o.token_ids for o in static.generate(prompts, params)] == ref
    assert static.graphs.num_bucket_replays > 0 and static.graphs.num_replays > static.graphs.num_bucket_replays


def test_engine_with_its_kernel_options_matches_hf_generate(device):
    """``LLM(decode_split_len=..., prefill_block_m=...)``: decode steps (eager and graphs) read their keys in
    shares of 32 positions (max_seq_len 64: two shares) at the least tile; mixed steps and token buckets do not
    split and take 64 query rows a program (32 tokens of the tiny model's 2 query heads a KV head: a prompt's
    whole chunk); with ``step_row_map`` the buckets' programs read their rows from a map made once a step (each
    graph's capture makes its own). HF generate's tokens either way."""
    model, _ = tiny_model("llama", seed=5, device=device)
    prompts = random_prompts(11, [5, 21, 9])
    params = SamplingParams(max_new_tokens=14, ignore_eos=True)
    ref = [r.token_ids for r in hf_generate(model, prompts, 14, eos_token_id=[])]
    for row_map in (False, True):
        llm = LLM(model, max_batch_size=2, max_seq_len=64, max_num_tokens=16, device=device, cuda_graph=True,
                  cuda_graph_batch_sizes=[1, 2], cuda_graph_token_buckets=[16], decode_split_len=32, prefill_block_m=64,
                  step_row_map=row_map,
                  kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=512, dtype="float32"))
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref
        assert {(s.ctx.split_len, s.ctx.block_m) for s in llm.graphs.shapes.values()} == {(32, None)}
        assert {(s.ctx.split_len, s.ctx.block_m) for s in llm.graphs.buckets.values()} == {(0, 64)}
        assert llm.graphs.num_replays > llm.graphs.num_bucket_replays > 0
        assert all(bool(s.ctx.program_maps) == row_map for s in llm.graphs.buckets.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_ops_compute_what_hugging_face_computes(device, dtype):
    """RMSNorm, rotary embedding and SiLU-and-mul, each one kernel, against the modules and function they
    stand in for (fp32: to rounding of the mean's sum; bf16: to one bf16 step)."""
    from transformers.models.llama import modeling_llama as hf
    from kvcm.engine import fused
    g = torch.Generator().manual_seed(3)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    x = torch.randn(7, 576, generator=g).to(dtype)
    norm = hf.LlamaRMSNorm(576, eps=1e-5)
    norm.weight.data = torch.randn(576, generator=g).to(dtype)
    ref = norm(x)
    got = fused.rmsnorm(x.to(device), norm.weight.to(device), 1e-5).cpu()
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, **tol)
    q = torch.randn(2, 5, 9, 64, generator=g).to(dtype).transpose(1, 2)      # [B, H, T, D] views, as HF makes
    k = torch.randn(2, 5, 3, 64, generator=g).to(dtype).transpose(1, 2)
    ang = torch.randn(2, 5, 32, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    rq, rk = hf.apply_rotary_pos_emb(q, k, cos, sin)
    gq, gk = fused.rotary(q.to(device), k.to(device), cos.to(device), sin.to(device))
    assert gq.shape == rq.shape and gk.shape == rk.shape
    torch.testing.assert_close(gq.cpu(), rq, **tol)
    torch.testing.assert_close(gk.cpu(), rk, **tol)
    gate, up = torch.randn(7, 1536, generator=g).to(dtype), torch.randn(7, 1536, generator=g).to(dtype)
    ref = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(fused.silu_mul(gate.to(device), up.to(device)).cpu(), ref, **tol)


def test_fused_ops_are_swapped_in_only_inside_an_engine_forward(device):
    """Inside the runner's forward the model's norms and MLPs run the fused kernels; outside it (Hugging Face
    generate on the same model object) they run their own code again. (The model's own layers: with the fused
    layers, the default, a llama's body is the engine's and its modules' forwards are not called.)"""
    from transformers.models.llama import modeling_llama as hf
    from kvcm.engine.attention import KernelOptions
    from kvcm.engine.runner import ModelRunner, StepItem
    model, _ = tiny_model("llama", seed=1, device=device)
    spec = kvcm.ModelSpec.from_hf_config(model.config)
    mgr = kvcm.create_kv_cache_manager("v2", spec, kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=256),
                                       max_batch_size=2, max_seq_len=64, device=device)
    assert ModelRunner(model, mgr, device).layers is not None
    runner = ModelRunner(model, mgr, device, kernel=KernelOptions(fused_layers=False))
    assert runner.layers is None
    assert runner.fused is not None and len(runner.fused.forwards) == 2 * 2 + 1 + 2    # norms, final norm, MLPs
    seen = []
    original = hf.apply_rotary_pos_emb
    norm = model.model.layers[0].input_layernorm
    hook = norm.register_forward_hook(lambda m, a, out: seen.append(("forward" in m.__dict__,
                                                                     hf.apply_rotary_pos_emb is not original)))
    mgr.begin_context_chunk("r", 0, 5, 5)
    runner.run([StepItem("r", [5, 6, 7, 8, 9], 0, decode=False)])
    model(torch.tensor([[5, 6, 7]], device=device))
    hook.remove()
    assert seen == [(True, True), (False, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_layer_kernels_compute_what_hugging_face_computes(device, dtype):
    """The fused layers' own kernels: the residual add and the norm in one (the sum bit for bit, the norm as
    ``fused.rmsnorm``), rotary with the K/V write in one (the pages bit for bit as HF's rotary then ``store_kv``),
    and SiLU-and-mul on the two halves of one side-by-side projection. Bit for bit where the rounding is the
    GPU's: the interpreter rounds fp32 to bf16 by truncation, so there bf16 is checked to one bf16 step."""
    from transformers.models.llama import modeling_llama as hf
    from kvcm.engine import fused, fused_layers
    g = torch.Generator().manual_seed(4)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    exact = dtype == torch.float32 or device == "cuda"

    def same(a, b):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, **tol)
    x, y = torch.randn(7, 576, generator=g).to(dtype), torch.randn(7, 576, generator=g).to(dtype)
    norm = hf.LlamaRMSNorm(576, eps=1e-5)
    norm.weight.data = torch.randn(576, generator=g).to(dtype)
    ref_sum = x + y
    ref = norm(ref_sum)
    xd = x.clone().to(device)
    got = fused_layers.add_rmsnorm(xd, y.to(device), norm.weight.to(device), 1e-5).cpu()
    same(xd.cpu(), ref_sum)
    torch.testing.assert_close(got, ref, **tol)
    same(got, fused.rmsnorm(xd, norm.weight.to(device), 1e-5).cpu())
    t, heads, kvh, d, tpb = 5, 9, 3, 64, 8
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=g).to(dtype)
    ang = torch.randn(t, d // 2, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    q, k, v = qkv.split([heads * d, kvh * d, kvh * d], -1)
    rq, rk = hf.apply_rotary_pos_emb(q.view(1, t, heads, d).transpose(1, 2), k.view(1, t, kvh, d).transpose(1, 2),
                                     cos[None], sin[None])
    flat = torch.randperm(6 * tpb, generator=g)[:t]
    pages = torch.randn(6, 2, tpb, kvh, d, generator=g).to(dtype)
    ref_pages = pages.clone()
    ref_pages[:, 0].index_put_((flat // tpb, flat % tpb), rk[0].transpose(0, 1))
    ref_pages[:, 1].index_put_((flat // tpb, flat % tpb), v.view(t, kvh, d))
    got_pages = pages.to(device)
    got_q = fused_layers.rope_store(qkv.to(device), cos.to(device), sin.to(device), got_pages,
                                    (flat // tpb).to(device), (flat % tpb).to(device), heads, kvh).cpu()
    same(got_q, rq[0].transpose(0, 1))
    same(got_pages.cpu(), ref_pages)
    gu = torch.randn(7, 2 * 1536, generator=g).to(dtype)
    ref = torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:]
    gud = gu.to(device)
    torch.testing.assert_close(fused.silu_mul(gud[:, :1536], gud[:, 1536:]).cpu(), ref, **tol)


def test_fused_layers_share_the_weights_and_follow_a_replaced_one(device):
    """The side-by-side projections hold the modules' weights (theirs are views, no copy), so Hugging Face
    generate on the same model is unchanged; a weight replaced by a new tensor is picked up by the next step."""
    model, _ = tiny_model("llama", seed=5, device=device)
    prompts = random_prompts(12, [6, 9])
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    ref = [r.token_ids for r in hf_generate(model, prompts, 6, eos_token_id=[])]
    llm = LLM(model, max_batch_size=2, max_seq_len=64, device=device, enable_block_reuse=False,   # no stale prefix
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=256, dtype="float32"))
    attn = model.model.layers[0].self_attn
    stack = llm.runner.layers.qkv[0]
    assert attn.k_proj.weight.untyped_storage().data_ptr() == stack.weight.untyped_storage().data_ptr()
    assert [r.token_ids for r in hf_generate(model, prompts, 6, eos_token_id=[])] == ref
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    with torch.no_grad():
        attn.v_proj.weight = torch.nn.Parameter(attn.v_proj.weight * -3.0)
        model.model.layers[1].mlp.up_proj.weight.mul_(2.0)          # in place: seen through the view
    changed = [r.token_ids for r in hf_generate(model, prompts, 6, eos_token_id=[])]
    assert changed != ref
    assert [o.token_ids for o in llm.generate(prompts, params)] == changed


def test_a_drafter_sharing_the_layers_shares_their_stacks(device):
    """A truncated drafter holds the target's own layer modules: both engines' fused layers use one stack per
    layer, so neither re-stacks the weights away from the other (which would rebuild them every step)."""
    from kvcm.engine import fused_layers
    from kvcm.models import truncated_drafter
    model, _ = tiny_model("llama", seed=5, device=device)
    target = fused_layers.fused_layers(model, device)
    draft = fused_layers.fused_layers(truncated_drafter(model, 1), device)
    assert draft.qkv[0] is target.qkv[0] and draft.gate_up[0] is target.gate_up[0]
    weight = target.qkv[0].weight
    assert target.qkv[0].current()[0] is weight and draft.qkv[0].current()[0] is weight
